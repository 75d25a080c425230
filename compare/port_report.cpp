// The port check's reports (port_check.h): the human text `lockstep diff` prints and the JSON
// (`lockstep.port` v1, compare/REPORTS.md "Port check").
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "lockstep/compare/port_check.h"

namespace lockstep {

namespace {

std::string E(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2e", v);
  return b;
}

std::string Th(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%g", v);
  return b;
}

// JSON has no inf / nan: written as strings (REPORTS.md "Unknown is not zero").
nlohmann::json Num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

std::string ProfileLine(const PortThresholds& t) {
  std::string s = "profile " + t.profile + ": logits NRMSE <= " + Th(t.logits_nrmse_max) +
                  ", KL <= " + Th(t.kl_max) + " per step; op NRMSE <= " + Th(t.op_nrmse_max) +
                  " per (op, layer); near-tie: top-2 gap < " + Th(t.near_tie_gap);
  for (const std::string& o : t.overridden) s += " [overridden: " + o + "]";
  return s;
}

// The op x layer table: one line per mapped op, one column per layer; stage ops in their own
// column. "." where the op has no cell in that layer (an attention-only op of a GDN layer).
void Table(const PortResult& r, std::string* out) {
  int layers = 0;
  std::set<std::string> seen;
  std::map<std::pair<std::string, int>, const PortCell*> at;
  for (const PortCell& c : r.cells) {
    layers = std::max(layers, c.layer + 1);
    seen.insert(c.ours);
    at[{c.ours, c.layer}] = &c;
  }
  std::vector<std::string> ops;  // in the map's order (a layer's execution order)
  for (const PortOpPair& p : PortOpMap())
    if (seen.count(p.ours) > 0) ops.push_back(p.ours);
  char b[64];
  *out += "per-layer op NRMSE (rows both engines dumped at the same window and position; * over " +
          Th(r.thresholds.op_nrmse_max) + "):\n";
  std::snprintf(b, sizeof(b), "  %-34s %9s", "op (llama.cpp / lockstep)", "stage");
  *out += b;
  for (int l = 0; l < layers; ++l) {
    std::snprintf(b, sizeof(b), " %9s", ("layer" + std::to_string(l)).c_str());
    *out += b;
  }
  *out += "\n";
  for (const std::string& op : ops) {
    std::string theirs;
    for (const PortOpPair& p : PortOpMap())
      if (op == p.ours) theirs = p.theirs;
    std::snprintf(b, sizeof(b), "  %-34s", (theirs + " / " + op).c_str());
    *out += b;
    for (int l = -1; l < layers; ++l) {
      const auto it = at.find({op, l});
      const std::string v =
          it == at.end() ? "." : E(it->second->nrmse) + (it->second->over ? "*" : " ");
      std::snprintf(b, sizeof(b), " %9s", v.c_str());
      *out += b;
    }
    *out += "\n";
  }
}

}  // namespace

std::string PortVerdictLine(const PortResult& r) {
  const std::string what =
      std::to_string(r.steps.size()) + " steps, " + std::to_string(r.cells.size()) + " op cells";
  if (!r.vacuous.empty()) return "FAIL: " + r.vacuous;
  if (r.Passed())
    return "PASS: " + what + " within " + r.thresholds.profile +
           (r.near_ties > 0 ? " (" + std::to_string(r.near_ties) + " named near-ties)" : "");
  std::string s = "FAIL: " + what + ": ";
  if (r.steps_failed > 0) s += std::to_string(r.steps_failed) + " steps failed";
  if (r.steps_failed > 0 && r.cells_over > 0) s += ", ";
  if (r.cells_over > 0)
    s += std::to_string(r.cells_over) + " op cells over " + Th(r.thresholds.op_nrmse_max) +
         "; the engines part at " +
         (r.first_layer_over >= 0 ? "layer " + std::to_string(r.first_layer_over)
                                  : std::string("a stage op")) +
         " (" + r.first_cell_over + ")";
  return s;
}

std::string PortText(const PortResult& r, const std::string& a_name, const std::string& b_name) {
  std::string o = "lockstep diff (port check): A = " + a_name + " (" + r.engine_a +
                  "), B = " + b_name + " (" + r.engine_b + "); A is the reference\n";
  o += ProfileLine(r.thresholds) + "\n";
  o += "model and request: identical (model_sha256, prompt token ids)\n";
  o += "steps: " + std::to_string(r.steps.size()) + " compared (A " + std::to_string(r.steps_a) +
       ", B " + std::to_string(r.steps_b) + "), greedy agrees in " +
       std::to_string(r.greedy_agree) + ", near-ties " + std::to_string(r.near_ties) + "\n";
  if (!r.steps_not_compared.empty()) o += "not compared: " + r.steps_not_compared + "\n";
  char b[200];
  std::snprintf(b, sizeof(b), "  %6s %6s %9s %9s %13s %9s %9s  %s\n", "window", "pos", "nrmse",
                "kl", "top1 A/B", "gap A", "gap B", "");
  o += b;
  for (const PortStep& s : r.steps) {
    const std::string top = std::to_string(s.top1_a) + "/" + std::to_string(s.top1_b);
    const std::string note = !s.passed  ? "FAIL: " + s.reason
                             : !s.agree ? "near-tie (top-2 gap " + E(s.gap_a) + ")"
                                        : "";
    std::snprintf(b, sizeof(b), "  %6d %6lld %9s %9s %13s %9s %9s  %s\n", s.window,
                  static_cast<long long>(s.position), E(s.nrmse).c_str(), E(s.kl).c_str(),
                  top.c_str(), E(s.gap_a).c_str(), E(s.gap_b).c_str(), note.c_str());
    o += b;
  }
  if (!r.ops_not_compared.empty()) {
    o += "op table: not compared: " + r.ops_not_compared + "\n";
  } else {
    Table(r, &o);
    o += "op cells: " + std::to_string(r.cells.size()) + " compared (dumped records: A " +
         std::to_string(r.dumped_a) + ", B " + std::to_string(r.dumped_b) +
         "; of ops the name map leaves out: " + std::to_string(r.unmapped) + ")\n";
    if (r.cells_over > 0)
      o += "first layer over " + Th(r.thresholds.op_nrmse_max) + ": " +
           (r.first_layer_over >= 0 ? std::to_string(r.first_layer_over) : std::string("stage")) +
           " (" + r.first_cell_over + ")\n";
    for (const PortCell& c : r.cells)
      if (c.over && !c.reason.empty() && c.reason.rfind("NRMSE", 0) != 0)
        o += "  " + c.theirs + " / " + c.ours + ": " + c.reason + "\n";
  }
  return o + PortVerdictLine(r) + "\n";
}

std::string PortJson(const PortResult& r, const std::string& a_name, const std::string& b_name) {
  using nlohmann::ordered_json;
  const PortThresholds& t = r.thresholds;
  ordered_json j;
  j["schema"] = "lockstep.port";
  j["schema_version"] = 1;
  j["verdict"] = r.Passed() ? "pass" : "fail";
  j["verdict_line"] = PortVerdictLine(r);
  j["exit_code"] = r.Passed() ? 0 : 1;
  j["a"] = {{"file", a_name}, {"engine", r.engine_a}};
  j["b"] = {{"file", b_name}, {"engine", r.engine_b}};
  j["thresholds"] = {{"profile", t.profile},
                     {"logits_nrmse_max", t.logits_nrmse_max},
                     {"kl_max", t.kl_max},
                     {"op_nrmse_max", t.op_nrmse_max},
                     {"near_tie_gap", t.near_tie_gap},
                     {"overridden", t.overridden}};
  ordered_json steps = ordered_json::array();
  for (const PortStep& s : r.steps)
    steps.push_back({{"window", s.window},
                     {"position", s.position},
                     {"nrmse", Num(s.nrmse)},
                     {"kl", Num(s.kl)},
                     {"top1_a", s.top1_a},
                     {"top1_b", s.top1_b},
                     {"gap_a", Num(s.gap_a)},
                     {"gap_b", Num(s.gap_b)},
                     {"agree", s.agree},
                     {"near_tie", s.near_tie},
                     {"passed", s.passed},
                     {"reason", s.reason}});
  j["steps"] = {{"compared", r.steps.size()},
                {"windows_a", r.steps_a},
                {"windows_b", r.steps_b},
                {"greedy_agree", r.greedy_agree},
                {"near_ties", r.near_ties},
                {"failed", r.steps_failed},
                {"first_disagreement", r.first_disagreement},
                {"not_compared", r.steps_not_compared},
                {"rows", std::move(steps)}};
  ordered_json cells = ordered_json::array();
  for (const PortCell& c : r.cells)
    cells.push_back({{"ours", c.ours},
                     {"theirs", c.theirs},
                     {"layer", c.layer},
                     {"rows", c.rows},
                     {"width", c.width},
                     {"nrmse", Num(c.nrmse)},
                     {"max_abs", Num(c.max_abs)},
                     {"worst_window", c.worst_window},
                     {"over", c.over},
                     {"reason", c.reason}});
  j["ops"] = {{"cells_compared", r.cells.size()},
              {"cells_over", r.cells_over},
              {"first_layer_over",
               r.first_layer_over == -2 ? ordered_json(nullptr) : ordered_json(r.first_layer_over)},
              {"first_cell_over", r.first_cell_over},
              {"dumped_a", r.dumped_a},
              {"dumped_b", r.dumped_b},
              {"unmapped", r.unmapped},
              {"not_compared", r.ops_not_compared},
              {"cells", std::move(cells)}};
  j["vacuous"] = r.vacuous;
  return j.dump(2) + "\n";
}

}  // namespace lockstep
