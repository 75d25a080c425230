// Tests for engine/safetensors.{h,cpp}: write/read roundtrips, determinism, checkpoint folders
// (single file, sharded with an index, loose shards), one test per malformed-input class with
// the exact Status code and the words the message must contain, and a seeded mutation fuzz of
// FromMemory (the libFuzzer target in tests/fuzz/ does the same, open-ended, under clang).
#include "lockstep/engine/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/dtype.h"
#include "test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using Code = Status::Code;

// ---- helpers ----

std::vector<std::byte> Bytes(std::string_view s) {
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}

// n deterministic, non-trivial bytes.
std::vector<std::byte> Pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> out(n);
  for (std::size_t i = 0; i < n; ++i)
    out[i] = static_cast<std::byte>((i * 131u + seed * 17u) & 0xffu);
  return out;
}

template <typename T>
std::vector<std::byte> AsBytes(const std::vector<T>& v) {
  std::vector<std::byte> out(v.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// A file image: 8-byte little-endian length (of `header`, unless overridden), the header text,
// then `data_bytes` pattern bytes.
std::vector<std::byte> Image(std::string_view header, std::size_t data_bytes,
                             std::optional<std::uint64_t> length = std::nullopt) {
  const std::uint64_t n = length.value_or(header.size());
  std::vector<std::byte> out(8);
  for (std::size_t i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((n >> (8 * i)) & 0xffu);
  const auto h = Bytes(header);
  out.insert(out.end(), h.begin(), h.end());
  const auto d = Pattern(data_bytes, 1);
  out.insert(out.end(), d.begin(), d.end());
  return out;
}

Result<SafetensorsFilePtr> Parse(const std::vector<std::byte>& image) {
  return SafetensorsFile::FromMemory(std::span<const std::byte>(image), "mem.safetensors");
}

std::string Contents(const std::string& path) {
  Result<std::string> r = ReadFile(path);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::string();
}

void WriteRaw(const std::string& path, const std::vector<std::byte>& bytes) {
  ASSERT_TRUE(WriteFileAtomic(path, std::span<const std::byte>(bytes)).ok());
}

// A fresh scratch folder per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::NewDir("lockstep_st");
  }  // removed with ScratchDir() at exit
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a one-or-more-tensor f32 file with the given names (each [2] f32, values by name).
  void WriteF32File(const std::string& file, const std::vector<std::string>& names) {
    std::vector<std::vector<float>> values;
    for (std::size_t i = 0; i < names.size(); ++i) {
      values.push_back({static_cast<float>(names[i].size()), static_cast<float>(i) + 0.5f});
    }
    std::vector<std::vector<std::byte>> bytes;
    for (const auto& v : values) bytes.push_back(AsBytes(v));
    std::vector<TensorToWrite> ts;
    for (std::size_t i = 0; i < names.size(); ++i) {
      ts.push_back({names[i], DType::kF32, {2}, bytes[i]});
    }
    const Status s = WriteSafetensors(Path(file), ts);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  fs::path dir_;
};

void ExpectCorruption(const Result<SafetensorsFilePtr>& r, std::string_view needle,
                      const std::string& what) {
  ASSERT_FALSE(r.ok()) << what << ": expected an error";
  EXPECT_EQ(r.status().code(), Code::kCorruption) << what << ": " << r.status().ToString();
  EXPECT_NE(r.status().message().find(needle), std::string::npos)
      << what << ": message lacks '" << needle << "': " << r.status().message();
}

// ---- writing and reading back ----

TEST_F(SafetensorsTest, RoundtripAllDtypesAndMetadata) {
  const std::vector<float> f32 = {1.0f, -2.5f, 3.25f, 0.0f, -0.0f, 1e-30f};
  std::vector<std::uint16_t> bf16;
  std::vector<std::uint16_t> f16;
  for (float x : {0.5f, -1.0f, 65504.0f, 3.0f}) {
    bf16.push_back(f32_to_bf16(x));
    f16.push_back(f32_to_f16(x));
  }
  const std::vector<std::int8_t> i8 = {-127, 0, 1, 127, -5};
  const auto b_f32 = AsBytes(f32);
  const auto b_bf16 = AsBytes(bf16);
  const auto b_f16 = AsBytes(f16);
  const auto b_i8 = AsBytes(i8);
  const std::vector<TensorToWrite> ts = {
      {"w.f32", DType::kF32, {2, 3}, b_f32},
      {"a.bf16", DType::kBF16, {4}, b_bf16},
      {"m.f16", DType::kF16, {2, 2}, b_f16},
      {"q.i8", DType::kI8, {5}, b_i8},
      {"z.empty", DType::kF32, {0, 3}, {}},
      {"s.scalar", DType::kF32, {}, std::span<const std::byte>(b_f32).first(4)},
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"lockstep", "v1 \"quoted\""}};
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, ts, meta).ok());

  Result<SafetensorsFilePtr> r = SafetensorsFile::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const SafetensorsFile& f = **r;
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.tensors().size(), ts.size());
  std::vector<std::string> names;
  for (const auto& t : f.tensors()) names.push_back(t.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"a.bf16", "m.f16", "q.i8", "s.scalar", "w.f32", "z.empty"}));
  for (const auto& w : ts) {
    const TensorInfo* t = f.Find(w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->dtype, w.dtype) << w.name;
    EXPECT_EQ(t->shape, w.shape) << w.name;
    EXPECT_EQ(t->file, path);
    ASSERT_EQ(t->nbytes, w.data.size()) << w.name;
    EXPECT_EQ(static_cast<std::size_t>(t->numel()) * dtype_size(t->dtype), t->nbytes);
    if (t->nbytes > 0) {
      EXPECT_EQ(std::memcmp(t->data, w.data.data(), t->nbytes), 0) << w.name;
    }
  }
  EXPECT_EQ(f.Find("absent"), nullptr);
  EXPECT_EQ(f.Find("s.scalar")->numel(), 1);
  EXPECT_EQ(f.Find("z.empty")->numel(), 0);

  // Values through the converters.
  float out[4];
  ASSERT_TRUE(convert_to_f32(DType::kF16, f.Find("m.f16")->data, 4, out));
  EXPECT_EQ(out[2], 65504.0f);
  ASSERT_TRUE(convert_to_f32(DType::kBF16, f.Find("a.bf16")->data, 4, out));
  EXPECT_EQ(out[1], -1.0f);

  // The same bytes through FromMemory give the same tensors.
  const std::string image = Contents(path);
  const auto image_bytes = Bytes(image);
  Result<SafetensorsFilePtr> m = Parse(image_bytes);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ((*m)->tensors().size(), ts.size());
  EXPECT_EQ((*m)->metadata(), meta);
}

