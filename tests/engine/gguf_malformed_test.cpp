// Malformed GGUF files (issue 26, Must show 4): each crafted defect is a kCorruption (exit 2) whose
// message names the problem, and random truncations and byte flips of a real file never crash
// the parser (run under ASan / UBSan by the fuzz build: tests/fuzz/gguf_fuzz.cpp).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

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
  expect(rewrite("q4_0.gguf", same_kv,
                 [](auto& ts) {
                   for (auto& t : ts)
                     if (t.name == "blk.0.ssm_out.weight") {
                       t.type = GgmlType::kQ4_0;  // 18 bytes per 32 values
                       t.data.resize(t.ne[0] / 32 * t.ne[1] * 18);
                     }
                 }),
         "got Q4_0");
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

}  // namespace
}  // namespace lockstep
