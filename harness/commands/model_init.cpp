#include "lockstep/harness/model_init.h"

#include <filesystem>
#include <ostream>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/bpe_tokenizer.h"
#include "lockstep/engine/gguf.h"

namespace lockstep {

namespace {

// The tokenizer file's text once it is known to fit a model of these options.
Result<std::string> CheckedTokenizer(const SyntheticOptions& opts, const std::string& path) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, std::size_t{256} << 20));
  LOCKSTEP_ASSIGN_OR_RETURN(TokenizerPtr tok, ParseBpeTokenizer(text, path));
  LOCKSTEP_ASSIGN_OR_RETURN(ModelConfig c, SyntheticConfig(opts.preset));
  const int n_vocab = opts.n_vocab > 0 ? opts.n_vocab : c.n_vocab;
  const int max_id = tok->info().max_id;
  if (max_id >= n_vocab)
    return Status::InvalidArgument(
        "--tokenizer", "'" + path + "' has ids up to " + std::to_string(max_id) +
                           " but the model's vocabulary is " + std::to_string(n_vocab) +
                           " (hint: --vocab " + std::to_string(max_id + 1) + " or more)");
  return text;
}

}  // namespace

Status RunModelInit(const SyntheticOptions& opts, const std::string& out_dir, std::ostream& out,
                    const std::string& tokenizer) {
  std::string tok_text;
  if (!tokenizer.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(tok_text, CheckedTokenizer(opts, tokenizer));
  }
  LOCKSTEP_RETURN_IF_ERROR(WriteSyntheticModel(opts, out_dir));
  if (!tokenizer.empty())
    LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(out_dir + "/tokenizer.json", tok_text));
  out << "wrote " << out_dir << "/config.json and " << out_dir << "/model.safetensors (preset "
      << opts.preset << ", seed " << opts.seed << ")";
  if (!tokenizer.empty()) out << " and " << out_dir << "/tokenizer.json";
  out << "\n";
  return Status::Ok();
}

Status RunModelInit(const SyntheticOptions& opts, const std::string& out_dir, std::ostream& out,
                    const ModelFormat& format, const std::string& tokenizer) {
  if (!format.gguf) return RunModelInit(opts, out_dir, out, tokenizer);
  std::string tok_text;
  if (!tokenizer.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(tok_text, CheckedTokenizer(opts, tokenizer));
  }
  LOCKSTEP_RETURN_IF_ERROR(WriteSyntheticModel(opts, out_dir));
  // ConvertToGguf embeds a tokenizer.json it finds beside the weights as tokenizer.ggml.*.
  if (!tokenizer.empty())
    LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(out_dir + "/tokenizer.json", tok_text));
  const std::string path = out_dir + "/model.gguf";
  const Status converted = ConvertToGguf(out_dir, path, format.quant);
  std::error_code ec;
  for (const char* f : {"/model.safetensors", "/config.json", "/tokenizer.json"})
    std::filesystem::remove(out_dir + f, ec);
  LOCKSTEP_RETURN_IF_ERROR(converted);
  out << "wrote " << path << " (preset " << opts.preset << ", seed " << opts.seed << ", "
      << (format.quant ? std::string(weight_type_name(*format.quant)) : std::string("unquantised"))
      << (tokenizer.empty() ? "" : ", the vocabulary of " + tokenizer) << ")\n";
  return Status::Ok();
}

Result<ModelFormat> ParseModelFormat(std::string_view format, std::string_view quant) {
  ModelFormat f;
  if (format == "gguf") {
    f.gguf = true;
  } else if (format != "safetensors") {
    return Status::InvalidArgument(
        "--format", "expected safetensors or gguf, got '" + std::string(format) + "'");
  }
  if (quant.empty() || quant == "none") return f;
  if (!f.gguf) return Status::InvalidArgument("--quant", "only with --format gguf");
  const auto t = weight_type_from_name(quant);
  if (!t || weight_block_elems(*t) == 1)
    return Status::InvalidArgument(
        "--quant",
        "expected a ggml block type (q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, "
        "q5_k, q6_k, iq4_nl, iq4_xs, iq3_s, iq3_xxs, iq2_xxs, iq2_xs, iq2_s, iq1_s, "
        "iq1_m, tq1_0, tq2_0), got '" +
            std::string(quant) + "'");
  f.quant = *t;
  return f;
}

Result<DType> ParseModelDtype(std::string_view text) {
  if (text == "f32") return DType::kF32;
  if (text == "bf16") return DType::kBF16;
  if (text == "f16") return DType::kF16;
  return Status::InvalidArgument("--dtype",
                                 "expected f32, bf16 or f16, got '" + std::string(text) + "'");
}

}  // namespace lockstep
