// A CLI that explains itself (issue 20, part 5), on the real binary: help lists its option groups
// in order with defaults and an example block per command; --version names the build; misspelled
// commands and flags get the nearest name; "-" is stdout for every document flag; generate shows
// progress and a summary on a terminal only and escapes the control bytes it prints.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/engine_config.h"
#include "test_util.h"

namespace lockstep {
namespace {

// Every command with its own help, and the words of its command line.
const std::vector<std::string>& Commands() {
  static const std::vector<std::string> c = {"model init",    "generate",     "diff",  "summarize",
                                             "align",         "run",          "gate",  "report",
                                             "golden record", "golden check", "serve", "preflight"};
  return c;
}

// The group headers of a help text ("Request:"), in order, and the option lines under each.
struct HelpText {
  std::vector<std::string> groups;
  std::map<std::string, std::string> group_of_flag;  // "--kv" -> "Pipeline"
  std::map<std::string, std::string> line_of_flag;   // "--kv" -> its line (columns squeezed)
  std::vector<std::string> examples;                 // the lines after "Examples:"
};

HelpText ParseHelp(const std::string& text) {
  HelpText h;
  std::istringstream in(text);
  std::string group;
  bool examples = false;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != ' ' && line.back() == ':') {
      group = line.substr(0, line.size() - 1);
      examples = group == "Examples";
      if (!examples) h.groups.push_back(group);
      continue;
    }
    if (examples && line.rfind("  ", 0) == 0) h.examples.push_back(line.substr(2));
    std::string sq;
    for (char ch : line)
      if (ch != ' ' || sq.empty() || sq.back() != ' ') sq += ch;
    if (sq.rfind(" --", 0) != 0) continue;
    const std::string flag = sq.substr(1, sq.find_first_of(" =", 1) - 1);
    h.group_of_flag[flag] = group;
    h.line_of_flag[flag] = sq;
  }
  return h;
}

TEST(CliHelp, GenerateListsItsGroupsInOrder) {
  const auto r = test::RunLockstep("generate --help");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const HelpText h = ParseHelp(r.out);
  const std::vector<std::string> want = {"Options",          "Request", "Model",
                                         "Pipeline",         "Service", "Speculative decoding",
                                         "Export and trace", "CUDA",    "Diagnostics"};
  EXPECT_EQ(h.groups, want) << r.out;
  // Each engine option sits in the group its table row names.
  const std::map<EngineOptionGroup, std::string> names = {
      {EngineOptionGroup::kRequest, "Request"},
      {EngineOptionGroup::kModel, "Model"},
      {EngineOptionGroup::kPipeline, "Pipeline"},
      {EngineOptionGroup::kService, "Service"},
      {EngineOptionGroup::kSpeculative, "Speculative decoding"},
      {EngineOptionGroup::kCuda, "CUDA"},
      {EngineOptionGroup::kDiagnostics, "Diagnostics"}};
  for (const EngineOption& o : EngineOptions()) {
    const std::string flag(o.flag);
    ASSERT_TRUE(h.group_of_flag.count(flag)) << flag << " missing:\n" << r.out;
    EXPECT_EQ(h.group_of_flag.at(flag), names.at(o.group)) << flag;
  }
  // The flags of generate itself, in theirs.
  const std::map<std::string, std::string> own = {{"--prompt", "Request"},
                                                  {"--prompt-file", "Request"},
                                                  {"--json", "Request"},
                                                  {"--config", "Model"},
                                                  {"--save-slot", "Service"},
                                                  {"--restore-slot", "Service"},
                                                  {"--export", "Export and trace"},
                                                  {"--trace-jsonl", "Export and trace"},
                                                  {"--trace-json", "Export and trace"},
                                                  {"--background", "Service"},
                                                  {"--sample-ms", "Diagnostics"},
                                                  {"--print-config", "Diagnostics"},
                                                  {"--progress", "Diagnostics"},
                                                  {"--no-progress", "Diagnostics"}};
  for (const auto& [flag, group] : own) {
    ASSERT_TRUE(h.group_of_flag.count(flag)) << flag;
    EXPECT_EQ(h.group_of_flag.at(flag), group) << flag;
  }
}

