// The BPE tokenizer on a small handwritten tokenizer.json (data/tiny_tokenizer.json: Qwen's
// pipeline, byte ids = byte values, a few ranked merges, three added tokens); the expected ids and
// pieces below are what Hugging Face's tokenizers 0.23.2 gives for the same file and strings.
// The comparison on Qwen's own file is tokenizer_hf_test.cpp. GgufVocabulary.*: the same file
// embedded in a GGUF model (tokenizer.ggml.*, as llama.cpp's converter writes it) gives the same
// tokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/bpe_tokenizer.h"
#include "lockstep/engine/gguf.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/runner.h"
#include "lockstep/instrument/fingerprint.h"
#include "model/pretokenize.h"
#include "test_util.h"

namespace lockstep {
namespace {

const std::string kTiny =
    std::string(LOCKSTEP_SOURCE_DIR) + "/tests/tokenizer/data/tiny_tokenizer.json";

std::string TinyText() {
  auto t = ReadFile(kTiny);
  EXPECT_TRUE(t.ok());
  return t.ok() ? *t : "";
}

const Tokenizer& Tiny() {
  static const TokenizerPtr tok = [] {
    auto t = LoadBpeTokenizer(kTiny);
    EXPECT_TRUE(t.ok()) << t.status().message();
    return std::move(*t);
  }();
  return *tok;
}

std::vector<std::int32_t> Enc(const std::string& s) {
  auto ids = Tiny().Encode(s);
  EXPECT_TRUE(ids.ok()) << ids.status().message();
  return ids.ok() ? *ids : std::vector<std::int32_t>{};
}

using Ids = std::vector<std::int32_t>;

TEST(BpeTokenizer, MergesApplyLowestRankFirst) {
  EXPECT_EQ(Enc("abc"), (Ids{'a', 256}));  // (b, c) ranks before (a, b): a + bc, not ab + c
  EXPECT_EQ(Enc("ab"), (Ids{257}));
  EXPECT_EQ(Enc("hello world"), (Ids{261, 266}));
  EXPECT_EQ(Enc("it's  x"), (Ids{'i', 't', 269, ' ', ' ', 'x'}));
}

TEST(BpeTokenizer, AddedTokensAreMatchedBeforeThePreTokenizer) {
  EXPECT_EQ(Enc("a<|sp|>b"), (Ids{'a', 270, 'b'}));
  EXPECT_EQ(Enc("<|sp|>long<x>a<|sp|>b"), (Ids{272, 271, 'a', 270, 'b'}));  // leftmost-longest
  EXPECT_EQ(Enc("<|sp"), (Ids{'<', '|', 's', 'p'}));                        // unterminated: text
  EXPECT_EQ(Enc("<|sp|>"), (Ids{270}));
}

TEST(BpeTokenizer, TextIsNfcNormalisedBeforeMerging) {
  EXPECT_EQ(Enc("e\xCC\x81"), (Ids{267}));  // e + U+0301 -> U+00E9, one merged token
  EXPECT_EQ(Enc("\xC3\xA9"), (Ids{267}));
  EXPECT_EQ(Tiny().Decode(Enc("e\xCC\x81")), "\xC3\xA9");
}

// Pieces as Hugging Face's pre_tokenizer.pre_tokenize_str cuts them (no normaliser applied).
TEST(BpeTokenizer, QwenSplitCutsLikeHuggingFace) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"Hello world's  \n\n x", {"Hello", " world", "'s", "  \n\n", " x"}},
      {"x'S y'\u017f I'LL", {"x", "'S", " y", "'\u017f", " I", "'LL"}},
      {"a1234b", {"a", "1", "2", "3", "4", "b"}},
      {" ,.!?\n\nz", {" ,.!?\n\n", "z"}},
      {"(hello) [x]", {"(hello", ")", " [", "x", "]"}},
      {"\t\tfoo  bar   \n", {"\t", "\tfoo", " ", " bar", "   \n"}},
      {"   ", {"   "}},
      {"a \u00a0b\u3000\u3000c", {"a", " ", "\u00a0b", "\u3000", "\u3000c"}},
      {"\u6570\u5b57\uff11\uff12\uff13abc", {"\u6570\u5b57", "\uff11", "\uff12", "\uff13", "abc"}},
      {"e\u0301!!!\r\n\r\nend", {"e", "\u0301!!!\r\n\r\n", "end"}},
      {"\u0085x \u0085 y", {"\u0085x", " \u0085", " y"}},
      {"\u000bx \f\u001cy", {"\u000bx", " ", "\f", "\u001cy"}},
      {"<|sp|>\n", {"<|", "sp", "|>\n"}},
      {" \n \n a", {" \n \n", " a"}},
      {" \u0085!", {" ", "\u0085", "!"}},
      {" \u001c!", {" \u001c!"}},
      {" \u200b!", {" \u200b!"}},
  };
  for (const auto& [text, want] : cases) {
    std::vector<std::uint32_t> ends;
    QwenSplit(text, ends);
    std::vector<std::string> got;
    std::uint32_t b = 0;
    for (auto e : ends) got.push_back(text.substr(b, e - b)), b = e;
    EXPECT_EQ(got, want) << nlohmann::json(text).dump();
  }
}

