// Campaign plans (harness/campaign.h): strict TOML parsing with file:line:column messages, the
// default stop rule, the positive-control arm, effective configs and the needle prompt.
#include "lockstep/harness/campaign.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "lockstep/instrument/fingerprint.h"
#include "test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

// A 48-layer checkpoint config (no weights: parsing only reads config.json).
const char* const& kModelConfig = test::k80BConfigJson;

void WriteText(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

// A plan folder with a prompt, a token file and a model folder, removed at exit.
class PlanDir : public ::testing::Environment {
 public:
  static const fs::path& Path() {
    static const fs::path dir = [] {
      fs::path d =
          fs::temp_directory_path() / ("lockstep_campaign_test_" + std::to_string(::getpid()));
      fs::remove_all(d);
      WriteText(d / "prompts" / "demo.txt", "Where do two runs first differ?\n");
      WriteText(d / "tokens.txt", "1 2 3 4\n");
      WriteText(d / "models" / "m48" / "config.json", kModelConfig);
      return d;
    }();
    return dir;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(Path(), ec);
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new PlanDir);

Result<Campaign> Parse(const std::string& text) {
  return ParseCampaign(text, "plan.toml", PlanDir::Path().string());
}

// "plan.toml:LINE:COL" of the first occurrence of `what` in `text` (1-based, bytes).
std::string Loc(const std::string& text, const std::string& what, bool last = false) {
  const std::size_t at = last ? text.rfind(what) : text.find(what);
  EXPECT_NE(at, std::string::npos) << what;
  if (at == std::string::npos) return "?";
  const std::size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
  const std::size_t col = line_start == std::string::npos || at == 0 ? at + 1 : at - line_start;
  const auto line =
      1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n');
  return "plan.toml:" + std::to_string(line) + ":" + std::to_string(col) + ":";
}

void ExpectInvalid(const std::string& text, const std::string& where, const std::string& detail) {
  auto r = Parse(text);
  ASSERT_FALSE(r.ok()) << "parsed:\n" << text;
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << r.status().ToString();
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_EQ(r.status().message().rfind(where, 0), 0u)
      << "want " << where << " in: " << r.status().message();
  EXPECT_NE(r.status().message().find(detail), std::string::npos)
      << "want '" << detail << "' in: " << r.status().message();
}

const std::string kHead = "name = \"aa\"\nquestion = \"Do two runs match?\"\n";
const std::string kModel = "[model]\npreset = \"tiny\"\n";
const std::string kRequest = "[request]\nprompt = \"hello there\"\n";
const std::string kArmA1 = "[[arm]]\nname = \"A1\"\n";
const std::string kArmA2 = "[[arm]]\nname = \"A2\"\nbaseline = \"A1\"\ndecision = \"aa_stable\"\n";
const std::string kPlain = kHead + kModel + kRequest + kArmA1 + kArmA2;

const std::string kFull = R"(# every key
name = "aa-full"
question = "Do two fixed-config runs match?"
hypothesis = "Early state matches; later path varies."
control = "delay:ms=1"
min_timing_repeats = 8

[model]
path = "models/m48"

[request]
prompt_file = "prompts/demo.txt"

[engine]
spec = 4
draft_policy = "adaptive"
split = [12, 24, 36]
pcie_frac = 1
kv_dtype = "int8"
inject = ["delay:stage=2:window=5:ms=20"]

[export]
windows = "0,3,5"
points = ["pre_verify", "commit"]
sample_ms = 50

[thresholds]
nrmse_max = 3e-4
kl_max = 2e-5
[thresholds.kinds]
ssm_state = 1e-3
logits = 5e-4

[gates]
output = true
state = true
path = { within = 26 }
aggregate_timing = { rel_max = 0.10 }
window_timing = { abs_ms = 2.0, rel = 0.5 }
resources = { no_swap = false, min_free_mib = 256 }
max_skipped = 4

[[arm]]
name = "A1"

[[arm]]
name = "A2"
baseline = "A1"
decision = "aa_stable"

[[arm]]
name = "T1"
mode = "timing"
repeat = 6
baseline = "A1"
decision = "timing_stable"

[[arm]]
name = "B8192"
baseline = "A1"
require = ["aa_stable", "timing_stable"]
max_skipped = -1
[arm.engine]
prefill_chunk = 8192
mtp = false
split = [10, 20, 30]

[[stop]]
name = "unstable_aa"
when = "all"
predicates = ["path_diverged", "window_timing_unstable"]
message = "unstable A/A => stop attribution"

[[stop]]
name = "guard"
predicates = ["resource_guard"]
)";

TEST(Campaign, FullPlanParsesEveryField) {
  auto r = Parse(kFull);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Campaign& c = *r;
  EXPECT_EQ(c.name, "aa-full");
  EXPECT_EQ(c.question, "Do two fixed-config runs match?");
  EXPECT_EQ(c.hypothesis, "Early state matches; later path varies.");
  EXPECT_EQ(c.control, "delay:ms=1");
  EXPECT_EQ(c.min_timing_repeats, 8);
  EXPECT_EQ(c.model.path, (PlanDir::Path() / "models" / "m48").string());
  EXPECT_TRUE(c.model.preset.empty());
  EXPECT_EQ(c.request.prompt_file, (PlanDir::Path() / "prompts" / "demo.txt").string());
  EXPECT_TRUE(fs::path(c.request.prompt_file).is_absolute());
  EXPECT_FALSE(c.request.needle.has_value());
  EXPECT_EQ(c.engine["spec"], 4);
  EXPECT_EQ(c.engine["draft_policy"], "adaptive");
  EXPECT_EQ(c.engine["split"], nlohmann::json({12, 24, 36}));
  EXPECT_TRUE(c.engine["pcie_frac"].is_number_float());
  EXPECT_EQ(c.engine["inject"], nlohmann::json({"delay:stage=2:window=5:ms=20"}));
  EXPECT_EQ(c.export_plan.windows, "0,3,5");
  EXPECT_EQ(c.export_plan.points, (std::vector<std::string>{"pre_verify", "commit"}));
  EXPECT_EQ(c.export_plan.sample_ms, 50);
  EXPECT_DOUBLE_EQ(c.thresholds.nrmse_max, 3e-4);
  EXPECT_DOUBLE_EQ(c.thresholds.kl_max, 2e-5);
  EXPECT_EQ(c.thresholds.nrmse_by_kind.size(), 2u);
  EXPECT_DOUBLE_EQ(c.thresholds.nrmse_by_kind.at("ssm_state"), 1e-3);
  EXPECT_DOUBLE_EQ(c.thresholds.nrmse_by_kind.at("logits"), 5e-4);
  EXPECT_TRUE(c.gates.output);
  EXPECT_TRUE(c.gates.state);
  EXPECT_EQ(c.gates.path_within, 26);
  EXPECT_DOUBLE_EQ(c.gates.aggregate_rel_max.value_or(-1), 0.10);
  EXPECT_DOUBLE_EQ(c.gates.window_abs_ms.value_or(-1), 2.0);
  EXPECT_DOUBLE_EQ(c.gates.window_rel.value_or(-1), 0.5);
  EXPECT_TRUE(c.gates.resources);
  EXPECT_FALSE(c.gates.no_swap);
  EXPECT_EQ(c.gates.min_free_mib, 256);
  EXPECT_EQ(c.gates.max_skipped, 4);

  ASSERT_EQ(c.arms.size(), 5u);  // 4 declared + control
  EXPECT_EQ(c.arms[0].name, "A1");
  EXPECT_EQ(c.arms[0].mode, "state");
  EXPECT_EQ(c.arms[0].repeat, 1);
  EXPECT_TRUE(c.arms[0].baseline.empty());
  EXPECT_EQ("plan.toml:" + std::to_string(c.arms[0].line) + ":1:",
            Loc(kFull, "[[arm]]\nname = \"A1\""));
  EXPECT_EQ(c.arms[1].baseline, "A1");
  EXPECT_EQ(c.arms[1].decision, "aa_stable");
  EXPECT_EQ(c.arms[2].mode, "timing");
  EXPECT_EQ(c.arms[2].repeat, 6);
  EXPECT_EQ(c.arms[3].name, "B8192");
  EXPECT_EQ(c.arms[3].require, (std::vector<std::string>{"aa_stable", "timing_stable"}));
  EXPECT_EQ(c.arms[3].engine["prefill_chunk"], 8192);
  EXPECT_EQ(c.arms[3].engine["mtp"], false);
  EXPECT_FALSE(c.arms[3].control);
  EXPECT_EQ(c.arms[3].max_skipped, -1);
  EXPECT_FALSE(c.arms[1].max_skipped.has_value());  // the [gates] value applies
  EXPECT_TRUE(c.arms[4].control);

  ASSERT_EQ(c.stop.size(), 2u);
  EXPECT_FALSE(c.default_stop);
  EXPECT_EQ(c.stop[0].name, "unstable_aa");
  EXPECT_TRUE(c.stop[0].all);
  EXPECT_EQ(c.stop[0].predicates,
            (std::vector<std::string>{"path_diverged", "window_timing_unstable"}));
  EXPECT_EQ(c.stop[0].message, "unstable A/A => stop attribution");
  EXPECT_FALSE(c.stop[1].all);
  EXPECT_FALSE(c.stop[1].message.empty());

  EXPECT_EQ(c.plan_text, kFull);
  EXPECT_EQ(c.plan_sha256, Sha256Hex(std::string_view(kFull)));
  EXPECT_EQ(c.plan_sha256.size(), 64u);
  EXPECT_EQ(c.plan_dir, PlanDir::Path().string());
}

TEST(Campaign, PresetModelAndOtherRequests) {
  auto r = Parse(kHead + "[model]\npreset = \"small\"\nseed = 9\ninduction = true\n" +
                 "[request]\nneedle = { tokens = 512, needles = 6, seed = 3 }\n" + kArmA1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->model.preset, "small");
  EXPECT_EQ(r->model.seed, 9u);
  EXPECT_TRUE(r->model.induction);
  ASSERT_TRUE(r->request.needle.has_value());
  EXPECT_EQ(r->request.needle->tokens, 512);
  EXPECT_EQ(r->request.needle->needles, 6);
  EXPECT_EQ(r->request.needle->seed, 3u);
  EXPECT_TRUE(r->stop.empty());  // nothing requires a decision
  EXPECT_FALSE(r->default_stop);

  auto t = Parse(kHead + kModel + "[request]\ntoken_file = \"./prompts/../tokens.txt\"\n" + kArmA1);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->request.token_file, (PlanDir::Path() / "tokens.txt").string());
  // Defaults.
  EXPECT_EQ(t->export_plan.windows, "0-2");
  EXPECT_EQ(t->min_timing_repeats, 6);
  EXPECT_FALSE(t->gates.path_within.has_value());
  EXPECT_TRUE(t->engine.empty());
}

