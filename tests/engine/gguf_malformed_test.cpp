// Malformed GGUF files (issue 26, Must show 4): each crafted defect is a kCorruption (exit 2) whose
// message names the problem, and random truncations and byte flips of a real file never crash
// the parser (run under ASan / UBSan by the fuzz build: tests/fuzz/gguf_fuzz.cpp). Malformed or
// unsupported tokenizer.ggml.* metadata is an exit-2 error naming the key (LoadGgufTokenizer).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>

#include "lockstep/engine/bpe_tokenizer.h"
#include "lockstep/engine/gguf.h"
#include "test_util.h"

namespace lockstep {
namespace {

// Raw GGUF bytes, field by field, so a test can write any value (also absurd ones).
struct Raw {
  std::string b;
  template <class T>
  Raw& put(T v) {
    char c[sizeof(T)];
    std::memcpy(c, &v, sizeof(T));
    b.append(c, sizeof(T));
    return *this;
  }
  Raw& str(const std::string& s) {
    put<std::uint64_t>(s.size());
    b += s;
    return *this;
  }
  Raw& header(std::uint64_t n_tensors, std::uint64_t n_kv, std::uint32_t version = 3) {
    return put<std::uint32_t>(0x46554747u).put(version).put(n_tensors).put(n_kv);
  }
  Raw& kv_u32(const std::string& k, std::uint32_t v) { return str(k).put<std::uint32_t>(4).put(v); }
  // Tensor info: name, dims, type, offset.
  Raw& tensor(const std::string& name, std::vector<std::uint64_t> ne, std::uint32_t type,
              std::uint64_t offset) {
    str(name).put<std::uint32_t>(static_cast<std::uint32_t>(ne.size()));
    for (auto d : ne) put(d);
    return put(type).put(offset);
  }
  Raw& pad(std::size_t align = 32) {
    b.append((align - b.size() % align) % align, '\0');
    return *this;
  }
  Raw& data(std::size_t n) {
    b.append(n, '\x01');
    return *this;
  }
};

Status Parse(const std::string& bytes) {
  auto r = GgufFile::FromMemory(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()),
      "crafted.gguf");
  return r.ok() ? Status::Ok() : r.status();
}

// One valid file: an f32 [4, 2] tensor "a" and an f32 [8] tensor "b".
std::string Valid() {
  Raw r;
  r.header(2, 1).kv_u32("general.alignment", 32);
  r.tensor("a", {4, 2}, 0, 0).tensor("b", {8}, 0, 32).pad().data(64);
  return r.b;
}

struct Case {
  const char* name;
  std::string bytes;
  const char* needle;
};

std::vector<Case> Cases() {
  std::vector<Case> c;
  auto add = [&](const char* n, const Raw& r, const char* needle) {
    c.push_back({n, r.b, needle});
  };
  add("empty file", Raw{}, "truncated: magic");
  add("bad magic", Raw{}.put<std::uint32_t>(0x46554748u).put<std::uint32_t>(3), "bad magic");
  add("version 1", Raw{}.header(0, 0, 1), "unsupported version 1");
  add("version 4", Raw{}.header(0, 0, 4), "unsupported version 4");
  add("no counts", Raw{}.put<std::uint32_t>(0x46554747u).put<std::uint32_t>(3),
      "truncated: tensor count");
  add("absurd tensor count", Raw{}.header(std::uint64_t{1} << 40, 0), "tensor count");
  add("absurd kv count", Raw{}.header(0, std::uint64_t{1} << 40), "key/value count");
  add("key length absurd", Raw{}.header(0, 1).put<std::uint64_t>(std::uint64_t{1} << 62).data(64),
      "string length");
  add("key past the end", Raw{}.header(0, 1).put<std::uint64_t>(100).put<std::uint32_t>(0),
      "truncated: key 0");
  add("empty key", Raw{}.header(0, 1).str("").put<std::uint32_t>(4).put<std::uint32_t>(1),
      "key 0 is empty");
  add("unknown value type", Raw{}.header(0, 1).str("k").put<std::uint32_t>(13),
      "unknown value type 13");
  add("bool of 2", Raw{}.header(0, 1).str("k").put<std::uint32_t>(7).put<std::uint8_t>(2),
      "bool value 2");
  add("array element type unknown",
      Raw{}.header(0, 1).str("k").put<std::uint32_t>(9).put<std::uint32_t>(77).put<std::uint64_t>(
          1),
      "unknown array element type 77");
  add("array count absurd",
      Raw{}.header(0, 1).str("k").put<std::uint32_t>(9).put<std::uint32_t>(4).put<std::uint64_t>(
          std::uint64_t{1} << 50),
      "does not fit");
  {
    Raw r;
    r.header(0, 1).str("k").put<std::uint32_t>(9).put<std::uint32_t>(9).put<std::uint64_t>(1);
    r.put<std::uint32_t>(9)
        .put<std::uint64_t>(1)
        .put<std::uint32_t>(4)
        .put<std::uint64_t>(1)
        .put<std::uint32_t>(1);
    add("arrays nested 3 deep", r, "nested deeper");
  }
  add("repeated key", Raw{}.header(0, 2).kv_u32("k", 1).kv_u32("k", 2), "key 'k' appears twice");
  add("alignment 48", Raw{}.header(0, 1).kv_u32("general.alignment", 48), "power of two");
  add("alignment 0", Raw{}.header(0, 1).kv_u32("general.alignment", 0), "power of two");
  add("alignment as a string",
      Raw{}.header(0, 1).str("general.alignment").put<std::uint32_t>(8).str("32"), "power of two");
  add("tensor name past the end", Raw{}.header(1, 0).put<std::uint64_t>(1000).data(64),
      "truncated: tensor info 0 name");
  add("zero dimensions", Raw{}.header(1, 0).tensor("t", {}, 0, 0), "0 dimensions");
  add("five dimensions", Raw{}.header(1, 0).tensor("t", {1, 1, 1, 1, 1}, 0, 0), "5 dimensions");
  add("a zero dimension", Raw{}.header(1, 0).tensor("t", {4, 0}, 0, 0), "dimension 1 = 0");
  add("overflowing dimensions",
      Raw{}.header(1, 0).tensor("t", {std::uint64_t{1} << 40, std::uint64_t{1} << 40}, 0, 0),
      "too large");
  add("unknown tensor type", Raw{}.header(1, 0).tensor("t", {4}, 99, 0), "unknown ggml type id 99");
  add("row not whole Q8_0 blocks", Raw{}.header(1, 0).tensor("t", {30, 2}, 8, 0),
      "whole number of Q8_0");
  add("misaligned offset", Raw{}.header(1, 0).tensor("t", {4}, 0, 4).pad().data(64),
      "not a multiple of the alignment");
  add("offset past the end", Raw{}.header(1, 0).tensor("t", {4}, 0, 1 << 20).pad().data(64),
      "past the end");
  add("data past the end", Raw{}.header(1, 0).tensor("t", {64}, 0, 0).pad().data(16),
      "past the end");
  add("overlapping tensors",
      Raw{}.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad().data(128),
      "overlaps");
  add("repeated tensor name",
      Raw{}.header(2, 0).tensor("a", {8}, 0, 0).tensor("a", {8}, 0, 32).pad().data(64),
      "tensor 'a' appears twice");
  add("truncated in a tensor info", Raw{Valid().substr(0, 110)}, "truncated: tensor 'b'");
  add("data section missing", Raw{Valid().substr(0, 140)}, "data section is missing");
  {
    Raw r;
    r.header(1, 1).str("pad").put<std::uint32_t>(8).str(std::string(64, 'x'));
    r.str("t").put<std::uint32_t>(2).put<std::uint64_t>(4);
    add("tensor dims truncated", r, "truncated: tensor 't' dimension");
  }
  return c;
}

TEST(GgufMalformed, EveryCraftedDefectIsNamed) {
  ASSERT_TRUE(Parse(Valid()).ok()) << Parse(Valid()).ToString();
  const auto cases = Cases();
  EXPECT_GE(cases.size(), 30u);
  for (const Case& k : cases) {
    const Status s = Parse(k.bytes);
    EXPECT_EQ(s.code(), Status::Code::kCorruption) << k.name << ": " << s.ToString();
    EXPECT_NE(s.ToString().find(k.needle), std::string::npos) << k.name << ": " << s.ToString();
  }
}

// Through the CLI: a file on disk is exit 2 with the one-line message (a few of the cases, and
// model-level defects the parser cannot see: wrong architecture, a missing key, a tensor type the
// engine does not compute with, a fused projection of the wrong shape).
TEST(GgufMalformed, CliExitsTwoNamingTheProblem) {
  const std::string dir = test::NewDir("gguf-bad");
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
    return dir + "/" + name;
  };
  auto expect = [&](const std::string& path, const std::string& needle) {
    auto r = test::RunLockstep("generate --model " + path + " --prompt hi --max-new 1");
    EXPECT_EQ(r.exit_code, 2) << path << ": " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  };
  const auto cases = Cases();
  for (std::size_t i = 0; i < cases.size(); i += 5)
    expect(write("c" + std::to_string(i) + ".gguf", cases[i].bytes), cases[i].needle);
  expect(write("arch.gguf",
               Raw{}.header(0, 1).str("general.architecture").put<std::uint32_t>(8).str("llama").b),
         "expected 'qwen3next'");

