#include "lockstep/instrument/resource_sampler.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <limits>
#include <system_error>
#include <utility>

#include "lockstep/engine/clock.h"
#include "lockstep/engine/median.h"

namespace lockstep {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1024} * 1024;
// /proc/meminfo and /proc/self/status are ~1.5 KB. The cap keeps a wrong path (a log file,
// /dev/zero) from costing more than one bounded read per sample.
constexpr std::size_t kMaxProcFileBytes = 1 << 20;
// A broken driver reporting an absurd device count must not make us allocate without bound.
constexpr unsigned int kMaxNvmlDevices = 1024;

std::int64_t ClockNs(clockid_t clock) {
  timespec ts{};
  if (clock_gettime(clock, &ts) != 0) return kResourceUnknown;
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Reads at most kMaxProcFileBytes. /proc files report st_size 0, so read until EOF rather than
// by size. O_NONBLOCK keeps a FIFO given by mistake from hanging the sampler thread.
bool ReadSmallFile(const std::string& path, std::string* out) {
  out->clear();
  if (path.empty()) return false;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  char buf[4096];
  bool ok = true;
  while (out->size() < kMaxProcFileBytes) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ok = !out->empty();  // EAGAIN on an empty FIFO, EISDIR, ...: nothing usable
      break;
    }
    if (n == 0) break;
    out->append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return ok;
}

bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

// Parses "Key:   <digits> [kB]" lines and stores the first well-formed value (bytes) of each
// wanted key; everything else is skipped. Returns nothing: a key left at -1 is unknown.
void ParseKeyedBytes(std::string_view text, std::span<const std::string_view> keys,
                     std::span<std::int64_t> values) {
  std::fill(values.begin(), values.end(), std::int64_t{kResourceUnknown});
  while (!text.empty()) {
    std::size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view{} : text.substr(eol + 1);

    std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view key = line.substr(0, colon);
    std::size_t k = 0;
    while (k < keys.size() && keys[k] != key) ++k;
    if (k == keys.size() || values[k] != kResourceUnknown) continue;

    std::string_view rest = line.substr(colon + 1);
    while (!rest.empty() && IsBlank(rest.front())) rest.remove_prefix(1);
    while (!rest.empty() && IsBlank(rest.back())) rest.remove_suffix(1);
    std::uint64_t v = 0;
    auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), v);
    if (ec != std::errc{} || end == rest.data()) continue;  // no digits, or overflow
    std::string_view unit(end, static_cast<std::size_t>(rest.data() + rest.size() - end));
    while (!unit.empty() && IsBlank(unit.front())) unit.remove_prefix(1);
    std::uint64_t mult = 0;
    if (unit == "kB") {
      mult = 1024;  // the kernel's "kB" is KiB
    } else if (unit.empty()) {
      mult = 1;
    } else {
      continue;  // "12abc", "12 MB": not a format we know, so not a value we trust
    }
    constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    if (v > kMax / mult) continue;
    values[k] = static_cast<std::int64_t>(v * mult);
  }
}

// NVML counts, clocks and temperatures are unsigned; a value that does not fit is not a reading.
int ToKnownInt(unsigned int v) {
  return v > static_cast<unsigned int>(INT_MAX) ? kResourceUnknown : static_cast<int>(v);
}
std::int64_t ToKnownInt64(unsigned long long v) {
  constexpr auto kMax = static_cast<unsigned long long>(std::numeric_limits<std::int64_t>::max());
  return v > kMax ? kResourceUnknown : static_cast<std::int64_t>(v);
}

// Lower / raise `acc` by a value that may be unknown; all resource values are >= 0 when known.
template <typename T>
void MinKnown(T* acc, T v) {
  if (v < 0) return;
  if (*acc < 0 || v < *acc) *acc = v;
}
template <typename T>
void MaxKnown(T* acc, T v) {
  if (v < 0) return;
  if (*acc < 0 || v > *acc) *acc = v;
}