TEST_F(SafetensorsTest, OutputIsDeterministicAndAligned) {
  const auto a = Pattern(24, 2);
  const auto b = Pattern(6, 3);
  const auto c = Pattern(1, 4);
  const std::vector<TensorToWrite> order1 = {
      {"b", DType::kF32, {2, 3}, a}, {"a", DType::kBF16, {3}, b}, {"c", DType::kU8, {1}, c}};
  const std::vector<TensorToWrite> order2 = {order1[2], order1[0], order1[1]};
  const std::map<std::string, std::string> meta = {{"k", "v"}};
  ASSERT_TRUE(WriteSafetensors(Path("one.safetensors"), order1, meta).ok());
  ASSERT_TRUE(WriteSafetensors(Path("two.safetensors"), order2, meta).ok());
  ASSERT_TRUE(WriteSafetensors(Path("three.safetensors"), order1, meta).ok());
  const std::string one = Contents(Path("one.safetensors"));
  EXPECT_EQ(one, Contents(Path("two.safetensors"))) << "input order must not matter";
  EXPECT_EQ(one, Contents(Path("three.safetensors"))) << "same input, same bytes";

  // Layout: header length multiple of 8, space padding, sorted keys, contiguous data.
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(one[static_cast<std::size_t>(i)]);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = one.substr(8, n);
  EXPECT_EQ(header.substr(0, header.find_last_not_of(' ') + 1),
            R"({"__metadata__":{"k":"v"},"a":{"data_offsets":[0,6],"dtype":"BF16","shape":[3]},)"
            R"("b":{"data_offsets":[6,30],"dtype":"F32","shape":[2,3]},)"
            R"("c":{"data_offsets":[30,31],"dtype":"U8","shape":[1]}})");
  EXPECT_EQ(one.size(), 8 + n + 31);
  EXPECT_EQ(std::memcmp(one.data() + 8 + n, b.data(), 6), 0);
  EXPECT_EQ(std::memcmp(one.data() + 8 + n + 6, a.data(), 24), 0);
}

