// Campaign arms on llama.cpp (llama_arm.h): the plan keys, the arm's options and the checks that
// refuse what the adapter cannot honour.
#include <algorithm>

#include "lockstep/harness/llama_arm.h"
#include "lockstep/harness/runner.h"
#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

const nlohmann::json& LlamaPlanDefaults() {
  static const nlohmann::json kDefaults = [] {
    const LlamaOptions d;
    return nlohmann::json{{"engine", "lockstep"},
                          {"llama_batch", d.batch},
                          {"llama_ubatch", d.ubatch},
                          {"llama_kv_type", d.kv_type},
                          {"llama_flash_attn", d.flash_attn},
                          {"llama_kv_unified", d.kv_unified},
                          {"llama_background_prompt", d.background_prompt}};
  }();
  return kDefaults;
}

const std::vector<std::string>& LlamaArmEngineKeys() {
  static const std::vector<std::string> kKeys = {"threads", "max_new", "slots"};
  return kKeys;
}

namespace {

// The value of plan key `key` for the arm: [arm.engine], else [engine], else the default.
const nlohmann::json& PlanValue(const Campaign& c, const ArmSpec& arm, const std::string& key) {
  if (arm.engine.contains(key)) return arm.engine[key];
  if (c.engine.contains(key)) return c.engine[key];
  return LlamaPlanDefaults()[key];
}

// Plan keys the arm sets ([engine] and [arm.engine]), each once.
std::vector<std::string> SetKeys(const Campaign& c, const ArmSpec& arm) {
  std::vector<std::string> keys;
  for (const nlohmann::json* t : {&arm.engine, &c.engine})
    for (auto it = t->begin(); it != t->end(); ++it)
      if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) keys.push_back(it.key());
  return keys;
}

}  // namespace

bool IsLlamaArm(const Campaign& c, const ArmSpec& arm) {
  return PlanValue(c, arm, "engine") == "llama.cpp";
}

Result<LlamaOptions> ArmLlamaOptions(const Campaign& c, const ArmSpec& arm,
                                     const EngineConfig& cfg) {
  LlamaOptions o;
  try {
    o.batch = PlanValue(c, arm, "llama_batch").get<int>();
    o.ubatch = PlanValue(c, arm, "llama_ubatch").get<int>();
    o.kv_type = PlanValue(c, arm, "llama_kv_type").get<std::string>();
    o.flash_attn = PlanValue(c, arm, "llama_flash_attn").get<std::string>();
    o.kv_unified = PlanValue(c, arm, "llama_kv_unified").get<bool>();
    o.background_prompt = PlanValue(c, arm, "llama_background_prompt").get<int>();
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument("arm '" + arm.name + "'",
                                   std::string("llama.cpp keys: ") + e.what());
  }
  o.model = cfg.model;
  o.threads = cfg.threads;
  o.max_new = cfg.max_new;
  o.slots = cfg.slots;
  if (Status st = o.Validate(); !st.ok()) {
    // The adapter names its command-line flag; a plan names its key.
    static const std::vector<std::pair<std::string, std::string>> kKeys = {
        {"--llama-batch", "llama_batch"},
        {"--llama-ubatch", "llama_ubatch"},
        {"--llama-kv-type", "llama_kv_type"},
        {"--llama-flash-attn", "llama_flash_attn"},
        {"--llama-background-prompt", "llama_background_prompt"},
        {"--threads", "threads"},
        {"--max-new", "max_new"},
        {"--slots", "slots"}};
    std::string msg = st.message();
    for (const auto& [flag, key] : kKeys)
      if (msg.rfind(flag, 0) == 0) msg = "engine key '" + key + "'" + msg.substr(flag.size());
    return Status::InvalidArgument("arm '" + arm.name + "'", msg);
  }
  return o;
}

Status CheckArmEngine(const Campaign& c, const ArmSpec& arm, const EngineConfig& cfg) {
  const std::string label = "arm '" + arm.name + "'";
  const nlohmann::json& engine = PlanValue(c, arm, "engine");
  if (engine != "lockstep" && engine != "llama.cpp")
    return Status::InvalidArgument(label,
                                   "engine key 'engine' must be \"lockstep\" or "
                                   "\"llama.cpp\", got " +
                                       engine.dump());
  const std::vector<std::string> keys = SetKeys(c, arm);
  if (!IsLlamaArm(c, arm)) {
    for (const std::string& k : keys)
      if (k != "engine" && LlamaPlanDefaults().contains(k))
        return Status::InvalidArgument(
            label, "engine key '" + k + "' applies to engine = \"llama.cpp\" arms only");
    return Status::Ok();
  }
  if (c.model.format != "gguf")
    return Status::InvalidArgument(label,
                                   "engine key 'engine' = \"llama.cpp\" needs a GGUF "
                                   "model: set [model] format = \"gguf\"");
  if (arm.server != "process")
    return Status::InvalidArgument(label, "'server' = \"" + arm.server +
                                              "\": a llama.cpp arm runs as a fresh process "
                                              "(server = \"process\") only");
  for (const std::string& k : keys) {
    if (LlamaPlanDefaults().contains(k) ||
        std::find(LlamaArmEngineKeys().begin(), LlamaArmEngineKeys().end(), k) !=
            LlamaArmEngineKeys().end())
      continue;
    return Status::InvalidArgument(
        label, "engine key '" + k +
                   "' is a lockstep-engine key; a llama.cpp arm takes threads, max_new, slots "
                   "and the llama_* keys (a positive control's injection is one too)");
  }
  return ArmLlamaOptions(c, arm, cfg).status();
}

std::vector<std::string> LlamaGenerateFlags(const LlamaOptions& o) {
  return {"--engine",
          "llama.cpp",
          "--model",
          o.model,
          "--threads",
          std::to_string(o.threads),
          "--max-new",
          std::to_string(o.max_new),
          "--slots",
          std::to_string(o.slots),
          "--llama-batch",
          std::to_string(o.batch),
          "--llama-ubatch",
          std::to_string(o.ubatch),
          "--llama-kv-type",
          o.kv_type,
          "--llama-flash-attn",
          o.flash_attn,
          "--llama-kv-unified",
          o.kv_unified ? "true" : "false",
          "--llama-background-prompt",
          std::to_string(o.background_prompt)};
}

std::string ArmConfigSha256(const Campaign& c, const ArmSpec& arm, const EngineConfig& cfg) {
  if (!IsLlamaArm(c, arm)) return EngineConfigHash(cfg);
  auto o = ArmLlamaOptions(c, arm, cfg);
  if (!o.ok()) return EngineConfigHash(cfg);
  o->model.clear();
  return Sha256Hex(o->ToJson());
}

}  // namespace lockstep