void AddLink(std::vector<PcieLink>* links, PcieLink link) {
  if (link.gen < 0 && link.width < 0) return;
  auto it = std::lower_bound(links->begin(), links->end(), link);
  if (it == links->end() || *it != link) links->insert(it, link);
}

// dlsym returns void*; converting it to a function pointer is conditionally supported in C++
// (POSIX guarantees it). memcpy states the intent without a cast warning.
template <typename Fn>
bool Resolve(void* lib, const char* name, Fn* out) {
  void* p = dlsym(lib, name);
  if (p == nullptr) return false;
  static_assert(sizeof(Fn) == sizeof(void*));
  std::memcpy(out, &p, sizeof p);
  return true;
}

std::int64_t GuardThresholdBytes(std::int64_t min_free_mib) {
  if (min_free_mib > std::numeric_limits<std::int64_t>::max() / kMiB) {
    return std::numeric_limits<std::int64_t>::max();
  }
  return min_free_mib * kMiB;
}

}  // namespace

// ---- NVML ----

NvmlHandlePtr NvmlHandle::Open(std::string* why_unavailable) {
  return OpenLibrary({"libnvidia-ml.so.1", "libnvidia-ml.so"}, why_unavailable);
}

NvmlHandlePtr NvmlHandle::OpenLibrary(const std::vector<std::string>& names,
                                      std::string* why_unavailable) {
  std::string why;
  std::string not_loaded;
  for (const std::string& name : names) {
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* err = dlerror();
      if (!not_loaded.empty()) not_loaded += "; ";
      not_loaded += name + " not found (dlopen: " + (err ? err : "unknown error") + ")";
      continue;
    }
    NvmlHandlePtr h(new NvmlHandle());
    h->lib_ = lib;  // dlclose()d by ~NvmlHandle on every path from here
    h->library_ = name;
    NvmlApi& a = h->api_;
    // The _v2 entry points appeared with driver 325 (2013); the unversioned ones are the
    // fallback for anything older.
    const char* missing_required = nullptr;
    if (!Resolve(lib, "nvmlInit_v2", &a.init) && !Resolve(lib, "nvmlInit", &a.init)) {
      missing_required = "nvmlInit_v2";
    } else if (!Resolve(lib, "nvmlShutdown", &a.shutdown)) {
      missing_required = "nvmlShutdown";
    } else if (!Resolve(lib, "nvmlDeviceGetCount_v2", &a.device_count) &&
               !Resolve(lib, "nvmlDeviceGetCount", &a.device_count)) {
      missing_required = "nvmlDeviceGetCount_v2";
    } else if (!Resolve(lib, "nvmlDeviceGetHandleByIndex_v2", &a.handle_by_index) &&
               !Resolve(lib, "nvmlDeviceGetHandleByIndex", &a.handle_by_index)) {
      missing_required = "nvmlDeviceGetHandleByIndex_v2";
    }
    if (missing_required != nullptr) {
      why = name + " loaded but lacks required symbol " + missing_required +
            " (hint: not the NVIDIA management library, or a driver too old; GPU fields are "
            "recorded as unknown)";
      if (why_unavailable) *why_unavailable = why;
      return nullptr;
    }
    // Optional: each missing one leaves only its own fields unknown.
    auto optional = [&](const char* sym, auto* fn) {
      if (!Resolve(lib, sym, fn)) h->missing_symbols_.emplace_back(sym);
    };
    optional("nvmlDeviceGetMemoryInfo", &a.memory_info);
    optional("nvmlDeviceGetTemperature", &a.temperature);
    optional("nvmlDeviceGetClockInfo", &a.clock_info);
    optional("nvmlDeviceGetCurrPcieLinkGeneration", &a.pcie_gen);
    optional("nvmlDeviceGetCurrPcieLinkWidth", &a.pcie_width);
    optional("nvmlErrorString", &a.error_string);
    if (!h->Init(&why)) {
      why.insert(0, name + ": ");
      if (why_unavailable) *why_unavailable = why;
      return nullptr;
    }
    if (why_unavailable) why_unavailable->clear();
    return h;
  }
  // The reason first, in words a reader of a report acts on; the loader's details after it.
  why = not_loaded.empty() ? std::string("no NVML library name given")
                           : "no NVIDIA driver on this machine (or its libraries are not on the "
                             "loader path): GPU fields are recorded as unknown; " +
                                 not_loaded;
  if (why_unavailable) *why_unavailable = why;
  return nullptr;
}

