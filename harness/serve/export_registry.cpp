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
  // Hashed outside the lock: a large export must not stall other requests' lookups.
  Result<std::string> sha = Sha256File(path);
  struct stat st {};
  if (!sha.ok() || ::stat(path.c_str(), &st) != 0) {
    Forget(name);
    return sha.ok() ? Status::IOError("export", "cannot stat the finished export") : sha.status();
  }
  std::lock_guard lk(mu_);
  Item& it = items_[name];
  it.entry = {path, *sha, static_cast<std::uint64_t>(st.st_size)};
  it.finished = true;
  return it.entry;
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
