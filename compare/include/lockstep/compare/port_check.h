// The port check (issue 38, item 4): `lockstep diff A.h5 B.h5` of two exports written by
// different engines (lockstep and llama.cpp, `generate --engine llama.cpp --export`) of the same
// request on the same GGUF. Not an A/A diff: the engines run other kernels, so nothing is
// bitwise, the state items differ in kind (llama.cpp exports no K/V or GDN state) and the A/A
// thresholds would fail every pair. What it compares instead:
//   - per step (verify window) the request's logits, row by position: NRMSE, KL(softmax(a) ||
//     softmax(b)), greedy agreement, and the top-2 gap of each side (a disagreement where A's gap
//     is under the profile's near-tie gap is a named near-tie, not a failure). Steps after the
//     first emitted token that differs are not compared (the requests differ from there on);
//   - where both exports carry op dumps (`--op-dump OPS@WINDOWS`) of ops that mean the same
//     thing (PortOpMap: llama.cpp graph tensor `attn_norm-3` <-> our `attn_norm` of layer 3), a
//     per-(op, layer) NRMSE table over the rows both dumped at the same (window, position), and
//     the first layer whose cells go over the profile's op threshold: where the engines part.
// Thresholds are the `cross_engine` profile (CrossEngineProfile), never the A/A defaults.
// Verdict (DESIGN.md's exit contract): pass (0) when every compared step and cell is within the
// profile and greedy agrees except at named near-ties; fail (1) otherwise, and when nothing was
// compared (no step, or dumps on one side only that map to nothing: never a pass). Different
// models (model_sha256) or prompt tokens are bad input: PortCheck returns kInvalidArgument
// (exit 2) naming the fingerprint.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/compare/export_reader.h"
#include "lockstep/engine/status.h"

namespace lockstep {

// The engine that wrote an export: its config's "engine" key ("llama.cpp"), "lockstep" without.
std::string ExportEngine(const ExportMeta& m);
// True when A and B were written by different engines (the port check applies).
bool IsCrossEngine(const ExportMeta& a, const ExportMeta& b);

// One entry of the name map: llama.cpp's graph tensor base name (the builder's cb() name; the
// tensor of layer L is `<theirs>-L`, layer-less ones have no suffix) and our op (op_table.h) of
// the same layer. Only ops whose rows hold the same values in the same layout are mapped
// (measured on the f32 tiny GGUF: every mapped row agrees to ~2e-6 NRMSE; port_check.cpp and
// compare/REPORTS.md "Port check" list the map and what was left out and why).
struct PortOpPair {
  const char* theirs;  // "attn_norm", "ffn_moe_logits", "result_norm"
  const char* ours;    // "attn_norm", "router_logits", "final_norm"
  bool per_layer;      // theirs carries the "-L" suffix; false: a stage op (our layer -1)
};
// The map in execution order of a layer (stage ops first / last where they run).
std::span<const PortOpPair> PortOpMap();
// The pairs of a llama.cpp record's name (`attn_norm-3` -> the pair for "attn_norm", layer 3;
// `attn_output-L` names two: o_proj and recurrence, one per layer type); empty: not mapped.
std::vector<const PortOpPair*> FindPortPairsTheirs(std::string_view name, int* layer);
// Our op's pair; nullptr when our op is not mapped.
const PortOpPair* FindPortPairOurs(std::string_view op);

// The cross-engine threshold profile.
struct PortThresholds {
  std::string profile = "cross_engine";
  double logits_nrmse_max = 0.0;  // per step
  double kl_max = 0.0;            // per step
  double op_nrmse_max = 0.0;      // per (op, layer) cell
  double near_tie_gap = 0.0;      // top-2 logit gap of A under which a greedy split is a near-tie
  std::vector<std::string> overridden;  // "--nrmse-max 1e-3" when a flag replaced a value
};
// f32 engines agree at the float floor (measured: logits ~1e-6, ops ~1e-7): the profile's bounds
// sit an order above it and well under the A/A defaults' 2e-4 / 1e-5.
PortThresholds CrossEngineProfile();

struct PortStep {
  int window = 0;
  std::int64_t position = 0;
  double nrmse = 0.0, kl = 0.0;
  std::int32_t top1_a = -1, top1_b = -1;
  double gap_a = 0.0, gap_b = 0.0;  // top-2 gaps
  bool agree = true, near_tie = false;
  bool passed = true;
  std::string reason;  // why it failed ("" on pass)
};

// One step's logits row of each side (A the reference): NRMSE, KL, top-1s, top-2 gaps and the
// verdict (a greedy disagreement passes only at a near-tie of A: gap_a < near_tie_gap).
PortStep ComparePortStep(int window, std::int64_t position, std::span<const float> a,
                         std::span<const float> b, const PortThresholds& th);

// One (op, layer) cell of the per-layer table.
struct PortCell {
  std::string ours, theirs;  // "attn_norm", "attn_norm-3"
  int layer = -1;            // -1: a stage op (embed / final_norm / lm_head)
  int order = 0;             // execution order (layer-major, the map's order within a layer)
  std::int64_t rows = 0;     // rows both dumped at the same (window, position)
  std::int64_t width = 0;
  double nrmse = 0.0, max_abs = 0.0;
  int worst_window = -1;  // the window of the row with the largest NRMSE
  bool over = false;      // nrmse > op_nrmse_max, or non-finite, or widths differ
  std::string reason;
};

struct PortResult {
  std::string engine_a, engine_b;
  PortThresholds thresholds;
  std::vector<PortStep> steps;  // compared steps, in window order
  int steps_a = 0, steps_b = 0;
  int greedy_agree = 0, near_ties = 0, steps_failed = 0;
  int first_disagreement = -1;              // window of the first greedy disagreement (-1: none)
  std::string steps_not_compared;           // why later steps were not compared ("" when all were)
  std::vector<PortCell> cells;              // in execution order
  std::int64_t dumped_a = 0, dumped_b = 0;  // dumped op records per side
  std::int64_t unmapped = 0;                // dumped records (either side) no pair maps
  int cells_over = 0;
  int first_layer_over = -2;     // the layer of the first cell over threshold (-2: none)
  std::string first_cell_over;   // "attn_norm-3 / attn_norm layer 3"
  std::string ops_not_compared;  // why the table is empty ("" when it is not)
  std::string vacuous;           // non-empty: nothing compared (never a pass)
  bool Passed() const { return vacuous.empty() && steps_failed == 0 && cells_over == 0; }
};

// One export is lockstep's, the other llama.cpp's (either order; A is the reference).
// kInvalidArgument (exit 2) when the models or the prompt tokens differ, or the engines are not
// one of each.
Result<PortResult> PortCheck(const ExportReader& a, const ExportReader& b,
                             const PortThresholds& th);

// The human report (what `lockstep diff` prints) and the JSON (`lockstep.port`, REPORTS.md).
std::string PortText(const PortResult& r, const std::string& a_name, const std::string& b_name);
std::string PortJson(const PortResult& r, const std::string& a_name, const std::string& b_name);
// The verdict line: "PASS: 12 steps, 54 op cells within cross_engine" / "FAIL: ...".
std::string PortVerdictLine(const PortResult& r);

}  // namespace lockstep
