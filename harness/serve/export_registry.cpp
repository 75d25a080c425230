#include "serve/export_registry.h"

#include <sys/stat.h>

#include <utility>

#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

void ExportRegistry::Writing(const std::string& name, const std::string& path) {
  std::lock_guard lk(mu_);
  Item& it = items_[name];
  it.entry = {path, "", 0};
  it.finished = false;
}

Result<ExportEntry> ExportRegistry::Finish(const std::string& name) {
  std::string path;
  {
    std::lock_guard lk(mu_);
    auto it = items_.find(name);
    if (it == items_.end()) return Status::NotFound("export", "no export " + name);
    path = it->second.entry.path;
  }
  // Hashed outside the lock: a large export must not stall other requests' lookups. The file
  // is stat'ed before and after: one changed while it was hashed is not recorded.
  struct stat before {
  }, after{};
  const bool stat_before = ::lstat(path.c_str(), &before) == 0 && S_ISREG(before.st_mode);
  Result<std::string> sha = Sha256File(path);
  ExportEntry e{path, sha.ok() ? *sha : "", 0};
  if (stat_before && sha.ok() && ::lstat(path.c_str(), &after) == 0) {
    e.bytes = static_cast<std::uint64_t>(after.st_size);
    e.dev = static_cast<std::uint64_t>(after.st_dev);
    e.ino = static_cast<std::uint64_t>(after.st_ino);
    e.mtime_ns = std::int64_t{after.st_mtim.tv_sec} * 1'000'000'000 + after.st_mtim.tv_nsec;
  }
  if (!sha.ok() || !stat_before || e.bytes == 0 || !SameFileAsHashed(e, before)) {
    Forget(name);
    return sha.ok() ? Status::IOError("export", "the finished export changed while it was hashed")
                    : sha.status();
  }
  std::lock_guard lk(mu_);
  Item& it = items_[name];
  it.entry = std::move(e);
  it.finished = true;
  return it.entry;
}

bool SameFileAsHashed(const ExportEntry& e, const struct stat& st) {
  return S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_dev) == e.dev &&
         static_cast<std::uint64_t>(st.st_ino) == e.ino &&
         static_cast<std::uint64_t>(st.st_size) == e.bytes &&
         std::int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec == e.mtime_ns;
}

void ExportRegistry::Forget(const std::string& name) {
  std::lock_guard lk(mu_);
  items_.erase(name);
}

void ExportRegistry::ForgetIfWriting(const std::string& name) {
  std::lock_guard lk(mu_);
  auto it = items_.find(name);
  if (it != items_.end() && !it->second.finished) items_.erase(it);
}

ExportRegistry::State ExportRegistry::Lookup(const std::string& name, ExportEntry* entry) const {
  std::lock_guard lk(mu_);
  auto it = items_.find(name);
  if (it == items_.end()) return State::kUnknown;
  if (!it->second.finished) return State::kWriting;
  if (entry) *entry = it->second.entry;
  return State::kFinished;
}

ServedExport::ServedExport(ExportRegistry& registry, std::string name, const std::string& path)
    : registry_(&registry), name_(std::move(name)) {
  registry_->Writing(name_, path);
}

ServedExport::~ServedExport() { ForgetIfWriting(); }

ServedExport::ServedExport(ServedExport&& o) noexcept
    : registry_(std::exchange(o.registry_, nullptr)), name_(std::move(o.name_)) {}

ServedExport& ServedExport::operator=(ServedExport&& o) noexcept {
  if (this != &o) {
    ForgetIfWriting();
    registry_ = std::exchange(o.registry_, nullptr);
    name_ = std::move(o.name_);
  }
  return *this;
}

Result<ExportEntry> ServedExport::Finish() {
  if (!registry_) return Status::NotFound("export", "no export");
  return registry_->Finish(name_);
}

void ServedExport::Forget() {
  if (registry_) registry_->Forget(name_);
}

void ServedExport::ForgetIfWriting() {
  if (registry_) registry_->ForgetIfWriting(name_);
}

}  // namespace lockstep