NvmlHandlePtr NvmlHandle::TEST_FromApi(const NvmlApi& api, std::string* why_unavailable) {
  NvmlHandlePtr h(new NvmlHandle());
  h->api_ = api;
  h->library_ = "fake";
  if (!api.init || !api.shutdown || !api.device_count || !api.handle_by_index) {
    if (why_unavailable) *why_unavailable = "fake NVML lacks a required entry point";
    return nullptr;
  }
  const std::pair<const char*, bool> optional[] = {
      {"nvmlDeviceGetMemoryInfo", api.memory_info != nullptr},
      {"nvmlDeviceGetTemperature", api.temperature != nullptr},
      {"nvmlDeviceGetClockInfo", api.clock_info != nullptr},
      {"nvmlDeviceGetCurrPcieLinkGeneration", api.pcie_gen != nullptr},
      {"nvmlDeviceGetCurrPcieLinkWidth", api.pcie_width != nullptr},
      {"nvmlErrorString", api.error_string != nullptr},
  };
  for (const auto& [sym, present] : optional) {
    if (!present) h->missing_symbols_.emplace_back(sym);
  }
  std::string why;
  if (!h->Init(&why)) {
    if (why_unavailable) *why_unavailable = why;
    return nullptr;
  }
  if (why_unavailable) why_unavailable->clear();
  return h;
}

bool NvmlHandle::Init(std::string* why) {
  auto error_text = [this](int rc) {
    const char* s = api_.error_string ? api_.error_string(rc) : nullptr;
    return std::string(s ? s : "NVML error") + " (" + std::to_string(rc) + ")";
  };
  int rc = api_.init();
  if (rc != nvml::kSuccess) {
    *why = "nvmlInit failed: " + error_text(rc) +
           " (hint: driver/library version mismatch, or no access to /dev/nvidia*; GPU fields "
           "are recorded as unknown)";
    return false;
  }
  initialised_ = true;  // from here the destructor owes nvmlShutdown
  unsigned int n = 0;
  rc = api_.device_count(&n);
  if (rc != nvml::kSuccess) {
    *why = "nvmlDeviceGetCount failed: " + error_text(rc) + " (GPU fields are recorded as unknown)";
    return false;
  }
  n = std::min(n, kMaxNvmlDevices);
  devices_.assign(n, nullptr);
  for (unsigned int i = 0; i < n; ++i) {
    nvml::DeviceHandle d = nullptr;
    // A device NVML cannot open (lost, no permission) stays listed with unknown fields.
    if (api_.handle_by_index(i, &d) == nvml::kSuccess) devices_[i] = d;
  }
  return true;
}

NvmlHandle::~NvmlHandle() {
  if (initialised_ && api_.shutdown) api_.shutdown();
  if (lib_ != nullptr) dlclose(lib_);
}

std::vector<DeviceSample> NvmlHandle::ReadDevices() const {
  std::vector<DeviceSample> out(devices_.size());
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    DeviceSample& d = out[i];
    d.index = static_cast<int>(i);
    nvml::DeviceHandle h = devices_[i];
    if (h == nullptr) continue;
    if (api_.memory_info) {
      nvml::Memory m{};
      if (api_.memory_info(h, &m) == nvml::kSuccess) {
        d.free_bytes = ToKnownInt64(m.free);
        d.total_bytes = ToKnownInt64(m.total);
      }
    }
    unsigned int v = 0;
    if (api_.temperature && api_.temperature(h, nvml::kTemperatureGpu, &v) == nvml::kSuccess) {
      d.temperature_c = ToKnownInt(v);
    }
    if (api_.clock_info && api_.clock_info(h, nvml::kClockSm, &v) == nvml::kSuccess) {
      d.sm_clock_mhz = ToKnownInt(v);
    }
    if (api_.pcie_gen && api_.pcie_gen(h, &v) == nvml::kSuccess) d.pcie_gen = ToKnownInt(v);
    if (api_.pcie_width && api_.pcie_width(h, &v) == nvml::kSuccess) d.pcie_width = ToKnownInt(v);
  }
  return out;
}

