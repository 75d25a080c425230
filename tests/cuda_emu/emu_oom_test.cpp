// A device that runs out of memory, through the product: `lockstep generate --backend cuda` on the
// emulator's plugin with EMU_DEVICE_MIB limiting the emulated GPU's memory. The allocation that
// fails is a runtime failure (exit 3) whose message names the stage, what was being allocated, its
// size and the device's free memory; nothing crashes or hangs, and the export is never left as a
// final file (FILE.partial only, and the message says so).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "test_util.h"

namespace lockstep {
namespace {

// Runs `generate` with the plugin and a device of `mib` MiB; restores the environment.
test::CmdResult GenerateWithDeviceMib(int mib, const std::string& export_path) {
  ::setenv("LOCKSTEP_PLUGIN_DIR", LOCKSTEP_EMU_PLUGIN_DIR, 1);
  ::setenv("EMU_DEVICE_MIB", std::to_string(mib).c_str(), 1);
  auto r = test::RunLockstep("generate --model " + test::ModelDir("tiny") + " --prompt-file " +
                             LOCKSTEP_SOURCE_DIR
                             "/campaigns/prompts/demo.txt --backend cuda --max-new 4 --export " +
                             export_path);
  ::unsetenv("EMU_DEVICE_MIB");
  ::unsetenv("LOCKSTEP_PLUGIN_DIR");
  return r;
}

TEST(EmuOom, OutOfDeviceMemoryIsARuntimeErrorNamingTheAllocation) {
  ASSERT_TRUE(std::filesystem::exists(LOCKSTEP_EMU_PLUGIN_DIR "/liblockstep_cuda.so"))
      << "build the plugin (target lockstep_cuda_emu) first";
  const std::string dir = test::NewDir("oom");
  struct Case {
    int mib;
    std::string needle;  // the first allocation that no longer fits
  };
  // 40 MiB: stage 0's first 64 MiB scratch block, before any work. 300 MiB: the arena blocks
  // and weights fit, stage 3's cuBLAS workspace does not: stages 0-2 have prefill work queued.
  for (const Case& c :
       {Case{40, "stage 0: cuda: out of device memory: scratch arena block (64.0 MiB) on device 0"},
        Case{300,
             "stage 3: cuda: out of device memory: cuBLAS workspace (32.0 MiB) on device 0"}}) {
    const std::string path = dir + "/x" + std::to_string(c.mib) + ".h5";
    const auto r = GenerateWithDeviceMib(c.mib, path);
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(" free of " + std::to_string(c.mib) + ".0 MiB"), std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find(path + ".partial keeps what was exported before"), std::string::npos)
        << r.err;
    EXPECT_FALSE(std::filesystem::exists(path)) << "a failed request must not leave a final export";
  }
  // The same request on the default (80 GiB) emulated device passes: the GPU check's rehearsal
  // (gpu_check_rehearsal) runs it in its cuda-vs-cpu step.
}

}  // namespace
}  // namespace lockstep
