#include "lockstep/harness/tokenize_command.h"

#include <cstdio>
#include <ostream>

#include "commands/output.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/prompt_text.h"

namespace lockstep {

namespace {

constexpr std::size_t kMaxInput = std::size_t{256} << 20;

Result<TokenizerPtr> ModelTokenizer(const std::string& model) {
  if (model.empty()) return Status::InvalidArgument("--model", "is required (a model folder)");
  return LoadModelTokenizer(model);
}

Result<std::string> OneInput(const std::string& text, const std::string& file, const char* what) {
  if (text.empty() == file.empty())
    return Status::InvalidArgument(what, "give exactly one of it or --file");
  if (!file.empty()) return ReadFile(file, kMaxInput);
  return text;
}

Status Emit(const std::string& json_path, const nlohmann::json& j, const std::string& plain,
            std::ostream& out) {
  if (json_path.empty()) {
    out << plain;
    return Status::Ok();
  }
  const std::string doc = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (IsStdout(json_path)) {
    out << doc;
    return Status::Ok();
  }
  out << plain;
  out.flush();
  return WriteOutput(json_path, doc);
}

}  // namespace

Status RunTokenize(const TokenizeOptions& opts, std::ostream& out) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::string text, OneInput(opts.text, opts.file, "TEXT"));
  LOCKSTEP_ASSIGN_OR_RETURN(TokenizerPtr tok, ModelTokenizer(opts.model));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<std::int32_t> ids, tok->Encode(text));
  std::string plain;
  for (std::size_t i = 0; i < ids.size(); ++i) plain += (i ? " " : "") + std::to_string(ids[i]);
  plain += "\n";
  nlohmann::json j = {{"schema", "lockstep.tokenize"}, {"schema_version", 1}};
  if (!opts.json.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(j["tokenizer"], TokenizerJson(*tok));
    j["ids"] = ids;
  }
  return Emit(opts.json, j, plain, out);
}

Status RunDetokenize(const DetokenizeOptions& opts, std::ostream& out) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::string list, OneInput(opts.ids, opts.file, "IDS"));
  LOCKSTEP_ASSIGN_OR_RETURN(TokenizerPtr tok, ModelTokenizer(opts.model));
  // Any id a model may emit: a model's vocabulary is often larger than its tokenizer's.
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<std::int32_t> ids, ParseTokenList(list, 1 << 24, "IDS"));
  std::size_t skipped = 0;
  for (std::int32_t id : ids) skipped += !tok->Has(id);
  if (skipped && tok->info().type != "byte")
    std::fprintf(stderr, "detokenize: %zu ids have no token (skipped, as Hugging Face does)\n",
                 skipped);
  const std::string text = tok->Decode(ids);
  nlohmann::json j = {{"schema", "lockstep.detokenize"}, {"schema_version", 1}};
  if (!opts.json.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(j["tokenizer"], TokenizerJson(*tok));
    j["text"] = text;
    j["skipped_ids"] = tok->info().type == "byte" ? 0 : skipped;
  }
  return Emit(opts.json, j, text + "\n", out);
}

}  // namespace lockstep
