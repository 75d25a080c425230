// The two renderings of a PreflightReport: the text a person reads (verdict line first, then the
// knobs, then one row per property) and the `lockstep.preflight` v1 JSON object.
#include <cstdio>
#include <sstream>

#include "commands/terminal.h"
#include "lockstep/compare/state_diff.h"
#include "lockstep/harness/preflight.h"

namespace lockstep {

namespace {

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2g", v);
  return buf;
}

std::string Pad(std::string s, std::size_t w) {
  if (s.size() < w) s.append(w - s.size(), ' ');
  return s;
}

std::string ResultCell(const PropertyResult& p) {
  std::string s = ProbeResultName(p.result);
  if (p.Fails()) s += " *";
  return s;
}

void KnobLines(const PreflightReport& r, std::ostream& o) {
  o << "knobs that make results timing- or batch-dependent, or that both arms must share:\n";
  for (const KnobFinding& k : r.knobs) {
    std::string what = k.breaks ? std::string("breaks ") + PropertyId(*k.breaks) : "pinned";
    if (!k.active) what = "inactive";
    o << "  " << Pad(k.knob + " = " + k.value, 34) << " " << Pad(what, 20) << " " << k.effect;
    if (!k.note.empty()) o << " [" << k.note << "]";
    o << "\n";
  }
}

// One row per point: the point, its background requests and co-residency, the counts, the
// largest NRMSE, the result and the first difference (or why it could not be checked).
void PointLines(const std::vector<SweepPoint>& points, const std::string& indent, std::ostream& o) {
  o << indent << Pad("point", 13) << Pad("bg", 5) << Pad("seqs", 6) << Pad("items", 8)
    << Pad("compared", 10) << Pad("differ", 8) << Pad("max NRMSE", 11) << Pad("result", 9)
    << "first difference\n";
  for (const SweepPoint& p : points) {
    std::string first = p.first ? p.first->text : "-";
    if (p.result == ProbeResult::kNotApplicable) first = p.reason;
    o << indent << Pad(p.Label(), 13) << Pad(std::to_string(p.background), 5)
      << Pad(std::to_string(p.seqs_max), 6) << Pad(std::to_string(p.items_total), 8)
      << Pad(std::to_string(p.items_compared), 10) << Pad(std::to_string(p.items_differ), 8)
      << Pad(p.items_differ > 0 ? Num(p.max_nrmse) : "0", 11) << Pad(ProbeResultName(p.result), 9)
      << first << "\n";
  }
}

void PropertyLines(const PreflightReport& r, std::ostream& o) {
  o << Pad("property", 15) << Pad("claimed", 9) << Pad("result", 15) << "first difference\n";
  for (const PropertyResult& p : r.properties) {
    std::string first = p.first ? p.first->text : "-";
    if (p.result == ProbeResult::kNotApplicable || p.result == ProbeResult::kNotProvoked)
      first = p.reason;
    o << Pad(PropertyId(p.property), 15) << Pad(p.claim.claimed ? "yes" : "no", 9)
      << Pad(ResultCell(p), 15) << first << "\n";
    if (!p.probe.empty()) o << "    probe: " << p.probe << "\n";
    if (!p.change.empty()) o << "    changed for the probe: " << p.change << "\n";
    if (p.items_differ > 0)
      o << "    " << p.items_differ << " of " << p.items_compared
        << " items differ bitwise; max NRMSE " << Num(p.max_nrmse)
        << (p.max_kl > 0 ? ", max logits KL " + Num(p.max_kl) : std::string()) << ": "
        << (p.within_default ? "within" : "beyond") << " the default thresholds\n";
    else if (p.items_compared > 0)
      o << "    " << p.items_compared << " items compared: bitwise equal\n";
    if (!p.broken_by.empty()) {
      std::string k;
      for (const std::string& b : p.broken_by) k += (k.empty() ? "" : ", ") + b;
      o << "    broken by design by: " << k << "\n";
    }
    if (!p.points.empty()) PointLines(p.points, "    ", o);
    o << "    claim: " << p.claim.why << "\n";
  }
}

void SweepLines(const SweepReport& s, std::ostream& o) {
  if (!s.ran) return;
  std::string k, clipped, tiles;
  for (int v : s.k_declared) k += (k.empty() ? "" : ",") + std::to_string(v);
  for (int v : s.k_clipped) clipped += (clipped.empty() ? "" : ",") + std::to_string(v);
  for (const RowTile& t : s.tiles)
    tiles += (tiles.empty() ? "" : ", ") + t.name + " " + std::to_string(t.rows);
  o << "sweep: the probe beside k co-resident background requests (k = " << k << "; slots "
    << s.slots << ")";
  if (!clipped.empty()) o << ", k over slots - 1 not run: " << clipped;
  o << "; rows R: prefill chunks of R rows beside " << s.rows_background
    << " background requests (tile boundaries: " << tiles << ")\n";
  if (!s.change.empty()) o << "  changed for the sweep: " << s.change << "\n";
  PointLines(s.points, "  ", o);
  const SweepPoint* f = s.FirstFailing();
  if (s.points.empty()) {
    o << "  no point ran: the sweep checked nothing\n";
  } else if (f == nullptr) {
    o << "  every point is bitwise the solo run on every compared item\n";
  } else if (f->result == ProbeResult::kDiffers) {
    o << "  first point where anything differs: " << f->Label() << " (" << f->first->text << ")\n";
  } else {
    o << "  first point not verified: " << f->Label() << " (" << f->reason << ")\n";
  }
}

nlohmann::json DifferenceJson(const FirstDifference& f) {
  nlohmann::json j = {{"what", f.what}, {"window", f.window}, {"text", f.text}};
  if (f.what == "state") {
    j["point"] = f.point;
    j["stage"] = f.stage;
    j["layer"] = f.layer < 0 ? nlohmann::json() : nlohmann::json(f.layer);
    j["item"] = f.item;
    j["path"] = f.rel;
    j["nrmse"] = f.nrmse < 0 ? nlohmann::json() : nlohmann::json(f.nrmse);
    j["kl"] = f.kl < 0 ? nlohmann::json() : nlohmann::json(f.kl);
    j["within_default_thresholds"] = f.within_default;
  } else if (f.what == "path") {
    j["fields"] = f.item;
    j["a"] = f.a;
    j["b"] = f.b;
  }
  return j;
}

nlohmann::json PointJson(const SweepPoint& p) {
  return {{"point", p.Label()},
          {"axis", p.axis},
          {"value", p.value},
          {"background", p.background},
          {"seqs_max", p.seqs_max},
          {"windows", p.windows},
          {"shared_windows", p.shared_windows},
          {"items_total", p.items_total},
          {"items_compared", p.items_compared},
          {"items_differ", p.items_differ},
          {"max_nrmse", p.max_nrmse},
          {"output_equal", p.output_equal},
          {"result", ProbeResultName(p.result)},
          {"reason", p.reason},
          {"first_difference", p.first ? DifferenceJson(*p.first) : nlohmann::json()},
          {"seconds", p.seconds}};
}

nlohmann::json PointsJson(const std::vector<SweepPoint>& points) {
  nlohmann::json a = nlohmann::json::array();
  for (const SweepPoint& p : points) a.push_back(PointJson(p));
  return a;
}

nlohmann::json SweepJson(const SweepReport& s) {
  if (!s.ran) return nlohmann::json();
  nlohmann::json tiles = nlohmann::json::array();
  for (const RowTile& t : s.tiles)
    tiles.push_back({{"name", t.name}, {"rows", t.rows}, {"where", t.where}});
  const SweepPoint* f = s.FirstFailing();
  return {{"passed", s.passed()},
          {"slots", s.slots},
          {"k_declared", s.k_declared},
          {"k_clipped", s.k_clipped},
          {"tiles", tiles},
          {"rows_background", s.rows_background},
          {"change", s.change},
          {"points", PointsJson(s.points)},
          {"first_failing", f ? nlohmann::json(f->Label()) : nlohmann::json()}};
}

nlohmann::json PropertyJson(const PropertyResult& p) {
  return {{"id", PropertyId(p.property)},
          {"title", PropertyTitle(p.property)},
          {"claimed", p.claim.claimed},
          {"claim", p.claim.why},
          {"result", ProbeResultName(p.result)},
          {"fails", p.Fails()},
          {"probe", p.probe},
          {"change", p.change},
          {"reason", p.reason},
          {"broken_by", p.broken_by},
          {"runs", p.runs},
          {"items_compared", p.items_compared},
          {"items_differ", p.items_differ},
          {"max_nrmse", p.max_nrmse},
          {"max_kl", p.max_kl},
          {"within_default_thresholds", p.within_default},
          {"first_difference", p.first ? DifferenceJson(*p.first) : nlohmann::json()},
          {"points", PointsJson(p.points)},
          {"seconds", p.seconds}};
}

}  // namespace

