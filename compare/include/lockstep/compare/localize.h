// Localize: where two runs' difference is born, from their exports' op records (issue 37).
//
// Walks both exports' /ops/records in execution order. Every record before the first one that
// differs is bitwise equal in both runs, so the first differing record is classified by what it
// is and what it reads (op_table.h's input names, resolved as that header says):
//   kBorn     an op's output differs while every input it reads (op records and state reads, all
//             earlier in execution order) is bitwise equal: "same inputs, different output" (its
//             arithmetic depended on something outside the request: the rows beside it, the
//             thread split, a kernel choice). When an input is not among the records (a window
//             outside --op-digests), the birth is named with `inputs_unrecorded` listing them.
//   kCarried  the first difference is a state item as an op reads it (K/V rows, a GDN
//             checkpoint): no op of the digested windows made it; it came with the state, from
//             the window named (`origin_*`: the last window whose read of it was still equal, and
//             the injection that fired on it if the export records one).
//   kPath     the two runs ran different ops or rows (a different draft, window size, stop) with
//             every op output before it equal: the path differs without a numeric birth (a
//             timing- or policy-dependent knob), or the tokens an op consumes differ (embed).
//   kNoDifference  every record is equal and both runs have the same records (exit 0).
//   kNothing  no op records in one of the exports, or none in common (exit 2: never a pass).
// Per layer of the first differing window it gives the added divergence (the layer output's
// divergence minus its input's): NRMSE from dumped rows when both exports hold them (--op-dump),
// else the relative difference of the rows' L2 norms (a lower bound of the NRMSE, named so).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/compare/export_reader.h"

namespace lockstep {

enum class LocalizeVerdict { kNoDifference, kBorn, kCarried, kPath, kNothing };
// "no_difference" | "born" | "carried" | "path" | "nothing_comparable"
const char* LocalizeVerdictName(LocalizeVerdict v);

// One op record as localize names it.
struct OpSite {
  int window = -1, stage = 0, layer = -1, index = -1, position = 0, row = 0;
  std::string op;
  std::int64_t digest_a = 0, digest_b = 0;
  double l2_a = 0.0, l2_b = 0.0;
};

struct LocalizeInput {
  std::string name;  // as the op table spells it ("q_rope", "state:k", "residual|embed")
  bool recorded = false;
  OpSite site;  // the record it resolved to (recorded only)
};

struct LayerDivergence {
  int stage = 0, layer = -1;
  double in = 0.0, out = 0.0, added = 0.0;  // divergence of the layer's input / output rows
};

struct LocalizeResult {
  LocalizeVerdict verdict = LocalizeVerdict::kNothing;
  std::string why;            // one line: what the verdict rests on
  std::int64_t compared = 0;  // records compared bitwise (equal ones and the first differing)
  std::int64_t records_a = 0, records_b = 0;
  OpSite first;                       // kBorn / kCarried / kPath: the first differing record (A's)
  OpSite first_b;                     // kPath: B's record at that place (when it has one)
  std::vector<LocalizeInput> inputs;  // kBorn: what the op reads
  std::vector<std::string> inputs_unrecorded;  // kBorn: inputs with no record
  std::string kind;  // "same inputs, different output" | "carried" | "path" | ...
  // From dumps of the first differing row (both exports): has_dump, NRMSE, max |a - b|, the
  // first element that differs and its values.
  bool has_dump = false;
  double nrmse = 0.0, max_abs = 0.0;
  std::int64_t first_element = -1;
  double element_a = 0.0, element_b = 0.0;
  // kCarried: the state item and where it came from.
  std::string item;              // "stage1/layer7/ssm_state"
  int origin_window_equal = -2;  // last window whose read of the item was equal (-2: none seen)
  std::string origin_injection;  // the --inject text that fired on it, if the export says so
  // Who shared the step of the first differing window (both runs; -1 unknown).
  int step_rows_a = -1, step_seqs_a = -1, step_rows_b = -1, step_seqs_b = -1;
  // Per layer of the first differing window (execution order).
  std::string divergence_metric;  // "nrmse (dumps)" | "l2-norm relative difference"
  std::vector<LayerDivergence> layers;
};

// Localises the difference between two exports' op records. Pure function of the metas.
LocalizeResult Localize(const ExportMeta& a, const ExportMeta& b);

// The exit code of a result: 0 no difference (with records compared), 1 a difference, 2 nothing
// comparable.
int LocalizeExitCode(const LocalizeResult& r);

// The verdict line: "born at window 26, stage 1, layer 19, moe_combine, row 3 (same inputs,
// different output)" and the like.
std::string LocalizeVerdictLine(const LocalizeResult& r);
// The result as one JSON object (lockstep.localize v1), Markdown and a whole HTML page, verdict
// first. `a_name` / `b_name`: the files as given.
std::string LocalizeJson(const LocalizeResult& r, const std::string& a_name,
                         const std::string& b_name);
std::string LocalizeMarkdown(const LocalizeResult& r, const std::string& a_name,
                             const std::string& b_name);
std::string LocalizeHtml(const LocalizeResult& r, const std::string& a_name,
                         const std::string& b_name);

}  // namespace lockstep
