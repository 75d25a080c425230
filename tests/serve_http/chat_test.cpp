// POST /v1/chat/completions on the real server (issue 42): the prompt is the model's chat
// template rendered by lockstep's interpreter, the answer is the completions path's in chat
// shape, and the tokens are bitwise what `lockstep generate --chat` gives the same messages with
// the same seed (plain and streamed; the streamed deltas concatenate to the text). A model without
// a template, or with one outside the interpreter's subset, is a 400 that says so (and exit 2 for
// generate), and chat fields lockstep cannot answer are refused with the reason.
#include <gtest/gtest.h>
#include <httplib.h>

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

// ChatML as Qwen's templates write it (system first when given, the generation prompt, the
// thinking switch), small enough to read here.
constexpr const char* kChatMl = R"({%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
)";

// The tiny model's files in a folder of its own, with `chat_template.jinja` = `tmpl` ("" none).
std::string ModelWithTemplate(const std::string& name, const std::string& tmpl) {
  const std::string dir = NewDir(name);
  for (const auto& e : fs::directory_iterator(ModelDir("tiny")))
    if (e.is_regular_file()) fs::copy_file(e.path(), dir + "/" + e.path().filename().string());
  if (!tmpl.empty()) std::ofstream(dir + "/chat_template.jinja") << tmpl;
  return dir;
}

std::vector<std::string> Args(const std::string& model) {
  return {"--model", model, "--port", "0", "--threads", "1"};
}

const json kMessages = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                    {{"role", "user"}, {"content", "Why is the sky blue? ü"}}});

// `lockstep generate --chat` on the same messages: its output ids.
json GenerateIds(const std::string& model, const json& chat, const std::string& flags) {
  const std::string file = NewDir("chat-generate") + "/chat.json";
  std::ofstream(file) << chat.dump();
  CmdResult r = RunLockstep("generate --model " + model + " --threads 1 --chat " + file + " " +
                            flags + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out, nullptr, false);
  return j.is_discarded() ? json() : j["output_ids"];
}

