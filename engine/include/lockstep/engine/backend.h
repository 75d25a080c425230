// Backend: where the stages of one engine compute, chosen at run time by name (`--backend`).
//
// A backend is created once per engine and owns what its stages share: for `cpu`, nothing but
// the borrowed thread pool; for `cuda`, the device copies of the weights, library handles, the
// streams and the NCCL communicators. It makes the stage sessions and the transport between
// them. The engine keeps the backend alive longer than both.
//
// Registry: `cpu` is always registered. Other backends come from their own library: linked in
// and registered by hand (the GPU tests call lockstep::cuda::RegisterCudaBackend()), or as a
// plugin, `liblockstep_<name>.so` beside the executable (or in $LOCKSTEP_PLUGIN_DIR), loaded the
// first time that backend is asked for. The `lockstep` executable loads `cuda` that way, so CPU
// runs never map the CUDA libraries (hundreds of MiB: start-up time and RSS).
// Thread safety: RegisterBackend and CreateBackend may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/stage.h"
#include "lockstep/engine/status.h"
#include "lockstep/engine/thread_pool.h"
#include "lockstep/engine/transport.h"
#include "lockstep/engine/weights.h"

namespace lockstep {

// What a stage is made from. Borrowed: weights, cfg and pool outlive the stage.
struct StageParams {
  const ModelWeights* weights = nullptr;
  const EngineConfig* cfg = nullptr;
  int index = 0;
  int n_stages = 1;
  int layer_begin = 0;
  int layer_end = 0;
  ThreadPool* pool = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // One stage session; kRuntime for a device failure (out of memory, driver error).
  virtual Result<StageSessionPtr> CreateStage(const StageParams& params) = 0;
  // The transport between `n_stages` stages made by this backend.
  virtual Result<TransportPtr> CreateTransport(int n_stages) = 0;
  // One line for logs and the run summary ("cpu, 4 threads", "cuda, NVIDIA H200 x1,
  // deterministic").
  virtual std::string Describe() const = 0;
};
using BackendPtr = std::unique_ptr<Backend>;

// Makes the backend for `cfg` (weights borrowed, outlive the backend).
using BackendFactory =
    std::function<Result<BackendPtr>(const EngineConfig& cfg, const ModelWeights& weights)>;

// Where CreateBackend looks for backend `name`'s plugin ("" when the executable's folder is
// unknown).
std::string BackendPluginPath(const std::string& name);
// dlopens a backend plugin and calls its extern "C" lockstep_register_backends(). The plugin
// resolves engine symbols from the executable, which must export them (ENABLE_EXPORTS).
// kNotSupported with dlerror()'s text when it cannot be loaded.
Status LoadBackendPlugin(const std::string& path);
// Registers (or replaces) the factory of backend `name`.
void RegisterBackend(const std::string& name, BackendFactory factory);
// Names of the registered backends, sorted.
std::vector<std::string> RegisteredBackends();
// The backend cfg.backend names (loading its plugin if needed). kNotSupported when that backend
// is not part of this build, or (from the factory) when it cannot run here (e.g. `cuda` without
// a visible device).
Result<BackendPtr> CreateBackend(const EngineConfig& cfg, const ModelWeights& weights);

}  // namespace lockstep
