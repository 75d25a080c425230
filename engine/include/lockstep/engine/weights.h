// Model weights in memory, each matrix kept in the type its file stores it in.
//
// Matrices (Mat) are f32, bf16 or f16 rows as in a safetensors file, or ggml blocks (Q4_K, IQ4_XS,
// ..., quant.h) as in a GGUF file. They point straight into the file's read-only mapping where the
// file's layout allows (element-aligned data, the same row-major order); otherwise (a misaligned
// tensor, a GGUF tensor that must be regrouped or have its values derived) into an arena owned by
// ModelWeights. The kernels (engine/cpu/matmul.h) widen or dequantise a matrix in registers; the
// widening of bf16/f16 to f32 is exact, so every product is bitwise what an f32 copy of the
// weights gives. Vectors (norm weights, conv1d, dt_bias, A_log) are small and always widened to
// f32 once at load.
//
// Loading checks every tensor for presence, dtype (f32/bf16/f16 accepted) and shape against the
// ModelConfig, and names the tensor in every error: e.g.
//   tensor 'model.layers.3.mlp.gate.weight': expected shape [8, 64], got [8, 32]
//   (hint: config.json and the safetensors files disagree; regenerate with 'lockstep model init')
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/model_config.h"
#include "lockstep/engine/status.h"

namespace lockstep {

// How a matrix's elements are stored. The block types follow ggml's layouts (block sizes 32 and
// 256, little-endian, f16 scales); their dequantised value is defined in quant.h. Every ggml
// block type a published Qwen3-Next GGUF uses is here; a file may mix them per tensor.
enum class WeightType : std::uint8_t {
  kF32,
  kBF16,
  kF16,
  kQ8_0,
  kQ4_K,
  kQ6_K,  // the first types (values kept)
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ2_K,
  kQ3_K,
  kQ5_K,  // the other legacy and k-quants
  kIQ4_NL,
  kIQ4_XS,
  kIQ3_S,
  kIQ3_XXS,
  kIQ2_XXS,
  kIQ2_XS,
  kIQ2_S,
  kIQ1_S,
  kIQ1_M,  // i-quants
  kTQ1_0,
  kTQ2_0,  // ternary
};
inline constexpr int kWeightTypeCount = 24;

std::string_view weight_type_name(WeightType t);  // "f32", "bf16", "f16", "q8_0", "q4_k", ...
int weight_block_elems(WeightType t);             // elements per block: 1, 1, 1, 32, 256, ...
std::size_t weight_block_bytes(WeightType t);     // bytes per block: 4, 2, 2, 34, 144, ...
std::uint32_t weight_type_ggml_id(WeightType t);  // ggml's type id (GGUF tensor info)
// The type named `name` (weight_type_name, case-insensitive), if any.
std::optional<WeightType> weight_type_from_name(std::string_view name);

struct MatPart;

// A row-major weight matrix view [rows=out, cols=in]; acts as y = x . W^T. `data` points at row 0;
// row r starts row_bytes() * r bytes later (cols is a multiple of the block size). `data` is
// aligned to the element type (2 bytes for the block types).
//
// A stacked matrix (parts != nullptr) is made of row ranges of other matrices, each of its own
// type: a GGUF pair regrouped without converting a byte (llama.cpp's Q4_K_M stores attn_qkv in
// Q5_K beside attn_gate in Q4_K; gguf.cpp). Part i holds rows [parts[i].row0, parts[i].row0 +
// parts[i].m.rows), in order, covering [0, rows). `type` and `data` are part 0's; row_ptr and
// row_bytes mean nothing for it: the products (cpu/matmul.h), bytes() and RowToF32 go by part.
struct Mat {
  const void* data = nullptr;
  int rows = 0;
  int cols = 0;
  WeightType type = WeightType::kF32;
  const MatPart* parts = nullptr;
  int n_parts = 0;

