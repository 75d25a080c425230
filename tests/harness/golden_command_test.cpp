// Recorded references (issue 27, part 3; Must-show 3), on the real binary: `golden record` then
// `golden check` on the same build passes bitwise; a check given a perturbation fails naming the
// first changed item (and passes within a loose threshold); a check against another model, a
// damaged or missing manifest, a stored export that is not the manifest's, are exit 2; recording
// into a non-empty folder needs --force.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/instrument/fingerprint.h"
#include "test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using test::RunLockstep;

// A small A/A plan on `tiny` (two state arms, three windows exported, a positive control that a
// reference does not record).
constexpr const char* kPlan = R"(name = "golden-tiny"
question = "q"
hypothesis = "h"
control = "perturb:layer=3:item=k:eps=1e-2:window=1"

[model]
preset = "tiny"
seed = 7
induction = true

[request]
prompt = "the cat sat on the mat. the cat sat on the"

[engine]
threads = 1
stages = 4
spec = 3
max_new = 8

[export]
windows = "0-2"
points = ["pre_verify", "post_verify", "commit"]

[gates]
state = true

[[arm]]
name = "A1"

[[arm]]
name = "A2"
baseline = "A1"
)";

const std::string kPerturb = " --engine-override inject=perturb:layer=3:item=k:eps=1e-2:window=1";

nlohmann::json ReadJson(const std::string& path) {
  auto t = ReadFile(path);
  EXPECT_TRUE(t.ok()) << path;
  return t.ok() ? nlohmann::json::parse(*t, nullptr, false) : nlohmann::json();
}

// The reference, recorded once per process; tests that alter it work on a copy.
const std::string& Reference() {
  static const std::string dir = [] {
    const std::string d = test::NewDir("golden-ref");
    std::ofstream(d + "/plan.toml") << kPlan;
    auto r = RunLockstep("golden record --plan " + d + "/plan.toml --out " + d + "/ref --json " +
                         d + "/record.json");
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return d + "/ref";
  }();
  return dir;
}

std::string CopyOfReference(const std::string& name) {
  const std::string d = test::NewDir(name) + "/ref";
  fs::copy(Reference(), d, fs::copy_options::recursive);
  return d;
}

TEST(GoldenCommand, RecordThenCheckPassesBitwise) {
  const std::string& ref = Reference();
  const nlohmann::json m = ReadJson(ref + "/manifest.json");
  ASSERT_EQ(m.value("schema", ""), "lockstep.golden");
  // The state arms, not the control; the build that recorded it; per-item digests.
  ASSERT_EQ(m["arms"].size(), 2u);
  EXPECT_EQ(m["arms"][0]["name"], "A1");
  EXPECT_EQ(m["arms"][1]["name"], "A2");
  auto exe_sha = Sha256File(LOCKSTEP_BIN_PATH);
  ASSERT_TRUE(exe_sha.ok());
  EXPECT_EQ(m["build"]["executable_sha256"], *exe_sha);
  EXPECT_NE(m["build"]["version"].get<std::string>().find("export schema: lockstep.export v1"),
            std::string::npos);
  EXPECT_TRUE(m["compression"] == "lz4" || m["compression"] == "none") << m["compression"];
  const auto& item = m["arms"][0]["items"][0];
  EXPECT_EQ(item["sha256"].get<std::string>().size(), 64u);
  EXPECT_FALSE(item["dtype"].get<std::string>().empty());
  EXPECT_FALSE(item["shape"].empty());
  EXPECT_EQ(m["arms"][0]["output_ids"].size(), 8u);
  EXPECT_TRUE(fs::exists(ref + "/arms/A1/export.h5"));

  const std::string json = test::NewDir("golden-pass") + "/check.json";
  auto r = RunLockstep("golden check " + ref + " --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("A1: bitwise equal"), std::string::npos) << r.out;
  const nlohmann::json s = ReadJson(json);
  EXPECT_EQ(s["verdict"], "pass");
  EXPECT_EQ(s["mode"], "bitwise");
  for (const auto& a : s["arms"]) {
    EXPECT_TRUE(a["bitwise_equal"].get<bool>()) << a.dump();
    EXPECT_GT(a["items_compared"].get<int>(), 0);
  }
}

TEST(GoldenCommand, PerturbedCheckFailsWithTheFirstChangedItem) {
  const std::string json = test::NewDir("golden-perturb") + "/check.json";
  auto r = RunLockstep("golden check " + Reference() + kPerturb + " --json " + json);
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("A1: CHANGED: first changed item: window 1"), std::string::npos) << r.out;
  const nlohmann::json s = ReadJson(json);
  EXPECT_EQ(s["verdict"], "changed");
  const auto& f = s["first_changed"];
  EXPECT_EQ(f["arm"], "A1");
  EXPECT_EQ(f["window"], 1);
  EXPECT_EQ(f["layer"], 3);
  EXPECT_EQ(f["item"].get<std::string>().substr(0, 1), "k") << f.dump();
  EXPECT_GT(f["nrmse"].get<double>(), 1e-3);
  // The injection is reported as a config difference, not refused.
  EXPECT_FALSE(s["arms"][0]["config_differences"].empty());
  // Within a loose threshold the same change passes.
  auto loose = RunLockstep("golden check " + Reference() + kPerturb + " --nrmse-max 0.5");
  EXPECT_EQ(loose.exit_code, 0) << loose.out << loose.err;
}

