// The build without llama.cpp's headers (LOCKSTEP_LLAMACPP=OFF): `--engine llama.cpp` is bad
// input naming the install script. No LlamaEngine can be created, so its members below are never
// reached; they exist for the link.
#include "lockstep/llamacpp/llama_engine.h"

namespace lockstep {

struct LlamaEngine::Impl {
  LlamaOptions opts;
  std::string commit;
};

bool LlamaCppBuilt() { return false; }
const char* LlamaCppBuiltCommit() { return ""; }
Status LlamaCppAvailable() {
  return Status::InvalidArgument(
      "--engine llama.cpp",
      std::string("this lockstep was built without llama.cpp (") + kLlamaCppInstallHint + ")");
}

Result<std::unique_ptr<LlamaEngine>> LlamaEngine::Open(const LlamaOptions& opts) {
  (void)opts;
  return LlamaCppAvailable();
}

LlamaEngine::LlamaEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LlamaEngine::~LlamaEngine() = default;
int LlamaEngine::n_vocab() const { return 0; }
const LlamaOptions& LlamaEngine::options() const { return impl_->opts; }
const std::string& LlamaEngine::commit() const { return impl_->commit; }
Result<LlamaResult> LlamaEngine::Generate(std::span<const std::int32_t> prompt,
                                          const LlamaHooks& hooks) {
  (void)prompt;
  (void)hooks;
  return Status::InvalidArgument("--engine llama.cpp", kLlamaCppInstallHint);
}

}  // namespace lockstep
