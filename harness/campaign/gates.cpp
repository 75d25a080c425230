#include "lockstep/harness/gates.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "lockstep/engine/median.h"

namespace lockstep {

namespace {

// Predicate parameters when the campaign declares no gate of that kind.
constexpr double kDefaultWindowAbsMs = 1.0;
constexpr double kDefaultWindowRel = 0.5;
constexpr double kDefaultAggregateRel = 0.10;

const IntervalDiff* Verify(const AlignResult& al) {
  for (const auto& t : al.timing)
    if (t.name == "verify") return &t;
  return nullptr;
}

// Matched windows whose |delta verify| exceeds max(abs_ms, rel x the baseline's median verify time
// over the matched prefix). Returns the count and fills the worst one.
int WindowsOverBand(const AlignResult& al, const std::vector<WindowRecord>& base, double abs_ms,
                    double rel, std::string* worst) {
  const IntervalDiff* v = Verify(al);
  if (!v || !v->known || v->delta_ms.empty()) return 0;
  std::vector<double> base_ms;
  for (int i = 0; i < al.matched && i < static_cast<int>(base.size()); ++i)
    base_ms.push_back(static_cast<double>(base[static_cast<std::size_t>(i)].verify_ns) * 1e-6);
  const double band = std::max(abs_ms, rel * Median(base_ms));
  int n = 0;
  double worst_abs = -1;
  for (std::size_t i = 0; i < v->delta_ms.size(); ++i) {
    const double d = std::fabs(v->delta_ms[i]);
    if (d > band) {
      ++n;
      if (d > worst_abs) {
        worst_abs = d;
        *worst = fmt::format("window {}: abs delta {:.3f} ms > band {:.3f} ms", i, d, band);
      }
    }
  }
  return n;
}

// Timing arms: per-window verify ms of each repeat over the first `n` windows.
std::vector<std::vector<double>> VerifyMs(const std::vector<std::vector<WindowRecord>>& repeats,
                                          int n) {
  std::vector<std::vector<double>> out;
  for (const auto& r : repeats) {
    std::vector<double> ms;
    for (int i = 0; i < n && i < static_cast<int>(r.size()); ++i)
      ms.push_back(static_cast<double>(r[static_cast<std::size_t>(i)].verify_ns) * 1e-6);
    out.push_back(std::move(ms));
  }
  return out;
}

}  // namespace

namespace {

// The gates of one comparison, recorded in order; the comparison passes when every gate does.
struct GateSink {
  ComparisonResult& r;
  void operator()(const std::string& name, bool passed, const std::string& msg) const {
    r.gates.push_back(GateOutcome{name, passed, msg});
    r.passed = r.passed && passed;
  }
  // A gate that was on and failed on a quantity it compared (campaign verdict rule, issue 35).
  void Caught(const std::string& name) const { r.caught_by.push_back(name); }
  // Windows a path or timing gate compared (the largest count of any of them: the same windows).
  void Windows(std::int64_t n) const { r.checked.windows = std::max(r.checked.windows, n); }
};

// The timing gates' inputs to the stop rules.
struct TimingFlags {
  bool aggregate_failed = false, window_unstable = false;
};

void GateOutput(const GateSpec& g, const ArmOutcome& base, const ArmOutcome& out, bool output_same,
                const GateSink& gate) {
  if (!g.output) return;
  // Tokens are compared only when both arms ran: a failed arm's missing output is not a token.
  const std::int64_t tokens =
      base.ok && out.ok
          ? static_cast<std::int64_t>(std::max(base.output_ids.size(), out.output_ids.size()))
          : 0;
  gate.r.checked.tokens += tokens;
  if (!output_same && tokens > 0) gate.Caught("output identical");
  gate("output identical", output_same,
       output_same ? fmt::format("{} tokens, stop {}", out.output_ids.size(), out.stop_reason)
                   : fmt::format("{}: {} tokens (stop {}), {}: {} tokens (stop {})", base.name,
                                 base.output_ids.size(), base.stop_reason, out.name,
                                 out.output_ids.size(), out.stop_reason));
}

// Whether a compared item differs in any bit (values; int8 items: their codes too).
bool ItemChanged(const ItemResult& it) {
  return it.verdict != Verdict::kSkip && (it.stats.n_diff > 0 || it.code_diff > 0);
}

// The state gate (thresholds, or bitwise equality with `exact`). Returns whether the state held
// (true when there is no diff: the arms' failure is its own gate and predicate).
bool GateState(const GateSpec& g, const ArmSpec& arm, const DiffResult* diff,
               const GateSink& gate) {
  if (diff == nullptr) {
    if (g.state && arm.mode == "state")
      gate(g.exact ? "state bitwise equal" : "state within thresholds", false,
           "no state diff (an arm failed or exported nothing)");
    return true;
  }
  if (g.exact) {
    std::int64_t changed = 0;
    const ItemResult* first = nullptr;
    for (const ItemResult& it : diff->items)
      if (ItemChanged(it)) first = first ? first : &it, ++changed;
    const bool ok = diff->Passed() && changed == 0;
    if (g.state) {
      gate.r.checked.items += diff->compared;
      if (changed > 0 && !diff->model_differs && !diff->request_differs)
        gate.Caught("state bitwise equal");
    }
    std::string msg = fmt::format("{} compared, {} differ bitwise, {} skipped", diff->compared,
                                  changed, diff->skipped);
    if (first != nullptr)
      msg +=
          fmt::format("; first differing: {} {} (NRMSE {}, {} elements differ)", first->checkpoint,
                      first->rel, FormatMetric(first->stats.nrmse), first->stats.n_diff);
    if (diff->model_differs || diff->request_differs) msg += "; model or request differ";
    if (!diff->vacuous.empty()) msg += "; " + diff->vacuous;
    if (g.state) gate("state bitwise equal", ok, msg);
    return ok;
  }
  if (!g.state) return diff->Passed();
  gate.r.checked.items += diff->compared;
  if (diff->failed > 0 && diff->compared > 0 && !diff->model_differs && !diff->request_differs)
    gate.Caught("state within thresholds");
  std::string msg = fmt::format("{} compared, {} passed, {} failed, {} skipped", diff->compared,
                                diff->passed, diff->failed, diff->skipped);
  if (diff->first_failure >= 0) {
    const ItemResult& f = diff->items[static_cast<std::size_t>(diff->first_failure)];
    msg += fmt::format("; first failing: {} {} ({})", f.checkpoint, f.rel, f.reason);
  }
  if (diff->model_differs || diff->request_differs) msg += "; model or request differ";
  if (!diff->vacuous.empty()) msg += "; " + diff->vacuous;
  gate("state within thresholds", diff->Passed(), msg);
  return diff->Passed();
}

// Returns whether the paths diverged early (within the gate's window count, or at all).
bool GatePath(const GateSpec& g, const AlignResult& al, const GateSink& gate) {
  const int within = g.path_within.value_or(0);
  const bool early = al.diverged && (within == 0 || al.div_idx < within);
  if (g.path_within) {
    // A path whose fields cannot differ (every window T = 1) was not checked: not a pass.
    const bool unchecked = !al.diverged && !al.path_unchecked.empty();
    const std::string name =
        within == 0 ? "no path divergence"
                    : fmt::format("no path divergence in the first {} windows", within);
    if (al.comparable() && !unchecked) {
      gate.Windows(al.diverged ? al.div_idx + 1 : al.matched);
      if (early) gate.Caught(name);
    }
    std::string msg = al.diverged ? fmt::format("first divergence at window {} of {}/{}",
                                                al.div_idx, al.n_a, al.n_b)
                      : unchecked ? "nothing compared: " + al.path_unchecked
                                  : fmt::format("no divergence over {} windows", al.matched);
    gate(name, !early && !unchecked, msg);
  }
  return early;
}

// Timing arms: repeats of both arms against each other (CompareTimingRepeats); other arms: the one
// run's matched windows.
TimingFlags GateTiming(const Campaign& c, const ArmSpec& arm, const ArmOutcome& base,
                       const ArmOutcome& out, const AlignResult& al, ComparisonResult& r,
                       const GateSink& gate) {
  const GateSpec& g = c.gates;
  const bool timing_arm = arm.mode == "timing";
  TimingFlags f;
  bool& aggregate_failed = f.aggregate_failed;
  bool& window_unstable = f.window_unstable;
  int windows_over_band = 0;
  if (timing_arm) {
    r.timing_repeats_a = static_cast<int>(base.repeats.size());
    r.timing_repeats_b = static_cast<int>(out.repeats.size());
    TimingVerdict tv =
        CompareTimingRepeats(VerifyMs(base.repeats, al.matched), VerifyMs(out.repeats, al.matched),
                             c.min_timing_repeats);
    const double rel_max = g.aggregate_rel_max.value_or(kDefaultAggregateRel);
    if (!tv.refused) {
      aggregate_failed = tv.aggregate_outside_noise && std::fabs(tv.aggregate_rel_diff) > rel_max;
      // A window counts when its medians' 95% intervals do not overlap AND the medians differ by
      // more than the band max(abs_ms, rel x baseline median): with dozens of windows a few
      // non-overlapping intervals are expected by chance alone. pyperf's instability flags are
      // reported (the verdict says so), not gated on.
      const double abs_ms = g.window_abs_ms.value_or(kDefaultWindowAbsMs);
      const double rel = g.window_rel.value_or(kDefaultWindowRel);
      for (int w : tv.windows_outside_noise) {
        const auto i = static_cast<std::size_t>(w);
        if (i >= tv.window_a.size() || i >= tv.window_b.size()) continue;
        const double ma = tv.window_a[i].median, mb = tv.window_b[i].median;
        if (std::fabs(mb - ma) > std::max(abs_ms, rel * ma)) ++windows_over_band;
      }
      window_unstable = windows_over_band > 0;
    }
    auto refused_msg = fmt::format("no timing verdict: {}", tv.refused_reason);
    if (!tv.refused && (g.aggregate_rel_max || g.window_abs_ms || g.window_rel))
      gate.Windows(al.matched);
    if (!tv.refused && g.aggregate_rel_max && aggregate_failed) gate.Caught("aggregate timing");
    if (!tv.refused && (g.window_abs_ms || g.window_rel) && window_unstable)
      gate.Caught("per-window timing");
    if (g.aggregate_rel_max)
      gate("aggregate timing", !tv.refused && !aggregate_failed,
           tv.refused
               ? refused_msg
               : fmt::format(
                     "median summed verify {:.3f} vs {:.3f} ms ({:+.1f}%, {} repeats per arm){}",
                     tv.aggregate_a.median, tv.aggregate_b.median, 100.0 * tv.aggregate_rel_diff,
                     std::min(tv.repeats_a, tv.repeats_b),
                     tv.aggregate_outside_noise ? ", outside the noise band"
                                                : ", within the noise band"));
    if (g.window_abs_ms || g.window_rel)
      gate("per-window timing", !tv.refused && !window_unstable,
           tv.refused
               ? refused_msg
               : fmt::format("{} windows outside the noise band, {} of them also outside the "
                             "max(abs, rel x median) band{}",
                             tv.windows_outside_noise.size(), windows_over_band,
                             tv.unstable ? "; pyperf instability flags raised" : ""));
    r.timing = std::move(tv);
  } else {
    const IntervalDiff* v = Verify(al);
    const double rel = v && v->known ? v->rel_diff : 0.0;
    aggregate_failed = std::fabs(rel) > g.aggregate_rel_max.value_or(kDefaultAggregateRel);
    std::string worst;
    const int over =
        WindowsOverBand(al, base.windows, g.window_abs_ms.value_or(kDefaultWindowAbsMs),
                        g.window_rel.value_or(kDefaultWindowRel), &worst);
    window_unstable = over > 0;
    const bool known = v && v->known;
    if (known && (g.aggregate_rel_max || g.window_abs_ms || g.window_rel)) gate.Windows(al.matched);
    if (known && g.aggregate_rel_max && aggregate_failed) gate.Caught("aggregate timing");
    if (known && (g.window_abs_ms || g.window_rel) && window_unstable)
      gate.Caught("per-window timing");
    if (g.aggregate_rel_max)
      gate("aggregate timing", !aggregate_failed,
           v && v->known ? fmt::format("summed verify over {} matched windows: {:.3f} vs {:.3f} ms "
                                       "({:+.1f}%, max {:.0f}%)",
                                       al.matched, v->sum_a_ms, v->sum_b_ms, 100.0 * rel,
                                       100.0 * *g.aggregate_rel_max)
                         : "verify time unknown");
    if (g.window_abs_ms || g.window_rel)
      gate("per-window timing", !window_unstable,
           over ? fmt::format("{} matched windows outside the band; worst: {}", over, worst)
                : fmt::format("all {} matched windows within the band", al.matched));
  }
  return f;
}

void GateResources(const GateSpec& g, const ArmOutcome& base, const ArmOutcome& out, bool guard,
                   bool swap, const GateSink& gate) {
  if (!g.resources) return;
  std::vector<std::string> why;
  if (guard) why.push_back("resource guard tripped");
  if (g.no_swap && swap) why.push_back("swap in use");
  std::int64_t min_free = -1;
  for (const ArmOutcome* o : {&base, &out})
    if (o->min_host_available_bytes >= 0 &&
        (min_free < 0 || o->min_host_available_bytes < min_free))
      min_free = o->min_host_available_bytes;
  if (g.min_free_mib >= 0 && min_free >= 0 && min_free < g.min_free_mib * 1048576)
    why.push_back(fmt::format("host available memory fell to {} MiB", min_free / 1048576));
  std::string msg =
      why.empty() ? "no guard trip, no swap" : fmt::format("{}", fmt::join(why, "; "));
  if (min_free < 0) msg += " (free memory unknown)";
  gate("resources", why.empty(), msg);
}

// Whether the arm's injections fired: the control's own (by its text) for the control arm, every
// one otherwise. An injection that never fired leaves the arm's result meaningless as evidence.
void GateInjections(const Campaign& c, const ArmSpec& arm, const ArmOutcome& out,
                    ComparisonResult& r, const GateSink& gate) {
  std::vector<std::string> unfired;
  bool control_fired = false;
  for (const auto& j : out.injections) {
    const std::string text = j.value("text", "");
    const bool fired = j.value("fired", false);
    if (!fired) unfired.push_back("'" + text + "'");
    if (text == c.control && fired) control_fired = true;
  }
  if (arm.control) {
    r.control_applied = control_fired;
    gate("control applied", control_fired,
         control_fired ? fmt::format("'{}' fired", c.control)
         : out.injections.empty()
             ? fmt::format("no injection record from {} (the arm left no generate JSON)", arm.name)
             : fmt::format("'{}' never fired: control not applied", c.control));
  } else if (!unfired.empty()) {
    gate("injections applied", false, fmt::format("never fired: {}", fmt::join(unfired, ", ")));
  }
}

// Whether every compared item is bitwise equal (values, int8 codes) and nothing failed: what the
// service predicates mean by "state not bitwise equal" (a missing item or a shape mismatch is
// not equal either).
bool StateBitwiseEqual(const DiffResult& d) {
  if (d.model_differs || d.request_differs) return false;
  for (const ItemResult& it : d.items)
    if (it.verdict == Verdict::kFail || ItemChanged(it)) return false;
  return true;
}

// One side's service facts as the predicates read them: a process arm (no service object) is a
// fresh engine's cold request without load.
struct ServiceSide {
  bool service = false;
  bool cold = true;
  std::int64_t requests_before = 0;
  bool has_load = false;
  std::string load_digest;
};

// Fields of a service record, by type: a failed arm's record may hold nulls (unknown), which
// read as the default.
bool BoolOr(const nlohmann::json& j, const char* k, bool d) {
  return j.is_object() && j.contains(k) && j[k].is_boolean() ? j[k].get<bool>() : d;
}
std::string StringOr(const nlohmann::json& j, const char* k, const std::string& d) {
  return j.is_object() && j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : d;
}
std::int64_t IntOr(const nlohmann::json& j, const char* k, std::int64_t d) {
  return j.is_object() && j.contains(k) && j[k].is_number_integer() ? j[k].get<std::int64_t>() : d;
}

ServiceSide Side(const nlohmann::json& s) {
  ServiceSide v;
  if (!s.is_object()) return v;
  v.service = true;
  v.cold = BoolOr(s, "cold", true);
  v.requests_before = IntOr(s, "requests_before", 0);
  const nlohmann::json& load = s.contains("load") ? s["load"] : nlohmann::json();
  v.has_load = load.is_object();
  if (v.has_load) v.load_digest = StringOr(load, "digest", "");
  return v;
}

nlohmann::json SideJson(const ServiceSide& v, const nlohmann::json& s) {
  return {{"server", s.is_object() ? StringOr(s, "server", "") : std::string("process")},
          {"cold", v.cold},
          {"prompt_tokens_reused", IntOr(s, "prompt_tokens_reused", 0)},
          {"requests_before", v.requests_before},
          {"load_digest", v.has_load ? nlohmann::json(v.load_digest) : nlohmann::json()}};
}

// The service predicates (warm_differs_from_cold, load_changes_state, load_changes_path,
// engine_reuse_changes_state) and the comparison's `service` record: what differs between the
// sides' service settings and whether the result was bitwise the same. Recorded when either side
// ran on a service, or the plan's stop rules name one of them.
void ServicePredicates(const Campaign& c, const ArmOutcome& base, const ArmOutcome& out,
                       bool output_same, const DiffResult* diff, const AlignResult& al,
                       ComparisonResult& r) {
  static const std::vector<std::string> kNames = {"warm_differs_from_cold", "load_changes_state",
                                                  "load_changes_path",
                                                  "engine_reuse_changes_state"};
  const ServiceSide a = Side(base.service), b = Side(out.service);
  bool asked = a.service || b.service;
  for (const auto& rule : c.stop)
    for (const auto& p : rule.predicates)
      asked = asked || std::find(kNames.begin(), kNames.end(), p) != kNames.end();
  if (!asked) return;
  const bool same = output_same && (diff == nullptr || StateBitwiseEqual(*diff));
  const bool warm_vs_cold = a.cold != b.cold;
  const bool load_differs =
      a.has_load != b.has_load || (a.has_load && a.load_digest != b.load_digest);
  const bool reuse_differs = (a.requests_before > 0) != (b.requests_before > 0);
  r.predicates["warm_differs_from_cold"] = warm_vs_cold && !same;
  r.predicates["load_changes_state"] = load_differs && !same;
  r.predicates["load_changes_path"] = load_differs && al.diverged;
  r.predicates["engine_reuse_changes_state"] = reuse_differs && !same;
  nlohmann::json contrast = nlohmann::json::array();
  if (warm_vs_cold) contrast.push_back("cold_warm");
  if (load_differs) contrast.push_back("load");
  if (reuse_differs) contrast.push_back("engine_reuse");
  r.service = {{"a", SideJson(a, base.service)},
               {"b", SideJson(b, out.service)},
               {"contrast", contrast},
               {"bitwise_equal", same},
               {"state_compared", diff != nullptr}};
}

}  // namespace

ComparisonResult EvaluateComparison(const Campaign& c, const ArmSpec& arm, const ArmOutcome& base,
                                    const ArmOutcome& out, const DiffResult* diff,
                                    const AlignResult& al) {
  ComparisonResult r;
  r.arm = arm.name;
  r.baseline = base.name;
  r.control = arm.control;
  const GateSpec& g = c.gates;
  const GateSink gate{r};
  if (!base.ok || !out.ok) {
    gate("arms ran", false,
         fmt::format("{} exited {}, {} exited {}", base.name, base.exit_code, out.name,
                     out.exit_code));
  }
  const bool output_same = base.output_ids == out.output_ids && base.stop_reason == out.stop_reason;
  GateOutput(g, base, out, output_same, gate);
  const bool state_ok = GateState(g, arm, diff, gate);
  const bool early = GatePath(g, al, gate);
  const TimingFlags tf = GateTiming(c, arm, base, out, al, r, gate);
  const bool aggregate_failed = tf.aggregate_failed, window_unstable = tf.window_unstable;
  const bool guard = base.guard_tripped || out.guard_tripped;
  const bool swap = base.max_swap_used_bytes > 0 || out.max_swap_used_bytes > 0;
  GateResources(g, base, out, guard, swap, gate);
  const bool gates_passed = r.passed;
  GateInjections(c, arm, out, r, gate);

  r.predicates["path_diverged"] = al.diverged;
  r.predicates["path_diverged_early"] = early;
  // Timing predicates are recorded only when the plan asks about timing (a timing gate, or a stop
  // rule naming them): single-run timing on a shared machine is noise the plan did not ask about,
  // and the ledger of a deterministic plan stays deterministic.
  bool timing_asked = g.aggregate_rel_max || g.window_abs_ms || g.window_rel;
  for (const auto& rule : c.stop)
    for (const auto& p : rule.predicates)
      timing_asked =
          timing_asked || p == "window_timing_unstable" || p == "aggregate_timing_failed";
  if (timing_asked) {
    r.predicates["window_timing_unstable"] = window_unstable;
    r.predicates["aggregate_timing_failed"] = aggregate_failed;
  }
  r.predicates["state_failed"] = !state_ok;
  r.predicates["output_differs"] = !output_same;
  r.predicates["resource_guard"] = guard;
  r.predicates["swap_used"] = swap;
  r.predicates["arm_failed"] = !base.ok || !out.ok;
  r.predicates["control_missed"] = arm.control && (gates_passed || !r.control_applied);
  ServicePredicates(c, base, out, output_same, diff, al, r);
  return r;
}

std::optional<StopDecision> EvaluateStopRules(const Campaign& c,
                                              const std::vector<ComparisonResult>& so_far) {
  for (const StopRule& rule : c.stop) {
    std::vector<std::string> fired;
    for (const auto& p : rule.predicates) {
      bool v = false;
      for (const auto& cr : so_far) {
        if (cr.control && p != "control_missed") continue;
        if (!rule.arms.empty() &&
            std::find(rule.arms.begin(), rule.arms.end(), cr.arm) == rule.arms.end())
          continue;
        auto it = cr.predicates.find(p);
        v = v || (it != cr.predicates.end() && it->second);
      }
      if (v) fired.push_back(p);
    }
    const bool fires = rule.all
                           ? (!rule.predicates.empty() && fired.size() == rule.predicates.size())
                           : !fired.empty();
    if (fires) return StopDecision{&rule, fired};
  }
  return std::nullopt;
}

nlohmann::json ToJson(const ComparisonResult& r) {
  nlohmann::json j;
  j["arm"] = r.arm;
  j["baseline"] = r.baseline;
  j["control"] = r.control;
  j["passed"] = r.passed;
  if (r.control) j["control_applied"] = r.control_applied;
  j["gates"] = nlohmann::json::array();
  for (const auto& g : r.gates)
    j["gates"].push_back({{"name", g.name}, {"passed", g.passed}, {"message", g.message}});
  j["predicates"] = r.predicates;
  j["checked"] = {
      {"tokens", r.checked.tokens}, {"items", r.checked.items}, {"windows", r.checked.windows}};
  j["caught_by"] = r.caught_by;
  j["timing_repeats"] = {r.timing_repeats_a, r.timing_repeats_b};
  if (!r.service.is_null()) j["service"] = r.service;
  if (!r.hosts.is_null()) j["hosts"] = r.hosts;
  if (r.timing) {
    const TimingVerdict& t = *r.timing;
    auto stats = [](const SampleStats& s) {
      return nlohmann::json{{"n", s.n},
                            {"median", s.median},
                            {"lo95", s.lo95},
                            {"hi95", s.hi95},
                            {"min", s.min},
                            {"max", s.max},
                            {"stdev", s.stdev},
                            {"spread_unstable", s.spread_unstable},
                            {"has_outlier", s.has_outlier}};
    };
    nlohmann::json tj;
    tj["refused"] = t.refused;
    tj["refused_reason"] = t.refused_reason;
    tj["repeats"] = {t.repeats_a, t.repeats_b};
    tj["aggregate_a"] = stats(t.aggregate_a);
    tj["aggregate_b"] = stats(t.aggregate_b);
    tj["aggregate_rel_diff"] = t.aggregate_rel_diff;
    tj["aggregate_outside_noise"] = t.aggregate_outside_noise;
    tj["windows_outside_noise"] = t.windows_outside_noise;
    tj["unstable"] = t.unstable;
    tj["window_a"] = nlohmann::json::array();
    tj["window_b"] = nlohmann::json::array();
    for (const auto& s : t.window_a) tj["window_a"].push_back(stats(s));
    for (const auto& s : t.window_b) tj["window_b"].push_back(stats(s));
    j["timing"] = tj;
  }
  return j;
}

Result<ComparisonResult> ComparisonFromJson(const nlohmann::json& j) {
  try {
    ComparisonResult r;
    r.arm = j.at("arm").get<std::string>();
    r.baseline = j.at("baseline").get<std::string>();
    r.control = j.at("control").get<bool>();
    r.passed = j.at("passed").get<bool>();
    r.control_applied = j.value("control_applied", true);
    for (const auto& g : j.at("gates"))
      r.gates.push_back(GateOutcome{g.at("name").get<std::string>(), g.at("passed").get<bool>(),
                                    g.at("message").get<std::string>()});
    r.predicates = j.at("predicates").get<std::map<std::string, bool>>();
    // A record from before issue 35 has neither: it counts as having compared nothing.
    if (const auto it = j.find("checked"); it != j.end()) {
      r.checked.tokens = it->value("tokens", std::int64_t{0});
      r.checked.items = it->value("items", std::int64_t{0});
      r.checked.windows = it->value("windows", std::int64_t{0});
    }
    r.caught_by = j.value("caught_by", std::vector<std::string>{});
    r.timing_repeats_a = j.at("timing_repeats").at(0).get<int>();
    r.timing_repeats_b = j.at("timing_repeats").at(1).get<int>();
    r.service = j.value("service", nlohmann::json());
    r.hosts = j.value("hosts", nlohmann::json());
    return r;
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption("comparison record", e.what());
  }
}

}  // namespace lockstep
