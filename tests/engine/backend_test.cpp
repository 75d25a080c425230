// The backend registry: the engine builds its stages and transport through the backend named by
// EngineConfig::backend; an unknown or unavailable backend is a clear kNotSupported (exit 2).
#include "lockstep/engine/backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "cpu/cpu_stage.h"
#include "lockstep/engine/engine.h"
#include "test_util.h"

namespace lockstep {
namespace {

using test::Model;

// A wrapper backend at the production interface: CPU stages, counting what the engine asks for.
struct CountingBackend final : Backend {
  int* stages_made;
  explicit CountingBackend(int* counter) : stages_made(counter) {}
  std::string name() const override { return "counting"; }
  Result<StageSessionPtr> CreateStage(const StageParams& p) override {
    ++*stages_made;
    return StageSessionPtr(std::make_unique<CpuStageSession>(p));
  }
  Result<TransportPtr> CreateTransport(int n) override {
    return TransportPtr(std::make_unique<InProcessTransport>(n));
  }
  std::string Describe() const override { return "counting wrapper over cpu"; }
};

TEST(Backend, CpuIsAlwaysRegistered) {
  auto names = RegisteredBackends();
  EXPECT_NE(std::find(names.begin(), names.end(), "cpu"), names.end());
}

TEST(Backend, EngineBuildsStagesThroughTheNamedBackend) {
  static int made = 0;
  made = 0;
  RegisterBackend("counting", [](const EngineConfig&, const ModelWeights&) -> Result<BackendPtr> {
    return BackendPtr(std::make_unique<CountingBackend>(&made));
  });
  EngineConfig c;
  c.model = test::ModelDir("tiny");
  c.backend = "counting";
  c.threads = 1;
  c.stages = 3;
  auto e = Engine::Create(c, Model("tiny"));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(made, 3);
  EXPECT_EQ((*e)->backend().name(), "counting");
}

TEST(Backend, UnbuiltBackendIsNotSupported) {
  EngineConfig c;
  c.backend = "no-such-backend";
  auto b = CreateBackend(c, Model("tiny"));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Status::Code::kNotSupported);
  EXPECT_NE(b.status().message().find("built: "), std::string::npos) << b.status().message();
}

TEST(Backend, CpuDescribesItself) {
  EngineConfig c;
  c.threads = 3;
  auto b = CreateBackend(c, Model("tiny"));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->Describe(), "cpu, 3 threads");
}

// `--backend cuda` on a machine without a GPU (or a build without CUDA) is exit 2 with the
// reason, never a crash.
TEST(Backend, CudaWithoutDeviceIsExitTwo) {
  if (std::filesystem::exists("/dev/nvidia0"))
    GTEST_SKIP() << "a GPU is present: covered by cuda_tests";
  auto r = test::RunLockstep("generate --model " + test::ModelDir("tiny") +
                             " --backend cuda --prompt hello --max-new 2");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(r.err.find("no CUDA device") != std::string::npos ||
              r.err.find("no 'cuda' backend") != std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace lockstep
