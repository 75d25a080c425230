// The `lockstep` executable: model init is byte-reproducible, generate prints text / JSON /
// the canonical config, every engine option of the table is a flag with its doc that round-trips
// through JSON, and usage or input errors exit 2 with a message.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lockstep/compare/export_reader.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/engine_config.h"
#include "test_util.h"

namespace lockstep {
namespace {

TEST(Cli, ModelInitIsByteIdenticalForTheSameSeed) {
  std::string a = test::NewDir("init-a"), b = test::NewDir("init-b"), c = test::NewDir("init-c");
  ASSERT_EQ(test::RunLockstep("model init --preset tiny --seed 5 --out " + a).exit_code, 0);
  ASSERT_EQ(test::RunLockstep("model init --preset tiny --seed 5 --out " + b).exit_code, 0);
  ASSERT_EQ(test::RunLockstep("model init --preset tiny --seed 6 --out " + c).exit_code, 0);
  for (const char* f : {"/config.json", "/model.safetensors"}) {
    EXPECT_EQ(*ReadFile(a + f), *ReadFile(b + f)) << f;
  }
  EXPECT_NE(*ReadFile(a + "/model.safetensors"), *ReadFile(c + "/model.safetensors"));
  auto bad = test::RunLockstep("model init --preset huge --out " + c);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("unknown preset 'huge'"), std::string::npos) << bad.err;
  // A preset cut in depth and breadth: the counts in config.json, the widths the preset's.
  const std::string cut = test::NewDir("init-cut");
  auto r = test::RunLockstep(
      "model init --preset small --layers 4 --experts 6 --experts-used 2 --vocab 300 --no-mtp "
      "--out " +
      cut);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(*ReadFile(cut + "/config.json"));
  EXPECT_EQ(j["num_hidden_layers"], 4);
  EXPECT_EQ(j["num_experts"], 6);
  EXPECT_EQ(j["num_experts_per_tok"], 2);
  EXPECT_EQ(j["vocab_size"], 300);
  EXPECT_EQ(j["hidden_size"], 512);
  for (const char* flags : {"--experts 3 --experts-used 4", "--layers 0", "--vocab -5"}) {
    auto e = test::RunLockstep(std::string("model init --preset small ") + flags + " --out " +
                               test::NewDir("init-bad"));
    EXPECT_EQ(e.exit_code, 2) << flags << ": " << e.err;
  }
}

TEST(Cli, GenerateJsonAndText) {
  const std::string m = test::ModelDir("tiny");
  auto r = test::RunLockstep("generate --model " + m +
                             " --prompt 'Hello there' --max-new 7 --ignore-eos --json --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_tokens"], 11);
  EXPECT_EQ(j["output_tokens"], 7);
  EXPECT_EQ(j["stop_reason"], "length");
  EXPECT_EQ(j["output_ids"].size(), 7u);
  EXPECT_GT(j["timings"]["decode_tokens_per_s"].get<double>(), 0.0);
  EXPECT_EQ(j["expert_cache"].size(), 4u);
  // The same request through a token file gives the same output.
  std::string tok = test::NewDir("tok") + "/prompt.txt";
  ASSERT_TRUE(WriteFileAtomic(tok, "72, 101,108\n108 111 32 116,104 101 114 101\n").ok());
  auto t = test::RunLockstep("generate --model " + m + " --prompt-tokens " + tok +
                             " --max-new 7 --ignore-eos --json --threads 1");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_EQ(nlohmann::json::parse(t.out)["output_ids"], j["output_ids"]);
  auto text = test::RunLockstep("generate --model " + m +
                                " --prompt 'Hello there' --max-new 3 --ignore-eos");
  EXPECT_EQ(text.exit_code, 0);
  EXPECT_FALSE(text.out.empty());
}

TEST(Cli, PrintConfigIsCanonicalAndReloadable) {
  auto r = test::RunLockstep(
      "generate --print-config --stages 4 --split 2,4,6 --kv int8 --threads 2 --pcie-frac 0.55");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["kv_dtype"], "int8");
  EXPECT_EQ(j["split"], nlohmann::json({2, 4, 6}));
  EXPECT_EQ(j["cuda_attn_split"], 512) << "the default context split, in every fingerprint";
  EXPECT_EQ(j.dump() + "\n", r.out) << "printed form is the canonical compact form";
  std::string f = test::NewDir("cfg") + "/c.json";
  ASSERT_TRUE(WriteFileAtomic(f, r.out).ok());
  auto again = test::RunLockstep("generate --print-config --config " + f);
  EXPECT_EQ(again.out, r.out);
  auto over = test::RunLockstep("generate --print-config --config " + f + " --kv bf16");
  EXPECT_EQ(nlohmann::json::parse(over.out)["kv_dtype"], "bf16");
  EXPECT_EQ(nlohmann::json::parse(over.out)["split"], nlohmann::json({2, 4, 6}));
  auto split0 = test::RunLockstep("generate --print-config --config " + f + " --cuda-attn-split 0");
  EXPECT_EQ(nlohmann::json::parse(split0.out)["cuda_attn_split"], 0);
}