TEST_F(SafetensorsTest, EmptyTensorListIsValid) {
  ASSERT_TRUE(WriteSafetensors(Path("empty.safetensors"), {}).ok());
  Result<SafetensorsFilePtr> r = SafetensorsFile::Open(Path("empty.safetensors"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE((*r)->tensors().empty());
  EXPECT_EQ(Contents(Path("empty.safetensors")).size(), 16u);  // 8 + "{}" padded to 8
}

TEST_F(SafetensorsTest, WriteRejectsBadInput) {
  const auto four = Pattern(4, 0);
  {
    const std::vector<TensorToWrite> ts = {{"x", DType::kF32, {2}, four}};
    const Status s = WriteSafetensors(Path("bad.safetensors"), ts);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("tensor 'x': f32 [2] needs 8 bytes, got 4"), std::string::npos)
        << s.message();
  }
  {
    const std::vector<TensorToWrite> ts = {
        {"x", DType::kF32, {1}, four}, {"y", DType::kU8, {4}, four}, {"x", DType::kI32, {1}, four}};
    const Status s = WriteSafetensors(Path("bad.safetensors"), ts);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("'x' is given twice"), std::string::npos) << s.message();
  }
  {
    const std::vector<TensorToWrite> ts = {{"x", DType::kF32, {-1}, four}};
    EXPECT_EQ(WriteSafetensors(Path("bad.safetensors"), ts).code(), Code::kInvalidArgument);
  }
  {
    const std::vector<TensorToWrite> ts = {{"__metadata__", DType::kU8, {4}, four}};
    EXPECT_EQ(WriteSafetensors(Path("bad.safetensors"), ts).code(), Code::kInvalidArgument);
  }
  {
    const std::vector<TensorToWrite> ts = {{"bad\xff name", DType::kU8, {4}, four}};
    EXPECT_EQ(WriteSafetensors(Path("bad.safetensors"), ts).code(), Code::kInvalidArgument);
  }
  EXPECT_TRUE(fs::is_empty(dir_)) << "nothing (not even a temporary) is left after a rejection";
  const std::vector<TensorToWrite> ok = {{"x", DType::kU8, {4}, four}};
  // A missing folder is bad input (issue 20): exit 2, not a runtime failure.
  EXPECT_EQ(WriteSafetensors(Path("no/such/folder/x.safetensors"), ok).code(),
            Code::kInvalidArgument);
}

// ---- checkpoint folders ----

TEST_F(SafetensorsTest, SingleFileFolderIgnoresStrayShards) {
  WriteF32File("model.safetensors", {"a", "b"});
  WriteF32File("other.safetensors", {"a"});  // would be a duplicate if it were read
  Result<TensorStorePtr> r = TensorStore::OpenDir(dir_.string());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->Names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ((*r)->files(), (std::vector<std::string>{Path("model.safetensors")}));
}

