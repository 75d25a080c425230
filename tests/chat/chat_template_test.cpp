// lockstep's chat-template interpreter on handwritten templates: Jinja's whitespace control and
// HF's trim/lstrip_blocks, scoping (set in a loop, namespace), Python string methods, slices,
// filters and tests; refusals by name; hostile templates stopped by the limits; where
// LoadChatTemplate finds a model's template (chat_template.jinja, tokenizer_config.json, GGUF).
#include "lockstep/harness/chat_template.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "lockstep/engine/gguf.h"
#include "lockstep/engine/tokenizer.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/chat_prompt.h"
#include "lockstep/harness/runner.h"
#include "test_util.h"

namespace lockstep {
namespace {

using J = nlohmann::ordered_json;

std::string Render(const std::string& src, const J& messages = J::array(),
                   ChatRenderOptions o = {}) {
  auto t = ChatTemplate::Parse(src);
  if (!t.ok()) return "PARSE: " + t.status().ToString();
  auto r = t->Render(messages, o);
  if (!r.ok()) return "RENDER: " + r.status().ToString();
  return *r;
}

TEST(ChatTemplate, WhitespaceControlAndBlocks) {
  EXPECT_EQ(Render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(Render("{% if true %}\nx\n{% endif %}\ny\n"), "x\ny");  // trim_blocks, one \n dropped
  EXPECT_EQ(Render("  {% if true %}x{% endif %}"), "x");            // lstrip_blocks
  EXPECT_EQ(Render("  {{ 'x' }}"), "  x");                          // not for expressions
  EXPECT_EQ(Render("a{# note #}b{#- c -#} d"), "abd");
  EXPECT_EQ(Render("{% if 0 %}a{% elif none %}b{% elif 'x' %}c{% else %}d{% endif %}"), "c");
  EXPECT_EQ(Render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Render("{%- generation %}x{% endgeneration -%}"), "x");
}

TEST(ChatTemplate, LoopsScopesAndNamespaces) {
  EXPECT_EQ(Render("{% for x in [1,2,3] %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }};"
                   "{% endfor %}"),
            "0TrueFalse;1FalseFalse;2FalseTrue;");
  // set inside a loop stays in the iteration; a namespace attribute outlives it.
  EXPECT_EQ(Render("{% set a = 1 %}{% set ns = namespace(b=1) %}{% for x in [5] %}{% set a = x %}"
                   "{% set ns.b = x %}{% endfor %}{{ a }} {{ ns.b }}"),
            "1 5");
  EXPECT_EQ(Render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}"),
            "a=1,b=2,");
  EXPECT_EQ(Render("{% for x in range(5) if x is odd %}{{ x }}{% endfor %}"), "13");
  EXPECT_EQ(Render("{% set ns = 3 %}{% set ns.x = 1 %}").rfind("RENDER: ", 0), 0u);
}

TEST(ChatTemplate, ExpressionsMethodsFiltersTests) {
  EXPECT_EQ(Render("{{ [1,2,3,4][::-1] }} {{ 'abcdef'[1:4] }} {{ [1,2,3][-1] }} {{ 'héllo'[1] }}"),
            "[4, 3, 2, 1] bcd 3 é");
  // Python's strip(chars): only those characters (@huggingface/jinja strips all whitespace).
  EXPECT_EQ(Render("[{{ '\\n \\tx \\n'.strip('\\n') }}][{{ '  x  '.lstrip() }}]"), "[ \tx ][x  ]");
  EXPECT_EQ(Render("{{ 'a</t>b</t>c'.split('</t>')[-1] }} {{ ' a  b '.split() | length }}"), "c 2");
  EXPECT_EQ(Render("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'bc')) }}"), "True True");
  EXPECT_EQ(Render("{{ messages | length - 1 }}", J::array({J::object(), J::object()})), "1");
  EXPECT_EQ(Render("{{ {'b': [1, 'x', none, true]} | tojson }}"),
            "{\"b\": [1, \"x\", null, true]}");
  EXPECT_EQ(Render("{{ 'Qué' | tojson }} {{ 'a\"\\n' | tojson }}"), "\"Qué\" \"a\\\"\\n\"");
  EXPECT_EQ(Render("{{ x is defined }} {{ none is none }} {{ 'a' is string }} {{ 1 is string }}"),
            "False True True False");
  EXPECT_EQ(
      Render("{{ 'y' if not x is defined else 'n' }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }}"),
      "y 3 2 1024");
  EXPECT_EQ(Render("{{ 'a' ~ 1 ~ none }} {{ 'b' in 'abc' }} {{ 3 not in [1, 2] }}"),
            "a1None True True");
  EXPECT_EQ(Render("{{ x | default('d') }} {{ ['a','b'] | join('-') }} {{ ' t ' | trim | upper }}"),
            "d a-b T");
  ChatRenderOptions off;
  off.enable_thinking = false;
  EXPECT_EQ(Render("{{ enable_thinking is false }}{{ add_generation_prompt }}", J::array(), off),
            "TrueTrue");
  EXPECT_EQ(Render("{{ raise_exception('roles must alternate') }}"),
            "RENDER: invalid argument: chat template raised an error: roles must alternate");
}

TEST(ChatTemplate, RefusesWhatItDoesNotSupportByName) {
  auto t = ChatTemplate::Parse("a\n{% macro f(x) %}{{ x }}{% endmacro %}");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Status::Code::kNotSupported);
  EXPECT_NE(t.status().message().find("unsupported tag 'macro' at line 2"), std::string::npos)
      << t.status().message();
  EXPECT_EQ(Render("{{ x | wordwrap }}")
                .rfind("RENDER: invalid argument: chat template: "
                       "filter 'wordwrap'",
                       0),
            0u);
  EXPECT_NE(Render("{% if x %}never closed").find("missing '{% endif %}'"), std::string::npos);
  EXPECT_NE(Render("{{ 'unterminated }}").find("unterminated string"), std::string::npos);
  EXPECT_NE(Render("{{ undefined_thing.attr }}").find("'undefined_thing' is undefined"),
            std::string::npos);
}

TEST(ChatTemplate, HostileTemplatesStopQuickly) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(Render("{% for i in range(1000000000) %}x{% endfor %}").find("range() of more than"),
            std::string::npos);
  EXPECT_NE(Render("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}"
                   "{% endfor %}")
                .find("steps"),
            std::string::npos);
  EXPECT_NE(Render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                   "{% endfor %}")
                .find("steps"),
            std::string::npos);
  EXPECT_NE(Render("{% set ns = namespace(x='ab') %}{% for i in range(64) %}"
                   "{% set ns.x = ns.x ~ ns.x %}{% endfor %}")
                .find("bytes"),
            std::string::npos);
  EXPECT_NE(Render("{% set ns = namespace(y='ab') %}{% for i in range(64) %}"
                   "{% set ns.y = ns.y + ns.y %}{{ ns.y }}{% endfor %}")
                .find("bytes"),
            std::string::npos);
  EXPECT_NE(Render("{{ 'x' * 1000000000 }}").find("bytes"), std::string::npos);
  EXPECT_NE(Render("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}")
                .find("too deeply"),
            std::string::npos);
  std::string deep;
  for (int k = 0; k < 200; ++k) deep += "{% if true %}";
  EXPECT_NE(Render(deep).find("too deeply"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

TEST(ChatTemplate, FoundBesideTheModel) {
  const std::string dir = testing::TempDir() + "/chat_template_found";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto none = LoadChatTemplate(dir);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"chat_template": "{{ bos_token }}[{{ messages[0].content }}]{{ eos_token }}",)"
      << R"( "eos_token": {"content": "<|im_end|>"}, "bos_token": "<s>"})";
  auto cfg = LoadChatTemplate(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  ASSERT_TRUE(cfg->has_value());
  auto r = (*cfg)->Render(J::array({J{{"role", "user"}, {"content", "hi"}}}), {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "<s>[hi]<|im_end|>");
  std::ofstream(dir + "/chat_template.jinja") << "jinja file {{ messages | length }}\n";
  auto file = LoadChatTemplate(dir);  // the .jinja file wins, as in transformers
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(*(*file)->Render(J::array(), {}), "jinja file 0");
  EXPECT_NE((*file)->origin().find("chat_template.jinja"), std::string::npos);
  std::ofstream(dir + "/chat_template.jinja") << "{% include 'x' %}";
  auto bad = LoadChatTemplate(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("chat_template.jinja"), std::string::npos);
  EXPECT_NE(bad.status().message().find("unsupported tag 'include'"), std::string::npos);

  // A GGUF file's tokenizer.chat_template, its special tokens from the vocabulary.
  std::map<std::string, GgufValue> kv;
  kv["general.architecture"] = GgufValue{std::string("qwen3next"), 8};
  kv["tokenizer.chat_template"] = GgufValue{std::string("gguf {{ eos_token }}"), 8};
  kv["tokenizer.ggml.tokens"] = GgufValue{
      std::vector<GgufValue>{GgufValue{std::string("a"), 8}, GgufValue{std::string("<|end|>"), 8}},
      9};
  kv["tokenizer.ggml.eos_token_id"] = GgufValue{std::uint64_t{1}, 4};
  ASSERT_TRUE(WriteGguf(dir + "/m.gguf", kv, {}).ok());
  auto g = LoadChatTemplate(dir + "/m.gguf");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_TRUE(g->has_value());
  EXPECT_EQ(*(*g)->Render(J::array(), {}), "gguf <|end|>");
}

// A campaign's [request] chat = FILE: the messages rendered with the model's template, then the
// model's tokenizer (byte level here): the ids `generate --chat` would run.
TEST(ChatTemplate, CampaignRequestFromChatMessages) {
  const std::string dir = testing::TempDir() + "/chat_campaign";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const auto& e : std::filesystem::directory_iterator(test::ModelDir("tiny")))
    if (e.is_regular_file())
      std::filesystem::copy_file(e.path(), dir + "/" + e.path().filename().string());
  std::ofstream(dir + "/chat_template.jinja")
      << "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
         "{% if add_generation_prompt %}<assistant>{% endif %}";
  std::ofstream(dir + "/chat.json")
      << R"({"messages": [{"role": "user", "content": "hé"}], "add_generation_prompt": true})";
  Campaign c;
  c.request.chat_file = dir + "/chat.json";
  ASSERT_TRUE(ProvisionPlanRequest(c, dir, dir + "/request.tokens").ok());
  std::ifstream in(dir + "/request.tokens");
  std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string want;
  for (std::int32_t id : EncodeBytes("<user>hé<assistant>"))
    want += (want.empty() ? "" : " ") + std::to_string(id);
  EXPECT_EQ(got, want + "\n");
  auto text = RenderChatFile(dir, dir + "/chat.json");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "<user>hé<assistant>");
  std::ofstream(dir + "/bad.json") << R"({"messages": [{"role": "user", "content": "x"}], "x": 1})";
  auto bad = RenderChatFile(dir, dir + "/bad.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown field 'x'"), std::string::npos);
}

}  // namespace
}  // namespace lockstep
