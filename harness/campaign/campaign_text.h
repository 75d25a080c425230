// Private to harness/campaign/: the per-pair texts of the campaign report (campaign_report.cpp
// builds the document; campaign_text.cpp writes what one comparison record says about state, path
// and timing) and the small formatting helpers both use. Input is a comparison record's JSON
// (compare/<arm>.json: "report" as compare/REPORTS.md, "comparison" as gates.cpp ToJson).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "lockstep/harness/campaign.h"
#include "lockstep/harness/ledger.h"

namespace lockstep::campaign_text {

using json = nlohmann::json;

inline std::string Cfg(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// Text for a Markdown table cell: a '|' would end the cell.
inline std::string Cell(std::string s) {
  std::replace(s.begin(), s.end(), '|', '/');
  return s;
}

// A number of `j[key]` with `digits` decimals; "?" when absent, the value's text when not a number.
inline std::string Num(const json& j, const char* key, int digits = 3) {
  if (!j.contains(key)) return "?";
  const json& v = j[key];
  if (v.is_number()) return fmt::format("{:.{}f}", v.get<double>(), digits);
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// The state comparison of one arm against its baseline (`st`: the report's "state" object).
void ArmStateText(std::ostream& md, const ArmSpec& a, const json& st);
// Where the paths of an arm and its baseline part (`al`: the report's "alignment" object).
void ArmPathText(std::ostream& md, const ArmSpec& a, const json& al);
// The matched prefix's interval table and each side's notable verify windows.
void ArmIntervalText(std::ostream& md, const ArmSpec& a, const json& al);
// The timing verdict of a repeated timing pair (`cmp`: the comparison record): medians over
// every repeat with their 95% intervals, the direction in words, every instability flag named
// with its rule, and the per-window medians.
void ArmTimingVerdictText(std::ostream& md, const ArmSpec& a, const json& cmp);

// ---- change gates (change_text.cpp): arms on different builds ----

// The builds line of the scope section: each build's version, commit, type and SHA-256 and the
// arms that ran it (`builds`, `arm_builds`: the ledger's planned entry; null: not recorded).
void BuildsText(std::ostream& md, const json& builds, const json& arm_builds,
                const std::vector<ArmSpec>& arms);
// What one state comparison says changed (`st`: the report's "state" object): the first item
// that differs in any bit, in (window, checkpoint, stage, layer, item) order, the first
// differing logits (their KL), the count and every changed item kind. Empty when nothing did.
struct ChangeFacts {
  std::int64_t compared = 0, changed = 0, failed = 0;
  json first, first_logits;        // items of the report (null: none)
  std::vector<std::string> kinds;  // changed item kinds, in first-seen order
  std::map<std::string, std::int64_t> per_kind;
};
ChangeFacts ChangedItems(const json& st);
// "window 1, checkpoint `00001_commit`, stage 2, layer 5, item `ssm_state`: NRMSE ..., KL ..."
std::string ChangedItemText(const ChangeFacts& f);
// The arm's build name as the ledger's planned entry recorded it (`arm_builds`).
std::string BuildName(const json& arm_builds, const ArmSpec& a);
// The verdict box's lines for a change gate: for each comparison of arms on different builds,
// what it found first, or that the campaign stopped before it (no attribution).
std::vector<std::string> ChangeBoxLines(const std::vector<ArmSpec>& arms, const json& arm_builds,
                                        const std::map<std::string, json>& records, bool stopped);
// The "Change against the baseline" section for each comparison of arms on different builds
// (`records`: compare/<arm>.json by arm); nothing when the plan compares no two builds.
void ChangeSection(std::ostream& md, const std::vector<ArmSpec>& arms,
                   const std::map<std::string, json>& records);

// ---- service arms (service_text.cpp) ----

// Each arm's service record: arms/<arm>/service.json, else the ledger's finished entry's
// `service`; process arms have none.
std::map<std::string, json> ReadServices(const std::string& dir, const std::vector<ArmSpec>& arms,
                                         const std::vector<LedgerEntry>& entries);
// The scope section's table of where each arm ran: server (process, fresh, shared, remote), the
// engine instance and config digest, engine state (fresh / carried / lost: re-primed), cold or
// warm with the prompt tokens reused and the snapshot position, primed, requests the engine had
// served before, the background load (requests, completed, failed, digest). Nothing when every
// arm is a process arm.
void ServiceScopeText(std::ostream& md, const std::vector<ArmSpec>& arms,
                      const std::map<std::string, json>& service);
// The order the timing arms' repeats were sent in, when the plan's `order` is not "plan" (the
// ledger's sent entries, e.g. "T1#0 T2#0 T2#1 T1#1"), and for a campaign merged from units
// (units.h): the hosts each arm ran on, every comparison whose sides ran on different hosts
// ("this A/A also measures host differences") and each placement the hosts violated. Hostnames
// never appear (host labels are digests). Nothing for a local run in plan order.
void UnitsScopeText(std::ostream& md, const Campaign& c, const std::vector<LedgerEntry>& entries);
// What a pair's service contrast (cold/warm, load, engine reuse) did: output and state bitwise
// equal or not, the first differing item, threshold failures as measured, the service
// predicates that are true. Nothing without the comparison record's `service`.
void ServicePairText(std::ostream& md, const ArmSpec& a, const json& record);
// The step composition of a pair's matched windows beside their verify times (a Markdown table
// and each side's summary: windows that shared their step with a prefill chunk, with other
// sequences only, alone), read from the arms' traces; and its HTML chart (verify ms per window
// above, each window's step rows below with the prefill rows marked). Both are empty unless a
// side is a service arm or some window shared its step.
void PairStepText(std::ostream& md, const std::string& run_dir, const ArmSpec& a,
                  const ArmSpec& base);
std::string PairStepChart(const std::string& run_dir, const ArmSpec& a, const ArmSpec& base);

// ---- scope and summary lines (scope_text.cpp) ----

// The plan's model: preset (seed, wiring) or checkpoint, with its SHA-256 (`plan_sha`: as the
// runner fingerprinted it; "" falls back to the first exported arm's, as in run folders from
// before the fingerprints were checked).
std::string ModelLine(const Campaign& c, const json& report, const std::string& plan_sha);
// The request, allowlisted (no prompt text).
std::string RequestLine(const Campaign& c);
// One arm's resources from its generate JSON `resources` (unmeasured values read "unknown").
std::string ResourceLine(const std::string& arm, const json& r);
// "- Fingerprints checked: ..." from the comparisons' records (`fingerprints`) and the ledger's
// remote_checked entry; nothing when neither has any.
void FingerprintText(std::ostream& md, const std::map<std::string, json>& records,
                     const std::vector<LedgerEntry>& entries);
// "Hypothesis check: ..." (campaigns/README.md): the verdict word the hypothesis names against
// the verdict; a pass with items that differ bitwise within their thresholds says so.
void HypothesisText(std::ostream& md, const Campaign& c, const std::string& verdict,
                    const std::map<std::string, json>& records);

// The first lines of a campaign report with llama.cpp arms (llama_arm.h): whether llama.cpp is
// batch-invariant on this model (the comparisons whose arms differ in engine keys, such as slots
// or llama_ubatch; the A/A pairs, which differ in none, said apart) and, from the run folder's
// localize/ of the first differing one, where that difference is born. Empty without such arms.
std::vector<std::string> LlamaInvarianceLines(const Campaign& c,
                                              const std::map<std::string, json>& records,
                                              const std::string& dir);

}  // namespace lockstep::campaign_text