TEST(Campaign, LoadCampaignReadsTheFileAndResolvesAgainstItsFolder) {
  const fs::path plan = PlanDir::Path() / "plans" / "load.toml";
  const std::string text =
      kHead + kModel + "[request]\nprompt_file = \"../prompts/demo.txt\"\n" + kArmA1;
  WriteText(plan, text);
  auto r = LoadCampaign(plan.string());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->plan_dir, (PlanDir::Path() / "plans").string());
  EXPECT_EQ(r->request.prompt_file, (PlanDir::Path() / "prompts" / "demo.txt").string());
  EXPECT_EQ(r->plan_sha256, Sha256Hex(std::string_view(text)));
  auto missing = LoadCampaign((PlanDir::Path() / "nope.toml").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().exit_code(), 2);
}

TEST(Campaign, UnknownTopLevelKey) {
  const std::string text = kHead + "colour = \"blue\"\n" + kModel + kRequest + kArmA1;
  ExpectInvalid(text, Loc(text, "colour"), "unknown key 'colour'");
}

TEST(Campaign, UnknownKeyInGates) {
  const std::string text = kPlain + "[gates]\noutput = true\nouptut = true\n";
  ExpectInvalid(text, Loc(text, "ouptut"), "unknown key 'ouptut' in [gates]");
  const std::string inline_text = kPlain + "[gates]\npath = { within = 0, whithin = 1 }\n";
  ExpectInvalid(inline_text, Loc(inline_text, "whithin"), "unknown key 'whithin' in [gates.path]");
}