  // A real model file with one defect each: rewritten through GgufFile + WriteGguf.
  const std::string good = test::NewDir("gguf-good");
  auto init = test::RunLockstep("model init --preset tiny --seed 1 --format gguf --out " + good);
  ASSERT_EQ(init.exit_code, 0) << init.err;
  auto f = GgufFile::Open(good + "/model.gguf");
  ASSERT_TRUE(f.ok());
  auto rewrite = [&](const std::string& name, auto edit_kv, auto edit_tensors) {
    std::map<std::string, GgufValue> kv((*f)->kv().begin(), (*f)->kv().end());
    std::vector<GgufTensorToWrite> ts;
    for (const GgufTensor& t : (*f)->tensors())
      ts.push_back({t.name, static_cast<GgmlType>(t.type), t.ne,
                    std::vector<std::byte>(t.data, t.data + t.nbytes)});
    edit_kv(kv);
    edit_tensors(ts);
    EXPECT_TRUE(WriteGguf(dir + "/" + name, kv, ts).ok());
    return dir + "/" + name;
  };
  auto same_kv = [](auto&) {};
  auto same_ts = [](auto&) {};
  expect(rewrite(
             "nokey.gguf", [](auto& kv) { kv.erase("qwen3next.embedding_length"); }, same_ts),
         "qwen3next.embedding_length is missing");
  // Q8_1 (an activation type no published checkpoint stores; every weight type is read).
  expect(rewrite("q8_1.gguf", same_kv,
                 [](auto& ts) {
                   for (auto& t : ts)
                     if (t.name == "blk.0.ssm_out.weight") {
                       t.type = GgmlType::kQ8_1;  // 36 bytes per 32 values
                       t.data.resize(t.ne[0] / 32 * t.ne[1] * 36);
                     }
                 }),
         "got Q8_1");
  expect(rewrite("qkvdims.gguf", same_kv,
                 [](auto& ts) {
                   for (auto& t : ts)
                     if (t.name == "blk.0.attn_qkv.weight") {
                       t.ne[1] -= 1;
                       t.data.resize(t.ne[0] * t.ne[1] * 4);
                     }
                 }),
         "attn_qkv.weight");
  expect(rewrite("missing.gguf", same_kv,
                 [](auto& ts) {
                   std::erase_if(ts, [](const auto& t) { return t.name == "blk.1.ssm_ba.weight"; });
                 }),
         "in_proj_ba.weight': missing from the checkpoint");
}