TEST(BpeTokenizer, InvalidUtf8IsRefusedNamingTheByte) {
  for (const std::string& bad :
       std::vector<std::string>{"\xff", "ab\x80", "\xC0\x80", "\xED\xA0\x80", "x\xE2\x82",
                                "\xF4\x90\x80\x80", std::string("ok\xF0\x9F\x98", 5)}) {
    auto r = Tiny().Encode(bad);
    ASSERT_FALSE(r.ok()) << bad.size();
    EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find("not valid UTF-8 (byte"), std::string::npos);
  }
}

TEST(BpeTokenizer, StreamDecodeEmitsOnlyCompleteCharacters) {
  const std::string text = "h\xC3\xA9llo \xF0\x9F\x98\x80!";  // 4-byte emoji: 4 byte tokens
  const Ids ids = Enc(text);
  StreamDecoder dec(Tiny());
  std::string streamed;
  for (std::int32_t id : ids) {
    const std::string piece = dec.Push(id);
    EXPECT_EQ(piece.find('\xF0') != std::string::npos && piece.size() < 4, false);
    streamed += piece;
  }
  streamed += dec.Finish();
  EXPECT_EQ(streamed, text);
  // The emoji's first three bytes emit nothing; the fourth emits all four.
  StreamDecoder d2(Tiny());
  EXPECT_EQ(d2.Push(0xF0), "");
  EXPECT_EQ(d2.Push(0x9F), "");
  EXPECT_EQ(d2.Push(0x98), "");
  EXPECT_EQ(d2.Push(0x80), "\xF0\x9F\x98\x80");
  // Broken sequences become U+FFFD as Hugging Face's decode (from_utf8_lossy) writes them.
  EXPECT_EQ(d2.Push(0xF0), "");
  EXPECT_EQ(d2.Push('a'),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(d2.Push(0xE2), "");
  EXPECT_EQ(d2.Finish(), "\xEF\xBF\xBD");
  const Ids lossy = {0xF0, 0x9F, 'x', 0x80, 0xC3};
  EXPECT_EQ(Tiny().Decode(lossy),
            "\xEF\xBF\xBD"
            "x"
            "\xEF\xBF\xBD"
            "\xEF\xBF\xBD");
}

TEST(BpeTokenizer, DecodeSkipsIdsWithoutAToken) {
  EXPECT_EQ(Tiny().Decode(Ids{'a', 1000, 270, -1, 'b'}), "a<|sp|>b");
  EXPECT_EQ(Tiny().info().vocab_size, 273);
  EXPECT_EQ(Tiny().info().max_id, 272);
}

// Every field outside what bpe_tokenizer.h lists is kNotSupported, naming it.
TEST(BpeTokenizer, UnsupportedTypesAndOptionsAreRefusedByName) {
  const auto base = nlohmann::json::parse(TinyText());
  struct Case {
    std::string name;
    std::function<void(nlohmann::json&)> edit;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"model type", [](auto& j) { j["model"]["type"] = "WordPiece"; }, "model.type \"WordPiece\""},
      {"normalizer",
       [](auto& j) {
         j["normalizer"] = {{"type", "NFKC"}};
       },
       "normalizer"},
      {"byte_fallback", [](auto& j) { j["model"]["byte_fallback"] = true; }, "model.byte_fallback"},
      {"dropout", [](auto& j) { j["model"]["dropout"] = 0.1; }, "model.dropout"},
      {"unk", [](auto& j) { j["model"]["unk_token"] = "<unk>"; }, "model.unk_token"},
      {"pattern",
       [](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+"; },
       "pre_tokenizer Split"},
      {"prefix space",
       [](auto& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
       "pre_tokenizer ByteLevel"},
      {"decoder",
       [](auto& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder"},
      {"post",
       [](auto& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"}};
       },
       "post_processor"},
      {"lstrip", [](auto& j) { j["added_tokens"][0]["lstrip"] = true; }, "lstrip"},
      {"normalized", [](auto& j) { j["added_tokens"][1]["normalized"] = true; }, "normalized"},
      {"truncation",
       [](auto& j) {
         j["truncation"] = {{"max_length", 8}};
       },
       "truncation"},
      {"added id", [](auto& j) { j["added_tokens"][0]["id"] = 300; }, "has id 300"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = base;
    c.edit(j);
    auto t = ParseBpeTokenizer(j.dump(), "t.json");
    ASSERT_FALSE(t.ok()) << c.name;
    EXPECT_EQ(t.status().code(), Status::Code::kNotSupported) << c.name;
    EXPECT_NE(t.status().message().find(c.needle), std::string::npos)
        << c.name << ": " << t.status().message();
    EXPECT_EQ(t.status().exit_code(), 2);
  }
  nlohmann::json j = base;
  j["model"]["merges"].push_back({"zz", "q"});
  auto t = ParseBpeTokenizer(j.dump(), "t.json");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Status::Code::kCorruption);
}

// ---- the commands (tiny model: vocabulary 512 holds the tiny tokenizer's 273 ids) ----

std::string TinyModelWithTokenizer() {
  static const std::string dir = [] {
    const std::string d = test::NewDir("tok-model");
    auto r =
        test::RunLockstep("model init --preset tiny --seed 7 --tokenizer " + kTiny + " --out " + d);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return d;
  }();
  return dir;
}

TEST(TokenizeCommand, TokenizeAndDetokenizeRoundTrip) {
  const std::string m = TinyModelWithTokenizer();
  auto t = test::RunLockstep("tokenize --model " + m + " 'hello world<|sp|>'");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_EQ(t.out, "261 266 270\n");
  auto d = test::RunLockstep("detokenize --model " + m + " '261,266 270'");
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_EQ(d.out, "hello world<|sp|>\n");
  auto j = test::RunLockstep("tokenize --model " + m + " --json - abc");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["ids"], nlohmann::json::parse("[97, 256]"));
  EXPECT_EQ(doc["tokenizer"]["type"], "bpe");
  EXPECT_EQ(doc["tokenizer"]["vocab_size"], 273);
  auto skip = test::RunLockstep("detokenize --model " + m + " '97 99999 98'");
  EXPECT_EQ(skip.exit_code, 0);
  EXPECT_EQ(skip.out, "ab\n");
  EXPECT_NE(skip.err.find("1 ids have no token"), std::string::npos) << skip.err;
  auto bad = test::RunLockstep("detokenize --model " + m + " '1 -5'");
  EXPECT_EQ(bad.exit_code, 2);
}

TEST(TokenizeCommand, InvalidUtf8PromptIsExit2) {
  const std::string m = TinyModelWithTokenizer();
  auto g = test::RunLockstep("generate --model " + m +
                             " --prompt \"$(printf 'ab\\377cd')\" --max-new 2");
  EXPECT_EQ(g.exit_code, 2);
  EXPECT_NE(g.err.find("prompt: text: is not valid UTF-8 (byte 2 of 5)"), std::string::npos)
      << g.err;
  auto t = test::RunLockstep("tokenize --model " + m + " \"$(printf '\\300\\200')\"");
  EXPECT_EQ(t.exit_code, 2) << t.err;
}

TEST(TokenizeCommand, GenerateUsesTheModelsTokenizerAndReportsIt) {
  const std::string m = TinyModelWithTokenizer();
  auto g =
      test::RunLockstep("generate --model " + m + " --prompt 'hello world' --max-new 4 --json -");
  ASSERT_EQ(g.exit_code, 0) << g.err;
  const auto j = nlohmann::json::parse(g.out);
  EXPECT_EQ(j["prompt_tokens"], 2);  // 261 266, not 11 bytes
  EXPECT_EQ(j["tokenizer"]["type"], "bpe");
  EXPECT_EQ(j["tokenizer"]["sha256"].get<std::string>().size(), 64u);
  std::string ids;
  for (auto id : j["output_ids"]) ids += std::to_string(id.get<int>()) + " ";
  auto d = test::RunLockstep("detokenize --model " + m + " --json - '" + ids + "'");
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_EQ(nlohmann::json::parse(d.out)["text"], j["text"]);
  // A model without tokenizer.json keeps byte-level tokens and says so.
  auto b = test::RunLockstep("generate --model " + test::ModelDir("tiny") +
                             " --prompt 'hello world' --max-new 1 --json -");
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(jb["prompt_tokens"], 11);
  EXPECT_EQ(jb["tokenizer"]["type"], "byte");
  EXPECT_TRUE(jb["tokenizer"]["sha256"].is_null());
}

// A campaign's text prompt is encoded by the plan model's tokenizer, as generate --prompt does
// (issue 23: the runner used byte tokens for every text prompt); the needle stays byte tokens.
TEST(TokenizeCommand, CampaignTextPromptsUseTheModelTokenizer) {
  const std::string m = TinyModelWithTokenizer();
  const std::string d = test::NewDir("tok-plan");
  for (const char* request :
       {"prompt = \"hello world\"", "prompt_file = \"p.txt\"", "needle = { tokens = 64 }"}) {
    ASSERT_TRUE(WriteFileAtomic(d + "/p.txt", "hello world").ok());
    const std::string plan =
        "name = \"t\"\nquestion = \"q\"\nhypothesis = \"h\"\n[model]\npath = \"" + m +
        "\"\n[request]\n" + request + "\n[[arm]]\nname = \"A1\"\n";
    auto c = ParseCampaign(plan, "plan.toml", d);
    ASSERT_TRUE(c.ok()) << c.status().message();
    const std::string tokens = d + "/request.tokens";
    std::filesystem::remove(tokens);
    ASSERT_TRUE(ProvisionPlanRequest(*c, m, tokens).ok());
    std::ifstream f(tokens);
    std::string ids((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (std::string(request).rfind("needle", 0) == 0) {
      std::istringstream in(ids);
      int n = 0, id = 0;
      while (in >> id) {
        ++n;
        EXPECT_LT(id, 256);
      }
      EXPECT_EQ(n, 64) << "the needle prompt is 64 byte tokens";
    } else {
      EXPECT_EQ(ids, "261 266\n") << request;
    }
  }
}

TEST(TokenizeCommand, ModelInitTokenizerNeedsALargeEnoughVocabulary) {
  const std::string d = test::NewDir("tok-small");
  auto r = test::RunLockstep("model init --preset tiny --vocab 200 --tokenizer " + kTiny +
                             " --out " + d + "/m");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("hint: --vocab 273 or more"), std::string::npos) << r.err;
  std::ifstream f(d + "/m/config.json");
  EXPECT_FALSE(f.good()) << "nothing is written when the tokenizer does not fit";
  const std::string u = test::NewDir("tok-unsup");
  auto j = nlohmann::json::parse(TinyText());
  j["model"]["type"] = "Unigram";
  ASSERT_TRUE(WriteFileAtomic(u + "/tokenizer.json", j.dump()).ok());
  auto t = test::RunLockstep("tokenize --model " + u + " abc");
  EXPECT_EQ(t.exit_code, 2);
  EXPECT_NE(t.err.find("model.type \"Unigram\" is not supported"), std::string::npos) << t.err;
}

// ---- the same vocabulary in a GGUF file (tokenizer.ggml.*) ----

std::string TinyGgufWithTokenizer() {
  static const std::string path = [] {
    const std::string d = test::NewDir("tok-gguf");
    auto r = test::RunLockstep("model init --preset tiny --seed 7 --format gguf --tokenizer " +
                               kTiny + " --out " + d);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("the vocabulary of"), std::string::npos) << r.out;
    EXPECT_FALSE(std::ifstream(d + "/tokenizer.json").good()) << "the GGUF carries it alone";
    return d + "/model.gguf";
  }();
  return path;
}

const std::vector<std::string>& VocabTexts() {
  static const std::vector<std::string> texts = {"hello world",
                                                 "hello world<|sp|>long <x>",
                                                 "<|sp|><|sp|>long<|sp|>",
                                                 "[PAD300] [PAD5]",
                                                 "e\xcc\x81 caf\xc3\xa9 \xc3\xa9",
                                                 "  \n\t tabs\r\n\n  ",
                                                 "\xe6\x97\xa5\xe6\x9c\xac 123 4567",
                                                 "don't we'll THEY'RE",
                                                 "a\xc2\xa0"
                                                 "b",
                                                 ""};
  return texts;
}

TEST(GgufVocabulary, SameTokenizerAsTheTokenizerJson) {
  auto g = LoadModelTokenizer(TinyGgufWithTokenizer());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Tokenizer& gguf = **g;
  EXPECT_EQ(gguf.info().type, "bpe");
  EXPECT_EQ(gguf.info().path, TinyGgufWithTokenizer());
  EXPECT_EQ(gguf.info().vocab_size, Tiny().info().vocab_size);
  EXPECT_EQ(gguf.info().max_id, Tiny().info().max_id);
  for (std::int32_t id = 0; id < 512; ++id) {
    EXPECT_EQ(gguf.Has(id), Tiny().Has(id)) << id;  // "[PAD<id>]" slots: no token, as in the json
    std::string a, b;
    gguf.AppendBytes(id, a);
    Tiny().AppendBytes(id, b);
    EXPECT_EQ(a, b) << id;
  }
  for (const std::string& text : VocabTexts()) {
    auto ids = gguf.Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(*ids, Enc(text)) << text;
    EXPECT_EQ(gguf.Decode(*ids), Tiny().Decode(*ids)) << text;
  }
  EXPECT_EQ(Enc("[PAD300]").size(), 8u) << "a padding slot's name is text, not a token";
}

TEST(GgufVocabulary, CommandsUseTheGgufsVocabulary) {
  const std::string gg = TinyGgufWithTokenizer(), st = TinyModelWithTokenizer();
  for (const char* text : {"hello world<|sp|>", "caf\xc3\xa9 <x> [PAD300]", "THEY RE 42"}) {
    const std::string q = " '" + std::string(text) + "'";
    auto a = test::RunLockstep("tokenize --model " + gg + q);
    auto b = test::RunLockstep("tokenize --model " + st + q);
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(a.out, b.out) << text;
  }
  auto d = test::RunLockstep("detokenize --model " + gg + " '261,266 270'");
  EXPECT_EQ(d.out, "hello world<|sp|>\n") << d.err;
  // generate --prompt: the same prompt ids, and (F32 GGUF == safetensors bitwise) the same output.
  auto a =
      test::RunLockstep("generate --model " + gg + " --prompt 'hello world' --max-new 4 --json -");
  auto b =
      test::RunLockstep("generate --model " + st + " --prompt 'hello world' --max-new 4 --json -");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja["prompt_tokens"], 2);
  EXPECT_EQ(ja["tokenizer"]["type"], "bpe");
  EXPECT_EQ(ja["tokenizer"]["vocab_size"], 273);
  EXPECT_EQ(ja["output_ids"], jb["output_ids"]);
  EXPECT_EQ(ja["text"], jb["text"]);
}

// The tokenizer's sha256 (generate / tokenize --json) of a GGUF digests its tokenizer.ggml.*
// metadata, not the file: weights changed, the same digest; a token changed, another one. (It
// hashed the whole file, every weight byte on each `generate --json`.)
TEST(GgufVocabulary, Sha256DigestsTheVocabularyNotTheWeights) {
  auto digest = [](const std::string& gguf) {
    auto r = test::RunLockstep("tokenize --model " + gguf + " --json - hi");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out)["tokenizer"]["sha256"].get<std::string>();
  };
  const std::string orig = TinyGgufWithTokenizer(), d = test::NewDir("tok-gguf-sha");
  const std::string base = digest(orig);
  ASSERT_EQ(base.size(), 64u);
  auto file = Sha256File(orig);
  ASSERT_TRUE(file.ok());
  EXPECT_NE(base, *file) << "the whole file's digest";
  auto bytes = ReadFile(orig, std::size_t{64} << 20);
  ASSERT_TRUE(bytes.ok());
  std::string w = *bytes;  // the last byte is tensor data
  w.back() = static_cast<char>(w.back() ^ 0x01);
  ASSERT_TRUE(WriteFileAtomic(d + "/weights.gguf", w).ok());
  EXPECT_EQ(digest(d + "/weights.gguf"), base) << "a weight byte changed the vocabulary digest";
  std::string v = *bytes;  // an added token's content, the same length
  const std::size_t at = v.find("<|sp|>");
  ASSERT_NE(at, std::string::npos);
  v[at + 3] = 'q';
  ASSERT_TRUE(WriteFileAtomic(d + "/vocab.gguf", v).ok());
  EXPECT_NE(digest(d + "/vocab.gguf"), base) << "a token changed, the digest did not";
}

TEST(GgufVocabulary, UndeclaredIsBytesUnsupportedIsExit2) {
  // No tokenizer.ggml.model: byte level, as a folder without tokenizer.json.
  const std::string plain = test::NewDir("tok-gguf-plain");
  ASSERT_EQ(
      test::RunLockstep("model init --preset tiny --seed 7 --format gguf --out " + plain).exit_code,
      0);
  auto b = test::RunLockstep("tokenize --model " + plain + "/model.gguf --json - ab");
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(b.out)["tokenizer"]["type"], "byte");
  // A declared vocabulary of another kind: exit 2 naming it, never bytes.
  auto f = GgufFile::Open(TinyGgufWithTokenizer());
  ASSERT_TRUE(f.ok());
  std::map<std::string, GgufValue> kv((*f)->kv().begin(), (*f)->kv().end());
  kv["tokenizer.ggml.model"] = {std::string("llama"), 8};
  std::vector<GgufTensorToWrite> ts;
  for (const GgufTensor& t : (*f)->tensors())
    ts.push_back({t.name, static_cast<GgmlType>(t.type), t.ne,
                  std::vector<std::byte>(t.data, t.data + t.nbytes)});
  const std::string spm = test::NewDir("tok-gguf-spm") + "/model.gguf";
  ASSERT_TRUE(WriteGguf(spm, kv, ts).ok());
  for (const std::string& cmd : {"tokenize --model " + spm + " abc",
                                 "generate --model " + spm + " --prompt abc --max-new 1"}) {
    auto r = test::RunLockstep(cmd);
    EXPECT_EQ(r.exit_code, 2) << cmd;
    EXPECT_NE(r.err.find("tokenizer.ggml.model 'llama' is not supported"), std::string::npos)
        << r.err;
  }
}

TEST(GgufVocabulary, ModelInitRefusesWhatTheGgufCannotCarry) {
  const std::string d = test::NewDir("tok-gguf-refuse");
  auto j = nlohmann::json::parse(TinyText());
  j["normalizer"] = nullptr;
  ASSERT_TRUE(WriteFileAtomic(d + "/no_nfc.json", j.dump()).ok());
  auto r = test::RunLockstep("model init --preset tiny --format gguf --tokenizer " + d +
                             "/no_nfc.json --out " + d + "/m");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("without the NFC normalizer"), std::string::npos) << r.err;
  EXPECT_FALSE(std::ifstream(d + "/m/model.gguf").good());
  auto v = test::RunLockstep("model init --preset tiny --vocab 200 --format gguf --tokenizer " +
                             kTiny + " --out " + d + "/m2");
  EXPECT_EQ(v.exit_code, 2);
  EXPECT_NE(v.err.find("hint: --vocab 273 or more"), std::string::npos) << v.err;
}

}  // namespace
}  // namespace lockstep