// A non-default value for each engine option, as its flag spells it, and the JSON value the
// canonical config must then hold. `context` adds the other flags the value needs to be valid.
// Every row of EngineOptions() needs an entry here (the test fails naming a missing one).
struct FlagValue {
  std::string text, json, context;
};
const std::map<std::string, FlagValue>& FlagValues() {
  static const std::map<std::string, FlagValue> values = {
      {"model", {"/some/model", R"("/some/model")", ""}},
      {"backend", {"cuda", R"("cuda")", ""}},
      {"threads", {"37", "37", ""}},
      {"quant_dot", {"ggml", R"("ggml")", ""}},
      {"deterministic", {"off", "false", ""}},
      {"cuda_graphs", {"off", "false", ""}},
      {"cuda_attn_split", {"0", "0", ""}},
      {"devices", {"1,0", "[1,0]", "--backend cuda"}},
      {"stages", {"2", "2", ""}},
      {"split", {"1,2,3", "[1,2,3]", ""}},
      {"prefill_chunk", {"7", "7", ""}},
      {"kv_dtype", {"int8", R"("int8")", ""}},
      {"kv_page_rows", {"16", "16", ""}},
      {"expert_cache", {"5", "5", ""}},
      {"pcie_frac", {"0.55", "0.55", ""}},
      {"slots", {"16", "16", ""}},
      {"batch_tokens", {"48", "48", ""}},
      {"batch_invariant", {"off", "false", ""}},
      {"prefix_cache", {"on", "true", ""}},
      {"snapshot_every", {"1024", "1024", ""}},
      {"prefix_cache_mib", {"64", "64", ""}},
      {"memory_mib", {"4096", "4096", ""}},
      {"queue_depth", {"8", "8", ""}},
      {"max_new", {"9", "9", ""}},
      {"seed", {"18446744073709551615", "18446744073709551615", ""}},
      {"temperature", {"0.7", "0.7", ""}},
      {"top_k", {"40", "40", ""}},
      {"top_p", {"0.9", "0.9", ""}},
      {"ignore_eos", {"", "true", ""}},  // a switch: the flag alone
      {"presence_penalty", {"0.5", "0.5", ""}},
      {"frequency_penalty", {"-1.25", "-1.25", ""}},
      {"repeat_penalty", {"1.5", "1.5", ""}},
      {"repeat_last_n", {"-1", "-1", ""}},
      {"spec", {"4", "4", ""}},
      {"mtp", {"off", "false", ""}},
      {"spec_max_suffix", {"3", "3", ""}},
      {"suffix_index", {"async", R"("async")", ""}},
      {"draft_policy", {"latency", R"("latency")", ""}},
      {"replay_path", {"/x/windows.jsonl", R"("/x/windows.jsonl")", ""}},
      {"inject", {"delay:stage=2:window=5:ms=200", R"(["delay:stage=2:window=5:ms=200"])", ""}},
  };
  return values;
}

TEST(Cli, EveryEngineOptionRoundTripsFlagConfigJson) {
  const auto defaults = nlohmann::json::parse(EngineConfig{}.ToJson());
  for (const EngineOption& o : EngineOptions()) {
    const std::string key(o.key);
    SCOPED_TRACE(std::string(o.flag));
    const auto it = FlagValues().find(key);
    if (it == FlagValues().end()) {
      ADD_FAILURE() << "engine option '" << key << "' has no test value: add one to FlagValues()";
      continue;
    }
    const FlagValue& v = it->second;
    const auto want = nlohmann::json::parse(v.json);
    ASSERT_NE(want, defaults[key]) << "the test value must differ from the default";
    // flag -> config -> JSON, in the binary.
    const auto base = test::RunLockstep("generate --print-config " + v.context);
    ASSERT_EQ(base.exit_code, 0) << base.err;
    const std::string arg = std::string(o.flag) + (v.text.empty() ? "" : " '" + v.text + "'");
    const auto r = test::RunLockstep("generate --print-config " + v.context + " " + arg);
    ASSERT_EQ(r.exit_code, 0) << arg << ": " << r.err;
    auto got_json = nlohmann::json::parse(r.out);
    EXPECT_EQ(got_json[key], want) << arg;
    // Only this option moved: every other key as without the flag.
    auto expected_json = nlohmann::json::parse(base.out);
    expected_json[key] = want;
    EXPECT_EQ(got_json, expected_json) << arg;
    // JSON -> config -> JSON: the same config, the same canonical bytes.
    auto got = EngineConfig::FromJson(r.out, "printed config");
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    auto expected = EngineConfig::FromJson(expected_json.dump(), "expected config");
    ASSERT_TRUE(expected.ok()) << expected.status().ToString();
    EXPECT_TRUE(*got == *expected) << arg;
    EXPECT_EQ(got->ToJson() + "\n", r.out) << arg;
    auto again = EngineConfig::FromJson(got->ToJson(), "round trip");
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_TRUE(*again == *got) << arg;
  }
}

