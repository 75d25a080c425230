// The campaign's verdict words as a type (harness/campaign_outcome.h): every word round-trips, and
// the box's colour follows the verdict (compare/ draws the box knowing only the tone).
#include "lockstep/harness/campaign_outcome.h"

#include <gtest/gtest.h>

#include <string>

namespace lockstep {
namespace {

TEST(CampaignOutcome, EveryWordRoundTripsAndHasItsTone) {
  struct Row {
    CampaignOutcome v;
    const char* word;
    VerdictTone tone;
  };
  const Row rows[] = {
      {CampaignOutcome::kPass, "pass", VerdictTone::kPass},
      {CampaignOutcome::kFail, "fail", VerdictTone::kFail},
      {CampaignOutcome::kStopped, "stopped", VerdictTone::kWarn},
      {CampaignOutcome::kInsensitive, "insensitive", VerdictTone::kFail},
      {CampaignOutcome::kControlNotApplied, "control_not_applied", VerdictTone::kFail},
      {CampaignOutcome::kNotChecked, "not_checked", VerdictTone::kFail}};
  for (const Row& r : rows) {
    EXPECT_STREQ(CampaignOutcomeName(r.v), r.word);
    ASSERT_EQ(ParseCampaignOutcome(r.word), r.v) << r.word;
    EXPECT_EQ(CampaignOutcomeTone(r.v), r.tone) << r.word;
  }
  EXPECT_FALSE(ParseCampaignOutcome("PASS").has_value());
  EXPECT_FALSE(ParseCampaignOutcome("").has_value());
  EXPECT_EQ(CampaignOutcomeTone(std::nullopt), VerdictTone::kWarn) << "unfinished or unknown";
}

TEST(CampaignOutcome, TheBoxIsColouredByTheToneNotTheWord) {
  VerdictBox v;
  v.status = "insensitive";
  v.label = "INSENSITIVE";
  v.tone = CampaignOutcomeTone(ParseCampaignOutcome(v.status));
  EXPECT_NE(HtmlVerdictBox(v).find("verdict verdict-fail"), std::string::npos);
  v.tone = VerdictTone::kWarn;
  EXPECT_NE(HtmlVerdictBox(v).find("verdict verdict-warn"), std::string::npos);
  v.status = "pass";
  v.tone = VerdictTone::kPass;
  EXPECT_NE(HtmlVerdictBox(v).find("verdict verdict-pass"), std::string::npos);
}

}  // namespace
}  // namespace lockstep
