// A campaign's verdict words (the ledger's `verdict` event, report.md's "Verdict:" line) as a type,
// and how each colours the report's verdict box: the campaign's vocabulary lives here, in the
// harness, so compare/ (which draws the box) knows only VerdictTone.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "lockstep/compare/report.h"

namespace lockstep {

enum class CampaignOutcome : std::uint8_t {
  kPass,               // "pass": every comparison passed its gates (and the control was caught)
  kFail,               // "fail": a gate failed
  kStopped,            // "stopped": a stop rule fired; attribution stopped
  kInsensitive,        // "insensitive": the positive control passed every gate
  kControlNotApplied,  // "control_not_applied": the control's injection never fired
  kNotChecked,         // "not_checked": something the verdict rule needs compared nothing
                       // (lockstep/harness/verdict.h)
};

// The ledger's spelling of each verdict.
const char* CampaignOutcomeName(CampaignOutcome v);
// The verdict spelled `word` exactly; nullopt for anything else (a word of a newer build).
std::optional<CampaignOutcome> ParseCampaignOutcome(std::string_view word);
// kPass for a pass; kFail for fail, not_checked, insensitive and control_not_applied (each exits
// 1: a CI gate that checked nothing must not look like a warning); kWarn for stopped, an
// unfinished campaign (nullopt) and any word this build does not know.
VerdictTone CampaignOutcomeTone(std::optional<CampaignOutcome> v);

}  // namespace lockstep