TEST(Campaign, WrongType) {
  const std::string text = kHead + kModel + kRequest + "[engine]\nspec = \"4\"\n" + kArmA1;
  ExpectInvalid(text, Loc(text, "\"4\""), "'spec' must be an integer, got string");
  const std::string repeat =
      kHead + kModel + kRequest + "[[arm]]\nname = \"T\"\nmode = \"timing\"\nrepeat = 1.5\n";
  ExpectInvalid(repeat, Loc(repeat, "1.5"), "'repeat' must be an integer, got floating-point");
  const std::string gate = kPlain + "[gates]\noutput = \"yes\"\n";
  ExpectInvalid(gate, Loc(gate, "\"yes\""), "'output' must be true or false, got string");
  const std::string split = kHead + kModel + kRequest + "[engine]\nsplit = [2, \"4\"]\n" + kArmA1;
  ExpectInvalid(split, Loc(split, "\"4\""), "'split' must be an array of integers");
  const std::string arm_table = kHead + kModel + kRequest + "[arm]\nname = \"A1\"\n";
  ExpectInvalid(arm_table, "plan.toml:", "'arm' must be an array of tables");
}

TEST(Campaign, ArmOverridesUnknownEngineField) {
  const std::string text = kHead + kModel + kRequest + kArmA1 +
                           "[[arm]]\nname = \"B\"\nbaseline = \"A1\"\n" +
                           "[arm.engine]\nprefill_chunk = 8192\nprefil_chunk = 8192\n";
  ExpectInvalid(text, Loc(text, "prefil_chunk"),
                "arm 'B' [arm.engine]: unknown engine field 'prefil_chunk'");
  const std::string model = kHead + kModel + kRequest + "[engine]\nmodel = \"x\"\n" + kArmA1;
  ExpectInvalid(model, Loc(model, "model = "), "'model' is set by the [model] table");
  const std::string replay =
      kHead + kModel + kRequest + kArmA1 + "[arm.engine]\nreplay_path = \"w.jsonl\"\n";
  ExpectInvalid(replay, Loc(replay, "replay_path"), "'replay_path' cannot be set");
}