// Truncations at every length of a real header and random byte flips in it: always either a
// parse or a kCorruption, never a crash (ASan catches out-of-bounds reads in the fuzz build).
TEST(GgufMalformed, TruncationsAndFlipsNeverCrash) {
  const std::string good = test::NewDir("gguf-fuzz");
  auto init = test::RunLockstep("model init --preset tiny --seed 1 --format gguf --out " + good);
  ASSERT_EQ(init.exit_code, 0) << init.err;
  std::ifstream in(good + "/model.gguf", std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto header_end = [&] {
    auto f = GgufFile::FromMemory(
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(file.data()), file.size()),
        "x");
    EXPECT_TRUE(f.ok());
    return static_cast<std::size_t>((*f)->tensors().front().data -
                                    reinterpret_cast<const std::byte*>(file.data()));
  }();
  for (std::size_t n = 0; n < header_end; n += 7) {
    const Status s = Parse(file.substr(0, n));
    EXPECT_EQ(s.code(), Status::Code::kCorruption) << n;
  }
  std::mt19937 rng(26);
  for (int i = 0; i < 3000; ++i) {
    std::string b = file.substr(0, header_end + 64);
    for (int k = 0; k < 1 + i % 4; ++k) b[rng() % header_end] = static_cast<char>(rng());
    const Status s = Parse(b);
    EXPECT_TRUE(s.ok() || s.code() == Status::Code::kCorruption) << s.ToString();
  }
}