TEST(CliHelp, EveryCommandGroupsItsFlagsAndShowsAnExample) {
  for (const std::string& cmd : Commands()) {
    SCOPED_TRACE(cmd);
    const auto r = test::RunLockstep(cmd + " --help");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const HelpText h = ParseHelp(r.out);
    // No flag left in CLI11's catch-all group (only --help is there).
    for (const auto& [flag, group] : h.group_of_flag)
      if (flag != "--help") {
        EXPECT_NE(group, "Options") << flag << " has no group";
      }
    // Every document flag says it takes "-".
    for (const char* doc : {"--json", "--md", "--html", "--junit"})
      if (h.line_of_flag.count(doc)) {
        EXPECT_NE(h.line_of_flag.at(doc).find("PATH|-"), std::string::npos)
            << h.line_of_flag.at(doc);
      }
    ASSERT_FALSE(h.examples.empty()) << "no Examples block:\n" << r.out;
    for (const std::string& e : h.examples)
      EXPECT_EQ(e.rfind("lockstep " + cmd + " ", 0), 0u) << "example of another command: " << e;
  }
  const auto top = test::RunLockstep("--help");
  ASSERT_EQ(top.exit_code, 0);
  EXPECT_FALSE(ParseHelp(top.out).examples.empty()) << top.out;
}

TEST(CliHelp, DefaultsAreShown) {
  // Every engine option that takes a value shows its default (--model has none: it is required
  // to run).
  const auto gen = test::RunLockstep("generate --help");
  const HelpText g = ParseHelp(gen.out);
  for (const EngineOption& o : EngineOptions()) {
    const bool is_switch = std::holds_alternative<bool EngineConfig::*>(o.field) && !o.parse;
    if (is_switch || o.key == "model") continue;
    EXPECT_NE(g.line_of_flag.at(std::string(o.flag)).find('='), std::string::npos)
        << o.flag << " shows no default: " << g.line_of_flag.at(std::string(o.flag));
  }
  // And the defaults that used to be missing or buried in the doc text.
  struct Want {
    std::string command, flag, shown;
  };
  const std::vector<Want> wants = {
      {"generate", "--sample-ms", "INT=100"},
      {"generate", "--export-windows", "TEXT=0-2"},
      {"generate", "--export-points", "TEXT=pre_verify,post_verify,commit"},
      {"generate", "--export-compress", "TEXT=none"},
      {"generate", "--split", "TEXT=even"},
      {"generate", "--devices", "TEXT=0"},
      {"generate", "--config", "TEXT=none"},
      {"diff", "--nrmse-max", "FLOAT=0.0002"},
      {"diff", "--kl-max", "FLOAT=1e-05"},
      {"diff", "--windows", "TEXT=all"},
      {"diff", "--mem-limit", "TEXT=1G"},
      {"align", "--fields", "TEXT=p,T,T_mtp,merged,from_sfx,chain_n"},
      {"run", "--junit", "PATH|-=<run folder>/junit.xml"},
      {"gate", "--out", "TEXT=out/gate/<plan>-<time>-<pid>"},
      {"report", "--md", "PATH|-=DIR/report.md"},
      {"model init", "--seed", "UINT=0"},
  };
  std::map<std::string, HelpText> helps;
  for (const Want& w : wants) {
    if (!helps.count(w.command))
      helps[w.command] = ParseHelp(test::RunLockstep(w.command + " --help").out);
    const HelpText& h = helps[w.command];
    ASSERT_TRUE(h.line_of_flag.count(w.flag)) << w.command << " " << w.flag;
    EXPECT_EQ(h.line_of_flag.at(w.flag).rfind(" " + w.flag + " " + w.shown, 0), 0u)
        << w.command << ": " << h.line_of_flag.at(w.flag);
  }
}

// --model takes a folder or a GGUF file (issue 39, item 4): generate and serve say both.
TEST(CliHelp, ModelIsAFolderOrAGgufFile) {
  for (const std::string cmd : {"generate", "serve"}) {
    const auto r = test::RunLockstep(cmd + " --help");
    ASSERT_EQ(r.exit_code, 0) << cmd;
    const HelpText h = ParseHelp(r.out);
    ASSERT_TRUE(h.line_of_flag.count("--model")) << cmd << ":\n" << r.out;
    const std::string& line = h.line_of_flag.at("--model");
    EXPECT_NE(line.find("folder"), std::string::npos) << cmd << ": " << line;
    EXPECT_NE(line.find(".gguf"), std::string::npos) << cmd << ": " << line;
  }
}