TEST_F(SafetensorsTest, ShardedFolderWithIndexLoadsAllNames) {
  WriteF32File("model-00001-of-00002.safetensors", {"layer.0.w", "embed"});
  WriteF32File("model-00002-of-00002.safetensors", {"layer.1.w", "lm_head"});
  ASSERT_TRUE(WriteFileAtomic(Path("model.safetensors.index.json"), std::string_view(R"({
    "metadata": {"total_size": 32},
    "weight_map": {
      "embed": "model-00001-of-00002.safetensors",
      "layer.0.w": "model-00001-of-00002.safetensors",
      "layer.1.w": "model-00002-of-00002.safetensors",
      "lm_head": "model-00002-of-00002.safetensors"
    }})"))
                  .ok());
  Result<TensorStorePtr> r = TensorStore::OpenDir(dir_.string());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const TensorStore& store = **r;
  EXPECT_EQ(store.Names(),
            (std::vector<std::string>{"embed", "layer.0.w", "layer.1.w", "lm_head"}));
  EXPECT_EQ(store.files().size(), 2u);
  const TensorInfo* t = store.Find("lm_head");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->file, Path("model-00002-of-00002.safetensors"));
  float v[2];
  std::memcpy(v, t->data, sizeof v);
  EXPECT_EQ(v[0], 7.0f);  // name length
  EXPECT_EQ(store.Find("nope"), nullptr);
}

TEST_F(SafetensorsTest, IndexNamingMissingShardIsNotFound) {
  WriteF32File("s1.safetensors", {"a"});
  ASSERT_TRUE(WriteFileAtomic(Path("model.safetensors.index.json"),
                              std::string_view(R"({"weight_map": {"a": "s1.safetensors",
                                                   "b": "s2.safetensors"}})"))
                  .ok());
  Result<TensorStorePtr> r = TensorStore::OpenDir(dir_.string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound) << r.status().ToString();
  EXPECT_NE(r.status().message().find("shard 's2.safetensors'"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("tensor 'b'"), std::string::npos) << r.status().message();
}

TEST_F(SafetensorsTest, IndexNameAbsentFromItsShardIsCorruption) {
  WriteF32File("s1.safetensors", {"a"});
  WriteF32File("s2.safetensors", {"b"});
  ASSERT_TRUE(WriteFileAtomic(Path("model.safetensors.index.json"),
                              std::string_view(R"({"weight_map": {"a": "s1.safetensors",
                                                   "b": "s1.safetensors"}})"))
                  .ok());
  Result<TensorStorePtr> r = TensorStore::OpenDir(dir_.string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().ToString();
  EXPECT_NE(r.status().message().find("tensor 'b' in shard 's1.safetensors'"), std::string::npos)
      << r.status().message();
}

TEST_F(SafetensorsTest, IndexWithBadWeightMapIsCorruption) {
  WriteF32File("s1.safetensors", {"a"});
  const std::pair<const char*, const char*> cases[] = {
      {R"({"weight_map": {"a": 3}})", "weight_map['a']"},
      {R"({"weight_map": {"a": "/etc/s1.safetensors"}})", "inside the folder"},
      {R"({"weight_map": {"a": "../s1.safetensors"}})", "inside the folder"},
      {R"({"weight_map": ["a"]})", "\"weight_map\" object"},
      {R"({"nothing": 1})", "\"weight_map\" object"},
      {R"({"weight_map": )", "not valid JSON"},
  };
  for (const auto& [text, needle] : cases) {
    ASSERT_TRUE(WriteFileAtomic(Path("model.safetensors.index.json"), std::string_view(text)).ok());
    Result<TensorStorePtr> r = TensorStore::OpenDir(dir_.string());
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), Code::kCorruption) << text << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  }
}

TEST_F(SafetensorsTest, DuplicateAcrossShardsIsCorruption) {
  WriteF32File("s1.safetensors", {"a", "dup"});
  WriteF32File("s2.safetensors", {"b", "dup"});
  {
    // Loose shards (no index).
    Result<TensorStorePtr> r = TensorStore::OpenDir(dir_.string());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().ToString();
    EXPECT_NE(r.status().message().find("tensor 'dup' is in both"), std::string::npos)
        << r.status().message();
  }
  {
    // With an index that lists each name once: the shards still disagree.
    ASSERT_TRUE(WriteFileAtomic(Path("model.safetensors.index.json"),
                                std::string_view(R"({"weight_map": {"a": "s1.safetensors",
                                  "b": "s2.safetensors", "dup": "s1.safetensors"}})"))
                    .ok());
    Result<TensorStorePtr> r = TensorStore::OpenDir(dir_.string());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().ToString();
    EXPECT_NE(r.status().message().find("'dup'"), std::string::npos) << r.status().message();
  }
}

