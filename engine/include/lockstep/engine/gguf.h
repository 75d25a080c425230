// GGUF files (llama.cpp's checkpoint format, versions 2 and 3): a validating reader over a
// read-only mapping and a deterministic writer.
//
// Layout: u32 magic "GGUF", u32 version, u64 tensor count, u64 key/value count; the key/values
// (u64-length string key, u32 value type, value: integers, f32/f64, bool, u64-length string, or an
// array of one element type with a u64 count); the tensor infos (name, u32 n_dims, u64 ne[n_dims]
// innermost first, u32 ggml type, u64 offset); padding to `general.alignment` (default 32); the
// data section, each tensor at its offset from the data section's start.
//
// Every count, length, size and offset is checked before it is used, against the bytes that
// remain and against fixed limits: a bad magic or version, a truncated header, absurd counts,
// strings or arrays longer than the file, unknown value or tensor types, a non-power-of-two
// alignment, zero or overflowing dimensions, a row not a whole number of blocks, a misaligned
// offset, data past the end, overlapping tensors, repeated keys or tensor names are each a
// kCorruption Status naming the file and the problem (and the key or tensor), never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "lockstep/engine/status.h"
#include "lockstep/engine/weights.h"

namespace lockstep {

// ggml tensor type ids used in GGUF files.
enum class GgmlType : std::uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
};
// "F32", "Q4_K", ... ; "type 17" for an id without a name here.
std::string GgmlTypeName(std::uint32_t id);
// The engine's WeightType for a ggml type it computes with (every WeightType; not Q8_1, Q8_K,
// MXFP4 or the integer types).
std::optional<WeightType> WeightTypeOfGgml(std::uint32_t id);
GgmlType GgmlOfWeightType(WeightType t);

// One metadata value. Arrays hold their elements converted to these alternatives.
struct GgufValue {
  std::variant<std::uint64_t, std::int64_t, double, bool, std::string, std::vector<GgufValue>> v;
  std::uint32_t type = 0;  // the file's value type id (4 = u32, 8 = string, 9 = array, ...)
};

struct GgufTensor {
  std::string name;
  std::uint32_t type = 0;         // ggml type id (known: its block size is in the table)
  std::vector<std::uint64_t> ne;  // innermost first, as in the file
  std::uint64_t offset = 0;       // from the data section's start
  std::uint64_t nbytes = 0;
  const std::byte* data = nullptr;  // into the mapping
};

class GgufFile {
 public:
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  // mmap + parse. Errors: kNotFound, kIOError, kCorruption (see the file comment).
  static Result<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses an in-memory image (`bytes` must outlive the result); the fuzz target's entry.
  static Result<std::unique_ptr<GgufFile>> FromMemory(std::span<const std::byte> bytes,
                                                      std::string label);

  const std::string& path() const { return path_; }
  std::uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue, std::less<>>& kv() const { return kv_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* Find(std::string_view name) const;
  // Typed metadata lookups: nullopt when absent or of another kind.
  std::optional<std::int64_t> Int(std::string_view key) const;
  std::optional<double> Float(std::string_view key) const;
  std::optional<std::string> String(std::string_view key) const;

 private:
  GgufFile() = default;
  Status Parse(std::span<const std::byte> bytes);

  std::string path_;
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
  std::uint32_t version_ = 0;
  std::map<std::string, GgufValue, std::less<>> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, std::size_t, std::less<>> by_name_;
};
using GgufFilePtr = std::unique_ptr<GgufFile>;

// A tensor to write: `data` holds the rows in `type` (ne innermost first).
struct GgufTensorToWrite {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<std::uint64_t> ne;
  std::vector<std::byte> data;
};

// Writes a GGUF v3 file atomically (alignment 32, tensors in the given order, metadata keys in
// sorted order): the same input gives the same bytes. Values: u32/i32/f32/string/bool scalars and
// arrays of strings or i32, as GgufValue with `type` set. kInvalidArgument for a data size that
// does not match type x ne.
Status WriteGguf(const std::string& path, const std::map<std::string, GgufValue>& kv,
                 const std::vector<GgufTensorToWrite>& tensors);

// The synthetic model of `safetensors_dir` (config.json + model.safetensors, HF layout) as
// llama.cpp's converter lays out a `qwen3next` GGUF (fused attn_qkv + attn_gate regrouped per
// head group, ssm_a = -exp(A_log), ssm_dt.bias, norms stored as 1 + w, stacked experts, the MTP
// layer as blk.{n_layer}.nextn.*, hyper-parameters under qwen3next.*), written to `out_path`.
// Matrices keep their dtype, or are quantised to `quant` (q8_0, q4_k, q6_k) where their rows are
// whole blocks; vectors stay F32. A tokenizer.json in the folder is embedded as llama.cpp's
// tokenizer.ggml.* metadata (model "gpt2", pre "qwen2"; LoadGgufTokenizer reads it back).
Status ConvertToGguf(const std::string& safetensors_dir, const std::string& out_path,
                     std::optional<WeightType> quant);

}  // namespace lockstep
