#include "lockstep/harness/model_command.h"

#include <filesystem>
#include <ostream>

#include "lockstep/engine/gguf.h"

namespace lockstep {

Status RunModelInit(const SyntheticOptions& opts, const std::string& out_dir, std::ostream& out) {
  LOCKSTEP_RETURN_IF_ERROR(WriteSyntheticModel(opts, out_dir));
  out << "wrote " << out_dir << "/config.json and " << out_dir << "/model.safetensors (preset "
      << opts.preset << ", seed " << opts.seed << ")\n";
  return Status::Ok();
}

Status RunModelInit(const SyntheticOptions& opts, const std::string& out_dir, std::ostream& out,
                    const ModelFormat& format) {
  if (!format.gguf) return RunModelInit(opts, out_dir, out);
  LOCKSTEP_RETURN_IF_ERROR(WriteSyntheticModel(opts, out_dir));
  const std::string path = out_dir + "/model.gguf";
  LOCKSTEP_RETURN_IF_ERROR(ConvertToGguf(out_dir, path, format.quant));
  std::error_code ec;
  std::filesystem::remove(out_dir + "/model.safetensors", ec);
  std::filesystem::remove(out_dir + "/config.json", ec);
  out << "wrote " << path << " (preset " << opts.preset << ", seed " << opts.seed << ", "
      << (format.quant ? std::string(weight_type_name(*format.quant)) : std::string("unquantised"))
      << ")\n";
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
  if (quant == "q8_0")
    f.quant = WeightType::kQ8_0;
  else if (quant == "q4_k")
    f.quant = WeightType::kQ4_K;
  else if (quant == "q6_k")
    f.quant = WeightType::kQ6_K;
  else
    return Status::InvalidArgument("--quant",
                                   "expected q8_0, q4_k or q6_k, got '" + std::string(quant) + "'");
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