TEST(CliHelp, VersionNamesTheBuild) {
  const auto r = test::RunLockstep("--version");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream in(r.out);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 6u) << r.out;
  EXPECT_EQ(lines[0].rfind("lockstep 0.", 0), 0u) << r.out;
  EXPECT_EQ(lines[1].rfind("commit: ", 0), 0u) << r.out;
  EXPECT_GT(lines[1].size(), std::string("commit: ").size()) << r.out;
  EXPECT_EQ(lines[2].rfind("build type: ", 0), 0u) << r.out;
  EXPECT_TRUE(lines[3] == "cuda backend: on" || lines[3] == "cuda backend: off") << r.out;
  EXPECT_EQ(lines[4], "export schema: lockstep.export v1");
  // The llama.cpp commit the adapter was compiled against (40 hex digits), or why there is none.
  const std::string llama = lines[5].substr(0, std::min<std::size_t>(lines[5].size(), 11));
  EXPECT_EQ(llama, "llama.cpp: ") << r.out;
  const std::string rest = lines[5].substr(llama.size());
  EXPECT_TRUE(
      (rest.size() == 40 && rest.find_first_not_of("0123456789abcdef") == std::string::npos) ||
      rest == "not built (scripts/install-llamacpp.sh)")
      << r.out;
}

TEST(CliHelp, MisspelledCommandsAndFlagsGetTheNearestName) {
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"generate --promt x", "unknown option --promt; did you mean --prompt?"},
      {"generate --prompt x --max-nwe 3", "unknown option --max-nwe; did you mean --max-new?"},
      {"gnerate --prompt x", "unknown command 'gnerate'; did you mean generate?"},
      {"sumarize a b", "did you mean summarize?"},
      {"model innit --preset tiny", "unknown command 'model innit'; did you mean model init?"},
      {"diff a.h5 b.h5 --nrmse-mx 1", "unknown option --nrmse-mx; did you mean --nrmse-max?"},
      {"run --resme x", "unknown option --resme; did you mean --resume?"},
  };
  for (const Case& c : cases) {
    const auto r = test::RunLockstep(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << r.err;
  }
  // Nothing near: no guess.
  const auto far = test::RunLockstep("generate --zzzzzzzz 1");
  EXPECT_EQ(far.exit_code, 2);
  EXPECT_NE(far.err.find("unknown option --zzzzzzzz"), std::string::npos) << far.err;
  EXPECT_EQ(far.err.find("did you mean"), std::string::npos) << far.err;
}

// A campaign run once per test process (aa-smoke, seconds), for the commands that read one.
const std::string& SmokeRun() {
  static const std::string dir = [] {
    const std::string d = test::NewDir("smoke") + "/run";
    const auto r = test::RunLockstep(std::string("run ") + LOCKSTEP_SOURCE_DIR +
                                     "/campaigns/aa-smoke.toml --no-progress --out " + d);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return d;
  }();
  return dir;
}

// The command's stdout is exactly one document; nothing named "-" appears in the working folder.
void ExpectStdoutDocument(const std::string& args, const std::string& starts_with) {
  SCOPED_TRACE(args);
  std::filesystem::remove("-");
  const auto r = test::RunLockstep(args);
  EXPECT_LE(r.exit_code, 1) << r.err;
  EXPECT_FALSE(r.out.empty());
  EXPECT_EQ(r.out.rfind(starts_with, 0), 0u) << "stdout:\n" << r.out.substr(0, 400);
  if (starts_with == "{") {
    EXPECT_TRUE(nlohmann::json::accept(r.out)) << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists("-")) << "a file named '-' was written";
}

