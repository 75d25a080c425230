// Campaigns on llama.cpp (issue 38, items 2-3): `[engine] engine = "llama.cpp"` arms through the
// real binary. campaigns/aa-llamacpp.toml on tiny: the A/A on fresh processes is bitwise equal
// (logits and the sequence state llama.cpp serialises), the batch arms differ and the report's
// first lines say so and where the first difference is born; on a bf16 `small` GGUF alone vs
// beside 3 sequences localize names the graph tensor. Plans llama.cpp arms cannot honour are
// refused by name (exit 2) before anything runs; those cases need no llama.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/compare/export_reader.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/llamacpp/llamacpp_build.h"
#include "test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

#define SKIP_WITHOUT_LLAMACPP()                                                 \
  do {                                                                          \
    const Status available = LlamaCppAvailable();                               \
    if (!available.ok()) GTEST_SKIP() << "llama.cpp: " << available.ToString(); \
  } while (0)

std::string Campaigns() { return std::string(LOCKSTEP_SOURCE_DIR) + "/campaigns"; }

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

json JsonFile(const std::string& path) {
  json j = json::parse(Slurp(path), nullptr, false);
  EXPECT_TRUE(j.is_object()) << path;
  return j;
}

// The plan `text` as a file in a new folder beside a copy of campaigns/prompts (its token file).
std::string PlanFile(const std::string& text) {
  const std::string d = test::NewDir("plan");
  fs::create_directories(d + "/prompts");
  fs::copy_file(Campaigns() + "/prompts/llamacpp.tokens", d + "/prompts/llamacpp.tokens");
  EXPECT_TRUE(WriteFileAtomic(d + "/plan.toml", text).ok());
  return d + "/plan.toml";
}

// campaigns/aa-llamacpp.toml with its model replaced and only the arms named kept (and its stop
// rule): the same campaign, cut.
std::string CutPlan(const std::string& from_preset, const std::string& to_preset,
                    const std::vector<std::string>& arms) {
  std::string text = Slurp(Campaigns() + "/aa-llamacpp.toml");
  const std::string from = "preset = \"" + from_preset + "\"";
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos);
  text.replace(at, from.size(), "preset = \"" + to_preset + "\"");
  const auto first = text.find("[[arm]]");
  const auto stop = text.find("\n# Only the A/A");
  std::string out = text.substr(0, first);
  for (std::size_t b = first; b < stop;) {
    const std::size_t next = std::min(text.find("[[arm]]", b + 1), stop);
    const std::string block = text.substr(b, next - b);
    for (const std::string& a : arms)
      if (block.find("name = \"" + a + "\"") != std::string::npos) out += block;
    b = next;
  }
  return out + text.substr(stop);
}

// The first `n` lines of `text`.
std::string Head(const std::string& text, int n) {
  std::size_t end = 0;
  for (int i = 0; i < n && end != std::string::npos; ++i) end = text.find('\n', end + 1);
  return text.substr(0, end);
}

// The seq_state items of an export's commit checkpoints: (checkpoint, bytes) in order.
std::vector<std::vector<std::uint8_t>> SeqStates(const std::string& path) {
  std::vector<std::vector<std::uint8_t>> out;
  auto r = ExportReader::Open(path);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return out;
  for (const ExportCheckpoint& cp : (*r)->meta().checkpoints)
    for (const ExportItem& it : cp.items) {
      if (it.kind != ItemKind::kSeqState) continue;
      EXPECT_EQ(cp.point, CheckpointPoint::kCommit);
      EXPECT_EQ(it.dtype, DType::kU8);
      std::vector<std::uint8_t> bytes(static_cast<std::size_t>(it.row_elems()));
      EXPECT_TRUE((*r)->ReadRows(cp, it, 0, 1, bytes.data()).ok());
      out.push_back(std::move(bytes));
    }
  return out;
}

