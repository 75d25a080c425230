// The per-pair texts of the campaign report (campaign_text.h): what one comparison record says
// about the state, the path and the timing of an arm against its baseline.
#include "campaign/campaign_text.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <vector>

namespace lockstep::campaign_text {
namespace {

std::string FieldsText(const json& w, const json& fields) {
  std::string s;
  for (const auto& f : fields) {
    const std::string name = f.get<std::string>();
    if (!w.contains(name)) continue;
    s += (s.empty() ? "" : ", ") + name + "=" + Cfg(w[name]);
  }
  return s;
}

}  // namespace

// The state comparison of one arm against its baseline (`st`: the report's "state" object).
void ArmStateText(std::ostream& md, const ArmSpec& a, const json& st) {
  std::vector<std::string> counts;
  for (const auto& cp : st.value("checkpoints", json::array()))
    if (cp.value("window", -1) == 0) counts.push_back(std::to_string(cp.value("compared", 0)));
  md << fmt::format("**{} vs {}**{}: ", a.name, a.baseline, a.control ? " (positive control)" : "");
  if (!counts.empty())
    md << fmt::format("there were {} comparison items at the first window's checkpoints. ",
                      fmt::join(counts, " / "));
  md << fmt::format("{} items compared, {} passed, {} failed, {} skipped.\n\n",
                    st.value("compared", 0), st.value("passed_items", 0), st.value("failed", 0),
                    st.value("skipped", 0));
  for (const auto& cp : st.value("checkpoints", json::array())) {
    md << fmt::format("- `{}` (p={}, T={}): {} compared / {} passed / {} failed / {} skipped",
                      cp.value("name", ""), cp.value("p", 0), cp.value("T", 0),
                      cp.value("compared", 0), cp.value("passed", 0), cp.value("failed", 0),
                      cp.value("skipped", 0));
    if (cp.contains("skip_reasons") && !cp["skip_reasons"].empty())
      for (auto r = cp["skip_reasons"].begin(); r != cp["skip_reasons"].end(); ++r)
        md << fmt::format(" ({}: {})", r.key(), r.value().dump());
    md << "\n";
  }
  const json& ff = st.contains("first_failure") ? st["first_failure"] : json();
  if (ff.is_object()) {
    // A whole-stage item (hidden_out, logits) has no layer: it is not "layer -1".
    const int layer = ff.value("layer", -1);
    md << fmt::format("\nFirst failing item: `{}` stage {}{} `{}` ({}).\n\n",
                      ff.value("checkpoint", ""), ff.value("stage", -1),
                      layer >= 0 ? fmt::format(" layer {}", layer) : std::string(),
                      ff.value("kind", ""), ff.value("reason", ""));
  } else
    md << "\nAll compared items passed.\n\n";
}

// Where the paths of an arm and its baseline part (`al`: the report's "alignment" object).
void ArmPathText(std::ostream& md, const ArmSpec& a, const json& al) {
  const json fields = al.value("fields", json::array());
  md << fmt::format("**{} vs {}**: ", a.name, a.baseline);
  md << fmt::format("the first {} windows matched in the recorded execution fields ({}).",
                    al.value("matched", 0),
                    fmt::format("{}", fmt::join(fields.get<std::vector<std::string>>(), ", ")));
  if (al.value("diverged", false)) {
    const json& da = al.value("div_a", json());
    const json& db = al.value("div_b", json());
    const int p = da.is_object() ? da.value("p", -1) : db.is_object() ? db.value("p", -1) : -1;
    md << fmt::format(
        " The first recorded path difference occurred at zero-based window {}, p={}:\n\n",
        al.value("div_idx", -1), p);
    md << "- " << a.baseline << ": " << (da.is_object() ? FieldsText(da, fields) : "(trace ended)")
       << ".\n";
    md << "- " << a.name << ": " << (db.is_object() ? FieldsText(db, fields) : "(trace ended)")
       << ".\n\n";
    md << fmt::format(
        "Windows after that point are not paired by index ({} ran {} more, {} ran {}).\n\n",
        a.baseline, al.value("rest_a_count", 0), a.name, al.value("rest_b_count", 0));
  } else {
    md << fmt::format(" No path divergence over {} windows.\n\n", al.value("matched", 0));
  }
}

// The matched prefix's interval table and each side's notable verify windows.
void ArmIntervalText(std::ostream& md, const ArmSpec& a, const json& al) {
  const json& timing = al.value("timing", json::array());
  if (!timing.empty()) {
    md << "| interval (matched prefix) | sum " << a.baseline << " ms | sum " << a.name
       << " ms | rel diff | median delta ms | largest abs delta ms (window) "
          "|\n|---|---|---|---|---|---|\n";
    for (const auto& t : timing) {
      if (!t.value("known", true)) {
        // Timing arms export nothing: their export interval is not applicable, not unknown.
        const char* v =
            a.mode == "timing" && t.value("name", "") == "export" ? "not applicable" : "unknown";
        md << fmt::format("| {} | {} | {} | | | |\n", t.value("name", ""), v, v);
        continue;
      }
      md << fmt::format(
          "| {} | {} | {} | {} | {} | {} ({}) |\n", t.value("name", ""), Num(t, "sum_a_ms"),
          Num(t, "sum_b_ms"),
          t["rel_diff"].is_number() ? fmt::format("{:+.1f}%", 100 * t["rel_diff"].get<double>())
                                    : Cfg(t["rel_diff"]),
          Num(t, "median_delta_ms"), Num(t, "max_abs_delta_ms"), t.value("max_at", -1));
    }
    md << "\n";
  }
  for (const char* side : {"notable_a", "notable_b"}) {
    const std::string who = std::string(side) == "notable_a" ? a.baseline : a.name;
    for (const auto& n : al.value(side, json::array()))
      md << fmt::format(
          "- {} had a {} ms T={} verify interval at its own zero-based window {}{}.\n", who,
          Num(n, "verify_ms"), n.value("T", 0), n.value("idx", 0),
          n.value("after_divergence", false) ? " (after the divergence: not a matched event)" : "");
  }
}

namespace {

// Every instability flag of one arm's summed verify time, named with the rule that raised it
// (harness/timing_stats.h: pyperf's spread rule, and an outlier rule relative to the median).
std::vector<std::string> FlagTexts(const std::string& arm, const json& g) {
  std::vector<std::string> out;
  const double median = g.value("median", 0.0);
  if (g.value("spread_unstable", false))
    out.push_back(fmt::format(
        "{}: spread (standard deviation {} ms over {} processes is >= 10% of the mean; pyperf's "
        "rule)",
        arm, Num(g, "stdev", 1), g.value("n", 0)));
  if (g.value("has_outlier", false) && median > 0.0) {
    const double lo = g.value("min", 0.0), hi = g.value("max", 0.0);
    const double worst = hi - median >= median - lo ? hi : lo;
    out.push_back(fmt::format(
        "{}: outlier (a process at {:.1f} ms is {:+.0f}% from the median {:.1f} ms; rule: >= 50% "
        "off the median)",
        arm, worst, 100.0 * (worst - median) / median, median));
  }
  return out;
}

}  // namespace

// The timing verdict over the fresh processes of a timing pair (`cmp`: the comparison record):
// medians over every repeat, never one repeat.
void ArmTimingVerdictText(std::ostream& md, const ArmSpec& a, const json& cmp) {
  if (!cmp.contains("timing")) return;
  const json& t = cmp["timing"];
  if (t.value("refused", false)) {
    md << "\nTiming verdict refused: " << t.value("refused_reason", "") << ".\n";
    return;
  }
  const json& ga = t["aggregate_a"];
  const json& gb = t["aggregate_b"];
  const double rel = t.value("aggregate_rel_diff", 0.0);
  md << fmt::format(
      "Timing over {} / {} fresh processes (medians over every repeat): summed verify median {} "
      "ms [95% {}, {}] for {} vs {} ms [95% {}, {}] for {}: {} is {:.1f}% {} than {}{}.\n",
      t["repeats"][0].get<int>(), t["repeats"][1].get<int>(), Num(ga, "median"), Num(ga, "lo95"),
      Num(ga, "hi95"), a.baseline, Num(gb, "median"), Num(gb, "lo95"), Num(gb, "hi95"), a.name,
      a.name, 100 * std::fabs(rel), rel >= 0 ? "slower" : "faster", a.baseline,
      t.value("aggregate_outside_noise", false) ? " (outside the noise band)"
                                                : " (within the noise band: the 95% intervals "
                                                  "overlap)");
  std::vector<std::string> flags = FlagTexts(a.baseline, ga);
  for (const auto& f : FlagTexts(a.name, gb)) flags.push_back(f);
  if (!flags.empty()) {
    md << "\nInstability flags on the summed verify time:\n\n";
    for (const auto& f : flags) md << "- " << f << "\n";
  }
  const json& wa = t["window_a"];
  const json& wb = t["window_b"];
  int flagged_a = 0, flagged_b = 0;
  for (const auto& w : wa)
    flagged_a += w.value("spread_unstable", false) || w.value("has_outlier", false);
  for (const auto& w : wb)
    flagged_b += w.value("spread_unstable", false) || w.value("has_outlier", false);
  if (flagged_a + flagged_b > 0)
    md << fmt::format(
        "\nPer window, {} of {} {} windows and {} of {} {} windows carry a flag (same rules).\n",
        flagged_a, wa.size(), a.baseline, flagged_b, wb.size(), a.name);
  md << "\n| window | median " << a.baseline << " ms [95%] | median " << a.name
     << " ms [95%] |\n|---|---|---|\n";
  for (std::size_t w = 0; w < std::min(wa.size(), wb.size()); ++w)
    md << fmt::format("| {} | {} [{}, {}] | {} [{}, {}] |\n", w, Num(wa[w], "median"),
                      Num(wa[w], "lo95"), Num(wa[w], "hi95"), Num(wb[w], "median"),
                      Num(wb[w], "lo95"), Num(wb[w], "hi95"));
  md << "\n";
}

}  // namespace lockstep::campaign_text