// Collapses runs of spaces (CLI11 pads the flag column).
std::string Squeeze(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c != ' ' || out.empty() || out.back() != ' ') out += c;
  }
  return out;
}

TEST(Cli, GenerateHelpListsEveryEngineOptionWithItsDoc) {
  const auto r = test::RunLockstep("generate --help");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, std::string> line_of_flag;  // "--kv" -> its help line
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    const std::string sq = Squeeze(line);
    if (sq.rfind(" --", 0) != 0) continue;
    line_of_flag[sq.substr(1, sq.find_first_of(" =", 1) - 1)] = sq;
  }
  const EngineConfig defaults;
  for (const EngineOption& o : EngineOptions()) {
    const std::string flag(o.flag);
    auto it = line_of_flag.find(flag);
    ASSERT_NE(it, line_of_flag.end()) << flag << " missing from:\n" << r.out;
    const std::string& line = it->second;
    EXPECT_TRUE(line.size() >= o.doc.size() &&
                line.compare(line.size() - o.doc.size(), o.doc.size(), o.doc) == 0)
        << flag << ": the help line does not end with the table's doc '" << o.doc << "':\n"
        << line;
    const std::string shown = FormatEngineOption(o, defaults);
    const bool is_switch = std::holds_alternative<bool EngineConfig::*>(o.field) && !o.parse;
    if (!shown.empty() && !is_switch) {
      EXPECT_NE(line.find("=" + shown + " "), std::string::npos)
          << flag << ": default " << shown << " not shown: " << line;
    }
  }
}

