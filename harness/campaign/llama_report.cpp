// The llama.cpp lines at the top of a campaign report's verdict box (campaign_text.h,
// LlamaInvarianceLines): what the plan's llama.cpp arms measured, in two sentences.
#include <fmt/format.h>

#include "campaign/campaign_text.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/llama_arm.h"
#include "lockstep/harness/run_record.h"

namespace lockstep::campaign_text {

namespace {

// The arm's value of engine key `key` ([arm.engine], else [engine]; null when neither sets it).
json ArmValue(const Campaign& c, const ArmSpec& a, const std::string& key) {
  if (a.engine.contains(key)) return a.engine[key];
  return c.engine.contains(key) ? c.engine[key] : json();
}

// "slots=4, llama_ubatch=1": the engine keys whose values differ between `a` and `b`.
std::string Changed(const Campaign& c, const ArmSpec& a, const ArmSpec& b) {
  std::vector<std::string> keys;
  for (const json* t : {&a.engine, &b.engine, &c.engine})
    for (auto it = t->begin(); it != t->end(); ++it)
      if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) keys.push_back(it.key());
  std::string out;
  for (const std::string& k : keys)
    if (ArmValue(c, a, k) != ArmValue(c, b, k))
      out += (out.empty() ? "" : ", ") + k + "=" + Cfg(ArmValue(c, a, k));
  return out;
}

// "; the window's step held 1 row (1 sequence) in A1, 4 rows (4 sequences) in beside-3": who
// shared the step where the difference is born (localize's `step`; "" when unknown).
std::string StepRows(const json& step, const std::string& a, const std::string& b) {
  const int ra = step.value("rows_a", -1), rb = step.value("rows_b", -1);
  if (ra < 0 || rb < 0) return "";
  auto one = [](int rows, int seqs, const std::string& arm) {
    return fmt::format("{} row{} ({} sequence{}) in {}", rows, rows == 1 ? "" : "s", seqs,
                       seqs == 1 ? "" : "s", arm);
  };
  return "; the window's step held " + one(ra, step.value("seqs_a", -1), a) + ", " +
         one(rb, step.value("seqs_b", -1), b);
}

const ArmSpec* Find(const Campaign& c, const std::string& name) {
  for (const ArmSpec& a : c.arms)
    if (a.name == name) return &a;
  return nullptr;
}

}  // namespace

std::vector<std::string> LlamaInvarianceLines(const Campaign& c,
                                              const std::map<std::string, json>& records,
                                              const std::string& dir) {
  std::vector<std::string> aa, same, differ;
  std::string born;
  for (const ArmSpec& a : c.arms) {
    const ArmSpec* base = a.baseline.empty() ? nullptr : Find(c, a.baseline);
    if (a.control || base == nullptr || !IsLlamaArm(c, a) || !IsLlamaArm(c, *base)) continue;
    auto it = records.find(a.name);
    if (it == records.end()) continue;
    const bool passed = it->second.value("comparison", json::object()).value("passed", false);
    const std::string change = Changed(c, a, *base);
    const std::string pair = a.name + " vs " + a.baseline;
    if (change.empty()) {
      aa.push_back(pair + (passed ? " bitwise equal" : " DIFFER"));
      continue;
    }
    (passed ? same : differ).push_back(pair + " (" + change + ")");
    if (passed || !born.empty()) continue;
    auto text =
        ReadFile(RunPaths(dir).Localize(a.baseline, a.name, ".json"), std::size_t{16} << 20);
    const json loc = text.ok() ? json::parse(*text, nullptr, false) : json();
    born = loc.is_object() && loc.contains("summary")
               ? "First difference (" + pair + "): " + loc["summary"].value("sentence", "") +
                     StepRows(loc.value("step", json::object()), a.baseline, a.name) + "."
               : "First difference (" + pair + "): not localised (plan key localize = true " +
                     "localises it).";
  }
  if (aa.empty() && same.empty() && differ.empty()) return {};
  const std::string n = std::to_string(same.size() + differ.size());
  std::string verdict =
      differ.empty()
          ? (same.empty()
                 ? "batch invariance not measured (no batch comparison ran)"
                 : "batch-invariant on this model: all " + n + " batch comparisons are equal (" +
                       fmt::format("{}", fmt::join(same, "; ")) + ")")
          : "NOT batch-invariant on this model: " + std::to_string(differ.size()) + " of " + n +
                " batch comparisons differ (" + fmt::format("{}", fmt::join(differ, "; ")) + ")";
  std::vector<std::string> out = {
      fmt::format("llama.cpp {}: {}; A/A on fresh processes: {}.",
                  std::string(LlamaCppBuiltCommit()).substr(0, 8), verdict,
                  aa.empty() ? "not run" : fmt::format("{}", fmt::join(aa, "; ")))};
  if (!born.empty()) out.push_back(born);
  return out;
}

}  // namespace lockstep::campaign_text
