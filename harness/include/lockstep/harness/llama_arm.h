// Campaign arms on llama.cpp (issue 38): `[engine] engine = "llama.cpp"` (or per arm in
// [arm.engine]) runs the arm through the llama.cpp adapter (`lockstep generate --engine llama.cpp`,
// a fresh process as every process arm), with llama.cpp's own knobs as plan keys. The arm's
// export, comparison, stop rules, report and `localize = true` are the lockstep engine's.
//
// Plan keys (campaigns/README.md "llama.cpp arms"): engine ("lockstep" | "llama.cpp"),
// llama_batch, llama_ubatch, llama_kv_type, llama_flash_attn, llama_kv_unified,
// llama_background_prompt, llama_background_seed; and of the EngineConfig keys only threads,
// max_new and slots (slots - 1 co-resident background sequences in each step's llama_batch).
// A llama.cpp arm needs a GGUF model ([model] format = "gguf"); every other combination it cannot
// honour (a lockstep-engine key, a service arm, an injection such as the positive control) is
// refused when the plan is parsed (exit 2, naming the key).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/status.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/llamacpp/llama_engine.h"

namespace lockstep {

// The llama.cpp plan keys with their defaults (their JSON types are the keys' types).
const nlohmann::json& LlamaPlanDefaults();
// The EngineConfig keys a llama.cpp arm takes besides the keys above.
const std::vector<std::string>& LlamaArmEngineKeys();

// Whether the arm runs on llama.cpp (its [arm.engine] engine, else the campaign's [engine]).
bool IsLlamaArm(const Campaign& c, const ArmSpec& arm);

// The arm's llama.cpp options: LlamaPlanDefaults <- [engine] <- [arm.engine]; model, threads,
// max_new and slots from `cfg` (the arm's EffectiveConfig). Validated (kInvalidArgument).
Result<LlamaOptions> ArmLlamaOptions(const Campaign& c, const ArmSpec& arm,
                                     const EngineConfig& cfg);

// The plan-time checks of an arm's engine choice: a llama.cpp arm on a model that is not a GGUF,
// a service arm, a key the adapter does not take; a llama_* key on a lockstep arm. Ok otherwise.
Status CheckArmEngine(const Campaign& c, const ArmSpec& arm, const EngineConfig& cfg);

// `lockstep generate` flags that run `o` on llama.cpp: --engine llama.cpp and every option
// (--model, --threads, --max-new, --slots, --llama-*), so nothing is left to defaults.
std::vector<std::string> LlamaGenerateFlags(const LlamaOptions& o);

// ArmConfigSha256 (the config digest a campaign records for an arm) is declared in runner.h.

}  // namespace lockstep
