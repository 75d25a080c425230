#include "llama_lib.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "lockstep/llamacpp/llamacpp_build.h"

namespace lockstep {

namespace {

// llama.cpp's log lines go to stderr only with LOCKSTEP_LLAMACPP_LOG=1 (model loading alone
// prints hundreds): a lockstep command keeps its one-line-per-event stderr.
void QuietLog(ggml_log_level level, const char* text, void* user) {
  (void)user;
  static const bool on = [] {
    const char* v = std::getenv("LOCKSTEP_LLAMACPP_LOG");  // env: LOCKSTEP_LLAMACPP_LOG
    return v != nullptr && *v != '\0' && *v != '0';
  }();
  if (on || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

std::string Unavailable(const std::string& what) {
  return what + " (" + kLlamaCppInstallHint + ")";
}

Result<LlamaLib> Load() {
  LlamaLib lib;
  const char* env = std::getenv("LOCKSTEP_LLAMACPP_DIR");  // env: LOCKSTEP_LLAMACPP_DIR
  lib.dir = env != nullptr && *env != '\0' ? env : LOCKSTEP_LLAMACPP_DEFAULT_DIR;
  const std::string libdir = lib.dir + "/lib";
  std::ifstream cf(lib.dir + "/commit");
  if (!cf || !(cf >> lib.commit))
    return Status::InvalidArgument("--engine llama.cpp",
                                   Unavailable("no llama.cpp in '" + lib.dir + "'"));
  if (lib.commit != LlamaCppBuiltCommit())
    return Status::InvalidArgument(
        "--engine llama.cpp",
        Unavailable("'" + lib.dir + "' holds llama.cpp " + lib.commit + ", this build's adapter " +
                    "was compiled against " + LlamaCppBuiltCommit()));
  // RUNPATH $ORIGIN in the package's libraries: opening libllama by path finds libggml beside it.
  // The handles stay open for the process (llama.cpp keeps global state).
  void* ggml = ::dlopen((libdir + "/libggml.so").c_str(), RTLD_NOW | RTLD_GLOBAL);
  void* llama =
      ggml ? ::dlopen((libdir + "/libllama.so").c_str(), RTLD_NOW | RTLD_GLOBAL) : nullptr;
  void* base =
      ggml ? ::dlopen((libdir + "/libggml-base.so").c_str(), RTLD_NOW | RTLD_GLOBAL) : nullptr;
  if (llama == nullptr || base == nullptr) {
    const char* err = ::dlerror();
    return Status::InvalidArgument(
        "--engine llama.cpp",
        Unavailable(std::string("cannot load the llama.cpp libraries: ") + (err ? err : libdir)));
  }
  std::string missing;
  auto sym = [&](void* h, const char* name, auto& fn) {
    void* p = ::dlsym(h, name);
    if (p == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(name);
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
#define LOCKSTEP_SYM(h, name) sym(h, #name, lib.name)
  LOCKSTEP_SYM(ggml, ggml_backend_load_all_from_path);
  LOCKSTEP_SYM(base, ggml_backend_tensor_get);
  LOCKSTEP_SYM(base, ggml_nbytes);
  LOCKSTEP_SYM(base, ggml_get_type_traits);
  LOCKSTEP_SYM(base, ggml_type_name);
  LOCKSTEP_SYM(base, ggml_log_set);
  LOCKSTEP_SYM(llama, llama_backend_init);
  LOCKSTEP_SYM(llama, llama_log_set);
  LOCKSTEP_SYM(llama, llama_model_default_params);
  LOCKSTEP_SYM(llama, llama_context_default_params);
  LOCKSTEP_SYM(llama, llama_model_load_from_file);
  LOCKSTEP_SYM(llama, llama_model_free);
  LOCKSTEP_SYM(llama, llama_init_from_model);
  LOCKSTEP_SYM(llama, llama_free);
  LOCKSTEP_SYM(llama, llama_model_get_vocab);
  LOCKSTEP_SYM(llama, llama_model_n_embd);
  LOCKSTEP_SYM(llama, llama_vocab_n_tokens);
  LOCKSTEP_SYM(llama, llama_vocab_type);
  LOCKSTEP_SYM(llama, llama_vocab_is_eog);
  LOCKSTEP_SYM(llama, llama_tokenize);
  LOCKSTEP_SYM(llama, llama_token_to_piece);
  LOCKSTEP_SYM(llama, llama_batch_init);
  LOCKSTEP_SYM(llama, llama_batch_free);
  LOCKSTEP_SYM(llama, llama_decode);
  LOCKSTEP_SYM(llama, llama_get_logits_ith);
  LOCKSTEP_SYM(llama, llama_state_seq_get_size);
  LOCKSTEP_SYM(llama, llama_state_seq_get_data);
  LOCKSTEP_SYM(llama, llama_print_system_info);
#undef LOCKSTEP_SYM
  if (!missing.empty())
    return Status::InvalidArgument(
        "--engine llama.cpp", Unavailable("the libraries in '" + libdir + "' lack " + missing));
  lib.ggml_log_set(QuietLog, nullptr);
  lib.llama_log_set(QuietLog, nullptr);
  // The CPU backend variants (libggml-cpu-<isa>.so): ggml picks the best one for this CPU.
  lib.ggml_backend_load_all_from_path(libdir.c_str());
  lib.llama_backend_init();
  return lib;
}

}  // namespace

Result<const LlamaLib*> LlamaLib::Get() {
  static const Result<LlamaLib> loaded = Load();
  if (!loaded.ok()) return loaded.status();
  return &*loaded;
}

bool LlamaCppBuilt() { return true; }
Status LlamaCppAvailable() { return LlamaLib::Get().status(); }
const char* LlamaCppBuiltCommit() { return LOCKSTEP_LLAMACPP_COMMIT; }

}  // namespace lockstep