TEST(GoldenCommand, AnotherModelIsExitTwo) {
  const std::string other = test::NewDir("golden-other-model") + "/m";
  ASSERT_EQ(RunLockstep("model init --preset tiny --seed 8 --induction --out " + other).exit_code,
            0);
  auto r = RunLockstep("golden check " + Reference() + " --model " + other);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("the models differ"), std::string::npos) << r.err;
}

TEST(GoldenCommand, DamagedReferencesAreExitTwo) {
  {  // a truncated manifest
    const std::string ref = CopyOfReference("golden-truncated");
    auto text = ReadFile(ref + "/manifest.json");
    ASSERT_TRUE(text.ok());
    ASSERT_TRUE(WriteFileAtomic(ref + "/manifest.json", text->substr(0, text->size() / 2)).ok());
    auto r = RunLockstep("golden check " + ref);
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("damaged manifest"), std::string::npos) << r.err;
  }
  {  // a manifest whose digest of one item is not the stored export's
    const std::string ref = CopyOfReference("golden-digest");
    nlohmann::json m = ReadJson(ref + "/manifest.json");
    std::string& sha = m["arms"][1]["items"][5]["sha256"].get_ref<std::string&>();
    sha[0] = sha[0] == '0' ? '1' : '0';
    ASSERT_TRUE(WriteFileAtomic(ref + "/manifest.json", m.dump(1)).ok());
    auto r = RunLockstep("golden check " + ref);
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("item digests do not match the manifest"), std::string::npos) << r.err;
  }
  {  // a stored export changed after recording
    const std::string ref = CopyOfReference("golden-export");
    std::fstream f(ref + "/arms/A2/export.h5", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(ref + "/arms/A2/export.h5") / 2));
    f.put('\x5a');
    f.close();
    auto r = RunLockstep("golden check " + ref);
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("stored export"), std::string::npos) << r.err;
  }
  {  // no manifest at all
    const std::string ref = CopyOfReference("golden-missing");
    fs::remove(ref + "/manifest.json");
    auto r = RunLockstep("golden check " + ref + " --json -");
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out, nullptr, false).value("verdict", ""), "does_not_fit")
        << r.out;
  }
}

TEST(GoldenCommand, ReRecordingNeedsForce) {
  const std::string ref = CopyOfReference("golden-force");
  const std::string plan = fs::path(Reference()).parent_path().string() + "/plan.toml";
  auto r = RunLockstep("golden record --plan " + plan + " --out " + ref);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  r = RunLockstep("golden record --plan " + plan + " --out " + ref + " --force");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_FALSE(fs::exists(ref + ".recording"));
  EXPECT_EQ(RunLockstep("golden check " + ref).exit_code, 0);
}

}  // namespace
}  // namespace lockstep