TEST(Campaign, StopRuleNamingAnUnknownPredicate) {
  const std::string text =
      kPlain + "[[stop]]\nname = \"s\"\npredicates = [\"path_diverged\", \"path_diverges\"]\n";
  ExpectInvalid(text, Loc(text, "\"path_diverges\""),
                "unknown predicate 'path_diverges' (valid: path_diverged,");
}

TEST(Campaign, MissingModelOrRequest) {
  ExpectInvalid(kHead + kRequest + kArmA1, "plan.toml:1:1:", "missing [model] table");
  ExpectInvalid(kHead + kModel + kArmA1, "plan.toml:1:1:", "missing [request] table");
  ExpectInvalid(kHead + kModel + kRequest, "plan.toml:1:1:", "missing [[arm]]");
  ExpectInvalid("question = \"q\"\n" + kModel + kRequest + kArmA1,
                "plan.toml:1:1:", "missing required key 'name'");
}

TEST(Campaign, BothPresetAndPath) {
  const std::string text =
      kHead + "[model]\npreset = \"tiny\"\npath = \"models/m48\"\n" + kRequest + kArmA1;
  ExpectInvalid(text, Loc(text, "[model]"), "exactly one of 'path' or 'preset', not both");
  const std::string neither = kHead + "[model]\nseed = 1\n" + kRequest + kArmA1;
  ExpectInvalid(neither, Loc(neither, "[model]"), "give one of 'path'");
  const std::string missing = kHead + "[model]\npath = \"models/none\"\n" + kRequest + kArmA1;
  ExpectInvalid(missing, Loc(missing, "\"models/none\""), "folder 'models/none' not found");
  const std::string no_config = kHead + "[model]\npath = \"prompts\"\n" + kRequest + kArmA1;
  ExpectInvalid(no_config, Loc(no_config, "\"prompts\""), "config.json");
  const std::string preset = kHead + "[model]\npreset = \"huge\"\n" + kRequest + kArmA1;
  ExpectInvalid(preset, Loc(preset, "\"huge\""), "huge");
  const std::string seed = kHead + "[model]\npath = \"models/m48\"\nseed = 3\n" + kRequest + kArmA1;
  ExpectInvalid(seed, Loc(seed, "3\n"), "'seed' applies to a synthetic 'preset' model only");
}

TEST(Campaign, RequestNeedsExactlyOneSource) {
  const std::string two =
      kHead + kModel + "[request]\nprompt = \"a\"\ntoken_file = \"tokens.txt\"\n" + kArmA1;
  ExpectInvalid(two, Loc(two, "[request]"),
                "give exactly one of prompt, prompt_file, token_file, chat or needle (got 2)");
  const std::string missing =
      kHead + kModel + "[request]\nprompt_file = \"prompts/none.txt\"\n" + kArmA1;
  ExpectInvalid(missing, Loc(missing, "\"prompts/none.txt\""), "file 'prompts/none.txt' not found");
  const std::string small =
      kHead + kModel + "[request]\nneedle = { tokens = 100, needles = 6 }\n" + kArmA1;
  ExpectInvalid(small, Loc(small, "100"), "need at least 215 tokens");
  const std::string range =
      kHead + kModel + "[request]\nneedle = { tokens = 512, needles = 65 }\n" + kArmA1;
  ExpectInvalid(range, Loc(range, "65"), "'needles' must be in [1, 64], got 65");
  const std::string few = kHead + kModel + "[request]\nneedle = { tokens = 63 }\n" + kArmA1;
  ExpectInvalid(few, Loc(few, "63"), "'tokens' must be in [64, 1048576], got 63");
}