TEST_F(SafetensorsTest, LooseShardsAreReadInSortedOrder) {
  WriteF32File("b.safetensors", {"y"});
  WriteF32File("a.safetensors", {"x"});
  ASSERT_TRUE(WriteFileAtomic(Path("notes.txt"), std::string_view("not a shard")).ok());
  Result<TensorStorePtr> r = TensorStore::OpenDir(dir_.string());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->files(),
            (std::vector<std::string>{Path("a.safetensors"), Path("b.safetensors")}));
  EXPECT_EQ((*r)->Names(), (std::vector<std::string>{"x", "y"}));
}

TEST_F(SafetensorsTest, EmptyFolderIsNotFound) {
  ASSERT_TRUE(WriteFileAtomic(Path("README"), std::string_view("hi")).ok());
  Result<TensorStorePtr> r = TensorStore::OpenDir(dir_.string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound) << r.status().ToString();
  EXPECT_NE(r.status().message().find("lockstep model init"), std::string::npos);
  EXPECT_NE(r.status().message().find(dir_.string()), std::string::npos);

  Result<TensorStorePtr> missing = TensorStore::OpenDir(Path("no_such_dir"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
}

TEST_F(SafetensorsTest, OpenErrors) {
  Result<SafetensorsFilePtr> missing = SafetensorsFile::Open(Path("missing.safetensors"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);

  WriteRaw(Path("empty.safetensors"), {});
  ExpectCorruption(SafetensorsFile::Open(Path("empty.safetensors")), "file is 0 bytes",
                   "empty file");
  WriteRaw(Path("five.safetensors"), Bytes("12345"));
  ExpectCorruption(SafetensorsFile::Open(Path("five.safetensors")),
                   "shorter than the 8-byte header length prefix", "5-byte file");

  Result<SafetensorsFilePtr> folder = SafetensorsFile::Open(dir_.string());
  ASSERT_FALSE(folder.ok());
  EXPECT_EQ(folder.status().code(), Code::kIOError);
}

// ---- malformed input: one case per problem, code + words of the message ----

constexpr const char* kGoodHeader = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}})";

TEST(SafetensorsBadInputTest, GoodImageParses) {
  Result<SafetensorsFilePtr> r = Parse(Image(kGoodHeader, 16));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->tensors().size(), 2u);
  EXPECT_EQ((*r)->path(), "mem.safetensors");
}