TEST(CliOutputs, DashIsStdoutForEveryDocumentFlag) {
  const std::string run = SmokeRun();
  const std::string a = run + "/arms/A1/export.h5", b = run + "/arms/A2/export.h5";
  const std::string ta = run + "/arms/A1/trace.jsonl", tb = run + "/arms/A2/trace.jsonl";
  for (const char* cmd : {"diff", "summarize"}) {
    const std::string pair = std::string(cmd) + " " + a + " " + b;
    ExpectStdoutDocument(pair + " --json -", "{");
    ExpectStdoutDocument(pair + " --md -", "");
    ExpectStdoutDocument(pair + " --html -", "<!DOCTYPE html>");
    ExpectStdoutDocument(pair + " --junit -", "<?xml");
  }
  ExpectStdoutDocument("align " + ta + " " + tb + " --json -", "{");
  ExpectStdoutDocument("align " + ta + " " + tb + " --md -", "");
  ExpectStdoutDocument(
      "generate --model " + test::ModelDir("tiny") + " --prompt hi --max-new 2 --json -", "{");
  ExpectStdoutDocument("report " + run + " --json -", "{");
  ExpectStdoutDocument("report " + run + " --md -", "");
  ExpectStdoutDocument("report " + run + " --junit -", "<?xml");
  const std::string plan = std::string(LOCKSTEP_SOURCE_DIR) + "/campaigns/aa-smoke.toml";
  ExpectStdoutDocument(
      "run " + plan + " --no-progress --json - --out " + test::NewDir("r1") + "/run", "{");
  ExpectStdoutDocument(
      "gate " + plan + " --no-progress --junit - --out " + test::NewDir("g1") + "/run", "<?xml");
  // Two documents cannot share stdout.
  const auto two = test::RunLockstep("diff " + a + " " + b + " --json - --md -");
  EXPECT_EQ(two.exit_code, 2);
  EXPECT_NE(two.err.find("only one document can go to stdout"), std::string::npos) << two.err;
  // A document in a folder that does not exist is bad input, not a runtime failure.
  const auto nofolder = test::RunLockstep("diff " + a + " " + b + " --json /nonexistent/d/r.json");
  EXPECT_EQ(nofolder.exit_code, 2) << nofolder.err;
  EXPECT_NE(nofolder.err.find("/nonexistent/d"), std::string::npos) << nofolder.err;
}

TEST(CliOutputs, CampaignSummaryJson) {
  const std::string run = SmokeRun();
  const auto r = test::RunLockstep("report " + run + " --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["schema"], "lockstep.campaign_summary");
  EXPECT_EQ(j["campaign"], "aa-smoke");
  EXPECT_EQ(j["folder"], run);
  EXPECT_EQ(j["verdict"], "pass");
  EXPECT_EQ(j["passed"], true);
  EXPECT_TRUE(j["stopped"].is_null());
  ASSERT_EQ(j["arms"].size(), 3u);
  EXPECT_EQ(j["arms"][0]["name"], "A1");
  EXPECT_EQ(j["arms"][0]["status"], "finished");
  ASSERT_EQ(j["pairs"].size(), 2u);
  EXPECT_EQ(j["pairs"][0]["arm"], "A2");
  EXPECT_EQ(j["pairs"][0]["baseline"], "A1");
  EXPECT_EQ(j["pairs"][0]["passed"], true);
  EXPECT_EQ(j["pairs"][1]["control"], true);
  EXPECT_EQ(j["pairs"][1]["caught"], true);
  EXPECT_EQ(j["reports"]["md"], run + "/report.md");
  // The progress text moved to stderr: stdout is the object alone (parsed above).
  EXPECT_NE(r.err.find("report: "), std::string::npos) << r.err;
  // A run refused before it started (the folder holds another run) writes no summary: the
  // ledger there is not this run's.
  const auto refused = test::RunLockstep(std::string("run ") + LOCKSTEP_SOURCE_DIR +
                                         "/campaigns/aa-smoke.toml --json - --out " + run);
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_EQ(refused.out, "");
  // Resuming a finished run renders it again: the same summary.
  const auto resumed = test::RunLockstep("run --resume " + run + " --no-progress --json -");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(nlohmann::json::parse(resumed.out), j);
}

// `lockstep ARGS` under script(1): stdin, stdout and stderr are a terminal. Returns what the
// terminal showed (both streams).
std::string OnTerminal(const std::string& args) {
  const std::string cmd = "script -qec \"" + std::string(LOCKSTEP_BIN_PATH) + " " + args +
                          "\" /dev/null 2>&1 </dev/null";
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
    ::pclose(p);
  }
  return out;
}

