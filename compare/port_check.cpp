// The port check (port_check.h): the llama.cpp <-> lockstep op name map, the threshold profile,
// and the per-step / per-(op, layer) comparison of two exports of different engines.
#include "lockstep/compare/port_check.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "lockstep/compare/metrics.h"

namespace lockstep {

namespace {

// The name map: one place (documented in compare/REPORTS.md "Port check"). Each pair was checked
// by measurement on the f32 tiny GGUF (every dumped row of the prefill and a decode window, both
// engines, compared with every same-width tensor of the other at the same layer and position):
// the mapped pairs agree to ~2e-6 NRMSE per row at most (per cell <= ~5e-6, growing with depth).
// llama.cpp names both mixers' outputs `attn_output-L`: the full-attention projection (our o_proj)
// and the Gated DeltaNet recurrence (our recurrence); a layer holds only one of the two, so the
// name maps to both and each matches where our op ran. Left out, with the reason:
//   Kcur / Vcur               each names two tensors of one layer (before and after the reshape /
//                             RoPE): rows cannot be told apart by name;
//   Kcur_normed, Qcur_normed  normed but not rotated: our k_rope / q_rope fuse the norm and RoPE;
//   linear_attn_qkv_mixed, z  llama.cpp's GDN input projection is regrouped (all q, all k, all v;
//                             all z apart); ours (in_proj) is per key head [q, k, v, z];
//   ffn_moe_* of experts      per (token, expert slot), in llama.cpp's slot order;
//   ffn_moe_out               the routed experts only (our moe_combine adds the shared expert);
//   h_nextn                   the final norm of every row, renamed result_norm where the call
//                             keeps them all (result_norm is mapped).
constexpr int kBefore = -1, kLayer = 0, kAfter = 1;
constexpr std::array<PortOpPair, 20> kPairs = {{
    {"model.embed_tokens", "embed", false},
    {"attn_norm", "attn_norm", true},
    {"Qcur_full", "q_proj", true},
    {"Qcur", "q_rope", true},
    {"attn_gated", "attn_out", true},
    {"attn_output", "o_proj", true},
    {"linear_attn_mixed_ba", "in_proj_ba", true},
    {"conv_output_silu", "conv", true},
    {"attn_output", "recurrence", true},
    {"final_output", "gated_norm", true},
    {"linear_attn_out", "out_proj", true},
    {"attn_residual", "attn_residual", true},
    {"attn_post_norm", "ffn_norm", true},
    {"ffn_moe_logits", "router_logits", true},
    {"ffn_moe_weights_norm", "topk", true},
    {"ffn_shexp", "shared_expert", true},
    {"ffn_out", "moe_combine", true},
    {"l_out", "residual", true},
    {"result_norm", "final_norm", false},
    {"result_output", "lm_head", false},
}};
std::size_t IndexOf(const PortOpPair* p) { return static_cast<std::size_t>(p - kPairs.data()); }

// "attn_norm-3" -> ("attn_norm", 3); no numeric suffix: (name, -1).
std::pair<std::string_view, int> SplitLayer(std::string_view s) {
  const auto d = s.rfind('-');
  if (d == std::string_view::npos || d + 1 >= s.size() || s.size() - d > 6) return {s, -1};
  int v = 0;
  for (std::size_t i = d + 1; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return {s, -1};
    v = v * 10 + (s[i] - '0');
  }
  return {s.substr(0, d), v};
}

// The top value's index (lowest on ties) and the gap to the second largest.
std::pair<std::int32_t, double> Top1AndGap(std::span<const float> v) {
  if (v.empty()) return {-1, 0.0};
  std::int32_t best = 0;
  for (std::size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[static_cast<std::size_t>(best)]) best = static_cast<std::int32_t>(i);
  double second = -INFINITY;
  for (std::size_t i = 0; i < v.size(); ++i)
    if (static_cast<std::int32_t>(i) != best) second = std::max(second, static_cast<double>(v[i]));
  return {best, static_cast<double>(v[static_cast<std::size_t>(best)]) - second};
}

// The request's logits rows of each window's post_verify checkpoint, by (window, position).
using StepRows = std::map<std::pair<int, std::int64_t>, std::vector<float>>;
Result<StepRows> LogitsRows(const ExportReader& x) {
  StepRows out;
  for (const ExportCheckpoint& cp : x.meta().checkpoints) {
    if (cp.point != CheckpointPoint::kPostVerify) continue;
    for (const ExportItem& it : cp.items) {
      if (it.kind != ItemKind::kLogits || it.dtype != DType::kF32) continue;
      // The last valid row is the window's own next-token row (T = 1 without speculation: the
      // only one), at position p + rows - 1.
      const std::int64_t r = it.rows() - 1;
      if (r < 0) continue;
      std::vector<float> row(static_cast<std::size_t>(it.row_elems()));
      LOCKSTEP_RETURN_IF_ERROR(x.ReadRows(cp, it, r, 1, row.data()));
      out[{cp.window, cp.p + r}] = std::move(row);
    }
  }
  return out;
}

// A dumped op row of either side, keyed by (pair, layer, window, position).
using CellKey = std::tuple<std::size_t, int, int, std::int32_t>;
struct DumpedRow {
  const float* data;
  std::int64_t width;
};

// The mapped dumped rows of one export; `llama`: the names are llama.cpp's graph tensors.
struct Mapped {
  std::map<CellKey, DumpedRow> rows;
  std::set<CellKey> twice;  // keys a name was reported at more than once (rows ambiguous)
};
Mapped MappedRows(const ExportMeta& m, bool llama, std::int64_t* dumped, std::int64_t* unmapped) {
  Mapped out;
  for (const ExportOpRecord& rec : m.op_records) {
    if (rec.dump_offset < 0 || rec.op < 0 || static_cast<std::size_t>(rec.op) >= m.op_table.size())
      continue;
    // A zero-width record holds no row (llama.cpp's output tensors in a call without outputs).
    if (rec.dump_len <= 0 ||
        rec.dump_offset + rec.dump_len > static_cast<std::int64_t>(m.op_dump.size()))
      continue;
    ++*dumped;
    const std::string& name = m.op_table[static_cast<std::size_t>(rec.op)].name;
    int layer = rec.layer;
    std::vector<const PortOpPair*> pairs;
    if (llama) {
      pairs = FindPortPairsTheirs(name, &layer);
    } else if (const PortOpPair* p = FindPortPairOurs(name)) {
      pairs.push_back(p);
    }
    if (rec.index >= 0) pairs.clear();  // experts: per (token, rank), not mapped
    bool mapped = false;
    for (const PortOpPair* p : pairs) {
      if (p->per_layer != (layer >= 0)) continue;
      mapped = true;
      const CellKey key{IndexOf(p), p->per_layer ? layer : -1, rec.window, rec.position};
      if (!out.rows.emplace(key, DumpedRow{m.op_dump.data() + rec.dump_offset, rec.dump_len})
               .second)
        out.twice.insert(key);
    }
    if (!mapped) ++*unmapped;
  }
  return out;
}

std::string Fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1e", v);
  return b;
}

void CompareSteps(const StepRows& ra, const StepRows& rb, const ExportMeta& ma,
                  const ExportMeta& mb, PortResult* r) {
  const PortThresholds& th = r->thresholds;
  std::map<int, int> windows_a, windows_b;
  for (const auto& [k, v] : ra) windows_a[k.first]++;
  for (const auto& [k, v] : rb) windows_b[k.first]++;
  r->steps_a = static_cast<int>(windows_a.size());
  r->steps_b = static_cast<int>(windows_b.size());
  for (const auto& [key, a] : ra) {
    const auto it = rb.find(key);
    if (it == rb.end()) continue;
    const int w = key.first;
    // Window w consumed the tokens emitted before it: equal on both sides, or not the same
    // request any more.
    const auto n = static_cast<std::size_t>(std::max(w, 0));
    if (n > ma.output_tokens.size() || n > mb.output_tokens.size() ||
        !std::equal(ma.output_tokens.begin(), ma.output_tokens.begin() + static_cast<long>(n),
                    mb.output_tokens.begin())) {
      if (r->steps_not_compared.empty())
        r->steps_not_compared = "steps from window " + std::to_string(w) +
                                " on: the emitted tokens before them differ (the requests part)";
      continue;
    }
    PortStep s = ComparePortStep(w, key.second, a, it->second, th);
    if (s.agree) ++r->greedy_agree;
    if (!s.agree && s.near_tie) ++r->near_ties;
    if (!s.agree && r->first_disagreement < 0) r->first_disagreement = w;
    if (!s.passed) ++r->steps_failed;
    r->steps.push_back(std::move(s));
  }
}

void CompareCells(const ExportMeta& ma, const ExportMeta& mb, bool llama_a, PortResult* r) {
  const auto rows_a = MappedRows(ma, llama_a, &r->dumped_a, &r->unmapped);
  const auto rows_b = MappedRows(mb, !llama_a, &r->dumped_b, &r->unmapped);
  if (r->dumped_a == 0 || r->dumped_b == 0) {
    r->ops_not_compared = std::string("no op dumps (--op-dump OPS@WINDOWS) in ") +
                          (r->dumped_a == 0 && r->dumped_b == 0 ? "either export"
                           : r->dumped_a == 0                   ? "A"
                                                                : "B");
    return;
  }
  struct Acc {
    F32Accumulator acc;
    std::int64_t rows = 0, width = 0;
    double worst = -1.0;
    int worst_window = -1;
    std::string reason;
  };
  std::map<std::pair<std::size_t, int>, Acc> cells;  // (pair, layer)
  for (const auto& [key, a] : rows_a.rows) {
    const auto it = rows_b.rows.find(key);
    if (it == rows_b.rows.end()) continue;
    const DumpedRow& b = it->second;
    Acc& c = cells[{std::get<0>(key), std::get<1>(key)}];
    if (rows_a.twice.count(key) > 0 || rows_b.twice.count(key) > 0) {
      c.reason = "the name is reported twice at one window and position: rows not matched";
      ++c.rows;
      continue;
    }
    if (a.width != b.width) {
      c.reason = "widths differ (" + std::to_string(a.width) + " vs " + std::to_string(b.width) +
                 "): not the same values";
      c.width = a.width;
      ++c.rows;
      continue;
    }
    c.width = a.width;
    c.acc.Add(a.data, b.data, static_cast<std::size_t>(a.width));
    const DiffStats one = CompareF32(a.data, b.data, static_cast<std::size_t>(a.width));
    if (!(one.nrmse <= c.worst)) c.worst = one.nrmse, c.worst_window = std::get<2>(key);
    ++c.rows;
  }
  int max_layer = 0;
  for (const auto& [k, c] : cells) max_layer = std::max(max_layer, k.second + 1);
  for (auto& [k, c] : cells) {
    PortCell cell;
    const PortOpPair& p = kPairs[k.first];
    cell.ours = p.ours;
    cell.layer = k.second;
    cell.theirs = p.per_layer ? std::string(p.theirs) + "-" + std::to_string(k.second) : p.theirs;
    // embed (the map's first pair) runs before the layers, the other stage ops after them.
    const int where = p.per_layer ? kLayer : k.first == 0 ? kBefore : kAfter;
    const int slot = where == kBefore ? 0 : where == kAfter ? max_layer + 1 : k.second + 1;
    cell.order = slot * static_cast<int>(kPairs.size()) + static_cast<int>(k.first);
    cell.rows = c.rows;
    cell.width = c.width;
    cell.worst_window = c.worst_window;
    const DiffStats d = c.acc.Finish();
    cell.nrmse = d.nrmse;
    cell.max_abs = d.max_abs;
    if (!c.reason.empty()) {
      cell.over = true, cell.reason = c.reason;
    } else if (d.non_finite) {
      cell.over = true, cell.reason = "NaN or Inf in the rows";
    } else if (!(d.nrmse <= r->thresholds.op_nrmse_max)) {
      cell.over = true,
      cell.reason = "NRMSE " + Fmt(d.nrmse) + " > " + Fmt(r->thresholds.op_nrmse_max);
    }
    r->cells.push_back(std::move(cell));
  }
  std::sort(r->cells.begin(), r->cells.end(),
            [](const PortCell& x, const PortCell& y) { return x.order < y.order; });
  for (const PortCell& c : r->cells) {
    if (!c.over) continue;
    if (r->cells_over++ == 0) {
      r->first_layer_over = c.layer;
      r->first_cell_over =
          c.theirs + " / " + c.ours + (c.layer >= 0 ? " layer " + std::to_string(c.layer) : "");
    }
  }
  if (r->cells.empty())
    r->ops_not_compared =
        "both exports dump ops, but no mapped op at a (layer, window, "
        "position) both dumped";
}

std::string Sha12(const std::string& s) { return s.substr(0, std::min<std::size_t>(12, s.size())); }

}  // namespace

