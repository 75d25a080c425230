#include "lockstep/harness/graft_spec.h"

#include <charconv>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "lockstep/compare/export_reader.h"
#include "lockstep/compare/state_diff.h"

namespace lockstep {

namespace {

// The config keys a graft's FROM may differ in: its own faults and where the model lies.
std::string WithoutRunKnobs(const std::string& config_json) {
  nlohmann::json j = nlohmann::json::parse(config_json, nullptr, false);
  if (!j.is_object()) return config_json;
  j.erase("inject");
  return j.dump();
}

std::string WindowsHeld(const ExportMeta& m, CheckpointPoint point) {
  std::string list;
  int n = 0;
  for (const ExportCheckpoint& cp : m.checkpoints) {
    if (cp.point != point) continue;
    if (++n <= 12) list += (list.empty() ? "" : ", ") + std::to_string(cp.window);
  }
  if (n > 12) list += ", ... (" + std::to_string(n) + ")";
  return list.empty() ? "none" : list;
}

Result<Graft> ReadGraft(const GraftSpec& s, const ExportReader& r) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("--graft '" + s.text + "'", why);
  };
  const ExportMeta& m = r.meta();
  const ExportCheckpoint* cp = nullptr;
  for (const ExportCheckpoint& c : m.checkpoints)
    if (c.window == s.window && c.point == s.point) cp = &c;
  if (cp == nullptr)
    return bad("window " + std::to_string(s.window) + " " + CheckpointPointName(s.point) +
               " is absent from " + s.from + " (it holds " + CheckpointPointName(s.point) +
               " of windows " + WindowsHeld(m, s.point) +
               "; export it with --export-windows / --export-points)");
  const ExportItem* item = nullptr;
  for (const ExportItem& it : cp->items)
    if (it.rel == s.rel) item = &it;
  if (item == nullptr) {
    std::string names;
    int n = 0;
    for (const ExportItem& it : cp->items)
      if (IsGraftable(it.kind) && ++n <= 6) names += (names.empty() ? "" : ", ") + it.rel;
    return bad("unknown item '" + s.rel + "': " + s.from + " holds no such item at " + cp->name +
               " (items are named as `lockstep diff` names them, e.g. " + names + ")");
  }
  if (!IsGraftable(item->kind))
    return bad("item '" + s.rel + "' (" + ItemKindName(item->kind) +
               ") is not state: only k, v, conv_state, ssm_state and mtp k / v can be grafted");
  Graft g;
  g.text = s.text;
  g.from = s.from;
  g.rel = s.rel;
  g.item = item->kind;
  g.stage = item->stage;
  g.layer = item->layer;
  g.window = s.window;
  g.point = s.point;
  g.dtype = item->dtype;
  g.shape = item->shape;
  g.rows = item->rows();
  g.row_bytes = static_cast<std::size_t>(item->row_elems()) * item->elem_bytes();
  g.data.resize(static_cast<std::size_t>(g.rows) * g.row_bytes);
  if (g.rows > 0) LOCKSTEP_RETURN_IF_ERROR(r.ReadRows(*cp, *item, 0, g.rows, g.data.data()));
  if (item->has_scales && g.rows > 0) {
    g.scales.resize(static_cast<std::size_t>(g.rows * item->scale_row_elems));
    LOCKSTEP_RETURN_IF_ERROR(r.ReadScaleRows(*cp, *item, 0, g.rows, g.scales.data()));
  }
  return g;
}

}  // namespace

Result<GraftSpec> ParseGraftSpec(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("--graft '" + text + "'",
                                   why +
                                       " (expected FROM.h5:ITEM@WINDOW:CHECKPOINT, e.g. "
                                       "a.h5:stage1/layer7/ssm_state@12:commit)");
  };
  GraftSpec s;
  s.text = text;
  const std::size_t c2 = text.rfind(':');
  if (c2 == std::string::npos) return bad("no ':CHECKPOINT'");
  const std::optional<CheckpointPoint> point = ParseCheckpointPoint(text.substr(c2 + 1));
  if (!point)
    return bad("checkpoint '" + text.substr(c2 + 1) +
               "' is not one of pre_verify, post_verify, commit");
  s.point = *point;
  const std::string head = text.substr(0, c2);
  const std::size_t at = head.rfind('@');
  if (at == std::string::npos) return bad("no '@WINDOW'");
  const std::string w = head.substr(at + 1);
  auto [ptr, ec] = std::from_chars(w.data(), w.data() + w.size(), s.window);
  if (w.empty() || ec != std::errc() || ptr != w.data() + w.size() || s.window < 0)
    return bad("window '" + w + "' is not an integer >= 0");
  const std::string lhs = head.substr(0, at);
  const std::size_t c1 = lhs.rfind(':');
  if (c1 == std::string::npos || c1 == 0 || c1 + 1 == lhs.size()) return bad("no 'FROM.h5:ITEM'");
  s.from = lhs.substr(0, c1);
  s.rel = lhs.substr(c1 + 1);
  return s;
}

Result<std::vector<Graft>> LoadGrafts(const std::vector<std::string>& specs,
                                      const std::string& config_json,
                                      const std::string& model_sha256) {
  std::vector<Graft> out;
  std::map<std::string, std::unique_ptr<ExportReader>> open;
  for (const std::string& text : specs) {
    LOCKSTEP_ASSIGN_OR_RETURN(GraftSpec s, ParseGraftSpec(text));
    auto it = open.find(s.from);
    if (it == open.end()) {
      ReaderLimits lim;
      lim.isolate = false;  // a file the user names for this run, read in process
      auto r = ExportReader::Open(s.from, lim);
      if (!r.ok())
        return Status::InvalidArgument("--graft '" + text + "'",
                                       "FROM is not a readable export: " + r.status().ToString());
      const ExportMeta& m = (*r)->meta();
      if (m.model_sha256 != model_sha256)
        return Status::InvalidArgument("--graft '" + text + "'",
                                       "FROM is an export of another model (model_sha256 " +
                                           m.model_sha256.substr(0, 12) + ", this run's " +
                                           model_sha256.substr(0, 12) + ")");
      const std::vector<std::string> diffs =
          ConfigDifferences(WithoutRunKnobs(m.config_json), WithoutRunKnobs(config_json));
      if (!diffs.empty())
        return Status::InvalidArgument(
            "--graft '" + text + "'",
            "FROM is an export of another config (config " + diffs[0] +
                (diffs.size() > 1 ? ", and " + std::to_string(diffs.size() - 1) + " more key(s)"
                                  : std::string()) +
                "; only inject may differ)");
      it = open.emplace(s.from, std::move(*r)).first;
    }
    LOCKSTEP_ASSIGN_OR_RETURN(Graft g, ReadGraft(s, *it->second));
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace lockstep