// ---- one sample ----

void ParseMeminfo(std::string_view text, ResourceSample* out) {
  static constexpr std::string_view kKeys[] = {"MemAvailable", "SwapTotal", "SwapFree"};
  std::int64_t v[3];
  ParseKeyedBytes(text, kKeys, v);
  out->host_available_bytes = v[0];
  // Without swap the kernel still prints SwapTotal: 0 kB, so "0 used" is a measurement.
  out->swap_used_bytes = (v[1] >= 0 && v[2] >= 0 && v[2] <= v[1]) ? v[1] - v[2] : kResourceUnknown;
}

void ParseProcStatus(std::string_view text, ResourceSample* out) {
  static constexpr std::string_view kKeys[] = {"VmRSS"};
  std::int64_t v[1];
  ParseKeyedBytes(text, kKeys, v);
  out->rss_bytes = v[0];
}

ResourceSample ReadResourceSample(const NvmlHandle* nvml, const ProcPaths& paths) {
  ResourceSample s;
  s.t_ns = MonotonicNs();
  std::string text;
  if (ReadSmallFile(paths.meminfo, &text)) ParseMeminfo(text, &s);
  if (ReadSmallFile(paths.self_status, &text)) ParseProcStatus(text, &s);
  s.process_cpu_ns = ClockNs(CLOCK_PROCESS_CPUTIME_ID);
  if (nvml != nullptr) s.devices = nvml->ReadDevices();
  std::int64_t end = MonotonicNs();
  if (s.t_ns >= 0 && end >= s.t_ns) s.read_ns = end - s.t_ns;
  return s;
}

// ---- aggregates ----

IntervalStats ComputeIntervals(std::span<const ResourceSample> samples) {
  std::vector<std::int64_t> gaps;
  gaps.reserve(samples.empty() ? 0 : samples.size() - 1);
  for (std::size_t i = 1; i < samples.size(); ++i) {
    if (samples[i - 1].t_ns < 0 || samples[i].t_ns < 0) continue;  // unknown time, no gap
    gaps.push_back(samples[i].t_ns - samples[i - 1].t_ns);
  }
  IntervalStats st;
  st.count = static_cast<std::int64_t>(gaps.size());
  if (gaps.empty()) return st;
  auto [mn, mx] = std::minmax_element(gaps.begin(), gaps.end());
  st.min_ns = *mn;
  st.max_ns = *mx;
  // Median is O(n) (nth_element, no sort) on up to max_samples gaps while the caller holds mu_;
  // an even count's mean rounds down.
  st.median_ns = Median(std::move(gaps));
  return st;
}

void Extremes::Add(const ResourceSample& s) {
  ++n_samples;
  MinKnown(&first_t_ns, s.t_ns);
  MaxKnown(&last_t_ns, s.t_ns);
  MinKnown(&min_host_available_bytes, s.host_available_bytes);
  MaxKnown(&max_swap_used_bytes, s.swap_used_bytes);
  MaxKnown(&max_rss_bytes, s.rss_bytes);
  for (const DeviceSample& d : s.devices) {
    auto it = std::lower_bound(devices.begin(), devices.end(), d.index,
                               [](const DeviceExtremes& e, int idx) { return e.index < idx; });
    if (it == devices.end() || it->index != d.index) {
      it = devices.insert(it, DeviceExtremes{});
      it->index = d.index;
    }
    ++it->n_samples;
    MinKnown(&it->min_free_bytes, d.free_bytes);
    if (d.total_bytes >= 0) it->total_bytes = d.total_bytes;
    MaxKnown(&it->max_temperature_c, d.temperature_c);
    MinKnown(&it->min_sm_clock_mhz, d.sm_clock_mhz);
    MaxKnown(&it->max_sm_clock_mhz, d.sm_clock_mhz);
    MinKnown(&min_sm_clock_mhz, d.sm_clock_mhz);
    MaxKnown(&max_sm_clock_mhz, d.sm_clock_mhz);
    AddLink(&it->pcie_links, PcieLink{d.pcie_gen, d.pcie_width});
    AddLink(&pcie_links, PcieLink{d.pcie_gen, d.pcie_width});
  }
}