// ---- tokenizer.ggml.* ----

using Kv = std::map<std::string, GgufValue>;

// The tokenizer metadata of a tiny model with the handwritten tokenizer.json (512 ids: 273 tokens,
// the rest "[PAD<id>]").
const Kv& VocabKv() {
  static const Kv kv = [] {
    const std::string d = test::NewDir("gguf-vocab");
    auto r = test::RunLockstep("model init --preset tiny --seed 1 --format gguf --tokenizer " +
                               std::string(LOCKSTEP_SOURCE_DIR) +
                               "/tests/tokenizer/data/tiny_tokenizer.json --out " + d);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    auto f = GgufFile::Open(d + "/model.gguf");
    EXPECT_TRUE(f.ok());
    Kv out;
    for (const auto& [k, v] : (*f)->kv())
      if (k.rfind("tokenizer.", 0) == 0) out[k] = v;
    return out;
  }();
  return kv;
}

// A tensor-less GGUF with `kv`, its tokenizer loaded.
Status LoadVocab(const Kv& kv, const std::string& name) {
  const std::string path = test::NewDir("gguf-vocab-bad") + "/" + name + ".gguf";
  EXPECT_TRUE(WriteGguf(path, kv, {}).ok());
  auto f = GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!f.ok()) return f.status();
  return LoadGgufTokenizer(**f).status();
}

std::vector<GgufValue>& Arr(Kv& kv, const std::string& key) {
  return std::get<std::vector<GgufValue>>(kv.at("tokenizer.ggml." + key).v);
}
GgufValue Str(std::string s) { return {std::move(s), 8}; }
GgufValue U32(std::uint64_t v) { return {v, 4}; }

struct VocabCase {
  std::string name;
  std::function<void(Kv&)> mutate;
  std::string expect;  // a part of the message
};