// Must show 2 and 5: the campaign on tiny. The A/A (logits and sequence state, bitwise) holds;
// every batch arm differs from the request alone; the report says so in its first lines and
// names where the first difference is born.
TEST(LlamaCppCampaign, AaLlamaCppOnTiny) {
  SKIP_WITHOUT_LLAMACPP();
  const std::string dir = test::NewDir("aa-llamacpp") + "/run";
  const auto t0 = std::chrono::steady_clock::now();
  const auto r =
      test::RunLockstep("run " + Campaigns() + "/aa-llamacpp.toml --out " + dir + " --no-progress");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("aa-llamacpp on tiny: %.1f s wall (exit %d)\n", s, r.exit_code);
  // A batch arm that differs fails its exact state gate: the campaign's verdict is a failure.
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;

  // The A/A: both comparisons of fresh processes pass bitwise, the sequence state included.
  const json aa = JsonFile(dir + "/compare/A2.json");
  EXPECT_TRUE(aa["comparison"].value("passed", false)) << aa["comparison"].dump();
  const auto sa = SeqStates(dir + "/arms/A1/export.h5");
  const auto sb = SeqStates(dir + "/arms/A2/export.h5");
  ASSERT_EQ(sa.size(), 8u) << "one seq_state per window (max_new 8)";
  ASSERT_EQ(sa.size(), sb.size());
  for (std::size_t w = 0; w < sa.size(); ++w) {
    EXPECT_GT(sa[w].size(), 0u);
    EXPECT_EQ(sa[w], sb[w]) << "window " << w;
  }
  EXPECT_NE(sa.front(), sa.back()) << "the state moves from window to window";

  // Beside 1, 3 and 15 sequences the request's bits differ, born where the kernel changes; a
  // 4-token ubatch (the prefill in 4 calls instead of 1) is bitwise the same; a 1-token ubatch
  // differs, and there localize sees a different sequence of calls in the prefill (a path).
  for (const char* arm : {"beside-1", "beside-3", "beside-15"}) {
    const json cmp = JsonFile(dir + "/compare/" + std::string(arm) + ".json");
    EXPECT_FALSE(cmp["comparison"].value("passed", true)) << arm;
    // localize = true: each failing pair is localised (fresh re-runs with op digests).
    const json loc = JsonFile(dir + "/localize/A1-" + std::string(arm) + ".json");
    EXPECT_EQ(loc["summary"].value("op", ""), "linear_attn_qkv_mixed-0") << arm << loc.dump();
    EXPECT_EQ(loc["summary"].value("kind", ""), "same inputs, different output") << loc.dump();
    EXPECT_EQ(loc["summary"].value("window", -9), 0) << loc.dump();
    EXPECT_EQ(loc["step"].value("rows_a", 0), 1) << loc["step"].dump();
  }
  // The sequence state is compared bitwise. Beside one other sequence the request's logits are
  // within the thresholds at every window (NRMSE ~5e-8) and its seq_state is not (a 4-byte
  // longer serialisation); with a 1-token ubatch the logits are bitwise equal at every window and
  // only the state shows the difference (its K/V cells, written by one-row products).
  int commits = 0;
  for (const std::string arm : {"A2", "beside-1", "ubatch-1"}) {
    const json cps = JsonFile(dir + "/compare/" + arm + ".json")["report"]["state"]["checkpoints"];
    for (const json& cp : cps) {
      const bool commit = cp.value("point", "") == "commit";
      commits += commit ? 1 : 0;
      EXPECT_EQ(cp.value("compared", 0), 1) << arm << cp.dump();
      EXPECT_EQ(cp.value("failed", -1), arm != "A2" && commit ? 1 : 0) << arm << cp.dump();
    }
  }
  EXPECT_EQ(commits, 24) << "8 windows' seq_state in each comparison";
  const json ub = JsonFile(dir + "/compare/ubatch-1.json")["comparison"];
  EXPECT_NE(ub.dump().find("first differing: 00000_commit stage0/seq_state"), std::string::npos)
      << ub.dump();
  EXPECT_TRUE(JsonFile(dir + "/compare/ubatch-4.json")["comparison"].value("passed", false));
  EXPECT_FALSE(JsonFile(dir + "/compare/ubatch-1.json")["comparison"].value("passed", true));
  EXPECT_EQ(JsonFile(dir + "/localize/A1-ubatch-1.json")["summary"].value("kind", ""), "path");
  const json loc = JsonFile(dir + "/localize/A1-beside-1.json");
  EXPECT_EQ(loc["step"].value("rows_b", 0), 2) << loc["step"].dump();
  EXPECT_EQ(JsonFile(dir + "/localize/A1-beside-15.json")["step"].value("rows_b", 0), 16);

  // The report's first lines: the verdict, then whether llama.cpp is batch-invariant here and
  // where the first difference is born.
  const std::string head = Head(Slurp(dir + "/report.md"), 4);
  EXPECT_NE(head.find("NOT batch-invariant on this model: 4 of 5 batch comparisons differ"),
            std::string::npos)
      << head;
  EXPECT_NE(head.find("A/A on fresh processes: A2 vs A1 bitwise equal"), std::string::npos) << head;
  EXPECT_NE(head.find("First difference (beside-1 vs A1): "), std::string::npos) << head;
  EXPECT_NE(head.find("linear_attn_qkv_mixed-0"), std::string::npos) << head;
  EXPECT_NE(head.find("the window's step held 1 row (1 sequence) in A1, 2 rows (2 sequences) in "
                      "beside-1"),
            std::string::npos)
      << head;
  std::printf("%s\n", head.c_str());
}

