// The named-op table (op_table.h) and the row digest.
#include "lockstep/engine/op_table.h"

#include <array>
#include <cmath>
#include <cstring>

#include "lockstep/engine/splitmix.h"

namespace lockstep {

namespace {

// The layer's input: the embedding (first layer of stage 0), the previous layer's (or previous
// stage's last layer's) residual, or the MTP head's projection.
#define LAYER_IN "residual|embed|mtp_fc"

// Indexed by OpId.
constexpr std::array<OpDef, kNumOps> kOps = {{
    {"embed", "", false},
    {"attn_norm", LAYER_IN, false},
    {"q_proj", "attn_norm", false},
    {"k_proj", "attn_norm", false},
    {"v_proj", "attn_norm", false},
    {"q_rope", "q_proj", false},
    {"k_rope", "k_proj", false},
    {"k", "", true},
    {"v", "", true},
    {"attn_out", "q_rope,k_rope,v_proj,q_proj,state:k,state:v", false},
    {"o_proj", "attn_out", false},
    {"in_proj", "attn_norm", false},
    {"in_proj_ba", "attn_norm", false},
    {"conv_state", "", true},
    {"ssm_state", "", true},
    {"conv", "in_proj,state:conv_state", false},
    {"gates", "in_proj_ba", false},
    {"l2norm", "conv", false},
    {"recurrence", "l2norm,conv,gates,state:ssm_state", false},
    {"gated_norm", "recurrence,in_proj", false},
    {"out_proj", "gated_norm", false},
    {"attn_residual", LAYER_IN ",o_proj|out_proj", false},
    {"ffn_norm", "attn_residual", false},
    {"router_logits", "ffn_norm", false},
    {"topk", "router_logits", false},
    {"expert_out", "ffn_norm,topk", false},
    {"shared_expert", "ffn_norm", false},
    {"moe_combine", "expert_out,topk,shared_expert,ffn_norm", false},
    {"ffn_out", "ffn_norm", false},
    {"residual", "attn_residual,moe_combine|ffn_out", false},
    {"final_norm", "residual|embed", false},
    {"lm_head", "final_norm", false},
    {"mtp_in", "final_norm|mtp_norm", false},
    {"mtp_fc", "mtp_in", false},
    {"mtp_norm", "residual", false},
    {"mtp_lm_head", "mtp_norm", false},
}};
#undef LAYER_IN
static_assert(static_cast<std::size_t>(OpId::kMtpLmHead) + 1 == kNumOps);

inline std::uint64_t Load64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace

const OpDef& GetOpDef(OpId op) { return kOps[static_cast<std::size_t>(op)]; }

std::span<const OpDef> OpTable() { return kOps; }

const OpDef* FindOpDef(std::string_view name) {
  for (const OpDef& d : kOps)
    if (name == d.name) return &d;
  return nullptr;
}

// Four lanes of h = (h ^ word) * odd constant (a bijection of h for a fixed word, so one changed
// word always leaves a different lane state; ~8 bytes a cycle), then SplitMix64 over the lanes
// and the length.
std::uint64_t RowDigestAppend(std::uint64_t h, const void* data, std::size_t bytes) {
  constexpr std::uint64_t kMul = 0x9fb21c651e98df25ull;  // odd
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t l0 = h, l1 = h ^ 0x1111, l2 = h ^ 0x2222, l3 = h ^ 0x3333;
  std::size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    l0 = (l0 ^ Load64(p + i)) * kMul;
    l1 = (l1 ^ Load64(p + i + 8)) * kMul;
    l2 = (l2 ^ Load64(p + i + 16)) * kMul;
    l3 = (l3 ^ Load64(p + i + 24)) * kMul;
  }
  for (; i + 8 <= bytes; i += 8) l0 = (l0 ^ Load64(p + i)) * kMul;
  if (i < bytes) {
    unsigned char tail[8] = {};
    std::memcpy(tail, p + i, bytes - i);
    l1 = (l1 ^ Load64(tail)) * kMul;
  }
  std::uint64_t out = SplitMix64(l0 ^ static_cast<std::uint64_t>(bytes));
  out = SplitMix64(out ^ l1);
  out = SplitMix64(out ^ l2);
  return SplitMix64(out ^ l3);
}

std::uint64_t RowDigest(const void* data, std::size_t bytes) {
  return RowDigestAppend(0x6c6f636b73746570ull, data, bytes);  // "lockstep"
}

double RowL2(const float* x, std::size_t n) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};  // four sums: no chain of dependent adds
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (std::size_t k = 0; k < 4; ++k)
      s[k] += static_cast<double>(x[i + k]) * static_cast<double>(x[i + k]);
  for (; i < n; ++i) s[0] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return std::sqrt((s[0] + s[1]) + (s[2] + s[3]));
}

}  // namespace lockstep