TEST(SafetensorsBadInputTest, EachProblemIsNamed) {
  struct Case {
    const char* what;
    std::vector<std::byte> image;
    const char* needle;
  };
  const Case cases[] = {
      {"shorter than 8 bytes", Bytes("abc"), "file is 3 bytes, shorter than the 8-byte"},
      {"empty", {}, "file is 0 bytes"},
      {"header length larger than file", Image(kGoodHeader, 16, 5000),
       "header length 5000 (from the first 8 bytes) is larger than the"},
      {"header length 2^63", Image(kGoodHeader, 16, std::uint64_t{1} << 63), "header length"},
      {"bad JSON", Image(R"({"a":{"dtype":"F32",)", 0), "header is not valid JSON"},
      {"trailing garbage", Image(R"({} x)", 0), "header is not valid JSON"},
      {"deeply nested header", Image(std::string(100000, '[') + std::string(100000, ']'), 0),
       "header JSON nests deeper than 8 levels"},
      {"header not an object", Image("[1,2,3]", 0), "header is a JSON array, expected an object"},
      {"entry not an object", Image(R"({"t":[1]})", 0), "tensor 't': entry is a JSON array"},
      {"unknown dtype", Image(R"({"t":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1),
       "tensor 't': unknown dtype 'Q7' (expected one of F32"},
      {"dtype missing", Image(R"({"t":{"shape":[1],"data_offsets":[0,1]}})", 1),
       "tensor 't': \"dtype\" is missing"},
      {"dtype not a string", Image(R"({"t":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})", 1),
       "tensor 't': \"dtype\" is 7"},
      {"negative shape entry",
       Image(R"({"t":{"dtype":"U8","shape":[2,-2],"data_offsets":[0,4]}})", 4),
       "tensor 't': shape[1] is -2, expected a non-negative integer"},
      {"non-integer shape entry",
       Image(R"({"t":{"dtype":"U8","shape":[2.5],"data_offsets":[0,2]}})", 2),
       "tensor 't': shape[0] is 2.5, expected a non-negative integer"},
      {"string shape entry", Image(R"({"t":{"dtype":"U8","shape":["3"],"data_offsets":[0,3]}})", 3),
       "tensor 't': shape[0] is \"3\""},
      {"shape not an array", Image(R"({"t":{"dtype":"U8","shape":3,"data_offsets":[0,3]}})", 3),
       "tensor 't': \"shape\" is 3, expected an array"},
      {"shape product overflows",
       Image(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,4]}})", 4),
       "more elements than can be addressed"},
      {"offsets past end", Image(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4),
       "tensor 't': data_offsets [0, 8) past the end of the data section (size 4) (hint: the "
       "file may be truncated)"},
      {"offsets not matching dtype x shape",
       Image(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 16),
       "tensor 't': data_offsets [0, 8) span 8 bytes, expected 12 bytes for F32 [3]"},
      {"offsets begin after end",
       Image(R"({"t":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})", 16), "begin after end"},
      {"offsets wrong arity", Image(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1),
       "tensor 't': \"data_offsets\" is [0], expected [begin, end]"},
      {"offsets negative", Image(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 1),
       "\"data_offsets\" is [-1,0]"},
      {"offsets missing", Image(R"({"t":{"dtype":"U8","shape":[1]}})", 1),
       "\"data_offsets\" is missing"},
      {"overlapping ranges",
       Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
             12),
       "tensor 'b': data_offsets [4, 12) overlap tensor 'a' [0, 8)"},
      {"same range twice",
       Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
             R"("b":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})",
             8),
       "overlap"},
      {"metadata with non-string value",
       Image(R"({"__metadata__":{"ok":"x","n":3},"t":{"dtype":"U8","shape":[1],)"
             R"("data_offsets":[0,1]}})",
             1),
       "__metadata__ key 'n': value 3 is a JSON number, expected a string"},
      {"metadata not an object", Image(R"({"__metadata__":"x"})", 0),
       "__metadata__ is a JSON string, expected an object"},
      {"duplicate tensor name",
       Image(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
             R"("t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
             2),
       "header lists 't' twice"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ExpectCorruption(Parse(c.image), c.needle, c.what);
  }
}

TEST(SafetensorsBadInputTest, HeaderLengthOverLimit) {
  // A length prefix over 100 MiB that the buffer could hold is still rejected before parsing.
  const std::uint64_t n = (std::uint64_t{100} << 20) + 8;
  std::vector<std::byte> image = Image("{}", static_cast<std::size_t>(n), n);
  ExpectCorruption(Parse(image), "byte limit", "header over 100 MiB");
}

TEST(SafetensorsBadInputTest, EmptyTensorsMayShareOffsets) {
  Result<SafetensorsFilePtr> r =
      Parse(Image(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("c":{"dtype":"F32","shape":[0,5],"data_offsets":[4,4]}})",
                  4));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->tensors().size(), 3u);
}

