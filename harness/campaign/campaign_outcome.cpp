#include "lockstep/harness/campaign_outcome.h"

#include <array>

namespace lockstep {
namespace {

constexpr std::array<CampaignOutcome, 6> kAll = {CampaignOutcome::kPass,
                                                 CampaignOutcome::kFail,
                                                 CampaignOutcome::kStopped,
                                                 CampaignOutcome::kInsensitive,
                                                 CampaignOutcome::kControlNotApplied,
                                                 CampaignOutcome::kNotChecked};

}  // namespace

const char* CampaignOutcomeName(CampaignOutcome v) {
  switch (v) {
    case CampaignOutcome::kPass:
      return "pass";
    case CampaignOutcome::kFail:
      return "fail";
    case CampaignOutcome::kStopped:
      return "stopped";
    case CampaignOutcome::kInsensitive:
      return "insensitive";
    case CampaignOutcome::kControlNotApplied:
      return "control_not_applied";
    case CampaignOutcome::kNotChecked:
      return "not_checked";
  }
  return "?";
}

std::optional<CampaignOutcome> ParseCampaignOutcome(std::string_view word) {
  for (CampaignOutcome v : kAll)
    if (word == CampaignOutcomeName(v)) return v;
  return std::nullopt;
}

VerdictTone CampaignOutcomeTone(std::optional<CampaignOutcome> v) {
  if (!v) return VerdictTone::kWarn;
  switch (*v) {
    case CampaignOutcome::kPass:
      return VerdictTone::kPass;
    case CampaignOutcome::kFail:
    case CampaignOutcome::kInsensitive:
    case CampaignOutcome::kControlNotApplied:
    case CampaignOutcome::kNotChecked:
      return VerdictTone::kFail;
    case CampaignOutcome::kStopped:
      break;
  }
  return VerdictTone::kWarn;
}

}  // namespace lockstep