PortStep ComparePortStep(int window, std::int64_t position, std::span<const float> a,
                         std::span<const float> b, const PortThresholds& th) {
  PortStep s;
  s.window = window;
  s.position = position;
  if (a.size() != b.size() || a.empty()) {
    s.passed = s.agree = false;
    s.reason = "no logits to compare (" + std::to_string(a.size()) + " vs " +
               std::to_string(b.size()) + " values: the vocabularies differ)";
    return s;
  }
  const DiffStats d = CompareF32(a.data(), b.data(), a.size());
  const KlStats kl = CompareLogits(a.data(), b.data(), 1, a.size());
  s.nrmse = d.nrmse;
  s.kl = kl.kl_max;
  std::tie(s.top1_a, s.gap_a) = Top1AndGap(a);
  std::tie(s.top1_b, s.gap_b) = Top1AndGap(b);
  s.agree = s.top1_a == s.top1_b;
  s.near_tie = s.gap_a < th.near_tie_gap;
  if (d.non_finite || kl.non_finite) {
    s.passed = false, s.reason = "NaN or Inf in the logits";
  } else if (!(s.nrmse <= th.logits_nrmse_max)) {
    s.passed = false, s.reason = "logits NRMSE " + Fmt(s.nrmse) + " > " + Fmt(th.logits_nrmse_max);
  } else if (!(s.kl <= th.kl_max)) {
    s.passed = false, s.reason = "KL " + Fmt(s.kl) + " > " + Fmt(th.kl_max);
  } else if (!s.agree && !s.near_tie) {
    s.passed = false, s.reason = "greedy tokens differ (" + std::to_string(s.top1_a) + " vs " +
                                 std::to_string(s.top1_b) + ") with a top-2 gap of " +
                                 Fmt(s.gap_a) + ", not a near-tie";
  }
  return s;
}