TEST(Campaign, BaselineNamingALaterArm) {
  const std::string text = kHead + kModel + kRequest +
                           "[[arm]]\nname = \"A1\"\nbaseline = \"A2\"\n" +
                           "[[arm]]\nname = \"A2\"\n";
  ExpectInvalid(text, Loc(text, "\"A2\""),
                "arm 'A1': baseline 'A2' is not an earlier arm (earlier arms: none)");
  const std::string self =
      kHead + kModel + kRequest + "[[arm]]\nname = \"A1\"\nbaseline = \"A1\"\n";
  ExpectInvalid(self, Loc(self, "\"A1\"", /*last=*/true), "an arm cannot be its own baseline");
}

TEST(Campaign, RequireNamingAnUnknownDecision) {
  const std::string text =
      kPlain +
      "[[arm]]\nname = \"B\"\nbaseline = \"A1\"\nrequire = [\"aa_stable\", \"aa_sable\"]\n";
  ExpectInvalid(text, Loc(text, "\"aa_sable\""),
                "requires decision 'aa_sable', which no earlier arm declares");
  const std::string no_baseline =
      kHead + kModel + kRequest + "[[arm]]\nname = \"A1\"\ndecision = \"d\"\n";
  ExpectInvalid(no_baseline, Loc(no_baseline, "\"d\""), "'decision' needs a 'baseline'");
}

TEST(Campaign, DuplicateArmName) {
  const std::string text = kPlain + "[[arm]]\nname = \"A2\"\n";
  ExpectInvalid(text, Loc(text, "\"A2\"", /*last=*/true),
                "duplicate arm name 'A2' (first declared at line 9)");
  const std::string bad_name = kHead + kModel + kRequest + "[[arm]]\nname = \"A 1\"\n";
  ExpectInvalid(bad_name, Loc(bad_name, "\"A 1\""), "must match [A-Za-z0-9_.-]+");
}

TEST(Campaign, StateArmWithRepeat) {
  const std::string text = kHead + kModel + kRequest + "[[arm]]\nname = \"A1\"\nrepeat = 2\n";
  ExpectInvalid(text, Loc(text, "2\n"), "a state arm runs once ('repeat' must be 1, got 2)");
  auto ok =
      Parse(kHead + kModel + kRequest + "[[arm]]\nname = \"T\"\nmode = \"timing\"\nrepeat = 2\n");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->arms[0].repeat, 2);
}

TEST(Campaign, BadEngineValueCaughtAtParseTime) {
  const std::string arm =
      kPlain + "[[arm]]\nname = \"B\"\nbaseline = \"A1\"\n[arm.engine]\nmax_new = 8\nspec = -1\n";
  ExpectInvalid(arm, Loc(arm, "-1"),
                "arm 'B': --spec: expected 0 .. 64 draft tokens (engine key 'spec')");
  const std::string campaign =
      kHead + kModel + kRequest + "[engine]\nthreads = 2\nspec = -1\n" + kArmA1;
  ExpectInvalid(campaign, Loc(campaign, "-1"), "(engine key 'spec' in [engine])");
  const std::string policy =
      kHead + kModel + kRequest + "[engine]\ndraft_policy = \"greedy\"\n" + kArmA1;
  ExpectInvalid(policy, Loc(policy, "\"greedy\""), "expected static, adaptive or latency");
  // The tiny preset has 8 layers: a split past them fails before anything runs.
  const std::string split =
      kHead + kModel + kRequest + kArmA1 + "[arm.engine]\nsplit = [2, 4, 9]\n";
  ExpectInvalid(split, Loc(split, "[2, 4, 9]"), "--split");
  const std::string inject =
      kHead + kModel + kRequest + "[engine]\ninject = [\"sleep:ms=3\"]\n" + kArmA1;
  ExpectInvalid(inject, Loc(inject, "[\"sleep"), "sleep:ms=3");
}

TEST(Campaign, TomlSyntaxError) {
  const std::string text = kHead + "[model\npreset = \"tiny\"\n";
  ExpectInvalid(text, "plan.toml:3:7:", "TOML syntax error: Error while parsing table header");
  const std::string dup = kHead + "name = \"again\"\n";
  ExpectInvalid(dup, "plan.toml:3:", "TOML syntax error");
  ExpectInvalid(kHead + "x = \"unterminated\n", "plan.toml:3:", "TOML syntax error");
  // Table headers that start with a non-key character (toml++ 3.3 asserts on these without NDEBUG).
  ExpectInvalid(kHead + "[[=arm]]\nname = \"A1\"\n", "plan.toml:3:3:", "TOML syntax error");
  ExpectInvalid(kHead + "[ #model]\n", "plan.toml:3:", "TOML syntax error");
}

