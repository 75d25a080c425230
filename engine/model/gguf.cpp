#include "model/tensor_source.h"

namespace lockstep {

Result<std::unique_ptr<TensorSource>> OpenGgufSource(const std::string &path,
                                                     ModelConfig *) {
  return Status::NotSupported("--model '" + path + "'",
                              "GGUF checkpoints are not read yet");
}

} // namespace lockstep