std::span<const PortOpPair> PortOpMap() { return kPairs; }

std::vector<const PortOpPair*> FindPortPairsTheirs(std::string_view name, int* layer) {
  const auto [base, l] = SplitLayer(name);
  std::vector<const PortOpPair*> out;
  *layer = -1;
  for (const PortOpPair& p : kPairs) {
    if (p.per_layer ? l >= 0 && base == p.theirs : name == p.theirs) {
      if (p.per_layer) *layer = l;
      out.push_back(&p);
    }
  }
  return out;
}

const PortOpPair* FindPortPairOurs(std::string_view op) {
  for (const PortOpPair& p : kPairs)
    if (op == p.ours) return &p;
  return nullptr;
}

PortThresholds CrossEngineProfile() {
  PortThresholds t;
  t.profile = "cross_engine";
  t.logits_nrmse_max = 1e-5;
  t.kl_max = 1e-7;
  t.op_nrmse_max = 1e-5;
  t.near_tie_gap = 1e-2;
  return t;
}

std::string ExportEngine(const ExportMeta& m) {
  const nlohmann::json j = nlohmann::json::parse(m.config_json, nullptr, false);
  if (j.is_object()) {
    const auto it = j.find("engine");
    if (it != j.end() && it->is_string()) return it->get<std::string>();
  }
  return "lockstep";
}

