// The change-gate texts of the campaign report (campaign_text.h): which build each arm ran, and
// what a comparison of two builds says changed, first and in all.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "campaign/campaign_text.h"
#include "lockstep/compare/report.h"
#include "lockstep/harness/builds.h"

namespace lockstep::campaign_text {

namespace {

std::string Short(const json& b, const char* key) {
  const std::string v = b.is_object() ? b.value(key, "") : "";
  return v.empty() ? "unknown" : v;
}

std::string Metric(const json& v) {
  return v.is_number() ? FormatMetric(v.get<double>()) : std::string("n/a");
}

}  // namespace

void BuildsText(std::ostream& md, const json& builds, const json& arm_builds,
                const std::vector<ArmSpec>& arms) {
  if (!builds.is_object() || builds.empty()) {
    md << "- Builds: not recorded (a run folder from before named builds).\n";
    return;
  }
  std::vector<std::string> parts, shas;
  for (auto it = builds.begin(); it != builds.end(); ++it) {
    std::vector<std::string> on;
    for (const ArmSpec& a : arms) {
      const std::string name =
          arm_builds.is_object() ? arm_builds.value(a.name, kSelfBuild) : std::string(kSelfBuild);
      if (name == it.key()) on.push_back(a.name);
    }
    const json& b = it.value();
    const std::string sha = Short(b, "sha256");
    shas.push_back(sha);
    parts.push_back(fmt::format(
        "`{}`{} = {}, commit {}, {} build, export schema {}, SHA-256 {} (arms {})", it.key(),
        it.key() == kSelfBuild ? " (the runner's executable)" : "", Short(b, "version"),
        Short(b, "commit"), Short(b, "build_type"), Short(b, "export_schema"), sha.substr(0, 12),
        on.empty() ? std::string("none") : fmt::format("{}", fmt::join(on, ", "))));
  }
  md << "- Builds: " << fmt::format("{}", fmt::join(parts, "; ")) << ".";
  if (shas.size() > 1 && std::all_of(shas.begin(), shas.end(),
                                     [&](const std::string& s) { return s == shas.front(); }))
    md << " The builds are byte-identical (one SHA-256): a difference between their arms is not a "
          "code change.";
  md << "\n";
}

ChangeFacts ChangedItems(const json& st) {
  ChangeFacts f;
  f.compared = st.value("compared", 0);
  f.failed = st.value("failed", 0);
  for (const auto& it : st.value("items", json::array())) {
    if (it.value("verdict", "") == "skip") continue;
    const auto count = [&it](const char* k) {
      return it.contains(k) && it[k].is_number() ? it[k].get<std::int64_t>() : 0;
    };
    if (count("n_diff") == 0 && count("code_diff") == 0) continue;
    ++f.changed;
    if (f.first.is_null()) f.first = it;
    const std::string kind = it.value("kind", "");
    if (kind == "logits" && f.first_logits.is_null()) f.first_logits = it;
    if (f.per_kind[kind]++ == 0) f.kinds.push_back(kind);
  }
  return f;
}

std::string ChangedItemText(const ChangeFacts& f) {
  if (f.first.is_null()) return "none";
  const json& it = f.first;
  const std::string cp = it.value("checkpoint", "");
  const int window = cp.size() > 5 ? std::atoi(cp.substr(0, 5).c_str()) : -1;
  const int layer = it.value("layer", -1);
  std::string s = fmt::format("window {}, checkpoint {}, stage {}, {}item {}: NRMSE {}", window, cp,
                              it.value("stage", -1),
                              layer >= 0 ? fmt::format("layer {}, ", layer) : std::string(),
                              it.value("kind", ""), Metric(it.value("nrmse", json())));
  if (it.value("kind", "") == "logits")
    s += ", KL " + Metric(it.value("kl_max", json()));
  else if (!f.first_logits.is_null())
    s += fmt::format(", KL n/a (not logits; the first changed logits, at {}, have KL {})",
                     f.first_logits.value("checkpoint", ""),
                     Metric(f.first_logits.value("kl_max", json())));
  else
    s += ", KL n/a (not logits; no logits changed)";
  return s;
}

std::string BuildName(const json& arm_builds, const ArmSpec& a) {
  return arm_builds.is_object() ? arm_builds.value(a.name, ArmBuildName(a)) : ArmBuildName(a);
}

std::vector<std::string> ChangeBoxLines(const std::vector<ArmSpec>& arms, const json& arm_builds,
                                        const std::map<std::string, json>& records, bool stopped) {
  std::vector<std::string> lines;
  for (const auto& a : arms) {
    const ArmSpec* base = nullptr;
    for (const auto& b : arms)
      if (b.name == a.baseline) base = &b;
    if (a.control || base == nullptr || BuildName(arm_builds, a) == BuildName(arm_builds, *base))
      continue;
    const std::string pair = fmt::format("{} vs {}, build {} against {}", a.name, a.baseline,
                                         BuildName(arm_builds, a), BuildName(arm_builds, *base));
    auto it = records.find(a.name);
    const json st = it == records.end()
                        ? json()
                        : it->second.value("report", json::object()).value("state", json());
    if (it == records.end()) {
      lines.push_back(fmt::format("No attribution ({}): the comparison was not made{}.", pair,
                                  stopped ? " (the campaign stopped first)" : ""));
    } else if (!st.is_object()) {
      lines.push_back(fmt::format("Change ({}): no state comparison was made.", pair));
    } else if (const auto f = ChangedItems(st); f.changed == 0) {
      lines.push_back(fmt::format("Change ({}): no compared item differs in any bit ({} items).",
                                  pair, f.compared));
    } else {
      lines.push_back(
          fmt::format("Change ({}): first changed item: {}; {} of {} items differ, kinds: {}.",
                      pair, ChangedItemText(f), f.changed, f.compared, fmt::join(f.kinds, ", ")));
    }
  }
  return lines;
}

void ChangeSection(std::ostream& md, const std::vector<ArmSpec>& arms,
                   const std::map<std::string, json>& records) {
  bool header = false;
  for (const ArmSpec& a : arms) {
    auto it = records.find(a.name);
    if (it == records.end() || a.control || !it->second.contains("builds")) continue;
    const json& b = it->second["builds"];
    const std::string from = b["a"].value("build", ""), to = b["b"].value("build", "");
    if (from == to) continue;
    if (!header) md << "## Change against the baseline\n\n", header = true;
    const json& rep = it->second.value("report", json::object());
    md << fmt::format("**{} vs {}** (build `{}` against build `{}`, commits {} and {}): ", a.name,
                      a.baseline, to, from, Short(b["b"], "commit"), Short(b["a"], "commit"));
    if (!rep.contains("state") || !rep["state"].is_object()) {
      md << "no state comparison was made.\n\n";
      continue;
    }
    const ChangeFacts f = ChangedItems(rep["state"]);
    if (f.changed == 0) {
      md << fmt::format(
          "no compared item differs in any bit ({} items at the exported checkpoints): the "
          "change did not alter what the engine computes there.\n\n",
          f.compared);
      continue;
    }
    md << fmt::format("{} of {} compared items differ ({} beyond the thresholds).\n\n", f.changed,
                      f.compared, f.failed);
    md << "- First changed item: " << ChangedItemText(f) << ".\n";
    std::vector<std::string> kinds;
    for (const std::string& k : f.kinds)
      kinds.push_back(fmt::format("{} ({})", k, f.per_kind.at(k)));
    md << "- Changed item kinds (items): " << fmt::format("{}", fmt::join(kinds, ", ")) << ".\n\n";
  }
}

}  // namespace lockstep::campaign_text
