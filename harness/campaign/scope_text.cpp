// The report's scope and summary lines that read the plan and the run folder's records: the
// model, request and resource lines, the fingerprints that were checked, the hypothesis check
// (declared in campaign_text.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "campaign/campaign_text.h"

namespace lockstep::campaign_text {

// `plan_sha`: the plan's model as the runner fingerprinted it ("": unknown; the first exported
// arm's model then stands in, as in run folders from before the fingerprints were checked).
std::string ModelLine(const Campaign& c, const json& report, const std::string& plan_sha) {
  std::string sha = plan_sha.substr(0, 12);
  // null for an arm without an export (a timing arm): the hash is then not known from here.
  if (sha.empty() && report.contains("arms") && report["arms"]["a"].contains("model_sha256_12") &&
      report["arms"]["a"]["model_sha256_12"].is_string())
    sha = report["arms"]["a"]["model_sha256_12"].get<std::string>();
  if (!c.model.preset.empty())
    return fmt::format(
        "synthetic preset `{}` (weight seed {}{}{}){}", c.model.preset, c.model.seed,
        c.model.induction ? ", induction wiring" : "",
        c.model.format == "gguf" || !c.model.dtype.empty() || c.model.layers > 0
            ? fmt::format(", {} {}{}", c.model.format == "gguf" ? "GGUF" : "safetensors",
                          !c.model.quant.empty()   ? c.model.quant
                          : !c.model.dtype.empty() ? c.model.dtype
                                                   : "default dtype",
                          c.model.layers > 0 ? fmt::format(", {} layers", c.model.layers) : "")
            : "",
        sha.empty() ? "" : ", model SHA-256 " + sha);
  return "checkpoint" + (sha.empty() ? std::string(" (hash unknown)") : ", model SHA-256 " + sha);
}

std::string RequestLine(const Campaign& c) {
  const RequestSpec& r = c.request;
  if (r.needle)
    return fmt::format("generated needle-in-a-haystack prompt: {} tokens, {} needles, seed {}",
                       r.needle->tokens, r.needle->needles, r.needle->seed);
  if (!r.prompt.empty())
    return fmt::format("inline prompt of {} tokens (text not published)", r.prompt.size());
  if (!r.prompt_file.empty()) return "prompt file (text not published)";
  if (!r.chat_file.empty()) return "chat messages rendered with the model's chat template";
  return "token-id file";
}

std::string ResourceLine(const std::string& arm, const json& r) {
  if (r.is_null() || r.empty()) return fmt::format("{}: resources not recorded", arm);
  auto mib = [](const json& v) {
    const auto b = v.is_number() ? v.get<std::int64_t>() : -1;
    return b < 0 ? std::string("unknown") : fmt::format("{} MiB", b / 1048576);
  };
  std::string s =
      fmt::format("{}: min host available memory {}, max swap used {}, peak RSS {}, {} samples",
                  arm, mib(r.value("min_host_available_bytes", json(-1))),
                  mib(r.value("max_swap_used_bytes", json(-1))),
                  mib(r.value("max_rss_bytes", json(-1))), r.value("samples", 0));
  if (r.contains("interval_ms")) {
    // -1 is how the sampler writes an interval it did not measure (fewer than two samples).
    auto ms = [&r](const char* key) {
      const json& v = r["interval_ms"].value(key, json());
      return v.is_number() && v.get<double>() >= 0 ? Num(r["interval_ms"], key, 1) + " ms"
                                                   : std::string("unknown");
    };
    s += fmt::format(" (sampling interval median {}, max {})", ms("median"), ms("max"));
  }
  s += r.contains("guard") ? "; the resource guard TRIPPED" : "; no resource-guard trip";
  return s;
}

// The hypothesis is judged by the verdict word it names (campaigns/README.md): "pass", "fail",
// "stop", "insensitive".
void HypothesisText(std::ostream& md, const Campaign& c, const std::string& verdict,
                    const std::map<std::string, json>& records) {
  if (c.hypothesis.empty() || verdict.empty()) return;
  std::string h = c.hypothesis;
  std::transform(h.begin(), h.end(), h.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  const std::vector<std::pair<std::string, std::string>> words = {
      {"pass", "pass"}, {"stop", "stopped"}, {"insensitive", "insensitive"}, {"fail", "fail"}};
  std::string expected;
  for (const auto& [word, v] : words)
    if (h.find(word) != std::string::npos && expected.empty()) expected = v;
  if (expected.empty()) {
    md << "Hypothesis check: the hypothesis names no verdict (pass, fail, stop, insensitive); "
          "compare it with the verdict above.\n\n";
    return;
  }
  // "Held" is said of a pass only as far as the gates asked: items that differ in bits but stay
  // within their thresholds are named, so the sentence never reads as "nothing changed".
  std::int64_t changed = 0, compared = 0;
  for (const auto& a : c.arms) {
    auto it = records.find(a.name);
    if (it == records.end() || a.control) continue;
    const json& rep = it->second.value("report", json::object());
    if (!rep.contains("state") || !rep["state"].is_object()) continue;
    const ChangeFacts f = ChangedItems(rep["state"]);
    changed += f.changed, compared += f.compared;
  }
  std::string held = expected == verdict ? "held" : "did not hold";
  if (expected == verdict && expected == "pass" && changed > 0)
    held = fmt::format(
        "held within the thresholds only: {} of {} compared items differ bitwise, each within "
        "its threshold",
        changed, compared);
  md << fmt::format(
      "Hypothesis check: the hypothesis expects `{}`; the verdict is `{}`: the "
      "hypothesis {}.\n\n",
      expected, verdict, held);
}

// The fingerprints the runner checked against the plan (lockstep/harness/verdict.h, rule 3), under
// their own names: the plan's model against every exported arm's, the executables against the arms'
// builds, and a remote server's model, executable and engine config before the first arm.
void FingerprintText(std::ostream& md, const std::map<std::string, json>& records,
                     const std::vector<LedgerEntry>& entries) {
  std::string model;
  std::set<std::string> exes;
  std::vector<std::string> mismatches;
  int exports = 0;
  for (const auto& [arm, rec] : records) {
    const json& fp = rec.value("fingerprints", json());
    if (!fp.is_object()) continue;
    model = fp.value("plan_model_sha256", "");
    for (const char* side : {"a", "b"})
      if (fp.contains(side)) exes.insert(fp[side].value("executable_sha256", "").substr(0, 12));
    exports += 2;
    if (fp.contains("mismatch") && fp["mismatch"].is_string()) mismatches.push_back(fp["mismatch"]);
  }
  json remote;
  for (const auto& e : entries)
    if (e.event == "remote_checked") remote = e.data;
  if (model.empty() && remote.is_null()) return;
  std::vector<std::string> parts;
  if (!model.empty())
    parts.push_back(fmt::format(
        "the plan's model (SHA-256 {}) and each arm's build (executable SHA-256 {}) against the "
        "{} exports of the compared pairs",
        model.substr(0, 12), fmt::join(exes, ", "), exports));
  if (remote.is_object())
    parts.push_back(fmt::format(
        "the remote server's model (SHA-256 {}), executable (SHA-256 {}) and engine config "
        "(SHA-256 {}) against the plan's, before the first arm",
        remote.value("model_sha256", "").substr(0, 12),
        remote.value("executable_sha256", "").substr(0, 12),
        remote.value("config_sha256", "").substr(0, 12)));
  md << "- Fingerprints checked: " << fmt::format("{}", fmt::join(parts, "; "));
  if (!mismatches.empty()) md << "; MISMATCHED: " << fmt::format("{}", fmt::join(mismatches, "; "));
  md << ".\n";
}

void UnitsScopeText(std::ostream& md, const Campaign& c, const std::vector<LedgerEntry>& entries) {
  std::map<std::string, std::string> mode;
  for (const ArmSpec& a : c.arms) mode[a.name] = a.mode;
  std::vector<std::string> timing_sends;
  std::map<std::string, std::set<std::string>> hosts;  // arm -> host labels
  std::vector<std::string> notes;
  for (const LedgerEntry& e : entries) {
    if (e.event == "sent" && mode[e.arm] == "timing")
      timing_sends.push_back(fmt::format("{}#{}", e.arm, e.data.value("repeat", 0)));
    if ((e.event == "finished" || e.event == "failed") && e.data.contains("unit")) {
      const json& u = e.data["unit"];
      if (u.contains("host_sha256") && u["host_sha256"].is_string())
        hosts[e.arm].insert("host " + u["host_sha256"].get<std::string>().substr(0, 8));
      if (u.contains("scheduler") && u["scheduler"].is_object())
        notes.push_back(fmt::format(
            "unit {} ({} #{}): the scheduler says {} (ExitCode {}): "
            "failed",
            u.value("index", -1), e.arm, e.data.value("repeat", 0),
            u["scheduler"].value("state", "?"), u["scheduler"].value("exit_code_text", "?")));
    }
    if (e.event == "compared" && e.data.contains("hosts") && e.data["hosts"].is_object() &&
        !e.data["hosts"].value("note", "").empty())
      notes.push_back("**hosts differ**: " + e.data["hosts"].value("note", ""));
    if (e.event == "compared")
      for (const json& g : e.data.value("gates", json::array()))
        if (g.value("name", "") == "placement" && !g.value("passed", true))
          notes.push_back("**placement violated**: " + g.value("message", ""));
  }
  if (c.order != "plan")
    md << fmt::format("- Timing arms' repeats ran in `{}` order{}: {}.\n", c.order,
                      c.order == "random" ? fmt::format(" (seed {})", c.order_seed) : "",
                      fmt::join(timing_sends, " "));
  if (hosts.empty() && notes.empty()) return;
  std::vector<std::string> per_arm;
  for (const auto& [arm, labels] : hosts)
    per_arm.push_back(fmt::format("{} on {}", arm, fmt::join(labels, " and ")));
  md << fmt::format("- Arms ran as units (`lockstep run-unit`), merged by `lockstep merge`: {}.\n",
                    fmt::join(per_arm, "; "));
  for (const std::string& n : notes) md << "- " << n << "\n";
}

}  // namespace lockstep::campaign_text
