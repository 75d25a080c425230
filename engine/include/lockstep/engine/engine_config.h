// EngineConfig: every engine option in one struct, and EngineOptions(), the one table that names
// each option for JSON and the command line. `lockstep generate --print-config` prints a config
// as canonical JSON (sorted keys, resolved defaults); the harness hands it to child processes
// with `--config FILE`, and its SHA-256 is the config fingerprint (config_sha256 in exports).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "lockstep/engine/dtype.h"
#include "lockstep/engine/model_config.h"
#include "lockstep/engine/status.h"

namespace lockstep {

struct EngineConfig {
  // ---- model and backend ----
  std::string model;  // checkpoint folder (config.json + *.safetensors)
  std::string backend = "cpu";
  int threads = 0;  // worker threads; 0 = one per hardware core (resolved at start)
  // Products on quantised and 16-bit weights: "exact" (the weights' f32 values with x in f32,
  // bitwise a product on an f32 copy of the weights) or "ggml" (llama.cpp's arithmetic: x rounded
  // to 8 bits per block with integer dot products for the block types of cpu/matmul_q8.h, x
  // rounded to bf16 / f16 for bf16 / f16 weights). Both deterministic and batch-invariant.
  std::string quant_dot = "exact";
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
  std::vector<int>
      devices;  // cuda: GPUs the stages run on (stage s on devices[s*n/stages]); empty = {0}

  // ---- pipeline ----
  int stages = 4;           // pipeline stage sessions
  std::vector<int> split;   // layer boundaries between stages (stages-1 values); empty = even
  int prefill_chunk = 512;  // tokens per prefill chunk (chunk-major through all stages)

  // ---- caches ----
  DType kv_dtype = DType::kF32;  // f32 | bf16 | int8 (int8: per-row-per-head scales)
  int kv_page_rows = 64;         // rows per K/V page
  int expert_cache = -1;         // resident experts per MoE layer; -1 = auto (from pcie_frac)
  double pcie_frac = 0.0;        // fraction of experts served from host memory ("over PCIe")

  // ---- service (engine/serve: slots, continuous batching, the prefix cache) ----
  int slots = 1;                // live sequences an engine holds (generate: 1; serve: 16)
  int batch_tokens = 512;       // rows an engine step admits (verify rows first, whole chunks)
  bool batch_invariant = true;  // off: a step's products fuse across requests (faster, and a
                                // request's bits then depend on what shares its steps)
  bool prefix_cache = false;    // reuse cached prompt prefixes (K/V pages + GDN snapshots)
  int snapshot_every = 0;       // GDN snapshot grid in positions; 0 = prefill_chunk
  int prefix_cache_mib = 1024;  // prefix cache budget (LRU eviction past it)
  int memory_mib = 0;           // K/V + state reservations of live requests; 0 = unlimited
  int queue_depth = 64;         // requests waiting for a slot at most

  // ---- request / sampling ----
  int max_new = 64;               // output tokens at most
  std::uint64_t seed = 0;         // counter-RNG key for sampling
  double temperature = 0.0;       // 0 = greedy
  int top_k = 0;                  // 0 = off
  double top_p = 1.0;             // 1 = off
  bool ignore_eos = false;        // keep generating past EOS (benchmarks)
  double presence_penalty = 0.0;  // SamplingParams' penalties (sampler.h); neutral = off
  double frequency_penalty = 0.0;
  double repeat_penalty = 1.0;
  int repeat_last_n = 64;  // -1 = the whole context

  // ---- speculative decoding ----
  int spec = 0;                         // draft budget K; 0 = plain decoding (T = 1)
  bool mtp = true;                      // MTP drafter on (when the checkpoint ships mtp.*)
  int spec_max_suffix = 8;              // suffix drafts propose up to this many tokens
  std::string suffix_index = "sync";    // sync | async (async: timing-dependent on purpose)
  std::string draft_policy = "static";  // static | adaptive | latency (latency: timing-dependent)
  std::string replay_path;              // window records (JSON lines) whose drafts are replayed

