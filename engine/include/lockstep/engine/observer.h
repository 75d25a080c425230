// Observer: how the engine hands its state to instrumentation without knowing about files.
//
// The generation loop calls the observer at three checkpoints of every verify window it wants
// (DESIGN.md, seed issue):
//   kPreVerify   before the verify: committed state at p, T rows about to run
//   kPostVerify  after the forward: main K/V holds the window's T speculative rows (kept apart as
//                k_spec/v_spec), the GDN checkpoint is still at p; hidden_out and logits of the T
//                rows
//   kCommit      after acceptance: committed rows and GDN checkpoint at the accepted position;
//                draft (MTP) K/V as it is before the next MTP write
// For each checkpoint: OnCheckpointBegin, one OnState per item, OnCheckpointEnd. Views are
// valid only during the OnState call (they point into live engine memory): an observer copies
// what it keeps. Unused paged tails are never part of a view; rows_capacity says how large the
// allocation is. The time the engine spends in these calls is recorded per window (export_ns).
//
// Items per stage session: k, v (committed rows) and k_spec, v_spec (post_verify only) of every
// full-attention layer; conv_state and ssm_state of every GDN layer; mtp k/v on the last stage
// (when the model has MTP); hidden_out (post_verify, every stage but the last) and logits
// (post_verify, last stage).
//
// Threading: every call comes from the thread that runs Generate() (decode/generate.cpp), one at
// a time and in order (WantsCheckpoint, then OnCheckpointBegin / OnState... / OnCheckpointEnd,
// then OnWindow after the window's commit): calls never overlap, and an observer used by one
// request needs no lock. The engine waits while a call runs, so an implementation may block (the
// exporter applies back-pressure when its queue is full: the time shows in export_ns) and may hand
// copies to threads of its own, but must not touch the engine or keep a view or its row/scales
// functions past OnState. WantsCheckpoint may be asked more than once per (window, point) and must
// give the same answer each time.
//
// Failures: the calls return nothing and cannot stop the request; generation goes on whatever an
// observer does. An observer that fails (a write error) keeps its first error and reports it
// through its own interface once the request is over: H5Exporter::Finish returns it, and
// `lockstep generate` prints the output tokens first and then exits with that Status's code
// (kIOError: exit 3; the partial export stays as FILE.partial). No exception may leave a call.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/dtype.h"
#include "lockstep/engine/op_table.h"
#include "lockstep/engine/step_record.h"
#include "lockstep/engine/window.h"