TEST(Campaign, OtherSectionsAreChecked) {
  const std::string kind = kPlain + "[thresholds.kinds]\nssm_states = 1e-3\n";
  ExpectInvalid(kind, Loc(kind, "ssm_states"), "unknown item kind 'ssm_states'");
  const std::string windows = kPlain + "[export]\nwindows = \"0-\"\n";
  ExpectInvalid(windows, Loc(windows, "\"0-\""), "windows: expected all, none or a list");
  const std::string point = kPlain + "[export]\npoints = [\"commit\", \"verify\"]\n";
  ExpectInvalid(point, Loc(point, "\"verify\""), "unknown point 'verify'");
  const std::string when =
      kPlain + "[[stop]]\nname = \"s\"\nwhen = \"most\"\npredicates = [\"swap_used\"]\n";
  ExpectInvalid(when, Loc(when, "\"most\""), "'when' must be any or all");
  const std::string control =
      kPlain.substr(0, kHead.size()) + "control = \"wobble:ms=1\"\n" + kPlain.substr(kHead.size());
  ExpectInvalid(control, Loc(control, "\"wobble"), "'control'");
  const std::string repeats = kHead + "min_timing_repeats = 1\n" + kModel + kRequest + kArmA1;
  ExpectInvalid(repeats, Loc(repeats, "1\n"), "'min_timing_repeats' must be in [2,");
  const std::string nan = kPlain + "[thresholds]\nnrmse_max = nan\n";
  ExpectInvalid(nan, Loc(nan, "nan"), "'nrmse_max' must be a finite number >= 0");
  const std::string window = kPlain + "[gates]\nwindow_timing = {}\n";
  ExpectInvalid(window, Loc(window, "{}"), "give abs_ms, rel or both");
}

TEST(Campaign, DefaultStopRuleForAaThenB) {
  auto plain = Parse(kPlain);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_TRUE(plain->stop.empty());
  EXPECT_FALSE(plain->default_stop);

  auto aab =
      Parse(kPlain + "[[arm]]\nname = \"B\"\nbaseline = \"A1\"\nrequire = [\"aa_stable\"]\n" +
            "[arm.engine]\nprefill_chunk = 8192\n");
  ASSERT_TRUE(aab.ok()) << aab.status().ToString();
  EXPECT_TRUE(aab->default_stop);
  ASSERT_EQ(aab->stop.size(), 1u);
  EXPECT_EQ(aab->stop[0].name, "unstable_aa");
  EXPECT_FALSE(aab->stop[0].all);
  EXPECT_EQ(
      aab->stop[0].predicates,
      (std::vector<std::string>{"path_diverged", "window_timing_unstable",
                                "aggregate_timing_failed", "state_failed", "output_differs"}));
  EXPECT_EQ(aab->stop[0].message, "unstable A/A => stop attribution (default rule)");
  for (const auto& p : aab->stop[0].predicates)
    EXPECT_NE(std::find(StopPredicates().begin(), StopPredicates().end(), p),
              StopPredicates().end());

  auto declared =
      Parse(kPlain + "[[arm]]\nname = \"B\"\nbaseline = \"A1\"\nrequire = [\"aa_stable\"]\n" +
            "[[stop]]\nname = \"mine\"\npredicates = [\"arm_failed\"]\n");
  ASSERT_TRUE(declared.ok()) << declared.status().ToString();
  EXPECT_FALSE(declared->default_stop);
  ASSERT_EQ(declared->stop.size(), 1u);
  EXPECT_EQ(declared->stop[0].name, "mine");
}

