#include "lockstep/engine/backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>

#include "cpu/cpu_stage.h"

namespace lockstep {

namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, BackendFactory> factories;  // GUARDED_BY(mu)
};

Registry& TheRegistry() {
  static Registry* r = [] {
    auto* reg = new Registry;  // never destroyed: backends may be created during static teardown
    reg->factories["cpu"] = [](const EngineConfig& cfg, const ModelWeights&) -> Result<BackendPtr> {
      return BackendPtr(std::make_unique<CpuBackend>(cfg.threads));
    };
    return reg;
  }();
  return *r;
}

}  // namespace

void RegisterBackend(const std::string& name, BackendFactory factory) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[name] = std::move(factory);
}

std::vector<std::string> RegisteredBackends() {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, f] : r.factories) names.push_back(name);
  return names;
}

std::string BackendPluginPath(const std::string& name) {
  const char* dir = std::getenv("LOCKSTEP_PLUGIN_DIR");  // env: LOCKSTEP_PLUGIN_DIR
  std::string base;
  if (dir != nullptr && *dir != '\0') {
    base = dir;
  } else {
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) return {};
    base = exe.parent_path().string();
  }
  return base + "/liblockstep_" + name + ".so";
}

Status LoadBackendPlugin(const std::string& path) {
  // RTLD_NOW: a missing symbol is an error here, not a crash later. RTLD_LOCAL: the plugin's own
  // symbols stay private; it resolves the engine's from the executable (built with exports).
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return Status::NotSupported("backend plugin " + path, dlerror());
  using RegisterFn = void (*)();
  auto fn = reinterpret_cast<RegisterFn>(dlsym(h, "lockstep_register_backends"));
  if (fn == nullptr)
    return Status::NotSupported("backend plugin " + path,
                                "no lockstep_register_backends symbol (not a lockstep plugin)");
  fn();  // the handle stays open for the life of the process: the factories live in it
  return Status::Ok();
}

namespace {
BackendFactory FindFactory(const std::string& name) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.factories.find(name);
  return it == r.factories.end() ? BackendFactory() : it->second;
}
}  // namespace

Result<BackendPtr> CreateBackend(const EngineConfig& cfg, const ModelWeights& weights) {
  BackendFactory factory = FindFactory(cfg.backend);
  std::string plugin_note;
  if (!factory) {
    // Not linked in: a plugin beside the executable may provide it (the cuda backend is one, so
    // CPU runs never load the CUDA libraries).
    const std::string path = BackendPluginPath(cfg.backend);
    if (!path.empty() && std::filesystem::exists(path)) {
      Status st = LoadBackendPlugin(path);
      if (!st.ok()) plugin_note = "; " + st.message();
      factory = FindFactory(cfg.backend);
    } else {
      plugin_note = "; no plugin " + (path.empty() ? std::string("found") : path);
    }
  }
  if (!factory) {
    std::string have;
    for (const auto& n : RegisteredBackends()) have += (have.empty() ? "" : ", ") + n;
    return Status::NotSupported(
        "--backend " + cfg.backend,
        "this build has no '" + cfg.backend + "' backend (built: " + have + plugin_note +
            "; the cuda backend needs nvcc at configure time and -DLOCKSTEP_CUDA=ON)");
  }
  return factory(cfg, weights);
}

}  // namespace lockstep
