#include "serve/memory.h"

#include <algorithm>

#include "lockstep/engine/dtype.h"

namespace lockstep {

namespace {

// One K/V cache (K and V) of `rows` positions, in whole pages, as KvCache allocates it.
std::uint64_t KvBytes(const EngineConfig& cfg, const ModelConfig& mc, int rows) {
  const std::uint64_t page_rows = static_cast<std::uint64_t>(std::max(1, cfg.kv_page_rows));
  const std::uint64_t pages = (static_cast<std::uint64_t>(rows) + page_rows - 1) / page_rows;
  const std::uint64_t elems =
      static_cast<std::uint64_t>(mc.n_heads_kv) * static_cast<std::uint64_t>(mc.head_dim);
  std::uint64_t row = elems * dtype_size(cfg.kv_dtype);
  if (cfg.kv_dtype == DType::kI8) row += static_cast<std::uint64_t>(mc.n_heads_kv) * 4;
  return 2 * pages * page_rows * row;
}

}  // namespace

Reservation ReserveRequest(const EngineConfig& cfg, const ModelConfig& mc, bool mtp, int rows,
                           int max_T) {
  Reservation r;
  const int n_attn = mc.n_full_attention_layers();
  const std::uint64_t n_gdn = static_cast<std::uint64_t>(mc.n_layers - n_attn);
  r.kv = static_cast<std::uint64_t>(n_attn) * KvBytes(cfg, mc, rows);
  if (mtp) r.mtp_kv = KvBytes(cfg, mc, rows);
  const std::uint64_t conv = static_cast<std::uint64_t>(std::max(0, mc.conv_kernel - 1)) *
                             static_cast<std::uint64_t>(mc.conv_dim());
  const std::uint64_t ssm = static_cast<std::uint64_t>(mc.n_v_heads) *
                            static_cast<std::uint64_t>(mc.k_head_dim) *
                            static_cast<std::uint64_t>(mc.v_head_dim);
  r.gdn = n_gdn * (conv + ssm) * 4 * (1 + static_cast<std::uint64_t>(max_T));
  const std::uint64_t T = static_cast<std::uint64_t>(std::max(1, max_T));
  const std::uint64_t rows_step =
      std::max<std::uint64_t>(T, static_cast<std::uint64_t>(cfg.prefill_chunk));
  r.scratch = 4 * (T * static_cast<std::uint64_t>(mc.n_vocab) +
                   16 * rows_step * static_cast<std::uint64_t>(mc.n_embd));
  return r;
}

std::uint64_t MemoryLimitBytes(const EngineConfig& cfg) {
  return static_cast<std::uint64_t>(std::max(0, cfg.memory_mib)) << 20;
}

}  // namespace lockstep
