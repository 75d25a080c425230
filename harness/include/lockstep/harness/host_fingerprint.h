// The host a unit ran on, fingerprinted (issue 41): what an A/A pair across two hosts also
// measures. Every field that cannot be read is "unknown" (numbers: -1), never a guess; the
// hostname itself is never stored, only its SHA-256.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace lockstep {

// A test hook, named as one: when set, its value replaces the hostname in ProbeHost, so a test
// can make one unit look like it ran on a second host. Never set it outside tests.
inline constexpr const char* kFakeHostEnv = "LOCKSTEP_TEST_HOOK_FAKE_HOST";

struct HostFingerprint {
  std::string cpu_model = "unknown";  // /proc/cpuinfo "model name"
  std::string isa = "unknown";        // the path the CPU backend was compiled for: avx512 | avx2 |
                                      // scalar (compile time: -march=native, CMakeLists.txt)
  int cores = -1;                     // online logical CPUs
  int threads = -1;                   // worker threads the unit's engine config asked (0: one
                                      // per core, resolved to `cores`)
  std::string kernel = "unknown";     // uname: sysname release machine
  std::int64_t memory_bytes = -1;     // /proc/meminfo MemTotal
  std::string gpu = "unknown", gpu_driver = "unknown", cuda = "unknown";  // NVIDIA's /proc files
  std::string hostname_sha256 = "unknown";

  nlohmann::json ToJson() const;
  // Missing keys read as unknown.
  static HostFingerprint FromJson(const nlohmann::json& j);
  // SHA-256 over every field but `threads` (a property of the run, not of the host).
  std::string Digest() const;
  // "host 3f2a9c1b (Intel(R) Xeon(R) ..., avx512, 16 cores)": what reports print.
  std::string Label() const;
};

// This machine's fingerprint; `threads` as the unit's engine config gives it (0: cores).
HostFingerprint ProbeHost(int threads);

}  // namespace lockstep
