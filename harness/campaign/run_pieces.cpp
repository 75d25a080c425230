// The pieces of a campaign run that other commands reuse (runner.h, "the pieces of a run"):
// the plan's model and request provisioned in a folder, and the argv of an arm's `lockstep
// generate` child. `lockstep golden record / check` run arms with them too.
#include <filesystem>
#include <sstream>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/model_config.h"
#include "lockstep/engine/tokenizer.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/chat_prompt.h"
#include "lockstep/harness/llama_arm.h"
#include "lockstep/harness/model_init.h"
#include "lockstep/harness/prompt_text.h"
#include "lockstep/harness/run_record.h"
#include "lockstep/harness/runner.h"

namespace lockstep {

namespace fs = std::filesystem;

std::string PlanModelPath(const Campaign& c, const std::string& dir) {
  if (c.model.preset.empty()) return c.model.path;
  return c.model.format == "gguf" ? RunPaths(dir).Model() + ".gguf" : RunPaths(dir).Model();
}

Result<std::string> ProvisionPlanModel(const Campaign& c, const std::string& dir) {
  for (const ArmSpec& a : c.arms)  // llama.cpp arms need the component: exit 2 before any runs
    if (IsLlamaArm(c, a))
      LOCKSTEP_RETURN_IF_ERROR(
          LlamaCppAvailable().WithContext("arm '" + a.name + "' (engine = \"llama.cpp\")"));
  if (c.model.preset.empty()) return c.model.path;
  const std::string model_dir = PlanModelPath(c, dir);
  if (c.model.format == "gguf" ? fs::exists(model_dir) : fs::exists(model_dir + "/config.json"))
    return model_dir;
  // Built aside and renamed: a killed runner never leaves a half-written model in place.
  const std::string tmp = model_dir + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::remove_all(model_dir, ec);
  SyntheticOptions so;
  so.preset = c.model.preset;
  so.seed = c.model.seed;
  so.induction = c.model.induction;
  so.n_layers = c.model.layers;
  if (!c.model.dtype.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(so.dtype, ParseModelDtype(c.model.dtype));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(const ModelFormat format,
                            ParseModelFormat(c.model.format, c.model.quant));
  std::ostringstream sink;
  LOCKSTEP_RETURN_IF_ERROR(RunModelInit(so, tmp, sink, format));
  fs::rename(format.gguf ? tmp + "/model.gguf" : tmp, model_dir, ec);
  if (format.gguf) fs::remove_all(tmp, ec);
  if (ec) return Status::IOError("model folder '" + model_dir + "'", ec.message());
  return model_dir;
}

namespace {

// A text prompt's ids through the model's tokenizer (tokenizer.json of the folder, a GGUF's
// vocabulary, else byte level), exactly as `lockstep generate --prompt` encodes it.
Result<std::vector<std::int32_t>> EncodePlanText(const std::string& model_dir,
                                                 std::string_view text) {
  LOCKSTEP_ASSIGN_OR_RETURN(TokenizerPtr tok, LoadModelTokenizer(model_dir));
  int n_vocab = tok->info().vocab_size;
  if (fs::is_directory(model_dir)) {
    LOCKSTEP_ASSIGN_OR_RETURN(ModelConfig mc, ModelConfig::FromFile(model_dir + "/config.json"));
    n_vocab = mc.n_vocab;
  }
  return EncodePromptText(*tok, text, n_vocab);
}

}  // namespace

Status ProvisionPlanRequest(const Campaign& c, const std::string& model_dir,
                            const std::string& tokens_path) {
  if (fs::exists(tokens_path)) return Status::Ok();
  std::vector<std::int32_t> ids;
  const RequestSpec& r = c.request;
  if (r.needle) {
    ids = EncodeBytes(NeedleHaystackPrompt(*r.needle));  // byte tokens by definition (campaign.h)
  } else if (!r.prompt.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(ids, EncodePlanText(model_dir, r.prompt));
  } else if (!r.prompt_file.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(r.prompt_file, std::size_t{256} << 20));
    LOCKSTEP_ASSIGN_OR_RETURN(ids, EncodePlanText(model_dir, text));
  } else if (!r.chat_file.empty()) {  // the model's chat template, as `generate --chat`
    LOCKSTEP_ASSIGN_OR_RETURN(std::string text, RenderChatFile(model_dir, r.chat_file));
    LOCKSTEP_ASSIGN_OR_RETURN(ids, EncodePlanText(model_dir, text));
  } else {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(r.token_file, std::size_t{256} << 20));
    return WriteFileAtomic(tokens_path, text);
  }
  std::string text;
  for (std::size_t i = 0; i < ids.size(); ++i) text += (i ? " " : "") + std::to_string(ids[i]);
  return WriteFileAtomic(tokens_path, text + "\n");
}

std::vector<std::string> ArmGenerateArgv(const Campaign& c, const ArmSpec& arm,
                                         const std::string& exe, const std::string& d,
                                         const std::string& tokens_path) {
  std::vector<std::string> argv = {exe,
                                   "generate",
                                   "--progress",
                                   "--config",
                                   d + "/config.json",
                                   "--prompt-tokens",
                                   tokens_path,
                                   "--arm",
                                   arm.name,
                                   "--json",
                                   "--trace-jsonl",
                                   d + "/trace.jsonl",
                                   "--sample-ms",
                                   std::to_string(c.export_plan.sample_ms)};
  if (IsLlamaArm(c, arm)) {
    // The adapter (llama_arm.h), with the model, threads, max_new and slots of the config the
    // caller wrote; a config that does not read back leaves the flags out and the child says why.
    auto text = ReadFile(d + "/config.json", std::size_t{16} << 20);
    auto cfg = text.ok() ? EngineConfig::FromJson(*text, d + "/config.json")
                         : Result<EngineConfig>(text.status());
    auto lo = cfg.ok() ? ArmLlamaOptions(c, arm, *cfg) : Result<LlamaOptions>(cfg.status());
    if (lo.ok())
      for (std::string& f : LlamaGenerateFlags(*lo)) argv.push_back(std::move(f));
  }
  if (arm.mode == "state") {
    std::string points;
    for (const auto& p : c.export_plan.points) points += (points.empty() ? "" : ",") + p;
    for (const std::string& a :
         {std::string("--export"), d + "/export.h5", std::string("--export-windows"),
          c.export_plan.windows, std::string("--export-points"), points})
      argv.push_back(a);
  }
  return argv;
}

}  // namespace lockstep
