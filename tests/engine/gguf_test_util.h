// Helpers of the GGUF tests (gguf_test.cpp, quant_oracle_test.cpp): synthetic models through
// `lockstep model init`, a GGUF file's dequantised weights as an f32 checkpoint, and the
// comparison of two checkpoints' runs (tokens and every state item bitwise).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "engine/state_digest.h"
#include "lockstep/engine/gguf.h"
#include "lockstep/engine/safetensors.h"
#include "model/tensor_source.h"
#include "test_util.h"

namespace lockstep::test {

inline std::string Init(const std::string& args, const std::string& name) {
  const std::string dir = test::NewDir(name);
  auto r = test::RunLockstep("model init " + args + " --out " + dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return dir;
}

inline void ExpectSameRun(const std::string& a_path, const std::string& b_path,
                          const std::string& what) {
  auto a = ModelWeights::Load(a_path);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = ModelWeights::Load(b_path);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const test::DigestRun ra = test::GenerateDigests(**a, a_path);
  const test::DigestRun rb = test::GenerateDigests(**b, b_path);
  EXPECT_EQ(ra.tokens, rb.tokens) << what;
  ASSERT_EQ(ra.items.size(), rb.items.size()) << what;
  EXPECT_GT(ra.items.size(), 50u);
  int differ = 0;
  for (const auto& [k, h] : ra.items) differ += h != rb.items.at(k);
  EXPECT_EQ(differ, 0) << what << ": items differ";
}

// The dequantised weights of a GGUF model as an f32 safetensors checkpoint with its config.
inline std::string DequantisedCopy(const std::string& gguf_path, const std::string& names_from) {
  ModelConfig c;
  auto src = OpenGgufSource(gguf_path, &c);
  EXPECT_TRUE(src.ok()) << src.status().ToString();
  auto store = TensorStore::OpenDir(names_from);
  EXPECT_TRUE(store.ok());
  std::vector<std::vector<float>> keep;
  std::vector<TensorToWrite> ts;
  for (const std::string& name : (*store)->Names()) {
    const SourceTensor* t = (*src)->Find(name);
    if (t == nullptr) ADD_FAILURE() << "no GGUF tensor for " << name;
    if (t == nullptr) continue;
    Mat m;
    m.type = *t->type;
    m.rows = static_cast<int>(t->shape[0]);
    m.cols = static_cast<int>(t->nbytes / static_cast<std::size_t>(m.rows) /
                              weight_block_bytes(m.type)) *
             weight_block_elems(m.type);
    m.data = t->data;
    if (!t->parts.empty()) {  // a stacked matrix (Q4_K_M's attn_qkv + attn_gate)
      m.parts = t->parts.data();
      m.n_parts = static_cast<int>(t->parts.size());
      m.cols = static_cast<int>(t->shape[1]);
    }
    keep.emplace_back(static_cast<std::size_t>(m.rows) * static_cast<std::size_t>(m.cols));
    for (int r = 0; r < m.rows; ++r)
      m.RowToF32(
          r, keep.back().data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(m.cols));
    ts.push_back({name, DType::kF32, (*store)->Find(name)->shape,
                  std::as_bytes(std::span<const float>(keep.back()))});
  }
  const std::string dir = test::NewDir("gguf-deq");
  EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", ts).ok());
  std::filesystem::copy_file(names_from + "/config.json", dir + "/config.json");
  return dir;
}

}  // namespace lockstep::test
