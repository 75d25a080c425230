// The decode path's launch budget (emulator only: it counts the kernels that ran). Launch
// overhead is most of a decode step's time on the small presets, so the fusions of the verify /
// decode path are a budget: RowsMatmulMulti (with the shared expert's SwiGLU), the shared
// expert's down projection in ExpertDown's launch, AddRmsNormZc, MoeEpilogue, GdnSplitConv, the
// held GDN recurrence's own q / k norms, AttnPrep, the gated attention output and a window's
// routing and grouping in one launch. A change that adds a kernel per layer fails here
// and says where, and the budget is then updated on purpose (engine/cuda/README.md, "Fewer
// launches").
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "cuda/ops.h"
#include "cuda_emu.h"
#include "gpu/cuda_engine_util.h"
#include "lockstep/engine/engine.h"
#include "test_util.h"

namespace lockstep {
namespace {

// Kernels of one verify window of up to 16 rows (a decode step is a window of one), by the
// model's layout:
//   every layer:  RowsMatmulMulti (router + the shared expert's gate / up pair and its SwiGLU),
//                 RouteAndGroup (one launch for T <= 16), ExpertGateUp, ExpertDown (+ the
//                 shared expert's down), MoeEpilogue, AddRmsNormZc (post-attention) = 6
//   GDN layer:    RowsMatmulMulti (in_proj), GdnSplitConv (split, conv, conv states),
//                 GdnRecurrent (held: + q / k norms), GatedRmsNorm, RowsMatmul (out_proj) = 5
//   attention:    RowsMatmulMulti (q / k / v), AttnPrep (split, norms, RoPE, K / V store),
//                 Attention (+ output gate), RowsMatmul (o_proj)                  = 4
//                 (and AttnCombineKernel where rows pass the context split: not in this test)
//   every stage:  SetInt (the position) and the first layer's input RmsNormZc     = 2
//   once:         EmbedRows, the final RmsNormZc, lm_head                         = 3
long Budget(const ModelConfig& c, int stages) {
  long n = 3 + 2L * stages;
  for (int il = 0; il < c.n_layers; ++il) {
    EXPECT_TRUE(c.is_moe(il)) << "layer " << il << ": the budget counts MoE layers";
    n += 6 + (c.is_full_attention(il) ? 4 : 5);
  }
  return n;
}

TEST(EmuLaunchBudget, KernelsPerDecodeTokenAndVerifyWindow) {
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "graphs on" : "graphs off");
    EngineConfig cfg = test::TinyConfig("cuda");
    cfg.cuda_graphs = graphs;
    auto e = test::MakeTiny(cfg);
    ASSERT_TRUE(e);
    const ModelConfig& c = e->weights().config;
    ASSERT_TRUE(cuda::GdnRecurrentHoldsColumns(c.k_head_dim))
        << "tiny's Dk takes the held recurrence";
    const std::size_t V = static_cast<std::size_t>(c.n_vocab);
    ASSERT_TRUE(e->Prefill(test::Tokens(21)).ok());
    std::vector<float> logits(9 * V);
    std::int32_t tok = 3;
    for (int i = 0; i < 2; ++i) {  // first calls (and the captures) out of the count
      ASSERT_TRUE(e->Verify(std::span<const std::int32_t>(&tok, 1), logits.data()).ok());
      ASSERT_TRUE(e->Commit(1).ok());
    }
    const long want = Budget(c, e->n_stages());
    const int n = 4;
    const long k0 = emu::KernelsRun();
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(e->Verify(std::span<const std::int32_t>(&tok, 1), logits.data()).ok());
      ASSERT_TRUE(e->Commit(1).ok());
    }
    const long k1 = emu::KernelsRun();
    EXPECT_EQ(k1 - k0, n * want) << "kernels per decode token: " << (k1 - k0) / n << ", budget "
                                 << want;
    // A verify window of any T <= 16 runs the same kernels (its rows share each launch).
    const std::vector<std::int32_t> window = {3, 4, 5, 6, 7};
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(e->Verify(window, logits.data()).ok());
      ASSERT_TRUE(e->Commit(1).ok());
    }
    const long k2 = emu::KernelsRun();
    ASSERT_TRUE(e->Verify(window, logits.data()).ok());
    ASSERT_TRUE(e->Commit(2).ok());
    EXPECT_EQ(emu::KernelsRun() - k2, want) << "kernels of a T=5 verify window, budget " << want;
  }
}

}  // namespace
}  // namespace lockstep
