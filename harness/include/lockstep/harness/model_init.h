// `lockstep model init`: writes a seeded synthetic model (config.json + model.safetensors, the
// Hugging Face layout) that the engine loads like a real checkpoint. The campaign runner calls
// RunModelInit too, for plans that name a preset instead of a folder.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>

#include "lockstep/engine/dtype.h"
#include "lockstep/engine/status.h"
#include "lockstep/engine/synthetic.h"
#include "lockstep/engine/weights.h"

namespace lockstep {

// `lockstep model init --preset P --seed N --out DIR [--dtype f32|bf16|f16] [--no-mtp] ...`:
// writes the model into `out_dir` (same options, byte-identical files) and one line naming what
// was written on `out`. kInvalidArgument for an unknown preset or a bad cut; kIOError when the
// folder cannot be written. With `tokenizer` (a tokenizer.json), the file is checked
// (LoadBpeTokenizer), its largest id must be below the model's vocabulary (kInvalidArgument
// naming --vocab otherwise, before anything is written) and it is copied to DIR/tokenizer.json.
Status RunModelInit(const SyntheticOptions& opts, const std::string& out_dir, std::ostream& out,
                    const std::string& tokenizer = "");

// `--format gguf [--quant q8_0|q4_k|q6_k]`: the same weights written as `out_dir`/model.gguf in
// llama.cpp's qwen3next layout (ConvertToGguf, gguf.h), matrices in their dtype or quantised;
// nothing else is left in the folder.
struct ModelFormat {
  bool gguf = false;
  std::optional<WeightType> quant;
};
// With a tokenizer: kNotSupported (the GGUF writer embeds no vocabulary yet).
Status RunModelInit(const SyntheticOptions& opts, const std::string& out_dir, std::ostream& out,
                    const ModelFormat& format, const std::string& tokenizer = "");
// Parses --format and --quant. kInvalidArgument naming the option for anything else (and for
// --quant without --format gguf).
Result<ModelFormat> ParseModelFormat(std::string_view format, std::string_view quant);

// Parses `--dtype`, the matrices' storage dtype: "f32" | "bf16" | "f16". kInvalidArgument
// naming --dtype otherwise.
Result<DType> ParseModelDtype(std::string_view text);

}  // namespace lockstep