TEST(ServeChat, AnswersInChatShapeWithGeneratesTokens) {
  const std::string model = ModelWithTemplate("chat-model", kChatMl);
  ServeProcess srv(Args(model));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  const json body = {{"messages", kMessages},
                     {"max_completion_tokens", 12},
                     {"temperature", 0.8},
                     {"seed", 7},
                     {"chat_template_kwargs", {{"enable_thinking", false}}}};
  Answer a = Post(*cli, "/v1/chat/completions", body);
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.body["object"], "chat.completion");
  const json& choice = a.body["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_TRUE(choice["message"]["content"].is_string());
  EXPECT_FALSE(choice.contains("text"));
  EXPECT_TRUE(choice["finish_reason"] == "length" || choice["finish_reason"] == "stop");
  EXPECT_EQ(a.body["usage"]["completion_tokens"], a.body["lockstep"]["output_ids"].size());
  // The rendered prompt: ChatML with the thinking switch off, byte-level ids of that text.
  const std::string prompt =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhy is "
      "the sky blue? ü<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
  EXPECT_EQ(a.body["usage"]["prompt_tokens"], prompt.size());
  const json chat_file = {{"messages", kMessages},
                          {"chat_template_kwargs", {{"enable_thinking", false}}}};
  EXPECT_EQ(a.body["lockstep"]["output_ids"],
            GenerateIds(model, chat_file, "--max-new 12 --temperature 0.8 --seed 7"));

  // Streamed: deltas in chat.completion.chunk events that concatenate to the same text.
  json sbody = body;
  sbody["stream"] = true;
  auto res = cli->Post("/v1/chat/completions", sbody.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  std::istringstream events(res->body);
  std::string line, text;
  json last;
  bool done = false;
  for (int n = 0; std::getline(events, line) && n < 10000; ++n) {
    if (line.rfind("data: ", 0) != 0) continue;
    if (line == "data: [DONE]") {
      done = true;
      continue;
    }
    json chunk = json::parse(line.substr(6));
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    const json& d = chunk["choices"][0]["delta"];
    if (d.contains("content")) text += d["content"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) last = chunk;
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(text, choice["message"]["content"].get<std::string>());
  ASSERT_TRUE(last.is_object());
  EXPECT_EQ(last["lockstep"]["output_ids"], a.body["lockstep"]["output_ids"]);
  EXPECT_EQ(last["usage"], a.body["usage"]);
}

TEST(ServeChat, RefusesWhatItCannotRenderOrAnswer) {
  // No template: chat is 400 naming the files it looked for, completions still work.
  {
    ServeProcess srv(Args(ModelWithTemplate("chat-none", "")));
    ASSERT_TRUE(srv.started()) << srv.Log();
    auto cli = srv.Client();
    Answer a = Post(*cli, "/v1/chat/completions", {{"messages", kMessages}, {"max_tokens", 2}});
    EXPECT_EQ(a.status, 400);
    EXPECT_NE(a.body.dump().find("no chat template"), std::string::npos) << a.body;
    EXPECT_EQ(Post(*cli, "/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}}).status, 200);
  }
  // A template outside the subset: 400 with the construct and line; generate --chat exit 2.
  const std::string bad = ModelWithTemplate("chat-macro", "{% macro m() %}x{% endmacro %}");
  {
    ServeProcess srv(Args(bad));
    ASSERT_TRUE(srv.started()) << srv.Log();
    auto cli = srv.Client();
    Answer a = Post(*cli, "/v1/chat/completions", {{"messages", kMessages}});
    EXPECT_EQ(a.status, 400);
    EXPECT_NE(a.body.dump().find("unsupported tag 'macro' at line 1"), std::string::npos) << a.body;
  }
  const std::string file = NewDir("chat-macro-file") + "/chat.json";
  std::ofstream(file) << kMessages.dump();
  CmdResult g = RunLockstep("generate --model " + bad + " --chat " + file + " --max-new 2");
  EXPECT_EQ(g.exit_code, 2) << g.err;
  EXPECT_NE(g.err.find("unsupported tag 'macro'"), std::string::npos) << g.err;

  ServeProcess srv(Args(ModelWithTemplate("chat-refusals", kChatMl)));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  struct Case {
    json body;
    const char* needle;
  };
  const Case cases[] = {
      {{{"max_tokens", 2}}, "'messages' is required"},
      {{{"messages", json::array()}}, "non-empty array"},
      {{{"messages", {{{"role", "robot"}, {"content", "x"}}}}}, "messages[0].role must be one of"},
      {{{"messages", {{{"role", "user"}}}}}, "messages[0].content is required"},
      {{{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}},
       "only text parts"},
      {{{"messages", kMessages}, {"tools", json::array({json::object()})}},
       "'tools' is not supported"},
      {{{"messages", kMessages}, {"logprobs", true}}, "chat logprobs are not implemented"},
      {{{"messages", kMessages}, {"prompt", "x"}}, "unknown field 'prompt'"},
      {{{"messages", kMessages}, {"bogus", 1}}, "unknown field 'bogus'"},
  };
  for (const Case& c : cases) {
    Answer a = Post(*cli, "/v1/chat/completions", c.body);
    EXPECT_EQ(a.status, 400) << c.body;
    EXPECT_NE(a.body.dump().find(c.needle), std::string::npos) << c.needle << " in " << a.body;
  }
  // Text parts are joined with "\n" (as vLLM does): the same prompt as the joined string.
  Answer parts = Post(
      *cli, "/v1/chat/completions",
      {{"messages",
        {{{"role", "user"},
          {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}},
       {"max_tokens", 3},
       {"temperature", 0}});
  Answer joined = Post(*cli, "/v1/chat/completions",
                       {{"messages", {{{"role", "user"}, {"content", "a\nb"}}}},
                        {"max_tokens", 3},
                        {"temperature", 0}});
  ASSERT_EQ(parts.status, 200) << parts.body;
  EXPECT_EQ(parts.body["lockstep"]["request_sha256"], joined.body["lockstep"]["request_sha256"]);
}

}  // namespace
}  // namespace lockstep::test