Extremes Summarize(std::span<const ResourceSample> samples) {
  Extremes e;
  for (const ResourceSample& s : samples) e.Add(s);
  return e;
}

// ---- resource guard ----

std::optional<GuardTrip> GuardFreeMemory(const ResourceSample& s) {
  const DeviceSample* lowest = nullptr;
  for (const DeviceSample& d : s.devices) {
    if (d.free_bytes < 0) continue;
    if (lowest == nullptr || d.free_bytes < lowest->free_bytes ||
        (d.free_bytes == lowest->free_bytes && d.index < lowest->index)) {
      lowest = &d;
    }
  }
  if (lowest != nullptr) {
    return GuardTrip{s.t_ns, lowest->free_bytes, "gpu" + std::to_string(lowest->index)};
  }
  if (s.host_available_bytes >= 0) return GuardTrip{s.t_ns, s.host_available_bytes, "host"};
  return std::nullopt;
}

std::optional<GuardTrip> EvaluateGuard(const ResourceSample& s, std::int64_t min_free_mib) {
  if (min_free_mib < 0) return std::nullopt;
  std::optional<GuardTrip> free = GuardFreeMemory(s);
  if (!free || free->free_bytes >= GuardThresholdBytes(min_free_mib)) return std::nullopt;
  return free;
}

// ---- ResourceSampler ----

ResourceSampler::ResourceSampler(SamplerOptions opts) : opts_(std::move(opts)) {}

ResourceSampler::ResourceSampler(SamplerOptions opts, NvmlHandlePtr nvml)
    : opts_(std::move(opts)), nvml_(std::move(nvml)), nvml_injected_(true) {}

ResourceSampler::~ResourceSampler() { Stop(); }

Status ResourceSampler::Start() {
  if (started_) {
    return Status::InvalidArgument("ResourceSampler::Start",
                                   "already started (a sampler runs once; create a new one)");
  }
  if (opts_.interval_ms < 1 || opts_.interval_ms > 3'600'000) {
    return Status::InvalidArgument(
        "--sample-ms", "expected 1..3600000 ms, got " + std::to_string(opts_.interval_ms));
  }
  if (opts_.guard_min_free_mib < -1 ||
      opts_.guard_min_free_mib > std::numeric_limits<std::int64_t>::max() / kMiB) {
    return Status::InvalidArgument(
        "--guard-min-free-mib",
        "expected -1 (off) or a size >= 0 MiB, got " + std::to_string(opts_.guard_min_free_mib));
  }
  if (opts_.max_samples < 1) {
    return Status::InvalidArgument("SamplerOptions::max_samples", "expected >= 1, got 0");
  }
  started_ = true;

  std::string reason;
  if (nvml_injected_) {
    if (!nvml_) reason = "no NVML handle given";
  } else if (opts_.use_nvml) {
    nvml_ = NvmlHandle::Open(&reason);
  } else {
    reason = "disabled (use_nvml = false)";
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    nvml_reason_ = reason;
  }

  // The schedule is anchored at the first sample; steady_clock is CLOCK_MONOTONIC on Linux.
  auto t0 = std::chrono::steady_clock::now();
  Record(ReadResourceSample(nvml_.get(), opts_.paths));
  try {
    thread_ = std::thread(&ResourceSampler::Run, this, t0);
  } catch (const std::system_error& e) {
    return Status::Runtime("resource sampler thread", e.what());
  }
  return Status::Ok();
}