  // ---- fault injection (testing the harness) ----
  std::vector<std::string> inject;  // e.g. "delay:stage=2:window=5:ms=200"

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
  // The GDN snapshot grid of the prefix cache (snapshot_every, or prefill_chunk when 0).
  int SnapshotGrid() const { return snapshot_every > 0 ? snapshot_every : prefill_chunk; }

  // Field by field (tests compare a config with its JSON round trip). Defaulted in the .cpp:
  // this header stays C++17 for the cuda plugin (engine/cuda/plugin.cpp).
  bool operator==(const EngineConfig& other) const;
};

// ---- the option table ----
//
// Every engine option is one EngineOption row in EngineOptions() (engine_config.cpp): the row
// drives ToJson, FromJson, Validate and the `lockstep generate` flags (harness/cli/engine_flags.h),
// so adding an option is a field above plus one row there (and a test value in
// tests/engine/cli_test.cpp's FlagValues(): the round-trip test fails naming an option without
// one). Defaults are the field initializers above (help prints them through `format`).

// The EngineConfig member an option reads and writes. Its type fixes the JSON form: int (a 32-bit
// integer), uint64 (a non-negative integer), double (a number), bool (true/false), string, lists
// of integers or strings, DType (its name, as ParseKvDtype reads it).
using EngineOptionField =
    std::variant<int EngineConfig::*, std::uint64_t EngineConfig::*, double EngineConfig::*,
                 bool EngineConfig::*, std::string EngineConfig::*,
                 std::vector<int> EngineConfig::*, std::vector<std::string> EngineConfig::*,
                 DType EngineConfig::*>;

// The `lockstep generate --help` group an option is listed in (harness/cli/engine_flags.h names
// them and fixes their order). Presentation only: no effect on JSON, parsing or validation.
enum class EngineOptionGroup : std::uint8_t {
  kRequest,
  kModel,
  kPipeline,
  kService,
  kSpeculative,
  kCuda,
  kDiagnostics
};

struct EngineOption {
  std::string_view key;   // JSON key ("prefill_chunk")
  std::string_view flag;  // command-line flag ("--prefill")
  EngineOptionField field;
  EngineOptionGroup group;
  std::string_view doc;  // one line; `lockstep generate --help` prints it next to the flag
  // What help shows as the default when `format` gives "" (an empty list or string means
  // something: "even" split, device 0, "none"). Empty: the formatted default.
  std::string_view default_text = {};
  // Command-line text -> field, for a value not spelled as its field type is (on|off, "0,1,2",
  // auto|N, a dtype name). Errors are kInvalidArgument naming `self.flag`. Null: the CLI reads
  // the field's own type (CLI11's integers and numbers; a bool is a switch without a value; a
  // list of strings is a repeatable flag).
  Status (*parse)(const EngineOption& self, std::string_view text, EngineConfig& c) = nullptr;
  // Field -> the text `parse` accepts (null: the type's own spelling). Help shows the default.
  std::string (*format)(const EngineOption& self, const EngineConfig& c) = nullptr;
  // This option's checks (it may read other fields: --devices against --stages); the error
  // names the flag. Null: every value is valid.
  Status (*validate)(const EngineConfig& c) = nullptr;
  // ToJson leaves the key out while it holds its default: options added after exports were
  // pinned, so the /config of a run that does not use them stays byte-for-byte what it was.
  bool omit_default = false;
};

// Every engine option, in EngineConfig's field order (the order of Validate's checks, and of
// --help within each help group). Static storage, never modified; thread-safe.
const std::vector<EngineOption>& EngineOptions();
// `o`'s value in `c` as its flag spells it ("" for an empty string or list).
std::string FormatEngineOption(const EngineOption& o, const EngineConfig& c);

// Parses "f32" | "bf16" | "int8" (K/V cache dtypes).
Result<DType> ParseKvDtype(std::string_view s);
// Parses a layer split "12,24,36". kInvalidArgument on bad syntax.
Result<std::vector<int>> ParseIntList(std::string_view s, std::string_view what);

}  // namespace lockstep