bool IsCrossEngine(const ExportMeta& a, const ExportMeta& b) {
  return ExportEngine(a) != ExportEngine(b);
}

Result<PortResult> PortCheck(const ExportReader& a, const ExportReader& b,
                             const PortThresholds& th) {
  const ExportMeta& ma = a.meta();
  const ExportMeta& mb = b.meta();
  PortResult r;
  r.thresholds = th;
  r.engine_a = ExportEngine(ma);
  r.engine_b = ExportEngine(mb);
  const bool llama_a = r.engine_a == "llama.cpp", llama_b = r.engine_b == "llama.cpp";
  if (llama_a == llama_b || (r.engine_a != "lockstep" && r.engine_b != "lockstep"))
    return Status::InvalidArgument(
        "diff", "the port check compares a lockstep export with a llama.cpp one; A is " +
                    r.engine_a + ", B is " + r.engine_b);
  if (ma.model_sha256.empty() || ma.model_sha256 != mb.model_sha256)
    return Status::InvalidArgument(
        "diff", "the exports are of different models (model_sha256 " + Sha12(ma.model_sha256) +
                    " | " + Sha12(mb.model_sha256) +
                    "): the port check compares both engines on the same GGUF");
  if (ma.request_tokens != mb.request_tokens)
    return Status::InvalidArgument(
        "diff", "the exports are of different requests (prompt token ids differ, " +
                    std::to_string(ma.request_tokens.size()) + " vs " +
                    std::to_string(mb.request_tokens.size()) +
                    " tokens): the port check compares one request on both engines");
  LOCKSTEP_ASSIGN_OR_RETURN(StepRows ra, LogitsRows(a));
  LOCKSTEP_ASSIGN_OR_RETURN(StepRows rb, LogitsRows(b));
  CompareSteps(ra, rb, ma, mb, &r);
  CompareCells(ma, mb, llama_a, &r);
  if (r.steps.empty())
    r.vacuous =
        "nothing compared: no post_verify logits of a window both exports hold "
        "(--export-windows / --export-points post_verify on both runs)";
  else if (r.dumped_a > 0 && r.dumped_b > 0 && r.cells.empty())
    r.vacuous = "nothing compared in the op table: " + r.ops_not_compared;
  return r;
}

}  // namespace lockstep