TEST(CliGenerate, ProgressAndSummaryOnATerminalOnly) {
  if (std::system("command -v script >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "script(1) (util-linux / bsdutils) is not installed";
  const std::string gen = "generate --model " + test::ModelDir("tiny") +
                          " --prompt 'Hello there' --max-new 6 "
                          "--ignore-eos --threads 1";
  const std::string tty = OnTerminal(gen);
  EXPECT_NE(tty.find("prefill 10/10 tokens"), std::string::npos) << tty;
  EXPECT_NE(tty.find("decode 1/6 tokens"), std::string::npos) << tty;
  EXPECT_NE(tty.find("generate: 6 tokens in "), std::string::npos) << tty;
  EXPECT_NE(tty.find("stop length"), std::string::npos) << tty;
  EXPECT_NE(tty.find("tok/s)"), std::string::npos) << tty;
  // --no-progress on a terminal: neither.
  const std::string quiet = OnTerminal(gen + " --no-progress");
  EXPECT_EQ(quiet.find("prefill"), std::string::npos) << quiet;
  EXPECT_EQ(quiet.find("generate: "), std::string::npos) << quiet;
  // Piped: neither, and stderr is empty.
  const auto piped = test::RunLockstep(gen);
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  EXPECT_EQ(piped.err, "");
  // --progress forces it on where stderr is no terminal: the lines the campaign runner reads.
  const auto forced = test::RunLockstep(gen + " --progress");
  EXPECT_NE(forced.err.find("progress: prefill 10/10\n"), std::string::npos) << forced.err;
  EXPECT_NE(forced.err.find("generate: 6 tokens"), std::string::npos) << forced.err;
  EXPECT_EQ(test::RunLockstep(gen + " --progress --no-progress").exit_code, 2);
}

TEST(CliGenerate, PrintedTextEscapesControlBytes) {
  // The induction model continues a repeated prompt: its output repeats backspace and ESC.
  const std::string prompt = test::NewDir("ctl") + "/p.bin";
  ASSERT_TRUE(WriteFileAtomic(prompt,
                              "a\bb\x1b"
                              "c a\bb\x1b"
                              "c a\bb\x1b"
                              "c a\bb\x1b"
                              "c a\bb")
                  .ok());
  const std::string gen = "generate --model " + test::ModelDir("tiny-induction") +
                          " --prompt-file " + prompt + " --max-new 12 --ignore-eos --threads 1";
  const auto j = test::RunLockstep(gen + " --json");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const auto doc = nlohmann::json::parse(j.out);
  const auto ids = doc["output_ids"].get<std::vector<int>>();
  ASSERT_TRUE(std::count(ids.begin(), ids.end(), 27) > 0 &&
              std::count(ids.begin(), ids.end(), 8) > 0)
      << "the output holds no ESC and backspace: the test proves nothing";
  EXPECT_NE(doc["text"].get<std::string>().find('\x1b'), std::string::npos)
      << "JSON keeps the bytes";
  const auto t = test::RunLockstep(gen);
  ASSERT_EQ(t.exit_code, 0) << t.err;
  for (char c : t.out)
    EXPECT_FALSE((static_cast<unsigned char>(c) < 0x20 && c != '\n') || c == 0x7f)
        << "raw control byte " << static_cast<int>(c) << " in: " << t.out;
  EXPECT_NE(t.out.find("\\x1b"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("\\x08"), std::string::npos) << t.out;
  // --json PATH: the object in the file, the (escaped) text on stdout.
  const std::string path = test::NewDir("jsonpath") + "/g.json";
  const auto both = test::RunLockstep(gen + " --json " + path);
  ASSERT_EQ(both.exit_code, 0) << both.err;
  EXPECT_EQ(both.out, t.out);
  EXPECT_EQ(nlohmann::json::parse(*ReadFile(path))["output_ids"], doc["output_ids"]);
}

}  // namespace
}  // namespace lockstep