std::string PreflightText(const PreflightReport& r, bool color) {
  std::ostringstream o;
  const std::string line = r.VerdictLine();
  o << Paint(line, r.passed() ? Tint::kGreen : Tint::kRed, color) << "\n";
  o << "config sha256 " << r.config_sha256.substr(0, 12) << ", prompt " << r.prompt_tokens
    << " tokens" << (r.builtin_prompt ? " (built-in)" : "") << ", " << r.probe_tokens
    << " tokens per probe request, " << Num(r.seconds) << " s\n";
  KnobLines(r, o);
  PropertyLines(r, o);
  SweepLines(r.sweep, o);
  o << "(* a claimed property that does not hold; bitwise comparison, default thresholds NRMSE "
    << Num(Thresholds{}.nrmse_max) << ", KL " << Num(Thresholds{}.kl_max) << ")\n";
  if (!r.work_dir.empty()) o << "probe exports kept in " << r.work_dir << "\n";
  return o.str();
}

nlohmann::json PreflightJson(const PreflightReport& r) {
  nlohmann::json knobs = nlohmann::json::array();
  for (const KnobFinding& k : r.knobs)
    knobs.push_back(
        {{"knob", k.knob},
         {"value", k.value},
         {"active", k.active},
         {"effect", k.effect},
         {"breaks", k.breaks ? nlohmann::json(PropertyId(*k.breaks)) : nlohmann::json()},
         {"note", k.note}});
  nlohmann::json props = nlohmann::json::array();
  for (const PropertyResult& p : r.properties) props.push_back(PropertyJson(p));
  const Thresholds th;
  return {{"schema", "lockstep.preflight"},
          {"schema_version", 1},
          {"verdict", r.passed() ? "pass" : "fail"},
          {"summary", r.VerdictLine()},
          {"config", nlohmann::json::parse(r.config.ToJson())},
          {"config_sha256", r.config_sha256},
          {"model_sha256", r.model_sha256},
          {"prompt_tokens", r.prompt_tokens},
          {"builtin_prompt", r.builtin_prompt},
          {"probe_tokens", r.probe_tokens},
          {"thresholds", {{"nrmse_max", th.nrmse_max}, {"kl_max", th.kl_max}}},
          {"knobs", knobs},
          {"properties", props},
          {"work_dir", r.work_dir.empty() ? nlohmann::json() : nlohmann::json(r.work_dir)},
          {"sweep", SweepJson(r.sweep)},
          {"seconds", r.seconds}};
}

}  // namespace lockstep
