// ggml and llama.cpp as test oracles: the prebuilt libraries of the llama.cpp component
// (scripts/install-llamacpp.sh fills .cache/llamacpp; env LOCKSTEP_LLAMACPP_DIR overrides), opened
// with dlopen as engine/llamacpp/llama_lib.cpp opens them. Tests skip, naming the reason, when
// the build has no llama.cpp headers or the folder has no libraries.
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#if defined(LOCKSTEP_TEST_GGML_DIR)
#include <ggml.h>
#include <llama.h>
#endif

namespace lockstep::test {

#if defined(LOCKSTEP_TEST_GGML_DIR)
struct GgmlLib {
  const ggml_type_traits* (*get_type_traits)(ggml_type) = nullptr;
  std::size_t (*quantize_chunk)(ggml_type, const float*, void*, std::int64_t, std::int64_t,
                                std::int64_t, const float*) = nullptr;
  bool (*requires_imatrix)(ggml_type) = nullptr;
  llama_model_quantize_params (*quantize_default_params)() = nullptr;
  std::uint32_t (*model_quantize)(const char*, const char*,
                                  const llama_model_quantize_params*) = nullptr;
  void (*llama_log_set)(ggml_log_callback, void*) = nullptr;
  void (*ggml_log_set)(ggml_log_callback, void*) = nullptr;
  std::string error;  // why the library is unusable (empty: usable)

  // The process-wide instance (the handles stay open).
  static const GgmlLib& Get() {
    static const GgmlLib lib = Load();
    return lib;
  }

 private:
  static void Quiet(ggml_log_level, const char*, void*) {}
  static GgmlLib Load() {
    GgmlLib l;
    const char* env = std::getenv("LOCKSTEP_LLAMACPP_DIR");  // env: LOCKSTEP_LLAMACPP_DIR
    const std::string dir = (env && *env ? std::string(env) : LOCKSTEP_TEST_GGML_DIR) + "/lib";
    void* ggml = ::dlopen((dir + "/libggml.so").c_str(), RTLD_NOW | RTLD_GLOBAL);
    void* base =
        ggml ? ::dlopen((dir + "/libggml-base.so").c_str(), RTLD_NOW | RTLD_GLOBAL) : nullptr;
    void* llama = base ? ::dlopen((dir + "/libllama.so").c_str(), RTLD_NOW | RTLD_GLOBAL) : nullptr;
    if (llama == nullptr) {
      const char* e = ::dlerror();
      l.error = "no llama.cpp libraries in " + dir + " (" + (e ? e : "dlopen failed") +
                "; run scripts/install-llamacpp.sh)";
      return l;
    }
    auto sym = [&](void* h, const char* name, auto& fn) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, name));
      if (fn == nullptr) l.error += std::string(l.error.empty() ? "missing " : ", ") + name;
    };
    sym(base, "ggml_get_type_traits", l.get_type_traits);
    sym(base, "ggml_quantize_chunk", l.quantize_chunk);
    sym(base, "ggml_quantize_requires_imatrix", l.requires_imatrix);
    sym(base, "ggml_log_set", l.ggml_log_set);
    sym(llama, "llama_model_quantize_default_params", l.quantize_default_params);
    sym(llama, "llama_model_quantize", l.model_quantize);
    sym(llama, "llama_log_set", l.llama_log_set);
    if (l.error.empty()) {
      l.ggml_log_set(Quiet, nullptr);
      l.llama_log_set(Quiet, nullptr);
    }
    return l;
  }
};
#endif

// Empty when the oracle is usable, else why not.
inline std::string GgmlUnavailable() {
#if defined(LOCKSTEP_TEST_GGML_DIR)
  return GgmlLib::Get().error;
#else
  return "this build has no llama.cpp headers (LOCKSTEP_LLAMACPP=OFF)";
#endif
}

}  // namespace lockstep::test
