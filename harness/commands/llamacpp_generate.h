// `lockstep generate --engine llama.cpp`: the request on llama.cpp (engine/llamacpp) with the
// same request flags, text output, --json, --export and --trace-jsonl as the lockstep engine.
//
// Export (instrument/SCHEMA.md, root attribute `engine` = "llama.cpp" and `llama_cpp_commit`):
// per exported window, post_verify holds stage0/logits (f32 [1, n_vocab], the request's row)
// and commit holds stage0/seq_state (u8 [1, bytes], llama_state_seq_get_data of the request's
// sequence, compared bitwise); --op-digests writes /ops from llama.cpp's named graph tensors
// (llama_engine.h). The config fingerprint is LlamaOptions::ToJson (it names the commit).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <vector>

#include "lockstep/engine/status.h"
#include "lockstep/engine/tokenizer.h"
#include "lockstep/harness/generate_command.h"

namespace lockstep {

// The request's prompt ids from --prompt / --prompt-file / --prompt-tokens / --chat (exactly one),
// through `tok` (shared by both engines' generate).
Result<std::vector<std::int32_t>> LoadGeneratePrompt(const GenerateOptions& o, int n_vocab,
                                                     const Tokenizer& tok);

// Runs `opts` on llama.cpp. kInvalidArgument naming scripts/install-llamacpp.sh when the
// component is absent, and for lockstep-engine options llama.cpp does not take (speculation,
// sampling, slot files, --background); otherwise as RunGenerateCommand.
Status RunLlamaGenerate(const GenerateOptions& opts, std::ostream& out);

}  // namespace lockstep
