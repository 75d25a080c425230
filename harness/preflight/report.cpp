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
    o << "    claim: " << p.claim.why << "\n";
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
          {"seconds", r.seconds}};
}

}  // namespace lockstep