void ResourceSampler::Stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ResourceSampler::Run(std::chrono::steady_clock::time_point t0) {
  const auto interval = std::chrono::milliseconds(opts_.interval_ms);
  auto next = t0 + interval;
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    // wait_until on a steady_clock deadline: libstdc++ waits with pthread_cond_clockwait on
    // CLOCK_MONOTONIC, so wall-clock jumps do not move the schedule.
    if (cv_.wait_until(lk, next, [this] { return stop_; })) return;
    lk.unlock();
    Record(ReadResourceSample(nvml_.get(), opts_.paths));
    next += interval;
    auto now = std::chrono::steady_clock::now();
    if (next <= now) {
      // Stalled past one or more whole slots (NVML hang, suspended VM): skip them rather than
      // firing a burst of back-to-back samples; the gap shows up in Intervals().max_ns.
      next += ((now - next) / interval + 1) * interval;
    }
    lk.lock();
  }
}

void ResourceSampler::Record(ResourceSample s) {
  std::lock_guard<std::mutex> lk(mu_);
  ++n_taken_;
  if (last_t_ns_ >= 0 && s.t_ns >= 0) {
    std::int64_t gap = s.t_ns - last_t_ns_;
    ++gaps_all_.count;
    gaps_all_.min_ns = gaps_all_.min_ns < 0 ? gap : std::min(gaps_all_.min_ns, gap);
    gaps_all_.max_ns = std::max(gaps_all_.max_ns, gap);
  }
  if (s.t_ns >= 0) last_t_ns_ = s.t_ns;
  extremes_.Add(s);
  if (opts_.guard_min_free_mib >= 0) {
    std::optional<GuardTrip> free = GuardFreeMemory(s);
    if (!free) {
      ++guard_unknown_;
    } else if (!trip_ && free->free_bytes < GuardThresholdBytes(opts_.guard_min_free_mib)) {
      trip_ = std::move(free);
      // Release pairs with guard_tripped()'s acquire: a poller that sees true and then calls
      // guard_trip() finds the trip (it also takes mu_, so this is belt and braces).
      guard_tripped_.store(true, std::memory_order_release);
    }
  }
  if (samples_.size() < opts_.max_samples) samples_.push_back(std::move(s));
}

std::optional<GuardTrip> ResourceSampler::guard_trip() const {
  std::lock_guard<std::mutex> lk(mu_);
  return trip_;
}

std::int64_t ResourceSampler::guard_unknown_samples() const {
  std::lock_guard<std::mutex> lk(mu_);
  return guard_unknown_;
}

std::vector<ResourceSample> ResourceSampler::Samples() const {
  std::lock_guard<std::mutex> lk(mu_);
  return samples_;
}

std::vector<ResourceSample> ResourceSampler::SamplesFrom(std::size_t first) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (first >= samples_.size()) return {};
  return std::vector<ResourceSample>(samples_.begin() + static_cast<std::ptrdiff_t>(first),
                                     samples_.end());
}

std::int64_t ResourceSampler::samples_taken() const {
  std::lock_guard<std::mutex> lk(mu_);
  return n_taken_;
}

std::int64_t ResourceSampler::samples_dropped() const {
  std::lock_guard<std::mutex> lk(mu_);
  return n_taken_ - static_cast<std::int64_t>(samples_.size());
}

IntervalStats ResourceSampler::Intervals() const {
  std::lock_guard<std::mutex> lk(mu_);
  IntervalStats st = ComputeIntervals(samples_);
  // The running values include gaps after the storage cap; the median cannot (it needs them all).
  st.count = gaps_all_.count;
  st.min_ns = gaps_all_.min_ns;
  st.max_ns = gaps_all_.max_ns;
  return st;
}

Extremes ResourceSampler::Summary() const {
  std::lock_guard<std::mutex> lk(mu_);
  return extremes_;
}

std::string ResourceSampler::nvml_unavailable_reason() const {
  std::lock_guard<std::mutex> lk(mu_);
  return nvml_reason_;
}

}  // namespace lockstep