std::vector<VocabCase> VocabCases() {
  const std::string t = "tokenizer.ggml.";
  auto set = [t](std::string key, GgufValue v) { return [t, key, v](Kv& kv) { kv[t + key] = v; }; };
  auto erase = [t](std::string key) { return [t, key](Kv& kv) { kv.erase(t + key); }; };
  auto ints = [](std::size_t n, std::int64_t v) {
    return GgufValue{std::vector<GgufValue>(n, GgufValue{v, 5}), 9};
  };
  return {
      {"model_llama", set("model", Str("llama")), "tokenizer.ggml.model 'llama' is not supported"},
      {"model_u32", set("model", U32(1)), "tokenizer.ggml.model is not a string"},
      {"pre_llama", set("pre", Str("llama-bpe")),
       "tokenizer.ggml.pre 'llama-bpe' is not supported"},
      {"pre_missing", erase("pre"), "tokenizer.ggml.pre is missing"},
      {"pre_u32", set("pre", U32(2)), "tokenizer.ggml.pre is not a string"},
      {"add_bos", set("add_bos_token", {true, 7}), "tokenizer.ggml.add_bos_token true"},
      {"add_eos_u32", set("add_eos_token", U32(0)), "tokenizer.ggml.add_eos_token is not a bool"},
      {"tokens_missing", erase("tokens"), "tokenizer.ggml.tokens is missing"},
      {"tokens_scalar", set("tokens", Str("a")), "tokenizer.ggml.tokens is not an array"},
      {"tokens_empty", set("tokens", {std::vector<GgufValue>{}, 9}),
       "tokenizer.ggml.tokens is empty"},
      {"tokens_ints", set("tokens", ints(512, 1)), "tokenizer.ggml.tokens entry 0 is not a string"},
      {"token_empty", [](Kv& kv) { Arr(kv, "tokens")[5] = Str(""); },
       "tokenizer.ggml.tokens entry 5 is empty or not UTF-8"},
      {"token_not_utf8", [](Kv& kv) { Arr(kv, "tokens")[270] = Str("<\xff>"); },
       "tokenizer.ggml.tokens entry 270 is empty or not UTF-8"},
      {"token_repeated",
       [](Kv& kv) {
         Arr(kv, "tokens")[300] = Str("a");
         Arr(kv, "token_type")[300] = {std::int64_t{1}, 5};
       },
       "tokenizer.ggml.tokens entry 300 ('a') repeats entry 97"},
      {"byte_without_token", [](Kv& kv) { Arr(kv, "tokens")[0] = Str("\xc4\x80x"); },
       "tokenizer.ggml.tokens: byte 0 has no token"},
      {"types_short", [](Kv& kv) { Arr(kv, "token_type").pop_back(); },
       "tokenizer.ggml.token_type has 511 entries, tokenizer.ggml.tokens has 512"},
      {"types_scalar", set("token_type", U32(1)), "tokenizer.ggml.token_type is not an array"},
      {"types_strings", set("token_type", GgufValue{std::vector<GgufValue>(512, Str("1")), 9}),
       "tokenizer.ggml.token_type entry 0 is not an integer"},
      {"type_byte",
       [](Kv& kv) {
         Arr(kv, "token_type")[7] = {std::int64_t{6}, 5};
       },
       "tokenizer.ggml.token_type 6 of token 7"},
      {"type_negative",
       [](Kv& kv) {
         Arr(kv, "token_type")[9] = {std::int64_t{-1}, 5};
       },
       "tokenizer.ggml.token_type -1 of token 9"},
      {"merges_missing", erase("merges"), "tokenizer.ggml.merges is missing"},
      {"merges_scalar", set("merges", Str("a b")), "tokenizer.ggml.merges is not an array"},
      {"merge_no_space", [](Kv& kv) { Arr(kv, "merges")[0] = Str("ab"); },
       "tokenizer.ggml.merges entry 0 is not a string 'a b'"},
      {"merge_unknown", [](Kv& kv) { Arr(kv, "merges")[1] = Str("zz qq"); },
       "tokenizer.ggml.merges entry 1 ('zz qq'): a token is not in tokenizer.ggml.tokens"},
      {"merge_of_added", [](Kv& kv) { Arr(kv, "merges")[2] = Str("<x> a"); },
       "tokenizer.ggml.merges entry 2 ('<x> a')"},
      {"eos_past_end", set("eos_token_id", U32(512)),
       "tokenizer.ggml.eos_token_id is not an id below the 512 tokens"},
      {"bos_string", set("bos_token_id", Str("0")),
       "tokenizer.ggml.bos_token_id is not an id below the 512 tokens"},
      {"padding_past_end", set("padding_token_id", U32(1u << 31)),
       "tokenizer.ggml.padding_token_id is not an id below the 512 tokens"},
  };
}

TEST(GgufMalformed, TokenizerMetadataNamesTheKey) {
  const Kv& good = VocabKv();
  ASSERT_EQ(std::get<std::string>(good.at("tokenizer.ggml.model").v), "gpt2");
  ASSERT_TRUE(LoadVocab(good, "good").ok());
  const std::vector<VocabCase> cases = VocabCases();
  EXPECT_GE(cases.size(), 25u);
  for (const VocabCase& c : cases) {
    Kv kv = good;
    c.mutate(kv);
    const Status s = LoadVocab(kv, c.name);
    EXPECT_TRUE(s.code() == Status::Code::kCorruption || s.code() == Status::Code::kNotSupported)
        << c.name << ": " << s.ToString();
    EXPECT_EQ(s.exit_code(), 2) << c.name;
    EXPECT_NE(s.ToString().find(c.expect), std::string::npos)
        << c.name << ": '" << s.ToString() << "' does not say '" << c.expect << "'";
  }
  // Through the command: one line, exit 2.
  Kv kv = good;
  kv["tokenizer.ggml.model"] = Str("t5");
  const std::string path = test::NewDir("gguf-vocab-cli") + "/t5.gguf";
  ASSERT_TRUE(WriteGguf(path, kv, {}).ok());
  auto r = test::RunLockstep("tokenize --model " + path + " abc");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("tokenizer.ggml.model 't5' is not supported"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace lockstep
