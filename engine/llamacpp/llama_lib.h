// LlamaLib: llama.cpp's shared libraries opened at run time (dlopen) and the entry points the
// adapter calls (dlsym), typed from the headers it was compiled against. Nothing links libllama:
// lockstep builds and runs without it, and only `--engine llama.cpp` needs the files.
//
// Where the libraries are: $LOCKSTEP_LLAMACPP_DIR/lib, else the cache folder the build was
// configured with (LOCKSTEP_LLAMACPP_DEFAULT_DIR, `<repo>/.cache/llamacpp`). The folder's
// `commit` file must name the commit the headers came from (a different llama.cpp has different
// struct layouts): anything else is refused.
//
// Threading: Get() loads once (a function-local static) and is safe to call from any thread; the
// entry points are llama.cpp's own (a context is used from one thread at a time).
#pragma once

#include <string>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"
#include "lockstep/engine/status.h"

namespace lockstep {

struct LlamaLib {
#define LOCKSTEP_LLAMA_FN(name) decltype(&::name) name = nullptr
  // libggml-base / libggml
  LOCKSTEP_LLAMA_FN(ggml_backend_load_all_from_path);
  LOCKSTEP_LLAMA_FN(ggml_backend_tensor_get);
  LOCKSTEP_LLAMA_FN(ggml_nbytes);
  LOCKSTEP_LLAMA_FN(ggml_get_type_traits);
  LOCKSTEP_LLAMA_FN(ggml_type_name);
  LOCKSTEP_LLAMA_FN(ggml_log_set);
  // libllama
  LOCKSTEP_LLAMA_FN(llama_backend_init);
  LOCKSTEP_LLAMA_FN(llama_log_set);
  LOCKSTEP_LLAMA_FN(llama_model_default_params);
  LOCKSTEP_LLAMA_FN(llama_context_default_params);
  LOCKSTEP_LLAMA_FN(llama_model_load_from_file);
  LOCKSTEP_LLAMA_FN(llama_model_free);
  LOCKSTEP_LLAMA_FN(llama_init_from_model);
  LOCKSTEP_LLAMA_FN(llama_free);
  LOCKSTEP_LLAMA_FN(llama_model_get_vocab);
  LOCKSTEP_LLAMA_FN(llama_model_n_embd);
  LOCKSTEP_LLAMA_FN(llama_vocab_n_tokens);
  LOCKSTEP_LLAMA_FN(llama_vocab_type);
  LOCKSTEP_LLAMA_FN(llama_vocab_is_eog);
  LOCKSTEP_LLAMA_FN(llama_tokenize);
  LOCKSTEP_LLAMA_FN(llama_token_to_piece);
  LOCKSTEP_LLAMA_FN(llama_batch_init);
  LOCKSTEP_LLAMA_FN(llama_batch_free);
  LOCKSTEP_LLAMA_FN(llama_decode);
  LOCKSTEP_LLAMA_FN(llama_get_logits_ith);
  LOCKSTEP_LLAMA_FN(llama_state_seq_get_size);
  LOCKSTEP_LLAMA_FN(llama_state_seq_get_data);
  LOCKSTEP_LLAMA_FN(llama_print_system_info);
#undef LOCKSTEP_LLAMA_FN

  std::string dir;     // the folder the libraries were loaded from (its lib/ holds them)
  std::string commit;  // its `commit` file (== LlamaCppBuiltCommit())

  // The loaded libraries (once per process). kInvalidArgument naming scripts/install-llamacpp.sh
  // when the folder, a library or a symbol is missing, or the commit differs from the headers'.
  static Result<const LlamaLib*> Get();
};

}  // namespace lockstep