// Must show 2 on the bf16 `small` GGUF: alone vs beside 3 co-resident sequences (one K/V stream
// per sequence). The difference is born in layer 0's Gated DeltaNet input projection
// (linear_attn_qkv_mixed-0): its input attn_norm-0 is bitwise equal, its output is not, because
// ggml's CPU backend multiplies a 1-row batch with another kernel than a 4-row one; the window's
// step held 1 row alone and 4 rows (4 sequences) beside the others.
TEST(LlamaCppCampaign, SmallBesideThreeLocalizesTheBornOp) {
  SKIP_WITHOUT_LLAMACPP();
  const std::string plan = PlanFile(CutPlan("tiny", "small", {"A1", "A2", "beside-3"}));
  const std::string dir = test::NewDir("aa-llamacpp-small") + "/run";
  const auto r = test::RunLockstep("run " + plan + " --out " + dir + " --no-progress");
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(JsonFile(dir + "/compare/A2.json")["comparison"].value("passed", false));
  EXPECT_FALSE(JsonFile(dir + "/compare/beside-3.json")["comparison"].value("passed", true));
  const json loc = JsonFile(dir + "/localize/A1-beside-3.json");
  const json& sum = loc["summary"];
  EXPECT_EQ(sum.value("op", ""), "linear_attn_qkv_mixed-0") << loc.dump();
  EXPECT_EQ(sum.value("kind", ""), "same inputs, different output") << loc.dump();
  EXPECT_EQ(sum.value("window", -9), 0) << loc.dump();
  EXPECT_EQ(loc["step"].value("rows_a", 0), 1) << loc["step"].dump();
  EXPECT_EQ(loc["step"].value("rows_b", 0), 4) << loc["step"].dump();
  EXPECT_EQ(loc["step"].value("seqs_b", 0), 4) << loc["step"].dump();
  const std::string head = Head(Slurp(dir + "/report.md"), 4);
  EXPECT_NE(head.find("NOT batch-invariant on this model: 1 of 1 batch comparisons differ"),
            std::string::npos)
      << head;
  EXPECT_NE(head.find("linear_attn_qkv_mixed-0"), std::string::npos) << head;
  std::printf("small bf16: %s\n", sum.value("sentence", "").c_str());
}

// The same campaign through the scheduler path (plan expand, one run-unit per arm, merge): the
// same comparisons, the same first report lines as the local run.
TEST(LlamaCppCampaign, UnitsGiveTheLocalRunsReportLines) {
  SKIP_WITHOUT_LLAMACPP();
  const std::string plan = PlanFile(CutPlan("tiny", "tiny", {"A1", "A2", "beside-3"}));
  const std::string local = test::NewDir("llamacpp-local") + "/run";
  const std::string units = test::NewDir("llamacpp-units") + "/run";
  ASSERT_EQ(test::RunLockstep("run " + plan + " --out " + local + " --no-progress").exit_code, 1);
  const auto ex = test::RunLockstep("plan expand " + plan + " --out " + units);
  ASSERT_EQ(ex.exit_code, 0) << ex.err;
  for (int i = 0; i < 3; ++i) {
    const auto u = test::RunLockstep("run-unit " + units + " --index " + std::to_string(i));
    ASSERT_EQ(u.exit_code, 0) << u.out << u.err;
  }
  const auto m = test::RunLockstep("merge " + units);
  EXPECT_EQ(m.exit_code, 1) << m.out << m.err;
  // Lines 3 and 4: the llama.cpp lines (batch invariance, where the difference is born).
  const auto lines = [](const std::string& path) {
    const std::string head = Head(Slurp(path), 4);
    const auto at = head.find("> - llama.cpp");
    return at == std::string::npos ? head : head.substr(at);
  };
  const std::string a = lines(local + "/report.md"), b = lines(units + "/report.md");
  EXPECT_NE(a.find("NOT batch-invariant on this model: 1 of 1"), std::string::npos) << a;
  EXPECT_EQ(a, b);
}

