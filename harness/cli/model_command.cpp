#include "lockstep/harness/model_command.h"

#include <ostream>

namespace lockstep {

Status RunModelInit(const SyntheticOptions& opts, const std::string& out_dir, std::ostream& out) {
  LOCKSTEP_RETURN_IF_ERROR(WriteSyntheticModel(opts, out_dir));
  out << "wrote " << out_dir << "/config.json and " << out_dir << "/model.safetensors (preset "
      << opts.preset << ", seed " << opts.seed << ")\n";
  return Status::Ok();
}

Result<DType> ParseModelDtype(std::string_view text) {
  if (text == "f32") return DType::kF32;
  if (text == "bf16") return DType::kBF16;
  if (text == "f16") return DType::kF16;
  return Status::InvalidArgument("--dtype",
                                 "expected f32, bf16 or f16, got '" + std::string(text) + "'");
}

}  // namespace lockstep