TEST(Campaign, ControlArmAppended) {
  const std::string text = kHead + "control = \"delay:ms=1\"\n" + kModel + kRequest +
                           "[engine]\ninject = [\"delay:stage=2:window=5:ms=20\"]\nspec = 2\n" +
                           "[[arm]]\nname = \"A1\"\n[arm.engine]\nprefill_chunk = 64\n" + kArmA2;
  auto r = Parse(text);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->arms.size(), 3u);
  const ArmSpec& control = r->arms.back();
  EXPECT_EQ(control.name, "control");
  EXPECT_EQ(control.mode, "state");
  EXPECT_EQ(control.baseline, "A1");
  EXPECT_TRUE(control.control);
  EXPECT_EQ(control.repeat, 1);
  EXPECT_TRUE(control.decision.empty());
  EXPECT_EQ(control.engine["inject"],
            nlohmann::json({"delay:stage=2:window=5:ms=20", "delay:ms=1"}));
  EXPECT_EQ(control.engine["prefill_chunk"],
            64);  // the first arm's overrides: only the injection differs
  auto cfg = EffectiveConfig(*r, control, "/m");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->inject, (std::vector<std::string>{"delay:stage=2:window=5:ms=20", "delay:ms=1"}));
  EXPECT_EQ(cfg->spec, 2);
  EXPECT_EQ(cfg->prefill_chunk, 64);
  EXPECT_FALSE(r->arms[0].control);

  const std::string taken = kHead + "control = \"delay:ms=1\"\n" + kModel + kRequest + kArmA1 +
                            "[[arm]]\nname = \"control\"\nbaseline = \"A1\"\n";
  ExpectInvalid(taken, Loc(taken, "\"delay:ms=1\""), "already has that name");
  const std::string timing = kHead + "control = \"delay:ms=1\"\n" + kModel + kRequest +
                             "[[arm]]\nname = \"T\"\nmode = \"timing\"\n";
  ExpectInvalid(timing, Loc(timing, "\"delay:ms=1\""), "to be a state arm");
}

TEST(Campaign, EffectiveConfigMergesArmOverCampaignOverDefaults) {
  auto r = Parse(kHead + kModel + kRequest +
                 "[engine]\nspec = 4\ndraft_policy = \"adaptive\"\nsplit = [2, 4, 6]\n" +
                 "inject = [\"delay:stage=2:window=5:ms=20\"]\n" + kArmA1 +
                 "[[arm]]\nname = \"B\"\nbaseline = \"A1\"\n" +
                 "[arm.engine]\nspec = 2\nsplit = [3, 5, 7]\ninject = []\ncuda_attn_split = 0\n");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const EngineConfig defaults;
  auto a1 = EffectiveConfig(*r, r->arms[0], "/models/tiny");
  ASSERT_TRUE(a1.ok()) << a1.status().ToString();
  EXPECT_EQ(a1->model, "/models/tiny");
  EXPECT_EQ(a1->spec, 4);
  EXPECT_EQ(a1->draft_policy, "adaptive");
  EXPECT_EQ(a1->split, (std::vector<int>{2, 4, 6}));
  EXPECT_EQ(a1->inject.size(), 1u);
  EXPECT_EQ(a1->prefill_chunk, defaults.prefill_chunk);
  EXPECT_EQ(a1->max_new, defaults.max_new);
  auto b = EffectiveConfig(*r, r->arms[1], "/models/tiny");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->spec, 2);                             // arm over campaign
  EXPECT_EQ(b->draft_policy, "adaptive");            // campaign over defaults
  EXPECT_EQ(b->split, (std::vector<int>{3, 5, 7}));  // arrays replace
  EXPECT_TRUE(b->inject.empty());
  EXPECT_EQ(b->stages, defaults.stages);
  EXPECT_EQ(a1->cuda_attn_split, 512);
  EXPECT_EQ(b->cuda_attn_split, 0);

  Campaign c;
  ArmSpec bad;
  bad.name = "X";
  bad.engine = {{"spec", 65}};
  auto e = EffectiveConfig(c, bad, "/m");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().exit_code(), 2);
  EXPECT_NE(e.status().message().find("arm 'X'"), std::string::npos);
}

#ifdef LOCKSTEP_SOURCE_DIR
TEST(Campaign, ReadmeExampleParses) {
  // campaigns/README.md documents the format with an annotated example: it must stay a valid plan.
  const fs::path readme = fs::path(LOCKSTEP_SOURCE_DIR) / "campaigns" / "README.md";
  std::ifstream in(readme);
  ASSERT_TRUE(in.good()) << readme;
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t begin = doc.find("```toml\n");
  ASSERT_NE(begin, std::string::npos);
  const std::size_t end = doc.find("```", begin + 8);
  ASSERT_NE(end, std::string::npos);
  auto r = ParseCampaign(doc.substr(begin + 8, end - begin - 8), "README.md",
                         readme.parent_path().string());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->name, "aa-smoke");
  ASSERT_EQ(r->arms.size(), 5u);
  EXPECT_TRUE(r->arms.back().control);
  for (const ArmSpec& arm : r->arms) EXPECT_TRUE(EffectiveConfig(*r, arm, "/m").ok()) << arm.name;
}

