// State diff of two exports (DESIGN.md "compare/", seed issue "early state checks").
//
// Items are matched by their path inside a checkpoint of the same name ("00000_commit" +
// "stage0/layer3/k"); A is the reference. Masking: committed rows are compared as committed
// state; speculative rows (k_spec/v_spec) only against the speculative rows of a window with the
// same (p, T) on the other side, labelled "speculative"; paged tails are never in the file and
// never compared (capacity_rows is reported, not read). Missing on one side, shape or dtype
// mismatch: a failed item with the reason. A checkpoint present on one side only: its items are
// skipped with the reason. When the model or the request differ the state is not compared at
// all (every item skipped with that reason, and the diff fails).
//
// No vacuous pass: a diff that compared no item (no checkpoint in the selection, an export with
// no checkpoint, no window both sides exported, every item skipped), or that skipped more items
// than DiffOptions::max_skipped, sets DiffResult::vacuous and does not pass. Two exports of the
// same run (same run_id) are kInvalidArgument unless DiffOptions::allow_self.
//
// Metrics (metrics.h) are streamed over row blocks with float64 accumulation; items run in
// parallel; the bytes held at once stay below DiffOptions::mem_limit_bytes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lockstep/compare/export_reader.h"
#include "lockstep/compare/metrics.h"
#include "lockstep/engine/status.h"

