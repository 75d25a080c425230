// `lockstep preflight`: inputs (config, model, prompt, options) checked as bad input before any
// probe runs, then RunPreflight, then the text and the JSON document.
#include <algorithm>
#include <ostream>

#include "commands/output.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/tokenizer.h"
#include "lockstep/harness/preflight.h"
#include "lockstep/harness/prompt_text.h"

namespace lockstep {

namespace {

Result<std::vector<std::int32_t>> PromptOf(const PreflightOptions& o, const std::string& model,
                                           int n_vocab, bool* builtin) {
  if (!o.prompt_text.empty() && !o.prompt_tokens.empty())
    return Status::InvalidArgument("prompt", "give --prompt or --prompt-tokens, not both");
  std::vector<std::int32_t> ids;
  *builtin = false;
  if (!o.prompt_tokens.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(o.prompt_tokens, std::size_t{64} << 20));
    LOCKSTEP_ASSIGN_OR_RETURN(
        ids, ParseTokenList(text, n_vocab, "--prompt-tokens '" + o.prompt_tokens + "'"));
  } else if (!o.prompt_text.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(TokenizerPtr tok, LoadModelTokenizer(model));
    LOCKSTEP_ASSIGN_OR_RETURN(ids, EncodePromptText(*tok, o.prompt_text, n_vocab));
  } else {
    *builtin = true;
    ids = BuiltinPreflightPrompt(n_vocab);
  }
  if (ids.size() < 2)
    return Status::InvalidArgument("prompt", "needs at least 2 tokens (prefill, then a window)");
  if (ids.size() > 8192)
    return Status::InvalidArgument(
        "prompt", std::to_string(ids.size()) + " tokens: a preflight prompt has at most 8192");
  return ids;
}

Status CheckOptions(const PreflightOptions& o) {
  for (const std::string& id : o.probes)
    if (!ParsePropertyId(id)) {
      std::string all;
      for (PreflightProperty p : AllPreflightProperties())
        all += (all.empty() ? "" : ", ") + std::string(PropertyId(p));
      return Status::InvalidArgument("--probes",
                                     "unknown probe '" + id + "' (probes: " + all + ")");
    }
  if (o.skip_probes && !o.probes.empty())
    return Status::InvalidArgument("--skip-probes", "give --skip-probes or --probes, not both");
  if (o.probe_tokens != 0 && (o.probe_tokens < 4 || o.probe_tokens > 256))
    return Status::InvalidArgument("--probe-tokens", "expected 4 .. 256 (0: from --max-new)");
  for (int k : o.sweep_k)
    if (k < 0 || k > 255)
      return Status::InvalidArgument(
          "--sweep", "k " + std::to_string(k) + ": expected 0 .. 255 background requests");
  if (o.sweep_rows)
    for (int r : *o.sweep_rows)
      if (r < 1 || r > 8192)
        return Status::InvalidArgument("--sweep-rows",
                                       std::to_string(r) + ": expected 1 .. 8192 rows");
  if (!o.sweep && (!o.sweep_k.empty() || o.sweep_rows))
    return Status::InvalidArgument("--sweep-rows", "needs --sweep");
  if (o.sweep && o.skip_probes)
    return Status::InvalidArgument("--sweep", "give --sweep or --skip-probes, not both");
  if (o.sweep && o.config.backend == "cuda")
    return Status::InvalidArgument("--sweep", "--backend cuda runs one sequence per engine");
  if (o.age_k.empty())
    return Status::InvalidArgument("--age", "give at least one request position k");
  for (int k : o.age_k)
    if (k < 2 || k > 64)
      return Status::InvalidArgument(
          "--age",
          std::to_string(k) + ": expected 2 .. 64 (request k on an engine that served k - 1)");
  if (!o.json.empty() && !IsStdout(o.json))
    LOCKSTEP_RETURN_IF_ERROR(CheckOutputFolder(o.json, "--json"));
  return Status::Ok();
}

}  // namespace

Status RunPreflightCommand(const PreflightOptions& opts, std::ostream& out) {
  PreflightOptions o = opts;
  LOCKSTEP_RETURN_IF_ERROR(CheckOptions(o));
  LOCKSTEP_RETURN_IF_ERROR(o.config.Validate());
  if (o.probe_tokens == 0) o.probe_tokens = std::clamp(o.config.max_new, 4, 24);
  if (o.config.model.empty())
    return Status::InvalidArgument("--model", "is required (a folder with config.json)");
  LOCKSTEP_ASSIGN_OR_RETURN(ModelWeightsPtr weights, ModelWeights::Load(o.config.model));
  bool builtin = true;
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<std::int32_t> prompt,
                            PromptOf(o, o.config.model, weights->config.n_vocab, &builtin));
  LOCKSTEP_ASSIGN_OR_RETURN(PreflightReport rep, RunPreflight(o, *weights, prompt));
  rep.builtin_prompt = builtin;
  out << PreflightText(rep, o.color);
  out.flush();
  if (!o.json.empty())
    LOCKSTEP_RETURN_IF_ERROR(WriteOutput(o.json, PreflightJson(rep).dump(2) + "\n"));
  if (!rep.passed()) return Status::GateFailed("preflight", rep.FailingSummary());
  return Status::Ok();
}

}  // namespace lockstep
