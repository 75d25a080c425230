// State transplant (issue 37, item 5): a run takes one state item's value from another run's
// export at one checkpoint, `--graft FROM.h5:ITEM@WINDOW:CHECKPOINT` (`lockstep generate`).
//
// The harness reads the value out of FROM (harness/include/lockstep/harness/graft_spec.h: it
// checks the item, the window, the shapes and FROM's fingerprints) and hands the engine a Graft
// holding the raw rows; the engine installs them in the current slot (Engine::SetGrafts). When
// the run reaches that checkpoint of that window, before any observer sees it, the item's value
// is replaced (Engine::ApplyGrafts, called by the generation loop at pre_verify, post_verify and
// commit): what the export records there is the grafted value, and everything computed after it
// reads it. The seam is the one `perturb` injections use (inject.h), on the committed state:
//   k, v            committed K/V rows [0, rows) of a full-attention layer (rows must equal this
//                   run's committed rows at that point), stored elements as the export holds them
//   conv_state,     the GDN checkpoint of a GDN layer (at post_verify the window's steps are
//   ssm_state       already computed from the old one: commit then installs those steps)
//   mtp_k, mtp_v    the draft (MTP) K/V rows [0, rows) of the last stage
// Transient items (k_spec, v_spec, hidden_out, logits) are not state and cannot be grafted.
//
// Every graft accounts for itself like an injection: fired or not, where (GraftRecordJson, one
// more object of the export's /injections, kind "graft"); one that never fired is an error after
// the run (CheckGraftsFired), once every output is written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/engine/dtype.h"
#include "lockstep/engine/observer.h"
#include "lockstep/engine/status.h"

namespace lockstep {

// ItemKinds a graft may target (the persistent state): k, v, conv_state, ssm_state, mtp_k, mtp_v.
constexpr bool IsGraftable(ItemKind k) {
  return k == ItemKind::kK || k == ItemKind::kV || k == ItemKind::kConvState ||
         k == ItemKind::kSsmState || k == ItemKind::kMtpK || k == ItemKind::kMtpV;
}

struct Graft {
  std::string text;  // --graft as given
  std::string from;  // FROM.h5
  std::string rel;   // the item as `lockstep diff` names it: "stage1/layer7/ssm_state"
  ItemKind item = ItemKind::kK;
  int stage = 0;
  int layer = -1;  // global layer (-1: mtp_k / mtp_v)
  int window = 0;
  CheckpointPoint point = CheckpointPoint::kCommit;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;  // FROM's dataset dims, rows first
  std::int64_t rows = 0;            // shape[0]
  std::size_t row_bytes = 0;        // stored bytes of one row
  std::vector<std::byte> data;      // rows x row_bytes, FROM's stored elements
  std::vector<float> scales;        // int8 K/V: f32 [rows, n_heads_kv]; else empty
};

// One time a graft took effect: window, stage, layer, point, and the rows it wrote.
struct GraftFiring {
  int window = -1, stage = -1, layer = -1;
  CheckpointPoint point = CheckpointPoint::kCommit;
  std::int64_t rows = 0;
};
struct GraftRecord {
  std::int64_t count = 0;
  std::vector<GraftFiring> firings;  // every firing (a graft fires at most once per run)
};

// The record as one JSON object of /injections (instrument/SCHEMA.md): text, kind "graft", from,
// item (the rel path), stage, layer (null: mtp), window, point, fired, count, firings.
std::string GraftRecordJson(const Graft& g, const GraftRecord& rec);

// kInvalidArgument naming every graft that never fired (the run of `windows` verify windows
// stopped for `stop_reason` before that window); Ok when all fired.
Status CheckGraftsFired(const std::vector<Graft>& grafts, const std::vector<GraftRecord>& records,
                        int windows, const std::string& stop_reason);

}  // namespace lockstep
