#include "lockstep/engine/engine_config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

namespace lockstep {

Result<DType> ParseKvDtype(std::string_view s) {
  if (s == "f32") return DType::kF32;
  if (s == "bf16") return DType::kBF16;
  if (s == "int8") return DType::kI8;
  return Status::InvalidArgument("--kv",
                                 "expected f32, bf16 or int8, got '" + std::string(s) + "'");
}

Result<std::vector<int>> ParseIntList(std::string_view s, std::string_view what) {
  std::vector<int> out;
  if (s.empty()) return out;
  std::size_t start = 0;
  while (start <= s.size()) {
    std::size_t comma = s.find(',', start);
    std::string_view part =
        s.substr(start, comma == std::string_view::npos ? s.size() - start : comma - start);
    int v = 0;
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (ec != std::errc() || ptr != part.data() + part.size() || part.empty())
      return Status::InvalidArgument(
          what, "expected comma-separated integers, got '" + std::string(s) + "'");
    out.push_back(v);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

namespace {

// ---- command-line spellings (EngineOption::parse / format) ----

Status ParseOnOff(const EngineOption& o, std::string_view text, EngineConfig& c) {
  if (text != "on" && text != "off")
    return Status::InvalidArgument(o.flag, "expected on or off, got '" + std::string(text) + "'");
  c.*std::get<bool EngineConfig::*>(o.field) = text == "on";
  return Status::Ok();
}
std::string FormatOnOff(const EngineOption& o, const EngineConfig& c) {
  return c.*std::get<bool EngineConfig::*>(o.field) ? "on" : "off";
}

// "0,1,2" (ParseIntList's syntax; "" is the empty list).
Status ParseCommaList(const EngineOption& o, std::string_view text, EngineConfig& c) {
  LOCKSTEP_ASSIGN_OR_RETURN(c.*std::get<std::vector<int> EngineConfig::*>(o.field),
                            ParseIntList(text, o.flag));
  return Status::Ok();
}
std::string FormatCommaList(const EngineOption& o, const EngineConfig& c) {
  std::string s;
  for (int v : c.*std::get<std::vector<int> EngineConfig::*>(o.field))
    s += (s.empty() ? "" : ",") + std::to_string(v);
  return s;
}

// auto | N, auto stored as -1.
Status ParseAutoOrCount(const EngineOption& o, std::string_view text, EngineConfig& c) {
  int& out = c.*std::get<int EngineConfig::*>(o.field);
  if (text == "auto") {
    out = -1;
    return Status::Ok();
  }
  auto r = ParseIntList(text, o.flag);
  if (!r.ok() || r->size() != 1 || (*r)[0] < 0)
    return Status::InvalidArgument(
        o.flag, "expected auto or a non-negative count, got '" + std::string(text) + "'");
  out = (*r)[0];
  return Status::Ok();
}
std::string FormatAutoOrCount(const EngineOption& o, const EngineConfig& c) {
  const int v = c.*std::get<int EngineConfig::*>(o.field);
  return v < 0 ? "auto" : std::to_string(v);
}

Status ParseKv(const EngineOption& o, std::string_view text, EngineConfig& c) {
  LOCKSTEP_ASSIGN_OR_RETURN(c.*std::get<DType EngineConfig::*>(o.field), ParseKvDtype(text));
  return Status::Ok();
}

// ---- checks (EngineOption::validate), one per option; the flag names the option ----

Status Bad(std::string_view flag, const std::string& m) { return Status::InvalidArgument(flag, m); }

Status CheckBackend(const EngineConfig& c) {
  // Any registered backend name (backend.h); whether it is built here is CreateBackend's answer.
  if (c.backend.empty() || c.backend.size() > 32 ||
      c.backend.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-") != std::string::npos)
    return Bad("--backend", "expected a backend name such as cpu or cuda, got '" + c.backend + "'");
  return Status::Ok();
}
Status CheckThreads(const EngineConfig& c) {
  if (c.threads < 0 || c.threads > 256) return Bad("--threads", "expected 0 (auto) .. 256");
  return Status::Ok();
}
Status CheckCudaAttnSplit(const EngineConfig& c) {
  if (c.cuda_attn_split < 0 || c.cuda_attn_split > (1 << 24))
    return Bad("--cuda-attn-split", "expected 0 (one block per row) .. 16777216 positions");
  return Status::Ok();
}
Status CheckDevices(const EngineConfig& c) {
  const auto& d = c.devices;
  for (std::size_t i = 0; i < d.size(); ++i) {
    if (d[i] < 0 || d[i] > 1023) return Bad("--devices", "expected device ordinals 0 .. 1023");
    for (std::size_t j = 0; j < i; ++j)
      if (d[j] == d[i]) return Bad("--devices", "device " + std::to_string(d[i]) + " listed twice");
  }
  if (static_cast<int>(d.size()) > c.stages)
    return Bad("--devices", std::to_string(d.size()) + " devices for " + std::to_string(c.stages) +
                                " stages (at most one device per stage)");
  if (c.backend == "cpu" && !d.empty())
    return Bad("--devices", "only the cuda backend runs on devices");
  return Status::Ok();
}
Status CheckStages(const EngineConfig& c) {
  if (c.stages < 1 || c.stages > 64) return Bad("--stages", "expected 1 .. 64");
  return Status::Ok();
}
Status CheckSplit(const EngineConfig& c) {
  if (!c.split.empty() && static_cast<int>(c.split.size()) != c.stages - 1)
    return Bad("--split", "expected " + std::to_string(c.stages - 1) + " boundaries for " +
                              std::to_string(c.stages) + " stages, got " +
                              std::to_string(c.split.size()));
  return Status::Ok();
}
Status CheckPrefill(const EngineConfig& c) {
  if (c.prefill_chunk < 1 || c.prefill_chunk > (1 << 20))
    return Bad("--prefill", "expected 1 .. 1048576 tokens per chunk");
  return Status::Ok();
}
Status CheckKvPage(const EngineConfig& c) {
  if (c.kv_page_rows < 1 || c.kv_page_rows > 4096)
    return Bad("--kv-page", "expected 1 .. 4096 rows per page");
  return Status::Ok();
}
Status CheckExpertCache(const EngineConfig& c) {
  if (c.expert_cache < -1) return Bad("--expert-cache", "expected auto or a non-negative count");
  return Status::Ok();
}
Status CheckPcieFrac(const EngineConfig& c) {
  if (!(c.pcie_frac >= 0.0 && c.pcie_frac <= 1.0))
    return Bad("--pcie-frac", "expected a fraction in [0, 1]");
  return Status::Ok();
}
Status CheckQuantDot(const EngineConfig& c) {
  if (c.quant_dot != "exact" && c.quant_dot != "ggml")
    return Bad("--quant-dot", "expected exact or ggml, got '" + c.quant_dot + "'");
  if (c.quant_dot == "ggml" && c.backend == "cuda")
    return Bad("--quant-dot",
               "ggml is built for --backend cpu only (the cuda backend has no 8-bit "
               "products yet)");
  return Status::Ok();
}
Status CheckMaxNew(const EngineConfig& c) {
  if (c.max_new < 0 || c.max_new > (1 << 24)) return Bad("--max-new", "expected 0 .. 16777216");
  return Status::Ok();
}
Status CheckTemperature(const EngineConfig& c) {
  if (!(c.temperature >= 0.0 && std::isfinite(c.temperature)))
    return Bad("--temperature", "expected >= 0");
  return Status::Ok();
}
Status CheckTopK(const EngineConfig& c) {
  if (c.top_k < 0) return Bad("--top-k", "expected >= 0");
  return Status::Ok();
}
Status CheckTopP(const EngineConfig& c) {
  if (!(c.top_p > 0.0 && c.top_p <= 1.0)) return Bad("--top-p", "expected a value in (0, 1]");
  return Status::Ok();
}
Status CheckPenalties(const EngineConfig& c) {
  auto in = [](double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; };
  if (!in(c.presence_penalty, -2.0, 2.0))
    return Bad("--presence-penalty", "expected a value in [-2, 2]");
  if (!in(c.frequency_penalty, -2.0, 2.0))
    return Bad("--frequency-penalty", "expected a value in [-2, 2]");
  if (!in(c.repeat_penalty, 0.0, 10.0) || c.repeat_penalty == 0.0)
    return Bad("--repeat-penalty", "expected a value in (0, 10]");
  if (c.repeat_last_n < -1) return Bad("--repeat-last-n", "expected -1 (all) or >= 0 tokens");
  return Status::Ok();
}
Status CheckSpec(const EngineConfig& c) {
  if (c.spec < 0 || c.spec > 64) return Bad("--spec", "expected 0 .. 64 draft tokens");
  return Status::Ok();
}
Status CheckSpecMaxSuffix(const EngineConfig& c) {
  if (c.spec_max_suffix < 0 || c.spec_max_suffix > 64)
    return Bad("--spec-max-suffix", "expected 0 .. 64 tokens");
  return Status::Ok();
}
Status CheckSuffixIndex(const EngineConfig& c) {
  if (c.suffix_index != "sync" && c.suffix_index != "async")
    return Bad("--suffix-index", "expected sync or async, got '" + c.suffix_index + "'");
  return Status::Ok();
}
Status CheckDraftPolicy(const EngineConfig& c) {
  if (c.draft_policy != "static" && c.draft_policy != "adaptive" && c.draft_policy != "latency")
    return Bad("--draft-policy",
               "expected static, adaptive or latency, got '" + c.draft_policy + "'");
  return Status::Ok();
}

Status CheckSlots(const EngineConfig& c) {
  if (c.slots < 1 || c.slots > 256) return Bad("--slots", "expected 1 .. 256");
  return Status::Ok();
}
Status CheckBatchTokens(const EngineConfig& c) {
  if (c.batch_tokens < 1 || c.batch_tokens > (1 << 20))
    return Bad("--batch-tokens", "expected 1 .. 1048576");
  return Status::Ok();
}
Status CheckSnapshotEvery(const EngineConfig& c) {
  if (c.snapshot_every < 0) return Bad("--snapshot-every", "expected >= 0 (0 = --prefill)");
  if (c.snapshot_every > 0 && c.prefill_chunk > 0 && c.snapshot_every % c.prefill_chunk != 0)
    return Bad(
        "--snapshot-every",
        std::to_string(c.snapshot_every) + " is not a multiple of --prefill " +
            std::to_string(c.prefill_chunk) +
            " (snapshots sit on prefill chunk boundaries, so cold and warm runs share them)");
  return Status::Ok();
}
Status CheckPrefixCacheMib(const EngineConfig& c) {
  if (c.prefix_cache_mib < 0) return Bad("--prefix-cache-mib", "expected >= 0");
  return Status::Ok();
}
Status CheckMemoryMib(const EngineConfig& c) {
  if (c.memory_mib < 0) return Bad("--memory-mib", "expected >= 0 (0 = unlimited)");
  return Status::Ok();
}
Status CheckQueueDepth(const EngineConfig& c) {
  if (c.queue_depth < 0 || c.queue_depth > (1 << 20))
    return Bad("--queue-depth", "expected 0 .. 1048576");
  return Status::Ok();
}

using C = EngineConfig;

using G = EngineOptionGroup;

// The one list of engine options (engine_config.h). Docs are one line each, without the default:
// help prints that from EngineConfig's initializers (or default_text). Hand-aligned, one option
// per paragraph.
// clang-format off
const std::vector<EngineOption> kOptions = {
    // ---- model and backend ----
    {.key = "model", .flag = "--model", .field = &C::model,
     .group = G::kModel,
     .doc = "Checkpoint: a folder (config.json + *.safetensors) or a .gguf file (a split set: its first)"},
    {.key = "backend", .flag = "--backend", .field = &C::backend,
     .group = G::kModel, .doc = "cpu | cuda", .validate = CheckBackend},
    {.key = "threads", .flag = "--threads", .field = &C::threads,
     .group = G::kModel,
     .doc = "Worker threads (0 = one per hardware thread)", .validate = CheckThreads},
    {.key = "quant_dot", .flag = "--quant-dot", .field = &C::quant_dot,
     .group = G::kModel,
     .doc = "Products on quantised / 16-bit weights: exact (the weights' f32 values, x in f32) | "
            "ggml (llama.cpp's arithmetic: x to 8 bits per block and integer dots for Q8_0 Q4_0 "
            "Q5_0 IQ4_NL Q4_K Q5_K Q6_K IQ4_XS, x rounded to bf16 / f16 for those weights)",
     .validate = CheckQuantDot, .omit_default = true},
    {.key = "deterministic", .flag = "--deterministic", .field = &C::deterministic,
     .group = G::kCuda, .doc = "cuda: on (bitwise reproducible) | off (faster paths)",
     .parse = ParseOnOff, .format = FormatOnOff},
    {.key = "cuda_graphs", .flag = "--cuda-graphs", .field = &C::cuda_graphs,
     .group = G::kCuda,
     .doc = "cuda: on (verify/decode steps replay a captured CUDA graph) | off (every kernel "
            "launched from the host)",
     .parse = ParseOnOff, .format = FormatOnOff},
    {.key = "cuda_attn_split", .flag = "--cuda-attn-split", .field = &C::cuda_attn_split,
     .group = G::kCuda,
     .doc = "cuda: attention rows with a longer context run in blocks of this many positions "
            "and a combine (0: one block per row). Changes the long rows' bits",
     .validate = CheckCudaAttnSplit},
    {.key = "devices", .flag = "--devices", .field = &C::devices,
     .group = G::kCuda, .doc = "cuda: GPUs for the stages, e.g. 0,1,2,3", .default_text = "0",
     .parse = ParseCommaList, .format = FormatCommaList, .validate = CheckDevices},
    // ---- pipeline ----
    {.key = "stages", .flag = "--stages", .field = &C::stages,
     .group = G::kPipeline, .doc = "Pipeline stages", .validate = CheckStages},
    {.key = "split", .flag = "--split", .field = &C::split,
     .group = G::kPipeline,
     .doc = "Layer boundaries between stages, e.g. 12,24,36", .default_text = "even",
     .parse = ParseCommaList, .format = FormatCommaList, .validate = CheckSplit},
    {.key = "prefill_chunk", .flag = "--prefill", .field = &C::prefill_chunk,
     .group = G::kPipeline, .doc = "Prefill chunk size in tokens", .validate = CheckPrefill},
    // ---- caches ----
    {.key = "kv_dtype", .flag = "--kv", .field = &C::kv_dtype,
     .group = G::kPipeline, .doc = "K/V cache dtype: f32 | bf16 | int8", .parse = ParseKv},
    {.key = "kv_page_rows", .flag = "--kv-page", .field = &C::kv_page_rows,
     .group = G::kPipeline, .doc = "Rows per K/V page", .validate = CheckKvPage},
    {.key = "expert_cache", .flag = "--expert-cache", .field = &C::expert_cache,
     .group = G::kPipeline, .doc = "Resident experts per MoE layer: auto (from --pcie-frac) | N",
     .parse = ParseAutoOrCount, .format = FormatAutoOrCount, .validate = CheckExpertCache},
    {.key = "pcie_frac", .flag = "--pcie-frac", .field = &C::pcie_frac,
     .group = G::kPipeline,
     .doc = "Fraction of experts served from host memory", .validate = CheckPcieFrac},
    // ---- service ----
    {.key = "slots", .flag = "--slots", .field = &C::slots,
     .group = G::kService, .doc = "Live sequences the engine holds", .validate = CheckSlots},
    {.key = "batch_tokens", .flag = "--batch-tokens", .field = &C::batch_tokens,
     .group = G::kService,
     .doc = "Rows per engine step (verify rows first, then whole prefill chunks)",
     .validate = CheckBatchTokens},
    {.key = "batch_invariant", .flag = "--batch-invariant", .field = &C::batch_invariant,
     .group = G::kService,
     .doc = "on (a request's bits never depend on what shares its steps) | off (products fuse "
            "across requests: faster, batch-dependent)",
     .parse = ParseOnOff, .format = FormatOnOff},
    {.key = "prefix_cache", .flag = "--prefix-cache", .field = &C::prefix_cache,
     .group = G::kService,
     .doc = "Conversation cache: on (reuse cached prompt prefixes) | off (every request cold)",
     .parse = ParseOnOff, .format = FormatOnOff},
    {.key = "snapshot_every", .flag = "--snapshot-every", .field = &C::snapshot_every,
     .group = G::kService,
     .doc = "Prefix-cache snapshot grid in positions, a multiple of --prefill (0 = --prefill)",
     .validate = CheckSnapshotEvery},
    {.key = "prefix_cache_mib", .flag = "--prefix-cache-mib", .field = &C::prefix_cache_mib,
     .group = G::kService, .doc = "Prefix cache budget in MiB (least recently used evicted)",
     .validate = CheckPrefixCacheMib},
    {.key = "memory_mib", .flag = "--memory-mib", .field = &C::memory_mib,
     .group = G::kService,
     .doc = "K/V and state reserved for live requests, MiB (0 = unlimited)",
     .validate = CheckMemoryMib},
    {.key = "queue_depth", .flag = "--queue-depth", .field = &C::queue_depth,
     .group = G::kService, .doc = "Requests waiting for a slot at most",
     .validate = CheckQueueDepth},
    // ---- request / sampling ----
    {.key = "max_new", .flag = "--max-new", .field = &C::max_new,
     .group = G::kRequest, .doc = "Maximum output tokens", .validate = CheckMaxNew},
    {.key = "seed", .flag = "--seed", .field = &C::seed,
     .group = G::kRequest, .doc = "Sampling seed (counter RNG key)"},
    {.key = "temperature", .flag = "--temperature", .field = &C::temperature,
     .group = G::kRequest,
     .doc = "Sampling temperature (0 = greedy)", .validate = CheckTemperature},
    {.key = "top_k", .flag = "--top-k", .field = &C::top_k,
     .group = G::kRequest, .doc = "Top-k cut (0 = off)", .validate = CheckTopK},
    {.key = "top_p", .flag = "--top-p", .field = &C::top_p,
     .group = G::kRequest, .doc = "Top-p cut (1 = off)", .validate = CheckTopP},
    {.key = "ignore_eos", .flag = "--ignore-eos", .field = &C::ignore_eos,
     .group = G::kRequest, .doc = "Keep generating past EOS"},
    {.key = "presence_penalty", .flag = "--presence-penalty", .field = &C::presence_penalty,
     .group = G::kRequest, .doc = "Minus this for each token the output has used (0 = off)",
     .validate = CheckPenalties, .omit_default = true},
    {.key = "frequency_penalty", .flag = "--frequency-penalty", .field = &C::frequency_penalty,
     .group = G::kRequest, .doc = "Minus this per earlier use in the output (0 = off)",
     .omit_default = true},
    {.key = "repeat_penalty", .flag = "--repeat-penalty", .field = &C::repeat_penalty,
     .group = G::kRequest,
     .doc = "Logits of recent tokens divided (> 0) or multiplied by this (1 = off)",
     .omit_default = true},
    {.key = "repeat_last_n", .flag = "--repeat-last-n", .field = &C::repeat_last_n,
     .group = G::kRequest, .doc = "Tokens of prompt + output --repeat-penalty looks at (-1 = all)",
     .omit_default = true},
    // ---- speculative decoding ----
    {.key = "spec", .flag = "--spec", .field = &C::spec,
     .group = G::kSpeculative,
     .doc = "Draft budget K (0 = plain decoding, T = 1)", .validate = CheckSpec},
    {.key = "mtp", .flag = "--mtp", .field = &C::mtp,
     .group = G::kSpeculative,
     .doc = "MTP drafter: on | off", .parse = ParseOnOff, .format = FormatOnOff},
    {.key = "spec_max_suffix", .flag = "--spec-max-suffix", .field = &C::spec_max_suffix,
     .group = G::kSpeculative, .doc = "Longest suffix draft", .validate = CheckSpecMaxSuffix},
    {.key = "suffix_index", .flag = "--suffix-index", .field = &C::suffix_index,
     .group = G::kSpeculative,
     .doc = "sync | async (async: timing-dependent drafts)", .validate = CheckSuffixIndex},
    {.key = "draft_policy", .flag = "--draft-policy", .field = &C::draft_policy,
     .group = G::kSpeculative, .doc = "static | adaptive | latency (latency: timing-dependent)",
     .validate = CheckDraftPolicy},
    {.key = "replay_path", .flag = "--replay-path", .field = &C::replay_path,
     .group = G::kSpeculative, .doc = "Replay the drafts of recorded window records (JSON lines)",
     .default_text = "none"},
    // ---- fault injection (testing the harness) ----
    {.key = "inject", .flag = "--inject", .field = &C::inject,
     .group = G::kDiagnostics,
     .doc = "Fault injection, e.g. delay:stage=2:window=5:ms=200 (repeatable)",
     .default_text = "none"},
};
// clang-format on

// ---- JSON, by field type ----

nlohmann::json FieldToJson(const EngineOptionField& f, const EngineConfig& c) {
  return std::visit(
      [&](auto m) -> nlohmann::json {
        const auto& v = c.*m;
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, DType>) {
          return std::string(dtype_name(v));
        } else {
          return v;
        }
      },
      f);
}

// Reads `v` into `o`'s field of `c`. Errors name the key and the expected JSON type.
Status FieldFromJson(const EngineOption& o, const nlohmann::json& v, const std::string& label,
                     EngineConfig& c) {
  auto type_err = [&](const char* want) {
    return Status::InvalidArgument(
        label, "key '" + std::string(o.key) + "': expected " + want + ", got " + v.type_name());
  };
  return std::visit(
      [&](auto m) -> Status {
        auto& out = c.*m;
        using T = std::decay_t<decltype(out)>;
        if constexpr (std::is_same_v<T, int>) {
          if (!v.is_number_integer()) return type_err("an integer");
          auto x = v.get<std::int64_t>();
          if (x < -(std::int64_t{1} << 31) || x >= (std::int64_t{1} << 31))
            return type_err("a 32-bit integer");
          out = static_cast<int>(x);
        } else if constexpr (std::is_same_v<T, std::uint64_t>) {
          if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
            return type_err("a non-negative integer");
          out = v.get<std::uint64_t>();
        } else if constexpr (std::is_same_v<T, double>) {
          if (!v.is_number()) return type_err("a number");
          out = v.get<double>();
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!v.is_boolean()) return type_err("true/false");
          out = v.get<bool>();
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (!v.is_string()) return type_err("a string");
          out = v.get<std::string>();
        } else if constexpr (std::is_same_v<T, DType>) {
          if (!v.is_string()) return type_err("a string");
          auto d = ParseKvDtype(v.get<std::string>());
          if (!d.ok())
            return Status::InvalidArgument(label, "key '" + std::string(o.key) +
                                                      "': expected f32, bf16 or int8, got '" +
                                                      v.get<std::string>() + "'");
          out = *d;
        } else {
          using E = typename T::value_type;  // std::vector<int> | std::vector<std::string>
          constexpr bool kInts = std::is_same_v<E, int>;
          const char* want = kInts ? "a list of integers" : "a list of strings";
          if (!v.is_array()) return type_err(want);
          out.clear();
          for (const auto& e : v) {
            if (kInts ? !e.is_number_integer() : !e.is_string()) return type_err(want);
            out.push_back(e.template get<E>());
          }
        }
        return Status::Ok();
      },
      o.field);
}

}  // namespace

const std::vector<EngineOption>& EngineOptions() { return kOptions; }

bool EngineConfig::operator==(const EngineConfig& other) const = default;

std::string FormatEngineOption(const EngineOption& o, const EngineConfig& c) {
  if (o.format) return o.format(o, c);
  return std::visit(
      [&](auto m) -> std::string {
        const auto& v = c.*m;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return v;
        } else if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, DType>) {
          return std::string(dtype_name(v));
        } else if constexpr (std::is_same_v<T, double>) {
          char buf[64];
          auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round-trip form
          return std::string(buf, end);
        } else if constexpr (std::is_arithmetic_v<T>) {
          return std::to_string(v);
        } else {
          std::string s;  // lists: comma-separated
          for (const auto& e : v) {
            if (!s.empty()) s += ",";
            if constexpr (std::is_same_v<std::decay_t<decltype(e)>, std::string>)
              s += e;
            else
              s += std::to_string(e);
          }
          return s;
        }
      },
      o.field);
}

