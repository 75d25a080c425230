#include "lockstep/harness/verdict.h"

#include <fmt/format.h>

#include <algorithm>

#include "lockstep/engine/inject.h"
#include "lockstep/engine/window_selection.h"

namespace lockstep {

namespace {

const ArmSpec* FindArm(const Campaign& c, const std::string& name) {
  for (const ArmSpec& a : c.arms)
    if (a.name == name) return &a;
  return nullptr;
}

// The arm's max_new (the windows that can run: at most one per new token); -1 when the arm's
// config does not resolve (the parser reports that itself).
int MaxNew(const Campaign& c, const ArmSpec& a) {
  auto cfg = EffectiveConfig(c, a, "plan-check");
  return cfg.ok() ? cfg->max_new : -1;
}

// Whether the plan's export selects a window in [from, max_new) of `a`.
bool ExportsWindowFrom(const Campaign& c, const ArmSpec& a, int from) {
  auto sel = WindowSelection::Parse(c.export_plan.windows, "windows");
  if (!sel.ok() || sel->none()) return false;
  const int n = MaxNew(c, a);
  for (int w = std::max(0, from); w < n; ++w)
    if (sel->Contains(w)) return true;
  return false;
}

// The gates that are on and can compare something for the pair arm vs base, by name.
std::vector<std::string> GatesFor(const Campaign& c, const ArmSpec& arm, const ArmSpec& base) {
  const GateSpec& g = c.gates;
  std::vector<std::string> on;
  if (g.output) on.push_back("output");
  if (g.state && arm.mode == "state" && base.mode == "state" && ExportsWindowFrom(c, arm, 0) &&
      ExportsWindowFrom(c, base, 0))
    on.push_back(g.exact ? "state (bitwise)" : "state");
  if (g.path_within) on.push_back("path");
  if (g.aggregate_rel_max) on.push_back("aggregate timing");
  if (g.window_abs_ms || g.window_rel) on.push_back("per-window timing");
  return on;
}

bool Has(const std::vector<std::string>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string Short(double v) { return fmt::format("{:g}", v); }

}  // namespace

Status CheckPlanCanPass(const Campaign& c, const std::string& source) {
  auto refuse = [&source](const std::string& why) {
    return Status::InvalidArgument(source, "this plan cannot pass on what it checks: " + why);
  };
  const GateSpec& g = c.gates;
  std::vector<const ArmSpec*> pairs;
  for (const ArmSpec& a : c.arms)
    if (!a.baseline.empty() && !a.control) pairs.push_back(&a);
  if (pairs.empty())
    return refuse(
        "nothing is paired (no [[arm]] names a baseline, so no comparison is made); declare a "
        "second arm with baseline = \"" +
        (c.arms.empty() ? std::string("A1") : c.arms.front().name) + "\"");
  const bool any_gate = g.output || g.state || g.path_within || g.aggregate_rel_max ||
                        g.window_abs_ms || g.window_rel;
  if (!any_gate)
    return refuse(
        "nothing is gated ([gates] turns on none of output, state, path, aggregate_timing, "
        "window_timing; resources alone compares no token, item or window)");
  if (g.state) {
    auto sel = WindowSelection::Parse(c.export_plan.windows, "windows");
    if (sel.ok() && sel->none())
      return refuse(
          "[gates] state is on but [export] windows = \"none\" exports no state: the state gate "
          "could compare nothing (turn it off, or export windows such as \"0-2\")");
  }
  for (const ArmSpec* a : pairs) {
    const ArmSpec* base = FindArm(c, a->baseline);
    if (base == nullptr) continue;  // the parser refuses an unknown baseline
    if (g.state && a->mode == "state" && base->mode == "state" &&
        (!ExportsWindowFrom(c, *a, 0) || !ExportsWindowFrom(c, *base, 0)))
      return refuse(fmt::format(
          "{} vs {}: [export] windows = \"{}\" selects no window that runs (max_new {} allows "
          "windows 0-{}): the state gate would compare no item",
          a->name, base->name, c.export_plan.windows, MaxNew(c, *a), MaxNew(c, *a) - 1));
    if (GatesFor(c, *a, *base).empty())
      return refuse(fmt::format(
          "{} vs {}: no gate that is on applies to this pair (a {} arm against a {} arm; the state "
          "gate compares state arms only)",
          a->name, base->name, a->mode, base->mode));
  }
  for (const ArmSpec& a : c.arms) {
    if (!a.control) continue;
    const ArmSpec* base = FindArm(c, a.baseline);
    if (base == nullptr) continue;
    const std::vector<std::string> on = GatesFor(c, a, *base);
    const bool state = Has(on, "state") || Has(on, "state (bitwise)");
    if (!g.output && !state && !g.path_within)
      return refuse(
          "the positive control can be caught only by the output, state or path gate, and none "
          "of them is on for it: it could only pass (insensitive) or fail on nothing");
    auto inj = ParseInjections({c.control});
    if (inj.ok() && !inj->empty() && !g.output && !g.path_within &&
        inj->front().kind == Injection::Kind::kPerturb &&
        !ExportsWindowFrom(c, a, inj->front().window))
      return refuse(fmt::format(
          "the positive control perturbs window {}, but [export] windows = \"{}\" exports none at "
          "or after it and only the state gate could catch it: it would be caught on nothing",
          inj->front().window, c.export_plan.windows));
  }
  return Status::Ok();
}

std::vector<std::string> PlanCheckLines(const Campaign& c) {
  std::vector<std::string> lines;
  for (const ArmSpec& a : c.arms) {
    if (a.baseline.empty()) continue;
    const ArmSpec* base = FindArm(c, a.baseline);
    if (base == nullptr) continue;
    lines.push_back(fmt::format("{}{} vs {}: gated by {}", a.control ? "positive control " : "",
                                a.name, a.baseline, fmt::join(GatesFor(c, a, *base), ", ")));
  }
  for (const std::string& r : RelaxedThresholds(c.thresholds)) lines.push_back("thresholds: " + r);
  return lines;
}

std::vector<std::string> RelaxedThresholds(const Thresholds& t) {
  const Thresholds d;
  std::vector<std::string> out;
  if (t.nrmse_max > d.nrmse_max)
    out.push_back(
        fmt::format("NRMSE relaxed to {}, default {}", Short(t.nrmse_max), Short(d.nrmse_max)));
  if (t.kl_max > d.kl_max)
    out.push_back(
        fmt::format("logits KL relaxed to {}, default {}", Short(t.kl_max), Short(d.kl_max)));
  for (const auto& [kind, v] : t.nrmse_by_kind)
    if (v > d.NrmseFor(kind))
      out.push_back(fmt::format("{} NRMSE relaxed to {}, default {}", kind, Short(v),
                                Short(d.NrmseFor(kind))));
  return out;
}

CampaignDecision DecideCampaignVerdict(const Campaign& c,
                                       const std::map<std::string, ComparisonResult>& compared,
                                       bool stopped) {
  CampaignDecision d{CampaignOutcome::kPass, ""};
  bool control_seen = false, control_unapplied = false, control_on_nothing = false;
  std::string control_gates;
  const ComparisonResult* first_unchecked = nullptr;
  int pairs = 0;
  for (const ArmSpec& a : c.arms) {
    auto it = compared.find(a.name);
    if (it == compared.end()) continue;
    const ComparisonResult& cr = it->second;
    if (cr.control) {
      control_seen = true;
      if (!cr.control_applied) {
        control_unapplied = true;
      } else if (cr.passed) {
        d = {CampaignOutcome::kInsensitive, "the positive control passed every gate"};
      } else if (cr.caught_by.empty()) {
        control_on_nothing = true;
        for (const GateOutcome& g : cr.gates)
          if (!g.passed) control_gates += (control_gates.empty() ? "" : ", ") + g.name;
      }
      continue;
    }
    ++pairs;
    if (!cr.passed && d.outcome == CampaignOutcome::kPass) {
      d = {CampaignOutcome::kFail, cr.arm + " vs " + cr.baseline + " failed its gates"};
    } else if (cr.passed && !cr.checked.any() && first_unchecked == nullptr) {
      first_unchecked = &cr;
    }
  }
  if (stopped && d.outcome != CampaignOutcome::kInsensitive)
    d = {CampaignOutcome::kStopped, "a stop rule fired; attribution stopped"};
  if (d.outcome == CampaignOutcome::kPass) {
    if (pairs == 0) {
      d = {CampaignOutcome::kNotChecked, "no predeclared pair was compared"};
    } else if (first_unchecked != nullptr) {
      d = {CampaignOutcome::kNotChecked,
           fmt::format("{} vs {} compared nothing under its gates (0 tokens, 0 items, 0 windows)",
                       first_unchecked->arm, first_unchecked->baseline)};
    } else if (!c.control.empty() && !control_seen) {
      d = {CampaignOutcome::kFail, "the positive control did not run"};
    } else if (control_on_nothing) {
      d = {CampaignOutcome::kNotChecked,
           "the positive control failed only where nothing was compared (" + control_gates +
               "): the gates' sensitivity was not tested on any quantity"};
    }
  }
  // Neither "caught" nor "insensitive" can be said of a control that never took effect.
  if (control_unapplied)
    d = {CampaignOutcome::kControlNotApplied,
         "the positive control's injection '" + c.control +
             "' did not fire: the gates' sensitivity was not tested"};
  return d;
}

std::string VerdictWords(const std::string& v) {
  if (v == "pass") return "PASS";
  if (v == "insensitive") return "FAIL (insensitive)";
  if (v == "control_not_applied") return "FAIL (control not applied)";
  if (v == "not_checked") return "NOT CHECKED";
  return "FAIL (" + v + ")";
}

}  // namespace lockstep
