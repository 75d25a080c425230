// Must show 1 of issue 42: the official OpenAI Node client (npm openai 6.49.0, installed at test
// time by setup_openai.sh) against the real `lockstep serve` on 127.0.0.1 (openai_calls.js):
// completions and chat completions, plain and streamed with stream_options.include_usage, `user`
// and the penalties (presence 0.5, frequency 0.25) set, n = 2; every call succeeds and every text
// equals `lockstep generate`'s with the same seed (choice k of n = 2: seed + k). Must show 3: two
// seedless chats at temperature 0.8 draw different seeds and differ, and each reported seed
// replays its answer exactly with `lockstep generate --seed`.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "serve_process.h"
#include "test_util.h"

namespace lockstep::test {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const std::string kDir = LOCKSTEP_OPENAI_DIR;

constexpr const char* kChatMl = R"({%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)";

const json kMessages = json::array({{{"role", "system"}, {"content", "You are terse."}},
                                    {{"role", "user"}, {"content", "Name a colour. ü"}}});

std::string Shell(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// `lockstep generate` with `request` ("--prompt ..." or "--chat FILE") at temperature 0.8 and
// the penalties openai_calls.js sets:
// its text and ids.
json Generate(const std::string& model, const std::string& request, int max_new,
              std::uint64_t seed) {
  CmdResult r =
      RunLockstep("generate --model " + model + " --threads 1 " + request + " --max-new " +
                  std::to_string(max_new) +
                  " --presence-penalty 0.5 --frequency-penalty 0.25 --temperature 0.8 --seed " +
                  std::to_string(seed) + " --json -");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out, nullptr, false);
}

TEST(OpenAiClient, EveryCallSucceedsAndMatchesGenerate) {
  std::ifstream skip(kDir + "/skip.txt");
  if (skip) {
    std::string why((std::istreambuf_iterator<char>(skip)), std::istreambuf_iterator<char>());
    GTEST_SKIP() << why;
  }
  const std::string model = NewDir("openai-model");
  for (const auto& e : fs::directory_iterator(ModelDir("tiny")))
    if (e.is_regular_file()) fs::copy_file(e.path(), model + "/" + e.path().filename().string());
  std::ofstream(model + "/chat_template.jinja") << kChatMl;
  ServeProcess srv({"--model", model, "--port", "0", "--threads", "1", "--api-key", "test-key",
                    "--model-name", "tiny-chat"});
  ASSERT_TRUE(srv.started()) << srv.Log();
  const std::string out = NewDir("openai-out") + "/calls.json";
  const std::string cmd =
      "NODE_PATH=" + Shell(kDir + "/npm/node_modules") + " node " +
      Shell(std::string(LOCKSTEP_SOURCE_DIR) + "/tests/openai/openai_calls.js") +
      " http://127.0.0.1:" + std::to_string(srv.port()) + "/v1 tiny-chat " + Shell(out) + " 2>&1";
  const int rc = std::system(cmd.c_str());
  ASSERT_EQ(rc, 0) << "openai_calls.js failed; server log:\n" << srv.Log();
  std::ifstream in(out);
  const json got = json::parse(in, nullptr, false);
  ASSERT_TRUE(got.is_object());

  const std::string prompt = "--prompt " + Shell("Hello, world");
  const std::string chat_file = NewDir("openai-chat") + "/chat.json";
  std::ofstream(chat_file) << json{{"messages", kMessages}}.dump();
  const std::string chat = "--chat " + Shell(chat_file);

  const json c = Generate(model, prompt, 10, 11);
  EXPECT_EQ(got["completion"]["text"], c["text"]);
  EXPECT_EQ(got["completion"]["lockstep"]["output_ids"], c["output_ids"]);
  EXPECT_EQ(got["completion_stream"]["text"], c["text"]);
  EXPECT_EQ(got["completion_stream"]["usage_chunks"], 1);  // include_usage: a chunk of its own
  EXPECT_EQ(got["completion_stream"]["usage"]["completion_tokens"], c["output_ids"].size());

  const json ch = Generate(model, chat, 10, 12);
  EXPECT_EQ(got["chat"]["text"], ch["text"]);
  EXPECT_EQ(got["chat"]["role"], "assistant");
  EXPECT_EQ(got["chat"]["usage"]["prompt_tokens"], ch["prompt_tokens"]);
  EXPECT_EQ(got["chat_stream"]["text"], ch["text"]);
  EXPECT_EQ(got["chat_stream"]["usage_chunks"], 1);
  EXPECT_EQ(got["chat_stream"]["usage"]["completion_tokens"], ch["output_ids"].size());

  ASSERT_EQ(got["chat_n2"]["texts"].size(), 2u);
  EXPECT_EQ(got["chat_n2"]["indices"], json::array({0, 1}));
  std::size_t n2_tokens = 0;
  for (int k = 0; k < 2; ++k) {
    const json g = Generate(model, chat, 10, 13 + static_cast<std::uint64_t>(k));
    EXPECT_EQ(got["chat_n2"]["texts"][k], g["text"]) << "choice " << k;
    n2_tokens += g["output_ids"].size();
    const json gc = Generate(model, prompt, 10, 14 + static_cast<std::uint64_t>(k));
    EXPECT_EQ(got["completion_n2"]["texts"][k], gc["text"]) << "choice " << k;
  }
  EXPECT_EQ(got["chat_n2"]["usage"]["completion_tokens"], n2_tokens);

  const json& s = got["seedless"];
  ASSERT_EQ(s.size(), 2u);
  EXPECT_TRUE(s[0]["seed_drawn"].get<bool>());
  EXPECT_NE(s[0]["seed"], s[1]["seed"]);
  EXPECT_NE(s[0]["output_ids"], s[1]["output_ids"]);
  for (int k = 0; k < 2; ++k) {
    const json g = Generate(model, chat, 16, s[k]["seed"].get<std::uint64_t>());
    EXPECT_EQ(s[k]["output_ids"], g["output_ids"]) << "seedless request " << k;
    EXPECT_EQ(s[k]["text"], g["text"]);
  }
}

}  // namespace
}  // namespace lockstep::test
