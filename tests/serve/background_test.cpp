// `lockstep generate --background SPEC` (issue 22): the harness can put a request among seeded
// random background requests; with batch_invariant on its export is bitwise the export without
// them (`lockstep diff --nrmse-max 0 --kl-max 0`), and a bad SPEC is bad input (exit 2).
#include <gtest/gtest.h>

#include "test_util.h"

namespace lockstep {
namespace {

std::string Args(const std::string& out, const std::string& extra) {
  return "generate --model " + test::ModelDir("tiny") + " --prompt-tokens " + out +
         ".tokens --slots 4 --threads 2 --prefill 32 --spec 4 "
         "--max-new 12 --ignore-eos --export-windows all --no-progress --export " +
         out + ".h5 " + extra;
}

TEST(Background, TheRequestsExportIsBitwiseTheExportWithoutBackground) {
  const std::string dir = test::NewDir("background");
  std::string ids;
  for (std::int32_t t : test::Tokens(150, 4)) ids += std::to_string(t) + " ";
  for (const char* arm : {"/alone", "/among"}) {
    FILE* f = std::fopen((dir + arm + ".tokens").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(ids.c_str(), f);
    std::fclose(f);
  }
  const test::CmdResult a = test::RunLockstep(Args(dir + "/alone", ""));
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const test::CmdResult b = test::RunLockstep(
      Args(dir + "/among", "--background n=5,prompt=50:400,max_new=4:16,arrive=0:6,seed=3"));
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(a.out, b.out) << "the same text";
  const test::CmdResult d =
      test::RunLockstep("diff " + dir + "/alone.h5 " + dir + "/among.h5 --nrmse-max 0 --kl-max 0");
  EXPECT_EQ(d.exit_code, 0) << d.out << d.err;
  const test::CmdResult bad =
      test::RunLockstep("generate --model " + test::ModelDir("tiny") + " --prompt-tokens " + dir +
                        "/alone.tokens --slots 4 --background n=0 --no-progress");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--background"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace lockstep
