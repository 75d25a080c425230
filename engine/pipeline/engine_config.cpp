#include "lockstep/engine/engine_config.h"

#include <cmath>
#include <charconv>
#include <nlohmann/json.hpp>

namespace lockstep {

Result<DType> ParseKvDtype(std::string_view s) {
  if (s == "f32") return DType::kF32;
  if (s == "bf16") return DType::kBF16;
  if (s == "int8") return DType::kI8;
  return Status::InvalidArgument("--kv", "expected f32, bf16 or int8, got '" + std::string(s) + "'");
}

Result<std::vector<int>> ParseIntList(std::string_view s, std::string_view what) {
  std::vector<int> out;
  if (s.empty()) return out;
  std::size_t start = 0;
  while (start <= s.size()) {
    std::size_t comma = s.find(',', start);
    std::string_view part = s.substr(start, comma == std::string_view::npos ? s.size() - start : comma - start);
    int v = 0;
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (ec != std::errc() || ptr != part.data() + part.size() || part.empty())
      return Status::InvalidArgument(what, "expected comma-separated integers, got '" + std::string(s) + "'");
    out.push_back(v);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string EngineConfig::ToJson() const {
  nlohmann::json j;  // std::map-backed: keys come out sorted
  j["model"] = model;
  j["backend"] = backend;
  j["threads"] = threads;
  j["deterministic"] = deterministic;
  j["cuda_graphs"] = cuda_graphs;
  j["cuda_attn_split"] = cuda_attn_split;
  j["devices"] = devices;
  j["stages"] = stages;
  j["split"] = split;
  j["prefill_chunk"] = prefill_chunk;
  j["kv_dtype"] = std::string(dtype_name(kv_dtype));
  j["kv_page_rows"] = kv_page_rows;
  j["expert_cache"] = expert_cache;
  j["pcie_frac"] = pcie_frac;
  j["max_new"] = max_new;
  j["seed"] = seed;
  j["temperature"] = temperature;
  j["top_k"] = top_k;
  j["top_p"] = top_p;
  j["ignore_eos"] = ignore_eos;
  j["spec"] = spec;
  j["mtp"] = mtp;
  j["spec_max_suffix"] = spec_max_suffix;
  j["suffix_index"] = suffix_index;
  j["draft_policy"] = draft_policy;
  j["replay_path"] = replay_path;
  j["inject"] = inject;
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
    const std::string& k = it.key();
    const auto& v = it.value();
    auto type_err = [&](const char* want) {
      return Status::InvalidArgument(label, "key '" + k + "': expected " + want + ", got " + v.type_name());
    };
    auto get_int = [&](int& out) -> Status {
      if (!v.is_number_integer()) return type_err("an integer");
      auto x = v.get<std::int64_t>();
      if (x < -(std::int64_t{1} << 31) || x >= (std::int64_t{1} << 31)) return type_err("a 32-bit integer");
      out = static_cast<int>(x);
      return Status::Ok();
    };
    auto get_double = [&](double& out) -> Status {
      if (!v.is_number()) return type_err("a number");
      out = v.get<double>();
      return Status::Ok();
    };
    if (k == "model") {
      if (!v.is_string()) return type_err("a string");
      c.model = v.get<std::string>();
    } else if (k == "backend") {
      if (!v.is_string()) return type_err("a string");
      c.backend = v.get<std::string>();
    } else if (k == "deterministic") {
      if (!v.is_boolean()) return type_err("true/false");
      c.deterministic = v.get<bool>();
    } else if (k == "cuda_graphs") {
      if (!v.is_boolean()) return type_err("true/false");
      c.cuda_graphs = v.get<bool>();
    } else if (k == "cuda_attn_split") {
      LOCKSTEP_RETURN_IF_ERROR(get_int(c.cuda_attn_split));
    } else if (k == "devices") {
      if (!v.is_array()) return type_err("a list of integers");
      c.devices.clear();
      for (const auto& e : v) {
        if (!e.is_number_integer()) return type_err("a list of integers");
        c.devices.push_back(e.get<int>());
      }
    } else if (k == "threads") {
      LOCKSTEP_RETURN_IF_ERROR(get_int(c.threads));
    } else if (k == "stages") {
      LOCKSTEP_RETURN_IF_ERROR(get_int(c.stages));
    } else if (k == "split") {
      if (!v.is_array()) return type_err("a list of integers");
      c.split.clear();
      for (const auto& e : v) {
        if (!e.is_number_integer()) return type_err("a list of integers");
        c.split.push_back(e.get<int>());
      }
    } else if (k == "prefill_chunk") {
      LOCKSTEP_RETURN_IF_ERROR(get_int(c.prefill_chunk));
    } else if (k == "kv_dtype") {
      if (!v.is_string()) return type_err("a string");
      LOCKSTEP_ASSIGN_OR_RETURN(c.kv_dtype, ParseKvDtype(v.get<std::string>()));
    } else if (k == "kv_page_rows") {
      LOCKSTEP_RETURN_IF_ERROR(get_int(c.kv_page_rows));
    } else if (k == "expert_cache") {
      LOCKSTEP_RETURN_IF_ERROR(get_int(c.expert_cache));
    } else if (k == "pcie_frac") {
      LOCKSTEP_RETURN_IF_ERROR(get_double(c.pcie_frac));
    } else if (k == "max_new") {
      LOCKSTEP_RETURN_IF_ERROR(get_int(c.max_new));
    } else if (k == "seed") {
      if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
        return type_err("a non-negative integer");
      c.seed = v.get<std::uint64_t>();
    } else if (k == "temperature") {
      LOCKSTEP_RETURN_IF_ERROR(get_double(c.temperature));
    } else if (k == "top_k") {
      LOCKSTEP_RETURN_IF_ERROR(get_int(c.top_k));
    } else if (k == "top_p") {
      LOCKSTEP_RETURN_IF_ERROR(get_double(c.top_p));
    } else if (k == "ignore_eos") {
      if (!v.is_boolean()) return type_err("true/false");
      c.ignore_eos = v.get<bool>();
    } else if (k == "spec") {
      LOCKSTEP_RETURN_IF_ERROR(get_int(c.spec));
    } else if (k == "mtp") {
      if (!v.is_boolean()) return type_err("true/false");
      c.mtp = v.get<bool>();
    } else if (k == "spec_max_suffix") {
      LOCKSTEP_RETURN_IF_ERROR(get_int(c.spec_max_suffix));
    } else if (k == "suffix_index" || k == "draft_policy" || k == "replay_path") {
      if (!v.is_string()) return type_err("a string");
      (k == "suffix_index" ? c.suffix_index : k == "draft_policy" ? c.draft_policy : c.replay_path) = v.get<std::string>();
    } else if (k == "inject") {
      if (!v.is_array()) return type_err("a list of strings");
      c.inject.clear();
      for (const auto& e : v) {
        if (!e.is_string()) return type_err("a list of strings");
        c.inject.push_back(e.get<std::string>());
      }
    } else {
      return Status::InvalidArgument(label, "unknown key '" + k + "'");
    }
  }
  LOCKSTEP_RETURN_IF_ERROR(c.Validate().WithContext(label));
  return c;
}

Status EngineConfig::Validate() const {
  auto bad = [](const std::string& opt, const std::string& m) { return Status::InvalidArgument(opt, m); };
  // Any registered backend name (backend.h); whether it is built here is CreateBackend's answer.
  if (backend.empty() || backend.size() > 32 ||
      backend.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-") != std::string::npos)
    return bad("--backend", "expected a backend name such as cpu or cuda, got '" + backend + "'");
  if (threads < 0 || threads > 256) return bad("--threads", "expected 0 (auto) .. 256");
  for (std::size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0 || devices[i] > 1023) return bad("--devices", "expected device ordinals 0 .. 1023");
    for (std::size_t j = 0; j < i; ++j)
      if (devices[j] == devices[i]) return bad("--devices", "device " + std::to_string(devices[i]) + " listed twice");
  }
  if (static_cast<int>(devices.size()) > stages)
    return bad("--devices", std::to_string(devices.size()) + " devices for " + std::to_string(stages) +
                                " stages (at most one device per stage)");
  if (backend == "cpu" && !devices.empty()) return bad("--devices", "only the cuda backend runs on devices");
  if (cuda_attn_split < 0 || cuda_attn_split > (1 << 24))
    return bad("--cuda-attn-split", "expected 0 (one block per row) .. 16777216 positions");
  if (stages < 1 || stages > 64) return bad("--stages", "expected 1 .. 64");
  if (!split.empty() && static_cast<int>(split.size()) != stages - 1)
    return bad("--split", "expected " + std::to_string(stages - 1) + " boundaries for " + std::to_string(stages) +
                              " stages, got " + std::to_string(split.size()));
  if (prefill_chunk < 1 || prefill_chunk > (1 << 20)) return bad("--prefill", "expected 1 .. 1048576 tokens per chunk");
  if (kv_page_rows < 1 || kv_page_rows > 4096) return bad("--kv-page", "expected 1 .. 4096 rows per page");
  if (expert_cache < -1) return bad("--expert-cache", "expected auto or a non-negative count");
  if (!(pcie_frac >= 0.0 && pcie_frac <= 1.0)) return bad("--pcie-frac", "expected a fraction in [0, 1]");
  if (max_new < 0 || max_new > (1 << 24)) return bad("--max-new", "expected 0 .. 16777216");
  if (!(temperature >= 0.0 && std::isfinite(temperature))) return bad("--temperature", "expected >= 0");
  if (top_k < 0) return bad("--top-k", "expected >= 0");
  if (!(top_p > 0.0 && top_p <= 1.0)) return bad("--top-p", "expected a value in (0, 1]");
  if (spec < 0 || spec > 64) return bad("--spec", "expected 0 .. 64 draft tokens");
  if (spec_max_suffix < 0 || spec_max_suffix > 64) return bad("--spec-max-suffix", "expected 0 .. 64 tokens");
  if (suffix_index != "sync" && suffix_index != "async")
    return bad("--suffix-index", "expected sync or async, got '" + suffix_index + "'");
  if (draft_policy != "static" && draft_policy != "adaptive" && draft_policy != "latency")
    return bad("--draft-policy", "expected static, adaptive or latency, got '" + draft_policy + "'");
  return Status::Ok();
}

Result<std::vector<int>> EngineConfig::StageBoundaries(const ModelConfig& m) const {
  if (stages > m.n_layers)
    return Status::InvalidArgument("--stages", std::to_string(stages) + " stages for a model with " +
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
      return Status::InvalidArgument("--split", "boundaries must be strictly increasing within (0, " +
                                                    std::to_string(m.n_layers) + "), got " +
                                                    nlohmann::json(split).dump());
  }
  return b;
}

int EngineConfig::ResidentExperts(int n_experts) const {
  if (expert_cache >= 0) return std::min(expert_cache, n_experts);
  // auto: the fraction not served over PCIe stays resident.
  return n_experts - static_cast<int>(std::lround(pcie_frac * n_experts));
}

}  // namespace lockstep
