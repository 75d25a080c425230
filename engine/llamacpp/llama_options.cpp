#include <nlohmann/json.hpp>

#include "lockstep/llamacpp/llama_engine.h"

namespace lockstep {

Status LlamaOptions::Validate() const {
  auto range = [](int v, int lo, int hi, const char* flag) {
    return v >= lo && v <= hi
               ? Status::Ok()
               : Status::InvalidArgument(flag, "is " + std::to_string(v) + ", expected " +
                                                   std::to_string(lo) + ".." + std::to_string(hi));
  };
  LOCKSTEP_RETURN_IF_ERROR(range(threads, 0, 1024, "--threads"));
  LOCKSTEP_RETURN_IF_ERROR(range(batch, 1, 65536, "--llama-batch"));
  LOCKSTEP_RETURN_IF_ERROR(range(ubatch, 1, 65536, "--llama-ubatch"));
  LOCKSTEP_RETURN_IF_ERROR(range(max_new, 1, 4096, "--max-new"));
  LOCKSTEP_RETURN_IF_ERROR(range(slots, 1, 64, "--slots"));
  LOCKSTEP_RETURN_IF_ERROR(range(background_prompt, 1, 4096, "--llama-background-prompt"));
  if (kv_type != "f32" && kv_type != "f16" && kv_type != "bf16" && kv_type != "q8_0")
    return Status::InvalidArgument("--llama-kv-type '" + kv_type + "'",
                                   "expected f32, f16, bf16 or q8_0");
  if (flash_attn != "off" && flash_attn != "on" && flash_attn != "auto")
    return Status::InvalidArgument("--llama-flash-attn '" + flash_attn + "'",
                                   "expected off, on or auto");
  if (model.empty()) return Status::InvalidArgument("--model", "is required (a .gguf file)");
  return Status::Ok();
}

std::string LlamaOptions::ToJson() const {
  nlohmann::json j = {{"engine", "llama.cpp"},
                      {"llama_cpp_commit", LlamaCppBuiltCommit()},
                      {"model", model},
                      {"threads", threads},
                      {"batch", batch},
                      {"ubatch", ubatch},
                      {"kv_type", kv_type},
                      {"flash_attn", flash_attn},
                      {"kv_unified", kv_unified},
                      {"max_new", max_new},
                      {"slots", slots},
                      {"background_prompt", background_prompt},
                      {"background_seed", background_seed},
                      {"sampling", "greedy"}};
  return j.dump();
}

Result<LlamaOptions> LlamaOptions::FromJson(std::string_view text, const std::string& label) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || j.value("engine", "") != "llama.cpp")
    return Status::InvalidArgument(label, "is not a llama.cpp config (LlamaOptions::ToJson)");
  LlamaOptions o;
  try {
    o.model = j.at("model").get<std::string>();
    o.threads = j.at("threads").get<int>();
    o.batch = j.at("batch").get<int>();
    o.ubatch = j.at("ubatch").get<int>();
    o.kv_type = j.at("kv_type").get<std::string>();
    o.flash_attn = j.at("flash_attn").get<std::string>();
    o.kv_unified = j.at("kv_unified").get<bool>();
    o.max_new = j.at("max_new").get<int>();
    o.slots = j.at("slots").get<int>();
    o.background_prompt = j.at("background_prompt").get<int>();
    o.background_seed = j.at("background_seed").get<std::uint64_t>();
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(label, std::string("llama.cpp config: ") + e.what());
  }
  return o;
}

}  // namespace lockstep
