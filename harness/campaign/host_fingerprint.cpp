// Host fingerprints from /proc and uname (host_fingerprint.h). Linux only; elsewhere the fields
// stay unknown.
#include "lockstep/harness/host_fingerprint.h"

#include <fmt/format.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

namespace {

// The value after "key" and its ':' on the first line of `path` that starts with `key`; ""
// when there is none.
std::string ProcField(const std::string& path, std::string_view key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string v = line.substr(colon + 1);
    const auto b = v.find_first_not_of(" \t");
    const auto e = v.find_last_not_of(" \t\r");
    return b == std::string::npos ? "" : v.substr(b, e - b + 1);
  }
  return "";
}

std::string OrUnknown(std::string s) { return s.empty() ? "unknown" : s; }

constexpr const char* CompiledIsa() {
#if defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__)
  return "avx2";
#else
  return "scalar";
#endif
}

}  // namespace

nlohmann::json HostFingerprint::ToJson() const {
  return {{"cpu_model", cpu_model},
          {"isa", isa},
          {"cores", cores},
          {"threads", threads},
          {"kernel", kernel},
          {"memory_bytes", memory_bytes},
          {"gpu", gpu},
          {"gpu_driver", gpu_driver},
          {"cuda", cuda},
          {"hostname_sha256", hostname_sha256}};
}

HostFingerprint HostFingerprint::FromJson(const nlohmann::json& j) {
  HostFingerprint h;
  if (!j.is_object()) return h;
  auto str = [&j](const char* k, std::string& out) {
    if (j.contains(k) && j[k].is_string()) out = j[k].get<std::string>();
  };
  str("cpu_model", h.cpu_model), str("isa", h.isa), str("kernel", h.kernel), str("gpu", h.gpu);
  str("gpu_driver", h.gpu_driver), str("cuda", h.cuda), str("hostname_sha256", h.hostname_sha256);
  if (j.contains("cores") && j["cores"].is_number_integer()) h.cores = j["cores"].get<int>();
  if (j.contains("threads") && j["threads"].is_number_integer())
    h.threads = j["threads"].get<int>();
  if (j.contains("memory_bytes") && j["memory_bytes"].is_number_integer())
    h.memory_bytes = j["memory_bytes"].get<std::int64_t>();
  return h;
}

std::string HostFingerprint::Digest() const {
  nlohmann::json j = ToJson();
  j.erase("threads");
  return Sha256Hex(j.dump());
}

std::string HostFingerprint::Label() const {
  return fmt::format("host {} ({}, {}, {} cores)", Digest().substr(0, 8), cpu_model, isa,
                     cores < 0 ? std::string("unknown") : std::to_string(cores));
}

HostFingerprint ProbeHost(int threads) {
  HostFingerprint h;
  h.cpu_model = OrUnknown(ProcField("/proc/cpuinfo", "model name"));
  h.isa = CompiledIsa();
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  h.cores = n > 0 ? static_cast<int>(n) : -1;
  h.threads = threads > 0 ? threads : h.cores;
  if (struct utsname u{}; ::uname(&u) == 0)
    h.kernel = fmt::format("{} {} {}", u.sysname, u.release, u.machine);
  // "MemTotal:       131891228 kB"
  if (const std::string mem = ProcField("/proc/meminfo", "MemTotal"); !mem.empty())
    h.memory_bytes = std::strtoll(mem.c_str(), nullptr, 10) * 1024;
  // NVIDIA's driver: its version line, and the first GPU's model.
  if (std::ifstream v("/proc/driver/nvidia/version"); v) {
    std::string line;
    std::getline(v, line);  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ..."
    const auto k = line.find("Kernel Module");
    if (k != std::string::npos) {
      std::string rest = line.substr(k + 13);
      const auto b = rest.find_first_not_of(' ');
      if (b != std::string::npos) h.gpu_driver = rest.substr(b, rest.find(' ', b) - b);
    }
  }
  std::error_code ec;
  for (const auto& d : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    h.gpu = OrUnknown(ProcField(d.path().string() + "/information", "Model"));
    break;
  }
  std::string name;
  if (const char* fake = std::getenv(kFakeHostEnv); fake && *fake) {
    name = fake;
  } else {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) == 0) name = buf;
  }
  if (!name.empty()) h.hostname_sha256 = Sha256Hex(name);
  return h;
}

}  // namespace lockstep