// Without the component (no libraries where LOCKSTEP_LLAMACPP_DIR points, or a build without the
// headers) a campaign with llama.cpp arms is exit 2 naming the install script before any arm runs.
TEST(LlamaCppCampaign, WithoutTheLibrariesExitsTwoNamingTheScript) {
  const std::string empty = test::NewDir("no-llamacpp");
  const char* old = std::getenv("LOCKSTEP_LLAMACPP_DIR");
  const std::string saved = old ? old : "";
  ::setenv("LOCKSTEP_LLAMACPP_DIR", empty.c_str(), 1);
  const std::string dir = test::NewDir("aa-llamacpp-absent") + "/run";
  const auto r =
      test::RunLockstep("run " + Campaigns() + "/aa-llamacpp.toml --out " + dir + " --no-progress");
  if (old)
    ::setenv("LOCKSTEP_LLAMACPP_DIR", saved.c_str(), 1);
  else
    ::unsetenv("LOCKSTEP_LLAMACPP_DIR");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("scripts/install-llamacpp.sh"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("arm 'A1'"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir + "/arms/A1")) << "no arm ran";
}

// What a llama.cpp arm cannot honour is refused when the plan is read (exit 2, one line naming
// the key), and llama.cpp's keys on a lockstep arm likewise. No llama.cpp needed.
TEST(LlamaCppCampaign, UnsupportedCombinationsExitTwoNamingTheKey) {
  const std::string head =
      "name = \"x\"\nquestion = \"q\"\n[request]\ntoken_file = \"prompts/llamacpp.tokens\"\n"
      "[gates]\noutput = true\n";
  const std::string gguf = "[model]\npreset = \"tiny\"\nformat = \"gguf\"\n";
  const std::string arms = "[[arm]]\nname = \"A1\"\n[[arm]]\nname = \"A2\"\nbaseline = \"A1\"\n";
  struct Case {
    std::string plan, key, top = "";  // top: top-level keys, before every table
  };
  const std::vector<Case> cases = {
      {gguf + "[engine]\nengine = \"llama.cpp\"\nspec = 2\n" + arms, "'spec'"},
      {gguf + "[engine]\nengine = \"llama.cpp\"\nstages = 2\n" + arms, "'stages'"},
      {"[model]\npreset = \"tiny\"\n[engine]\nengine = \"llama.cpp\"\n" + arms, "format"},
      {gguf + "[engine]\nllama_ubatch = 4\n" + arms, "'llama_ubatch'"},
      {gguf + "[engine]\nengine = \"vllm\"\n" + arms, "'engine'"},
      {gguf + "[engine]\nengine = \"llama.cpp\"\nllama_kv_type = \"q4\"\n" + arms,
       "'llama_kv_type'"},
      {gguf + "[engine]\nengine = \"llama.cpp\"\n" + arms, "'inject'",
       "control = \"perturb:layer=3:item=k:eps=1e-2:window=1\"\n"},
      {gguf + "[engine]\nengine = \"llama.cpp\"\n" + arms + "server = \"fresh\"\n", "'server'"},
      {"[model]\npreset = \"tiny\"\nformat = \"onnx\"\n[engine]\n" + arms, "format"},
  };
  for (const Case& c : cases) {
    const auto r = test::RunLockstep("run --check-plan " + PlanFile(c.top + head + c.plan));
    EXPECT_EQ(r.exit_code, 2) << c.plan << "\n" << r.err;
    EXPECT_NE(r.err.find(c.key), std::string::npos) << c.plan << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  // The same plan on a lockstep arm, or with the llama.cpp keys on llama.cpp arms, is accepted.
  const auto ok = test::RunLockstep(
      "run --check-plan " +
      PlanFile(head + gguf + "[engine]\nengine = \"llama.cpp\"\nllama_ubatch = 4\nslots = 2\n" +
               arms));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

}  // namespace
}  // namespace lockstep
