// EngineConfig: every engine option in one struct. `lockstep generate --print-config` prints it
// as canonical JSON (sorted keys, resolved defaults); the harness hands it to child processes
// with `--config FILE`, and its SHA-256 is the config fingerprint.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/engine/dtype.h"
#include "lockstep/engine/model_config.h"
#include "lockstep/engine/status.h"

namespace lockstep {

struct EngineConfig {
  // ---- model and backend ----
  std::string model;         // checkpoint folder (config.json + *.safetensors)
  std::string backend = "cpu";
  int threads = 0;           // worker threads; 0 = one per hardware core (resolved at start)
  // cuda: no atomics, fixed cuBLAS math and workspace, batch-invariant verify kernels. `false`
  // lets verify windows use cuBLAS GEMMs (TF32, shape-dependent algorithms) and the MoE combine
  // any order: faster, not reproducible. The cpu backend is always deterministic.
  bool deterministic = true;
  // cuda: each stage replays its verify / decode steps from a CUDA graph (captured once per
  // window size, re-captured when a buffer it uses grows). Same kernels, same bits as without;
  // fewer host launches. `false` launches every kernel from the host.
  bool cuda_graphs = true;
  // cuda: attention rows whose context is longer than this many positions run in blocks of this
  // many positions and a combine (split-context decode attention: a long context spreads over
  // many SMs instead of one block per head). Rows up to it are unchanged. A row's bits depend on
  // this value (never on T), so the two arms of an A/A must share it. 0 = one block per row.
  int cuda_attn_split = 512;
  std::vector<int> devices;  // cuda: GPUs the stages run on (stage s on devices[s*n/stages]); empty = {0}

  // ---- pipeline ----
  int stages = 4;            // pipeline stage sessions
  std::vector<int> split;    // layer boundaries between stages (stages-1 values); empty = even
  int prefill_chunk = 512;   // tokens per prefill chunk (chunk-major through all stages)

  // ---- caches ----
  DType kv_dtype = DType::kF32;  // f32 | bf16 | int8 (int8: per-row-per-head scales)
  int kv_page_rows = 64;         // rows per K/V page
  int expert_cache = -1;         // resident experts per MoE layer; -1 = auto (from pcie_frac)
  double pcie_frac = 0.0;        // fraction of experts served from host memory ("over PCIe")

  // ---- request / sampling ----
  int max_new = 64;          // output tokens at most
  std::uint64_t seed = 0;    // counter-RNG key for sampling
  double temperature = 0.0;  // 0 = greedy
  int top_k = 0;             // 0 = off
  double top_p = 1.0;        // 1 = off
  bool ignore_eos = false;   // keep generating past EOS (benchmarks)

  // ---- speculative decoding ----
  int spec = 0;                        // draft budget K; 0 = plain decoding (T = 1)
  bool mtp = true;                     // MTP drafter on (when the checkpoint ships mtp.*)
  int spec_max_suffix = 8;             // suffix drafts propose up to this many tokens
  std::string suffix_index = "sync";   // sync | async (async: timing-dependent on purpose)
  std::string draft_policy = "static"; // static | adaptive | latency (latency: timing-dependent)
  std::string replay_path;             // window records (JSON lines) whose drafts are replayed

  // ---- fault injection (testing the harness) ----
  std::vector<std::string> inject;     // e.g. "delay:stage=2:window=5:ms=200"

  // Canonical JSON (keys sorted, all fields present). Stable across runs for equal configs.
  std::string ToJson() const;
  // Strict parse: unknown keys, wrong types and bad values are kInvalidArgument naming the key.
  static Result<EngineConfig> FromJson(std::string_view text, const std::string& label);

  // Checks values that do not need the model (ranges, names). kInvalidArgument on failure.
  Status Validate() const;
  // Layer boundaries for `model`: [0, b1, ..., n_layers] (stages+1 values). Checks the split.
  Result<std::vector<int>> StageBoundaries(const ModelConfig& model) const;
  // Resident experts per MoE layer for `n_experts` (resolves auto from pcie_frac).
  int ResidentExperts(int n_experts) const;
};

// Parses "f32" | "bf16" | "int8" (K/V cache dtypes).
Result<DType> ParseKvDtype(std::string_view s);
// Parses a layer split "12,24,36". kInvalidArgument on bad syntax.
Result<std::vector<int>> ParseIntList(std::string_view s, std::string_view what);

}  // namespace lockstep
