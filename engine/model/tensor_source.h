// What the weight loader reads tensors from: a checkpoint's tensors under their Hugging Face
// names (model.layers.N....), whatever the file format. The safetensors folder maps names one to
// one; the GGUF reader (gguf.h) translates llama.cpp's names and layouts to these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/weights.h"

namespace lockstep {

struct SourceTensor {
  std::string name;                 // as the file names it (for messages)
  std::optional<WeightType> type;   // nullopt: a type the engine cannot use
  std::string type_name;            // the file's name of the type (for messages)
  std::vector<std::int64_t> shape;  // outermost first (rows, cols)
  const std::byte* data = nullptr;  // in a mapping or buffer the source owns; any alignment
  std::size_t nbytes = 0;           // rows x row bytes (checked by the source)
  std::string file;
  // A stacked matrix (weights.h): its row ranges as views into the source's data (type, data,
  // rows and cols per part); empty for a plain tensor. `type` is then part 0's, `nbytes` the sum.
  std::vector<MatPart> parts;
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // The tensor with Hugging Face name `hf_name`, or nullptr.
  virtual const SourceTensor* Find(std::string_view hf_name) const = 0;
  virtual std::vector<std::string> files() const = 0;
  virtual std::string format() const = 0;
};

// Opens a GGUF file (or the split set whose first file is `path`) as a TensorSource and reads
// its hyper-parameters into *config (gguf.cpp).
Result<std::unique_ptr<TensorSource>> OpenGgufSource(const std::string& path, ModelConfig* config);

// Fills `w` (config already set) from `src`, matrices kept as `residency` says. Shared by the
// safetensors and GGUF loaders.
Status LoadWeightsFrom(const TensorSource& src, bool load_mtp, WeightResidency residency,
                       ModelWeights& w);

}  // namespace lockstep