namespace lockstep {

// Thresholds per item kind. Every kind is gated on NRMSE (int8 items on their dequantized
// values); logits are gated on KL as well. Defaults from the seed issue.
struct Thresholds {
  double nrmse_max = 2e-4;  // default for every kind
  double kl_max = 1e-5;     // logits: max over rows of KL(softmax(a) || softmax(b))
  std::map<std::string, double> nrmse_by_kind;  // overrides, e.g. {"logits", 1e-3}
  double NrmseFor(const std::string& kind) const;
  // Applies "kind=value" overrides, e.g. "ssm_state=1e-3" (kInvalidArgument for an unknown kind).
  Status SetKindOverride(std::string_view spec);
};

// Kinds the schema knows, in report order.
const std::vector<std::string>& ItemKinds();

enum class Verdict : std::uint8_t { kPass, kFail, kSkip };
const char* VerdictName(Verdict v);  // "pass" | "fail" | "skip"

// Why an item failed or was skipped, as a type: what readers outside compare/ (preflight, campaign
// gates) test instead of the words of `reason`, which is the sentence for people.
enum class ItemFailure : std::uint8_t {
  kNone,       // passed
  kSkipped,    // not compared (the checkpoint on one side only, a model or request mismatch)
  kMissing,    // present on one side only
  kKindDtype,  // kind or dtype differ
  kShape,      // shapes differ
  kScales,     // int8 scales on one side only
  kNonFinite,  // NaN or Inf in the data
  kNrmse,      // NRMSE above its threshold
  kKl,         // logits KL above its threshold
};
// True for the failures a metric was measured for (kNonFinite, kNrmse, kKl): the structural ones
// (missing, kind/dtype, shape, scales) carry no value.
constexpr bool IsMeasured(ItemFailure f) {
  return f == ItemFailure::kNonFinite || f == ItemFailure::kNrmse || f == ItemFailure::kKl;
}

struct ItemResult {
  std::string checkpoint;  // "00000_commit"
  int window = 0;
  std::string point;  // pre_verify | post_verify | commit
  std::string rel;    // "stage0/layer3/k"
  std::string kind;
  int stage = -1, layer = -1;
  std::string dtype;  // of A (or B when A lacks the item)
  std::string label;  // "committed" | "speculative" | "state" | "activations" | "logits" | "draft"
  Verdict verdict = Verdict::kPass;
  ItemFailure failure = ItemFailure::kNone;  // why it failed / was skipped, as a type
  std::string reason;     // why it failed / was skipped, as a sentence (empty on pass)
  std::int64_t rows = 0;  // rows compared
  std::int64_t capacity_rows = 0;
  std::uint64_t elements = 0;
  DiffStats stats;  // values (int8: dequantized) — nrmse, max_abs, n_diff, first_diff, non_finite
  std::uint64_t code_diff = 0;  // int8: codes that differ (exact comparison)
  std::int64_t first_code_diff = -1;
  bool has_kl = false;  // logits
  KlStats kl;
  double nrmse_max = 0.0;  // threshold applied
  double kl_max = 0.0;     // threshold applied (logits)
};

struct CheckpointSummary {
  std::string name;  // "00000_commit"
  int window = 0;
  std::string point;
  std::int64_t p = 0, T = 0;
  int compared = 0, passed = 0, failed = 0, skipped = 0;  // compared = passed + failed
  std::map<std::string, int> skip_reasons;                // reason -> count
};

struct DiffOptions {
  Thresholds thresholds;
  std::string points = "pre_verify,post_verify,commit";  // --points (ParseExportPoints syntax)
  std::string windows = "all";  // --windows: "all" | "0-2" | "0,3,5" (WindowSelection syntax)
  std::int64_t mem_limit_bytes = std::int64_t{1} << 30;
  int threads = 0;  // 0: hardware threads
  // Skipped items allowed before the diff fails (-1: any number). Arms that deliberately compare
  // different configs skip the checkpoints whose windows differ; everything else skips nothing.
  std::int64_t max_skipped = 0;
  bool allow_self = false;  // --allow-self: diff an export with itself (same run_id)
};

struct DiffResult {
  Thresholds thresholds;                        // as applied (printed by every report)
  std::vector<std::string> config_differences;  // "spec: 4 | 2" for each differing config key
  bool model_differs = false, request_differs = false;
  bool output_differs = false;                 // output token ids or stop reason
  std::vector<CheckpointSummary> checkpoints;  // in (window, point) order
  std::vector<ItemResult> items;               // in (window, point, stage, layer, kind) order
  int compared = 0, passed = 0, failed = 0, skipped = 0;
  std::uint64_t bytes_read = 0;  // both sides
  double seconds = 0.0;
  // Index into items of the first failing item in that order (-1: none).
  std::int64_t first_failure = -1;
  // Non-empty: why the comparison is vacuous ("nothing compared: the exports share no window",
  // "nothing compared: every item was skipped", "12 items skipped, more than --max-skipped 0").
  // A vacuous comparison is never a pass.
  std::string vacuous;
  bool Passed() const {
    return failed == 0 && !model_differs && !request_differs && vacuous.empty();
  }
};

// Why the result compared nothing or skipped too much ("" when it did not): the text of
// DiffResult::vacuous. `ma`/`mb` tell an empty export from an empty selection.
std::string VacuousReason(const DiffResult& d, const ExportMeta& ma, const ExportMeta& mb,
                          const DiffOptions& opts);

// "the models differ: model_sha256 1a2b3c4d5e6f | 9f8e7d6c5b4a", likewise for the request; the
// fingerprints that make two runs' state or paths not comparable (empty: none).
std::vector<std::string> IdentityDifferences(const ExportMeta& a, const ExportMeta& b);
// Keys of the two canonical configs whose values differ, as "key: A | B" (the model path and
// replay_path are not compared: two copies of one checkpoint are the same model).
std::vector<std::string> ConfigDifferences(const std::string& config_a,
                                           const std::string& config_b);
// What AlignResult::fingerprint_differences holds for two exports: IdentityDifferences, then,
// when `configs`, one "config: key: A | B" per differing key. Defined here, beside the checks it
// joins, so align.cpp stays free of export metadata (the trace fuzzer links it alone).
std::vector<std::string> FingerprintDifferences(const ExportMeta& a, const ExportMeta& b,
                                                bool configs = true);

Result<DiffResult> DiffExports(const ExportReader& a, const ExportReader& b,
                               const DiffOptions& opts);

}  // namespace lockstep