std::string EngineConfig::ToJson() const {
  nlohmann::json j;  // std::map-backed: keys come out sorted, whatever the table's order
  static const EngineConfig kDefaults;
  for (const EngineOption& o : kOptions) {
    nlohmann::json v = FieldToJson(o.field, *this);
    if (o.omit_default && v == FieldToJson(o.field, kDefaults)) continue;
    j[std::string(o.key)] = std::move(v);
  }
  return j.dump();
}

Result<EngineConfig> EngineConfig::FromJson(std::string_view text, const std::string& label) {
  EngineConfig c;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end());
  } catch (const std::exception& e) {
    return Status::InvalidArgument(label, std::string("invalid JSON: ") + e.what());
  }
  if (!j.is_object()) return Status::InvalidArgument(label, "expected a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const auto row = std::find_if(kOptions.begin(), kOptions.end(),
                                  [&](const EngineOption& o) { return o.key == it.key(); });
    if (row == kOptions.end())
      return Status::InvalidArgument(label, "unknown key '" + it.key() + "'");
    LOCKSTEP_RETURN_IF_ERROR(FieldFromJson(*row, it.value(), label, c));
  }
  LOCKSTEP_RETURN_IF_ERROR(c.Validate().WithContext(label));
  return c;
}

Status EngineConfig::Validate() const {
  for (const EngineOption& o : kOptions)
    if (o.validate) LOCKSTEP_RETURN_IF_ERROR(o.validate(*this));
  return Status::Ok();
}

Result<std::vector<int>> EngineConfig::StageBoundaries(const ModelConfig& m) const {
  if (stages > m.n_layers)
    return Status::InvalidArgument("--stages", std::to_string(stages) +
                                                   " stages for a model with " +
                                                   std::to_string(m.n_layers) + " layers");
  std::vector<int> b{0};
  if (split.empty()) {
    for (int s = 1; s < stages; ++s) b.push_back(m.n_layers * s / stages);
  } else {
    for (int x : split) b.push_back(x);
  }
  b.push_back(m.n_layers);
  for (std::size_t i = 1; i < b.size(); ++i) {
    if (b[i] <= b[i - 1])
      return Status::InvalidArgument(
          "--split", "boundaries must be strictly increasing within (0, " +
                         std::to_string(m.n_layers) + "), got " + nlohmann::json(split).dump());
  }
  return b;
}

int EngineConfig::ResidentExperts(int n_experts) const {
  if (expert_cache >= 0) return std::min(expert_cache, n_experts);
  // auto: the fraction not served over PCIe stays resident.
  return n_experts - static_cast<int>(std::lround(pcie_frac * n_experts));
}

}  // namespace lockstep