TEST(Campaign, EveryShippedPlanParses) {
  // The plans in campaigns/ (aa-cuda.toml included: CI has no GPU to run it, so this is its only
  // check here): each parses and gives every arm a valid effective engine config.
  int n = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(LOCKSTEP_SOURCE_DIR) / "campaigns")) {
    if (entry.path().extension() != ".toml") continue;
    ++n;
    auto r = LoadCampaign(entry.path().string());
    ASSERT_TRUE(r.ok()) << entry.path() << ": " << r.status().ToString();
    for (const ArmSpec& arm : r->arms) {
      auto e = EffectiveConfig(*r, arm, "/m");
      EXPECT_TRUE(e.ok()) << entry.path() << " arm " << arm.name << ": " << e.status().ToString();
    }
  }
  EXPECT_GE(n, 5);
}
#endif

std::size_t CountOf(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Campaign, NeedleHaystackPrompt) {
  for (int tokens : {64, 65, 97, 215, 512, 4096, 130658}) {
    for (int needles : {1, 2, 6}) {
      if (tokens < 29 + 31 * needles) continue;
      NeedleSpec spec{tokens, needles, 20261018};
      const std::string text = NeedleHaystackPrompt(spec);
      ASSERT_EQ(text.size(), static_cast<std::size_t>(tokens)) << tokens << " " << needles;
      EXPECT_EQ(text, NeedleHaystackPrompt(spec));
      for (char ch : text) ASSERT_TRUE(ch >= 0x20 && ch <= 0x7e) << static_cast<int>(ch);
      EXPECT_EQ(CountOf(text, "The code of vault "), static_cast<std::size_t>(needles));
      // The question ends the text and asks about a vault that has a needle.
      const std::string q = "What is the code of vault ";
      ASSERT_EQ(text.rfind(q), text.size() - 29) << text;
      EXPECT_EQ(text.back(), '?');
      const std::string vault = text.substr(text.size() - 3, 2);
      EXPECT_EQ(CountOf(text, "The code of vault " + vault + " is "), 1u) << text;
      // Every needle is a whole sentence: "The code of vault KK is NNNNN. "
      std::set<std::string> vaults;
      for (std::size_t at = text.find("The code of vault "); at != std::string::npos;
           at = text.find("The code of vault ", at + 1)) {
        const std::string sentence = text.substr(at, 31);
        EXPECT_EQ(sentence.substr(20, 4), " is ") << sentence;
        EXPECT_EQ(sentence.substr(29), ". ") << sentence;
        vaults.insert(sentence.substr(18, 2));
      }
      EXPECT_EQ(vaults.size(), static_cast<std::size_t>(needles));
    }
  }
  const NeedleSpec a{512, 6, 3}, b{512, 6, 4};
  EXPECT_NE(NeedleHaystackPrompt(a), NeedleHaystackPrompt(b));
  EXPECT_EQ(NeedleHaystackPrompt(a).size(), NeedleHaystackPrompt(b).size());
}

TEST(Campaign, NeedleHaystackPromptIsPinned) {
  // The generator is part of the plan (SplitMix64, no std:: distributions): the same spec gives the
  // same bytes on every platform and standard library. A change here changes every needle campaign.
  const std::string text = NeedleHaystackPrompt(NeedleSpec{256, 2, 7});
  EXPECT_EQ(text.substr(0, 62), "The code of vault 67 is 69346. The code of vault 11 is 92203. ");
  EXPECT_EQ(text.substr(text.size() - 29), "What is the code of vault 67?");
  EXPECT_EQ(Sha256Hex(std::string_view(text)),
            "58791bd7ee14a557af27dcd552aefaee6318d5c8857aae6a0708862ba3756689");
  // The shipped replica plan's request and the full-length one (many filler draws), recorded from
  // the generator's own SplitMix64 before it was rebuilt on the engine's finaliser.
  EXPECT_EQ(Sha256Hex(std::string_view(NeedleHaystackPrompt(NeedleSpec{4096, 6, 20261018}))),
            "c381c6c1b0f59b81b5bdd29a02600257e6457d3934a7a201dd4d6b665c931ce4");
  EXPECT_EQ(Sha256Hex(std::string_view(NeedleHaystackPrompt(NeedleSpec{130658, 6, 20261018}))),
            "52736cec4f46a11fbf76f0c9035c837a56d30fde06e4b2acb1a39ff34810f9b7");
  EXPECT_EQ(Sha256Hex(std::string_view(NeedleHaystackPrompt(NeedleSpec{97, 2, 0}))),
            "cacd16fcea1d19ea5314710588fc920bfdf617075250e5df6671bf8860a12d15");
}

}  // namespace
}  // namespace lockstep