// Every proper prefix of a valid file (contiguous data, so the last tensor ends at EOF) is
// rejected as corrupt, in memory and on disk.
TEST_F(SafetensorsTest, TruncatedFilesAreCorruption) {
  const auto a = Pattern(40, 5);
  const auto b = Pattern(10, 6);
  const std::vector<TensorToWrite> ts = {{"a", DType::kF32, {10}, a}, {"b", DType::kBF16, {5}, b}};
  ASSERT_TRUE(WriteSafetensors(Path("full.safetensors"), ts, {{"m", "v"}}).ok());
  const auto image = Bytes(Contents(Path("full.safetensors")));
  ASSERT_TRUE(Parse(image).ok());
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<std::uint64_t>(image[static_cast<std::size_t>(i)]);

  for (std::size_t cut = 0; cut < image.size(); ++cut) {
    const std::vector<std::byte> part(image.begin(), image.begin() + static_cast<long>(cut));
    const Result<SafetensorsFilePtr> r = Parse(part);
    ASSERT_FALSE(r.ok()) << "cut at " << cut;
    ASSERT_EQ(r.status().code(), Code::kCorruption) << "cut at " << cut;
    ASSERT_FALSE(r.status().message().empty());
  }
  // The expected wording at a few cut points, through Open (mmap) this time.
  struct Cut {
    std::size_t at;
    const char* needle;
  };
  const Cut cuts[] = {
      {0, "file is 0 bytes"},
      {5, "file is 5 bytes, shorter than the 8-byte"},
      {8 + 10, "is larger than the 10 bytes that follow"},  // inside the header
      {static_cast<std::size_t>(8 + n), "past the end of the data section (size 0)"},
      {static_cast<std::size_t>(8 + n + 45), "tensor 'b': data_offsets [40, 50) past the end"},
  };
  for (const Cut& c : cuts) {
    const std::string path = Path("cut" + std::to_string(c.at) + ".safetensors");
    WriteRaw(path, std::vector<std::byte>(image.begin(), image.begin() + static_cast<long>(c.at)));
    ExpectCorruption(SafetensorsFile::Open(path), c.needle, "cut at " + std::to_string(c.at));
    ExpectCorruption(SafetensorsFile::Open(path), path, "message names the file");
  }
}

// ---- seeded mutation fuzz of FromMemory ----

