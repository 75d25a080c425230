// The weight types' table: names, block sizes and ggml type ids. Its own file so that the GGUF
// reader (and the fuzz targets built over it) need not link the rest of weights.cpp.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string_view>

#include "lockstep/engine/weights.h"
#include "util/check.h"

namespace lockstep {

namespace {

struct WeightTypeInfo {
  WeightType type;
  const char* name;
  int elems;
  std::size_t bytes;
  std::uint32_t ggml_id;
};

// Block sizes and bytes as ggml defines them (ggml-common.h's block_* structs).
constexpr WeightTypeInfo kWeightTypes[kWeightTypeCount] = {
    {WeightType::kF32, "f32", 1, 4, 0},
    {WeightType::kBF16, "bf16", 1, 2, 30},
    {WeightType::kF16, "f16", 1, 2, 1},
    {WeightType::kQ8_0, "q8_0", 32, 34, 8},
    {WeightType::kQ4_K, "q4_k", 256, 144, 12},
    {WeightType::kQ6_K, "q6_k", 256, 210, 14},
    {WeightType::kQ4_0, "q4_0", 32, 18, 2},
    {WeightType::kQ4_1, "q4_1", 32, 20, 3},
    {WeightType::kQ5_0, "q5_0", 32, 22, 6},
    {WeightType::kQ5_1, "q5_1", 32, 24, 7},
    {WeightType::kQ2_K, "q2_k", 256, 84, 10},
    {WeightType::kQ3_K, "q3_k", 256, 110, 11},
    {WeightType::kQ5_K, "q5_k", 256, 176, 13},
    {WeightType::kIQ4_NL, "iq4_nl", 32, 18, 20},
    {WeightType::kIQ4_XS, "iq4_xs", 256, 136, 23},
    {WeightType::kIQ3_S, "iq3_s", 256, 110, 21},
    {WeightType::kIQ3_XXS, "iq3_xxs", 256, 98, 18},
    {WeightType::kIQ2_XXS, "iq2_xxs", 256, 66, 16},
    {WeightType::kIQ2_XS, "iq2_xs", 256, 74, 17},
    {WeightType::kIQ2_S, "iq2_s", 256, 82, 22},
    {WeightType::kIQ1_S, "iq1_s", 256, 50, 19},
    {WeightType::kIQ1_M, "iq1_m", 256, 56, 29},
    {WeightType::kTQ1_0, "tq1_0", 256, 54, 34},
    {WeightType::kTQ2_0, "tq2_0", 256, 66, 35},
};

const WeightTypeInfo& InfoOf(WeightType t) {
  const auto i = static_cast<std::size_t>(t);
  LOCKSTEP_CHECK(i < static_cast<std::size_t>(kWeightTypeCount) && kWeightTypes[i].type == t)
      << "weight type " << i;
  return kWeightTypes[i];
}

}  // namespace

std::string_view weight_type_name(WeightType t) { return InfoOf(t).name; }
int weight_block_elems(WeightType t) { return InfoOf(t).elems; }
std::size_t weight_block_bytes(WeightType t) { return InfoOf(t).bytes; }
std::uint32_t weight_type_ggml_id(WeightType t) { return InfoOf(t).ggml_id; }

std::optional<WeightType> weight_type_from_name(std::string_view name) {
  for (const WeightTypeInfo& i : kWeightTypes) {
    const std::string_view n = i.name;
    if (n.size() == name.size() && std::equal(n.begin(), n.end(), name.begin(), [](char a, char b) {
          return a == static_cast<char>(std::tolower(static_cast<unsigned char>(b)));
        }))
      return i.type;
  }
  return std::nullopt;
}

}  // namespace lockstep