TEST(Cli, UsageAndInputErrorsExit2) {
  const std::string m = test::ModelDir("tiny");
  struct Case {
    std::string args, needle;
  };
  std::vector<Case> cases = {
      {"generate --model " + m + " --prompt hi --kv int4", "--kv"},
      {"generate --model " + m + " --prompt hi --stages 4 --split 1,2", "--split"},
      {"generate --model " + m + " --prompt hi --stages 9", "--stages"},
      {"generate --model " + m + " --prompt hi --top-p 0", "--top-p"},
      {"generate --model " + m + " --prompt hi --cuda-attn-split -1", "--cuda-attn-split"},
      {"generate --model " + m + " --prompt hi --no-such-flag", "no-such-flag"},
      {"generate --model " + m, "prompt"},
      {"generate --model " + m + " --prompt-tokens /nonexistent/t.txt", "/nonexistent/t.txt"},
      {"generate --model /nonexistent --prompt hi", "/nonexistent"},
      {"generate --model " + m + " --prompt hi --backend tpu", "--backend"},
      {"frobnicate", "frobnicate"},
  };
  for (const auto& c : cases) {
    auto r = test::RunLockstep(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\n" << r.err;
  }
  std::string tok = test::NewDir("badtok") + "/t.txt";
  ASSERT_TRUE(WriteFileAtomic(tok, "1 2 99999").ok());
  auto r = test::RunLockstep("generate --model " + m + " --prompt-tokens " + tok);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("99999"), std::string::npos) << r.err;
  ASSERT_TRUE(WriteFileAtomic(tok, "1 two 3").ok());
  r = test::RunLockstep("generate --model " + m + " --prompt-tokens " + tok);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("'two'"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace lockstep

// ---- injections account for themselves (issue 20) ----

namespace lockstep {
namespace {

const char* kInjectPrompt = " --prompt 'the cat sat on the mat. the cat sat on the' --threads 1";

TEST(CliInject, AFiredInjectionIsRecordedInJsonTraceAndExport) {
  const std::string dir = test::NewDir("inject-fired");
  auto r = test::RunLockstep("generate --model " + test::ModelDir("tiny-induction") +
                             kInjectPrompt + " --max-new 12 --spec 3 --json --export " + dir +
                             "/a.h5 --trace-json " + dir +
                             "/a.trace.json --inject perturb:layer=3:item=k:eps=1e-2:window=1 "
                             "--inject delay:ms=0:stage=2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["injections"].size(), 2u) << r.out;
  const auto& p = j["injections"][0];
  EXPECT_EQ(p["text"], "perturb:layer=3:item=k:eps=1e-2:window=1");
  EXPECT_EQ(p["fired"], true);
  EXPECT_EQ(p["count"], 1);
  ASSERT_EQ(p["firings"].size(), 1u);
  EXPECT_EQ(p["firings"][0]["window"], 1);
  EXPECT_EQ(p["firings"][0]["stage"], 1);  // layer 3 is stage 1's (tiny: 2 layers per stage)
  EXPECT_EQ(p["firings"][0]["layer"], 3);
  EXPECT_EQ(p["firings"][0]["item"], "k");
  EXPECT_FLOAT_EQ(p["firings"][0]["factor"].get<float>(), 1.01f);
  const auto& d = j["injections"][1];
  EXPECT_EQ(d["fired"], true);
  EXPECT_EQ(d["count"], j["windows"]);  // stage 2 of every window
  EXPECT_EQ(d["firings"][0]["ms"], 0.0);
  // The export carries the same records (/injections), read back by the reader.
  auto reader = ExportReader::Open(dir + "/a.h5");
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  ASSERT_EQ((*reader)->meta().injections.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse((*reader)->meta().injections[0]), p);
  // The Chrome trace: the records in otherData and one instant event per recorded firing.
  auto trace = ReadFile(dir + "/a.trace.json");
  ASSERT_TRUE(trace.ok());
  const auto t = nlohmann::json::parse(*trace);
  EXPECT_EQ(t["otherData"]["injections"].size(), 2u);
  int instants = 0;
  for (const auto& e : t["traceEvents"])
    if (e.value("cat", "") == "inject") {
      ++instants;
      EXPECT_EQ(e["ph"], "i");
    }
  EXPECT_EQ(instants, 1 + d["count"].get<int>());
  // Without --inject the export has no /injections and the reader none.
  auto plain = test::RunLockstep("generate --model " + test::ModelDir("tiny-induction") +
                                 kInjectPrompt + " --max-new 4 --export " + dir + "/b.h5");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  auto rb = ExportReader::Open(dir + "/b.h5");
  ASSERT_TRUE(rb.ok());
  EXPECT_TRUE((*rb)->meta().injections.empty());
}

TEST(CliInject, AnInjectionThatCanNeverFireIsExitTwoBeforeTheRun) {
  const std::string dir = test::NewDir("inject-never");
  auto r = test::RunLockstep("generate --model " + test::ModelDir("tiny-induction") +
                             kInjectPrompt + " --max-new 12 --export " + dir +
                             "/a.h5 --inject perturb:layer=3:item=k:eps=1e-2:window=500");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("window 500 never runs: a request of max_new 12 runs at most 12 verify "
                       "windows"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/a.h5"));  // nothing ran
  auto k = test::RunLockstep("generate --model " + test::ModelDir("tiny-induction") +
                             kInjectPrompt + " --max-new 12 --inject perturb:layer=2:item=k:eps=1");
  EXPECT_EQ(k.exit_code, 2);
  EXPECT_NE(k.err.find("layer 2 is a GDN layer (no K/V)"), std::string::npos) << k.err;
}

TEST(CliInject, AnInjectionThatDidNotFireIsAnErrorAfterTheRun) {
  // max_new 12 allows window 11, but with drafts the request ends after fewer windows.
  const std::string dir = test::NewDir("inject-unfired");
  auto r = test::RunLockstep("generate --model " + test::ModelDir("tiny-induction") +
                             kInjectPrompt + " --max-new 12 --spec 3 --json --export " + dir +
                             "/a.h5 --inject perturb:layer=3:item=k:eps=1e-2:window=11");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--inject 'perturb:layer=3:item=k:eps=1e-2:window=11': never fired: the "
                       "request ran "),
            std::string::npos)
      << r.err;
  // Every output is written first, and its record says the injection did not fire.
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_LT(j["windows"].get<int>(), 12);
  EXPECT_EQ(j["injections"][0]["fired"], false);
  EXPECT_EQ(j["injections"][0]["count"], 0);
  auto reader = ExportReader::Open(dir + "/a.h5");
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  ASSERT_EQ((*reader)->meta().injections.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse((*reader)->meta().injections[0])["fired"], false);
}

TEST(CliInject, AMissingOutputFolderIsExitTwoBeforeTheRun) {
  for (const char* flag : {"--export", "--trace-json", "--trace-jsonl"}) {
    auto r = test::RunLockstep("generate --model " + test::ModelDir("tiny") +
                               " --prompt hi --max-new 2 " + flag + " /nonexistent-folder/f");
    EXPECT_EQ(r.exit_code, 2) << flag << ": " << r.err;
    EXPECT_NE(
        r.err.find(std::string(flag) +
                   " '/nonexistent-folder/f': the folder '/nonexistent-folder' does not exist"),
        std::string::npos)
        << r.err;
  }
}

}  // namespace
}  // namespace lockstep
