// The CUDA stage's fallback when a graph capture fails (emulator only: the failures are injected
// with emu::InjectCaptureFault). A stage whose capture fails at the start, part-way through or at
// instantiation must say so once, stop using graphs and give bitwise the results of a stage that
// never used them: the half-run capture's host bookkeeping (routing copies, scratch) undone.
#include <gtest/gtest.h>

#include <cstring>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "cuda_emu.h"
#include "gpu/cuda_engine_util.h"
#include "lockstep/engine/engine.h"
#include "test_util.h"

namespace emu {
// The fault's name in gtest's (and so CTest's) listing of the parameterised tests.
void PrintTo(CaptureFault f, std::ostream* os) {
  *os << (f == CaptureFault::kBegin    ? "at cudaStreamBeginCapture"
          : f == CaptureFault::kDuring ? "part-way through the capture"
                                       : "at cudaGraphInstantiate");
}
}  // namespace emu

namespace lockstep {
namespace {

class EmuGraphFallback : public ::testing::TestWithParam<emu::CaptureFault> {
 protected:
  void TearDown() override { emu::InjectCaptureFault(emu::CaptureFault::kNone); }
};

TEST_P(EmuGraphFallback, FailedCaptureRunsEagerlyWithTheSameBits) {
  std::unique_ptr<Engine> g, e;
  test::MakeGraphedAndEager(test::TinyConfig("cuda"), &g, &e);
  ASSERT_TRUE(g && e);
  const std::size_t V = static_cast<std::size_t>(g->weights().config.n_vocab);
  const auto prompt = test::Tokens(21);
  ASSERT_TRUE(g->Prefill(prompt).ok());
  ASSERT_TRUE(e->Prefill(prompt).ok());
  emu::InjectCaptureFault(GetParam());
  testing::internal::CaptureStderr();
  const auto toks = test::Tokens(40, 3);
  std::size_t next = 0;
  // T = 1 three times reaches the capture (eager, eager with nothing to grow, capture), then
  // windows of 3 (their own capture attempt would come third; graphs are off by then).
  const std::vector<int> sizes = {1, 1, 1, 1, 3, 3, 3, 1}, commits = {1, 1, 1, 1, 2, 3, 1, 1};
  for (std::size_t w = 0; w < sizes.size(); ++w) {
    const int T = sizes[w];
    std::vector<float> la(T * V), lb(T * V);
    std::span<const std::int32_t> tk(toks.data() + next, static_cast<std::size_t>(T));
    ASSERT_TRUE(g->Verify(tk, la.data()).ok()) << "window " << w;
    ASSERT_TRUE(e->Verify(tk, lb.data()).ok()) << "window " << w;
    EXPECT_TRUE(test::BitwiseEqual(la, lb)) << "window " << w;
    ASSERT_TRUE(g->Commit(commits[w]).ok() && e->Commit(commits[w]).ok());
    next += static_cast<std::size_t>(commits[w]);
  }
  const std::string err = testing::internal::GetCapturedStderr();
  for (int is = 0; is < g->n_stages(); ++is) {
    StageSession& a = g->stage(is);
    StageSession& b = e->stage(is);
    EXPECT_TRUE(a.status().ok()) << a.status().ToString();
    EXPECT_EQ(a.init_counters().graph_captures, 0) << "stage " << is;
    EXPECT_EQ(a.init_counters().graph_launches, 0) << "stage " << is;
    EXPECT_NE(err.find("cuda stage " + std::to_string(is) + ": CUDA graphs off"), std::string::npos)
        << err;
    EXPECT_EQ(a.experts().counters().hits, b.experts().counters().hits) << "stage " << is;
    EXPECT_EQ(a.experts().counters().misses, b.experts().counters().misses) << "stage " << is;
    for (int il = a.layer_begin(); il < a.layer_end(); ++il) {
      if (GdnState* ga = a.gdn(il)) {
        GdnState* gb = b.gdn(il);
        EXPECT_EQ(std::memcmp(ga->ssm(), gb->ssm(), ga->ssm_size() * 4), 0) << "ssm layer " << il;
      }
      if (KvCache* ka = a.kv(il)) {
        EXPECT_EQ(ka->rows_written(), b.kv(il)->rows_written()) << "layer " << il;
        EXPECT_EQ(ka->rows_committed(), b.kv(il)->rows_committed()) << "layer " << il;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Faults, EmuGraphFallback,
                         ::testing::Values(emu::CaptureFault::kBegin, emu::CaptureFault::kDuring,
                                           emu::CaptureFault::kInstantiate),
                         [](const auto& info) {
                           switch (info.param) {
                             case emu::CaptureFault::kBegin:
                               return std::string("AtBegin");
                             case emu::CaptureFault::kDuring:
                               return std::string("PartWay");
                             default:
                               return std::string("AtInstantiate");
                           }
                         });

}  // namespace
}  // namespace lockstep
