// Observer: how the engine hands its state to instrumentation without knowing about files.
//
// The generation loop calls the observer at three checkpoints of every verify window it wants
// (DESIGN.md, seed issue):
//   kPreVerify   before the verify: committed state at p, T rows about to run
//   kPostVerify  after the forward: main K/V holds the window's T speculative rows (kept apart as
//                k_spec/v_spec), the GDN checkpoint is still at p; hidden_out and logits of the T rows
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
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/engine/dtype.h"
#include "lockstep/engine/window.h"

namespace lockstep {

enum class CheckpointPoint : std::uint8_t { kPreVerify, kPostVerify, kCommit };
const char* CheckpointPointName(CheckpointPoint p);  // "pre_verify" | "post_verify" | "commit"

enum class ItemKind : std::uint8_t { kK, kV, kKSpec, kVSpec, kConvState, kSsmState, kMtpK, kMtpV, kHiddenOut, kLogits };
const char* ItemKindName(ItemKind k);  // "k", "v", "k_spec", "v_spec", "conv_state", ... as in the schema

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
};

}  // namespace lockstep