TEST(SafetensorsFuzzTest, MutatedImagesNeverCrash) {
  // A valid seed image with a bit of everything.
  std::vector<std::byte> seed;
  {
    const std::string dir =
        (fs::temp_directory_path() / ("lockstep_fuzz_" + std::to_string(::getpid()))).string();
    fs::create_directories(dir);
    const auto a = Pattern(24, 1);
    const auto b = Pattern(8, 2);
    const auto c = Pattern(3, 3);
    const std::vector<TensorToWrite> ts = {{"layer.0.w", DType::kF32, {2, 3}, a},
                                           {"layer.0.b", DType::kBF16, {4}, b},
                                           {"q", DType::kI8, {3}, c},
                                           {"z", DType::kF16, {0}, {}}};
    ASSERT_TRUE(WriteSafetensors(dir + "/seed.safetensors", ts, {{"format", "pt"}}).ok());
    seed = Bytes(Contents(dir + "/seed.safetensors"));
    fs::remove_all(dir);
  }
  ASSERT_TRUE(Parse(seed).ok());
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | static_cast<std::uint64_t>(seed[static_cast<std::size_t>(i)]);

  const char* tokens[] = {"{",
                          "}",
                          "[",
                          "]",
                          ",",
                          ":",
                          "\"",
                          "-1",
                          "0",
                          "1",
                          "2.5",
                          "1e999",
                          "18446744073709551616",
                          "9223372036854775807",
                          "null",
                          "true",
                          "\"F32\"",
                          "\"Q7\"",
                          "\"BOOL\"",
                          "\"dtype\"",
                          "\"shape\"",
                          "\"data_offsets\"",
                          "\"__metadata__\"",
                          "[0,0]",
                          "[-1]",
                          "[0,1e3]",
                          "{}",
                          "[]",
                          "\\u0000",
                          "\xff",
                          "\xc3\xa9",
                          "\"\\ud800\"",
                          " "};
  std::mt19937_64 rng(0x5eed5afeu);
  int n_ok = 0;
  int n_err = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<std::byte> img = seed;
    const int n_mut = 1 + static_cast<int>(rng() % 3);
    for (int m = 0; m < n_mut; ++m) {
      switch (rng() % 6) {
        case 0: {  // flip random bytes (mostly inside the header, where parsing happens)
          const std::size_t k = 1 + rng() % 4;
          for (std::size_t j = 0; j < k && !img.empty(); ++j) {
            const std::size_t at = rng() % 2 == 0
                                       ? rng() % img.size()
                                       : 8 + rng() % std::max<std::uint64_t>(header_len, 1);
            if (at < img.size()) img[at] ^= static_cast<std::byte>(1u << (rng() % 8));
          }
          break;
        }
        case 1:  // truncate at a random length
          img.resize(rng() % (img.size() + 1));
          break;
        case 2: {  // overwrite the length prefix with a random value (often near the truth)
          std::uint64_t v = rng();
          if (rng() % 2 == 0) v = header_len + (rng() % 33) - 16;
          if (img.size() >= 8) {
            for (std::size_t i = 0; i < 8; ++i)
              img[i] = static_cast<std::byte>((v >> (8 * i)) & 0xffu);
          }
          break;
        }
        case 3:    // splice a JSON token into the header, fixing up the length prefix
        case 4: {  // ... or replacing a stretch of it
          if (img.size() < 8) break;
          const std::string_view tok = tokens[rng() % std::size(tokens)];
          const std::size_t hlen =
              static_cast<std::size_t>(std::min<std::uint64_t>(header_len, img.size() - 8));
          const std::size_t at = 8 + (hlen == 0 ? 0 : rng() % hlen);
          const std::size_t erase =
              rng() % 2 == 0 ? 0 : std::min<std::size_t>(rng() % 8, 8 + hlen - at);
          const auto tb = Bytes(tok);
          img.erase(img.begin() + static_cast<long>(at),
                    img.begin() + static_cast<long>(at + erase));
          img.insert(img.begin() + static_cast<long>(at), tb.begin(), tb.end());
          const std::uint64_t new_len = hlen - erase + tb.size();
          if (rng() % 4 != 0) {
            for (std::size_t i = 0; i < 8; ++i)
              img[i] = static_cast<std::byte>((new_len >> (8 * i)) & 0xffu);
          }
          break;
        }
        case 5: {  // rewrite a digit inside the header (offsets / shapes drift)
          for (int tries = 0; tries < 16 && img.size() > 8; ++tries) {
            const std::size_t at = 8 + rng() % (img.size() - 8);
            const auto ch = static_cast<char>(img[at]);
            if (ch >= '0' && ch <= '9') {
              img[at] = static_cast<std::byte>('0' + static_cast<int>(rng() % 10));
              break;
            }
          }
          break;
        }
      }
    }
    // An exact-size heap copy so AddressSanitizer sees any read past the end.
    const std::size_t size = img.size();
    std::unique_ptr<std::byte[]> buf(new std::byte[size == 0 ? 1 : size]);
    if (size != 0) std::memcpy(buf.get(), img.data(), size);
    const std::span<const std::byte> bytes(buf.get(), size);

    Result<SafetensorsFilePtr> r = SafetensorsFile::FromMemory(bytes, "fuzz");
    if (!r.ok()) {
      ++n_err;
      ASSERT_EQ(r.status().code(), Code::kCorruption)
          << "iteration " << iter << ": " << r.status().ToString();
      ASSERT_FALSE(r.status().message().empty()) << "iteration " << iter;
      continue;
    }
    ++n_ok;
    const auto& tensors = (*r)->tensors();
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const TensorInfo& t = tensors[i];
      if (i > 0) {
        ASSERT_LT(tensors[i - 1].name, t.name) << "iteration " << iter;
      }
      ASSERT_GE(t.data, bytes.data()) << "iteration " << iter;
      ASSERT_LE(t.data + t.nbytes, bytes.data() + bytes.size()) << "iteration " << iter;
      ASSERT_EQ(static_cast<std::uint64_t>(t.numel()) * dtype_size(t.dtype), t.nbytes);
      // Touch every byte so the sanitizer checks the whole range.
      unsigned sum = 0;
      for (std::size_t k = 0; k < t.nbytes; ++k) sum += static_cast<unsigned>(t.data[k]);
      (void)sum;
    }
  }
  // The mutations must exercise both outcomes, or the test proves little.
  EXPECT_GT(n_ok, 50);
  EXPECT_GT(n_err, 1000);
  std::printf("[ fuzz ] %d accepted, %d rejected\n", n_ok, n_err);
}

}  // namespace
}  // namespace lockstep
