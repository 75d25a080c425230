// ExportRegistry: the exports `lockstep serve` itself wrote, by file name, for
// `GET /v1/exports/{file}`. Only names in here can be downloaded: a client-chosen name, a path
// (`..`, `/`) or a file someone else put into --export-dir is never served. A name is
// registered `writing` when its request opens the export (its file is `<name>.partial`) and
// `finished` with the file's SHA-256 (computed once, when the export is renamed into place); a
// request whose export did not finish (cancelled, failed) is forgotten.
//
// Thread-safe: handler threads register, finish and look up concurrently.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "lockstep/engine/status.h"

namespace lockstep {

struct ExportEntry {
  std::string path;    // the finished file
  std::string sha256;  // lower-case hex of its bytes
  std::uint64_t bytes = 0;
  // The file that was hashed (fstat): a download serves it only while the name still holds
  // the same file, unchanged (a replaced or rewritten file would carry a digest not its own).
  std::uint64_t dev = 0, ino = 0;
  std::int64_t mtime_ns = 0;
};

// True when `st` (an fstat of the file a download opened) is the file `e` was hashed from.
bool SameFileAsHashed(const ExportEntry& e, const struct stat& st);

class ExportRegistry {
 public:
  enum class State { kUnknown, kWriting, kFinished };

  // `name` is being written to `path` + ".partial".
  void Writing(const std::string& name, const std::string& path);
  // The export `name` is in place at its path: hashes the file and records it. kIOError when it
  // cannot be read (the name is forgotten).
  Result<ExportEntry> Finish(const std::string& name);
  void Forget(const std::string& name);
  // Forgets `name` only while it is still being written (a client gone before its end).
  void ForgetIfWriting(const std::string& name);
  // The state of `name`, and its entry when finished.
  State Lookup(const std::string& name, ExportEntry* entry) const;

 private:
  struct Item {
    ExportEntry entry;
    bool finished = false;
  };
  mutable std::mutex mu_;
  std::map<std::string, Item> items_;  // GUARDED_BY(mu_)
};

// The owner of one served export's registration, for the request's lifetime: constructed, the
// name is registered `writing` (its file `path` + ".partial"); Finish() records it for download;
// Forget() drops it (the request failed or was cancelled); ForgetIfWriting() drops it unless it
// finished (a client gone before its end). Destroyed, it forgets a name that never finished, so
// no path can leave a `writing` name behind. An empty owner (no export) does nothing. Each call
// goes to the thread-safe registry, so the owner may be used from the handler's and the stream's
// threads; it must outlive neither the registry nor be moved while in use.
class ServedExport {
 public:
  ServedExport() = default;
  ServedExport(ExportRegistry& registry, std::string name, const std::string& path);
  ~ServedExport();
  ServedExport(ServedExport&& o) noexcept;
  ServedExport& operator=(ServedExport&& o) noexcept;
  ServedExport(const ServedExport&) = delete;
  ServedExport& operator=(const ServedExport&) = delete;

  explicit operator bool() const { return registry_ != nullptr; }
  const std::string& name() const { return name_; }

  // ExportRegistry::Finish of the name (kNotFound for an empty owner).
  Result<ExportEntry> Finish();
  void Forget();
  void ForgetIfWriting();

 private:
  ExportRegistry* registry_ = nullptr;
  std::string name_;
};

}  // namespace lockstep
