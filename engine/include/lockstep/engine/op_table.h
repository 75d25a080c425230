// Named ops: the one table of the forward pass's operations (issue 37), and the seam through which
// a backend reports each op's output rows.
//
// Every operation of the forward pass that writes a tensor has an OpDef: a name and the names of
// what it reads. An input is either an op name (`q_proj`), several alternatives of which the most
// recent one counts (`residual|embed|mtp_fc`: the first layer of a stage reads the embedding, the
// previous stage's last residual or the MTP head's projection), or a state item (`state:k`,
// `state:ssm_state`: what the op read from an earlier window). Resolution rule, shared by every
// reader (lockstep localize): an op input of the record at (window, position) is the most recent
// earlier record of that name with the same window and position; a state input is the most recent
// earlier state record of that name in the same window, stage and layer. Names are free-form
// strings, so another engine (llama.cpp's graph tensors `attn_norm-3`, issue 38) can report ops
// with OpDefs of its own; the table below is this engine's.
//
// Reporting (CPU backend): kernels call ReportOp / ReportState (engine/cpu/op_report.h), which
// cost one branch when no sink is installed. The engine installs its sink (OpSink) only for steps
// that have a request whose observer wants op records (Observer::WantsOps) or a `perturb-op`
// injection; the sink maps the step's rows to requests, digests each row and hands OpRecords to
// the request's observer. The CUDA backend reports none (engine/cuda/README.md).
//
// Rows: an op's output is reported as rows of the step's activation (one row per token; experts:
// one record per (token, rank) with `index` = the expert id), so a record is identified by
// (window, stage, layer, op, index, position) and by its place in execution order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>

namespace lockstep {

struct OpDef {
  const char* name;    // "q_proj"
  const char* inputs;  // comma-separated input names ("attn_norm"; "residual|embed"; "state:k")
  bool state = false;  // a state item as an op reads it (a record per (sequence, layer) read)
};

// This engine's ops, in table order (the order a layer runs them is the reporting order).
enum class OpId : std::uint8_t {
  kEmbed,
  kAttnNorm,
  kQProj,
  kKProj,
  kVProj,
  kQRope,  // q split from the gate, q-norm and RoPE (fused)
  kKRope,  // k-norm and RoPE (fused)
  kStateK,
  kStateV,
  kAttnOut,  // softmax(q k) v of every head, times the output gate (fused)
  kOProj,
  kInProj,    // GDN in_proj_qkvz
  kInProjBa,  // GDN in_proj_ba
  kStateConv,
  kStateSsm,
  kConv,    // causal conv + SiLU
  kGates,   // beta and the log decay per value head
  kL2Norm,  // l2-normalised q (scaled) and k
  kRecurrence,
  kGatedNorm,
  kOutProj,
  kAttnResidual,  // x + mixer output (the input of ffn_norm)
  kFfnNorm,
  kRouterLogits,
  kTopk,  // routing weights of the selected experts
  kExpertOut,
  kSharedExpert,
  kMoeCombine,
  kFfnOut,  // dense FFN layers
  kResidual,
  kFinalNorm,
  kLmHead,
  kMtpIn,  // MTP: [norm(embed(next)), norm(hidden)]
  kMtpFc,
  kMtpNorm,
  kMtpLmHead,
};
inline constexpr std::size_t kNumOps = 36;

const OpDef& GetOpDef(OpId op);
// Every op of the table, in table order.
std::span<const OpDef> OpTable();
// The op named `name` of the table; nullptr for anything else.
const OpDef* FindOpDef(std::string_view name);

// The 64-bit digest of a row's bytes: equal bytes give equal digests; a change of one 8-byte
// word always changes a lane's state, and the lanes are mixed with the length by SplitMix64 (a
// changed row keeps its digest with probability about 2^-64). Bitwise, not numeric: -0.0 and 0.0
// differ, as do NaN payloads.
std::uint64_t RowDigest(const void* data, std::size_t bytes);
// Continues a digest over more bytes (state items whose rows are not contiguous).
std::uint64_t RowDigestAppend(std::uint64_t h, const void* data, std::size_t bytes);
// The f64 L2 norm of n floats.
double RowL2(const float* x, std::size_t n);

// ---- the reporting seam (backend -> engine) ----

// Rows of one op's output in the step's activation: rows [row0, row0 + n_rows), `width` floats
// each, `stride` floats apart. `data` is writable: a `perturb-op` injection changes it in place
// before the consumers read it.
struct OpRows {
  const OpDef* def = nullptr;
  int stage = 0, layer = -1;  // layer: global index; n_layers for the MTP layer; -1 stage ops
  int index = -1;             // expert id (expert_out), else -1
  int row0 = 0, n_rows = 0;
  std::size_t width = 0, stride = 0;
  float* data = nullptr;
};

// A state item as one sequence's op reads it (the committed K/V rows [0, n_rows), a GDN
// checkpoint): `row0` is the sequence's first row in the step, `row(r)` the raw bytes of row r.
struct OpStateRead {
  const OpDef* def = nullptr;
  int stage = 0, layer = -1;
  int row0 = 0;
  int n_rows = 0;
  std::size_t row_bytes = 0;
  std::function<const void*(int)> row;
};

class OpSink {
 public:
  virtual ~OpSink() = default;
  virtual void OnOp(const OpRows& rows) = 0;
  virtual void OnStateRead(const OpStateRead& read) = 0;
};

// What an observer receives per row (Observer::OnOp): one output row of one op of its request,
// or one state read (state: row -1, data null).
struct OpRecord {
  const OpDef* def = nullptr;
  int window = -1;  // verify window; -1 prefill
  int stage = 0, layer = -1, index = -1;
  int position = 0;  // the row's absolute position (state reads: the sequence's first row's)
  int row = 0;       // row within the request's rows of this call; -1 for a state read
  std::uint64_t digest = 0;
  double l2 = 0.0;
  const float* data = nullptr;  // the row (width floats), valid during the call only
  std::size_t width = 0;
};

}  // namespace lockstep