  std::size_t row_bytes() const {
    return static_cast<std::size_t>(cols) / static_cast<std::size_t>(weight_block_elems(type)) *
           weight_block_bytes(type);
  }
  const std::byte* row_ptr(int r) const {
    return static_cast<const std::byte*>(data) + static_cast<std::size_t>(r) * row_bytes();
  }
  // Row r as f32; only for type == kF32 (a programmer error otherwise: checked, aborts).
  const float* row(int r) const;
  // Row r widened (or dequantised) to f32 into out[cols]: exact for f32/bf16/f16.
  void RowToF32(int r, float* out) const;
  // Bytes the matrix occupies in memory (= in the file for the types a file stores).
  std::size_t bytes() const;
};

struct MatPart {
  int row0 = 0;
  Mat m;  // a plain matrix (no parts of its own), m.cols == the stacked matrix's cols
};

// For each part of the stacked matrix `w` overlapping its rows [b, e): f(part, lo, hi), rows
// [lo, hi) of part.m (w's rows [part.row0 + lo, part.row0 + hi)). The products use it to run a
// stacked range part by part.
template <class F>
void ForEachPartRows(const Mat& w, int b, int e, F&& f) {
  for (int i = 0; i < w.n_parts; ++i) {
    const MatPart& p = w.parts[i];
    const int lo = b > p.row0 ? b : p.row0, hi = e < p.row0 + p.m.rows ? e : p.row0 + p.m.rows;
    if (lo < hi) f(p, lo - p.row0, hi - p.row0);
  }
}

inline std::size_t Mat::bytes() const {
  if (parts == nullptr) return static_cast<std::size_t>(rows) * row_bytes();
  std::size_t b = 0;
  for (int i = 0; i < n_parts; ++i) b += parts[i].m.bytes();
  return b;
}

struct AttentionWeights {
  Mat q_proj;  // [2*Hq*D, H]: per head h rows [2hD, 2hD+D) query, [2hD+D, 2hD+2D) gate
  Mat k_proj;  // [Hkv*D, H]
  Mat v_proj;  // [Hkv*D, H]
  Mat o_proj;  // [H, Hq*D]
  const float* q_norm = nullptr;  // f32 [D], zero-centred
  const float* k_norm = nullptr;  // f32 [D], zero-centred
};

struct GdnWeights {
  Mat in_proj_qkvz;                // [2*Hk*Dk + 2*Hv*Dv, H], grouped per key head
  Mat in_proj_ba;                  // [2*Hv, H], grouped per key head
  const float* conv1d = nullptr;   // f32 [conv_dim, K]
  const float* dt_bias = nullptr;  // f32 [Hv]
  const float* a_log = nullptr;    // f32 [Hv]
  const float* norm = nullptr;     // f32 [Dv], plain weight (not 1+w)
  Mat out_proj;                    // [H, Hv*Dv]
};

struct FfnWeights {  // one SwiGLU expert (or the shared expert, or a dense MLP)
  Mat gate;          // [I, H]
  Mat up;            // [I, H]
  Mat down;          // [H, I]
  std::size_t bytes() const { return gate.bytes() + up.bytes() + down.bytes(); }
};

struct MoeWeights {
  Mat router;                          // [E, H]
  std::vector<FfnWeights> experts;     // [E]
  FfnWeights shared;                   // shared expert (Is wide); rows == 0 when absent
  const float* shared_gate = nullptr;  // f32 [H] (shared_expert_gate.weight [1, H])
};

struct LayerWeights {
  LayerType type = LayerType::kLinearAttention;
  bool moe = true;
  const float* input_norm = nullptr;  // f32 [H], zero-centred
  const float* post_norm = nullptr;   // f32 [H], zero-centred
  AttentionWeights attn;              // full-attention layers
  GdnWeights gdn;                     // linear-attention layers
  MoeWeights ffn_moe;                 // moe == true
  FfnWeights ffn_dense;               // moe == false
};

struct MtpWeights {
  bool present = false;
  Mat fc;                                        // [H, 2H]: cols [0,H) embedding, [H,2H) hidden
  const float* pre_fc_norm_embedding = nullptr;  // f32 [H]
  const float* pre_fc_norm_hidden = nullptr;     // f32 [H]
  const float* norm = nullptr;                   // f32 [H]
  LayerWeights layer;                            // full attention + MoE
};

// How Load keeps the matrices. kFileType (the default) keeps them in the file's type, mapped
// where possible; kWidenF32 converts every matrix to an f32 copy at load (the engine's behaviour
// before weights stayed in their file type: kept for tests and benchmarks that compare the two;
// the CUDA backend's packer widens on its own and works with either).
enum class WeightResidency { kFileType, kWidenF32 };

class TensorSource;  // what Load read the tensors from (a mapped checkpoint); kept alive

class ModelWeights {
 public:
  ModelWeights();
  ~ModelWeights();
  ModelWeights(const ModelWeights&) = delete;
  ModelWeights& operator=(const ModelWeights&) = delete;

  ModelConfig config;
  Mat embed;                          // [V, H]
  Mat lm_head;                        // [V, H] (== embed when tied)
  const float* final_norm = nullptr;  // f32 [H]
  std::vector<LayerWeights> layers;   // [n_layers]
  MtpWeights mtp;
  std::vector<std::string> files;  // checkpoint files the weights came from
  std::string format;              // "safetensors" or "gguf"

  // Bytes the loader allocated itself (widened vectors, copies, f32 matrices under kWidenF32).
  std::size_t arena_bytes() const;
  // Weight bytes held in memory (mapped or owned) by a stage of layers [layer_begin, layer_end):
  // its layers; the embedding if it is the first stage (layer_begin == 0); the final norm,
  // lm_head (unless tied and already counted) and the MTP layer if it is the last
  // (layer_end == n_layers). The whole model: ResidentBytes(0, n_layers).
  std::size_t ResidentBytes(int layer_begin, int layer_end) const;
  // Weight bytes one decode token must read, each matrix in its in-memory type: every mixer and
  // norm weight, the router, the top-k routed experts and the shared expert of every layer, one
  // embedding row, the final norm and lm_head. MTP excluded. The memory-bandwidth bound of decode
  // is this divided by the read bandwidth.
  std::size_t ActiveBytesPerToken() const;

  // Loads config.json + safetensors from `dir`, or a GGUF file (`path` ending in .gguf; the
  // first file of a split set names the set). `load_mtp` = false skips the MTP tensors.
  static Result<std::unique_ptr<ModelWeights>> Load(
      const std::string& path, bool load_mtp = true,
      WeightResidency residency = WeightResidency::kFileType);

  // The loader's storage (internal: used by the loaders in engine/model/).
  float* AllocF32(std::size_t n);
  std::byte* AllocBytes(std::size_t n);
  const MatPart* KeepParts(std::vector<MatPart> parts);  // storage for a stacked Mat's parts
  void KeepSource(std::unique_ptr<TensorSource> src);

 private:
  std::vector<std::unique_ptr<float[]>> owned_f32_;
  std::vector<std::unique_ptr<std::byte[]>> owned_bytes_;
  std::vector<std::unique_ptr<std::vector<MatPart>>> owned_parts_;
  std::size_t owned_bytes_total_ = 0;
  std::vector<std::unique_ptr<TensorSource>> sources_;
};
using ModelWeightsPtr = std::unique_ptr<ModelWeights>;

}  // namespace lockstep