namespace lockstep {

// ---- names: the one spelling of each point and kind (export paths and attributes, the index,
// --points / --export-points, --nrmse-kind, --inject item=, reports). Each enum's order is the
// schema's order (checkpoints sort by point, items by kind in it); All*() iterates it. ----

enum class CheckpointPoint : std::uint8_t { kPreVerify, kPostVerify, kCommit };
inline constexpr std::size_t kNumCheckpointPoints = 3;
// "pre_verify" | "post_verify" | "commit"; "?" for a value outside the enum.
const char* CheckpointPointName(CheckpointPoint p);
// The point spelled `name` exactly (case-sensitive); nullopt for anything else.
std::optional<CheckpointPoint> ParseCheckpointPoint(std::string_view name);
// Every point in schema order.
constexpr std::array<CheckpointPoint, kNumCheckpointPoints> AllCheckpointPoints() {
  std::array<CheckpointPoint, kNumCheckpointPoints> a{};
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<CheckpointPoint>(i);
  return a;
}
// Every point's name in schema order (the default of --export-points and of a plan's points).
std::vector<std::string> AllCheckpointPointNames();

enum class ItemKind : std::uint8_t {
  kK,
  kV,
  kKSpec,
  kVSpec,
  kConvState,
  kSsmState,
  kMtpK,
  kMtpV,
  kHiddenOut,
  kLogits,
  // A sequence's whole state as another engine serialises it (llama.cpp's
  // llama_state_seq_get_data): opaque bytes (u8), compared bitwise.
  kSeqState
};
inline constexpr std::size_t kNumItemKinds = 11;
// "k", "v", "k_spec", "v_spec", "conv_state", "ssm_state", "mtp_k", "mtp_v", "hidden_out",
// "logits", "seq_state" (the schema's `kind` attribute); "?" for a value outside the enum.
const char* ItemKindName(ItemKind k);
// The kind spelled `name` exactly (case-sensitive); nullopt for anything else.
std::optional<ItemKind> ParseItemKind(std::string_view name);
// Every kind in schema order.
constexpr std::array<ItemKind, kNumItemKinds> AllItemKinds() {
  std::array<ItemKind, kNumItemKinds> a{};
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<ItemKind>(i);
  return a;
}
// Kinds of one layer (k, v, k_spec, v_spec of an attention layer; conv_state, ssm_state of a GDN
// layer): their StateView::layer is the global layer index; every other kind's is -1.
constexpr bool IsLayerItem(ItemKind k) { return k <= ItemKind::kSsmState; }
// The kinds `--inject perturb:...:item=I` accepts: k, v, conv_state, ssm_state, hidden_out, logits.
constexpr bool IsPerturbable(ItemKind k) {
  return k == ItemKind::kK || k == ItemKind::kV || k == ItemKind::kConvState ||
         k == ItemKind::kSsmState || k == ItemKind::kHiddenOut || k == ItemKind::kLogits;
}

struct CheckpointInfo {
  int window = 0;
  CheckpointPoint point = CheckpointPoint::kPreVerify;
  int p = 0;               // the window's first position
  int T = 1;               // rows of the window
  int committed_rows = 0;  // main K/V committed rows at this checkpoint
  int spec_rows = 0;       // main K/V speculative rows at this checkpoint
  int recurrent_pos = 0;   // GDN checkpoint position at this checkpoint
};

// A read-only view of one state item. Row items (K/V, hidden_out, logits) are addressed per row
// because paged storage is not contiguous: row(r) returns the raw bytes of row r (row_bytes,
// elements of `dtype`), and for int8 K/V scales(r) its f32 scales [n_heads_kv].
struct StateView {
  ItemKind kind = ItemKind::kK;
  int stage = 0;
  int layer = -1;  // global layer index; -1 for mtp, hidden_out and logits
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;  // outermost first, rows first for row items
  int rows = 0;                     // valid rows (row items); 1 for whole-tensor items
  int rows_capacity = 0;            // allocated rows (paged tail excluded from the view)
  std::size_t row_bytes = 0;
  std::function<const std::byte*(int row)> row;
  std::function<const float*(int row)> scales;  // int8 K/V only, else empty
};

class Observer {
 public:
  virtual ~Observer() = default;
  // Cheap filter, asked before any view is built.
  virtual bool WantsCheckpoint(int window, CheckpointPoint point) const = 0;
  virtual void OnCheckpointBegin(const CheckpointInfo& info) = 0;
  virtual void OnState(const CheckpointInfo& info, const StateView& view) = 0;
  virtual void OnCheckpointEnd(const CheckpointInfo& info) = 0;
  // After every window's commit (also for windows without checkpoints).
  virtual void OnWindow(const WindowRecord& rec) { (void)rec; }
  // After every engine step the observed request had rows in (its verify window or a prefill
  // chunk), with that step's record (step_record.h). Called by the scheduler.
  virtual void OnStep(const StepRecord& step) { (void)step; }
  // Op records (op_table.h), for an observer the engine was given as the request's op observer
  // (Engine::SetOpObserver): asked per forward call with the request's window (-1: prefill
  // chunks and their MTP rows); when true, OnOp is called for every output row of every named op
  // of the request in that call and for every state item an op reads, in execution order, from
  // the driver thread. `rec.data` is valid during the call only.
  virtual bool WantsOps(int window) const {
    (void)window;
    return false;
  }
  virtual void OnOp(const OpRecord& rec) { (void)rec; }
};

}  // namespace lockstep
