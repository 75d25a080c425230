// Crash-safe file writing: write to a temporary file in the same folder, fsync it, rename it
// over the destination, fsync the folder. A reader never sees a half-written file; a killed
// writer leaves at most the temporary (named `<path>.tmp.<pid>`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "lockstep/engine/status.h"

namespace lockstep {

// ---- streaming writer ----

// Writes one file atomically in pieces, for outputs too large to build in memory (safetensors
// checkpoints of hundreds of MB):
//
//   LOCKSTEP_ASSIGN_OR_RETURN(auto w, AtomicFileWriter::Create(path));
//   LOCKSTEP_RETURN_IF_ERROR(w.Append(header));
//   LOCKSTEP_RETURN_IF_ERROR(w.Append(data));
//   LOCKSTEP_RETURN_IF_ERROR(w.Commit());
//
// Create() opens `<path>.tmp.<pid>` (created or truncated, mode 0644 before umask) in the same
// folder as `path`. Append() writes with a loop of write() calls (partial writes and EINTR are
// retried). Commit() fsyncs and closes the temporary, renames it over `path` and fsyncs the
// folder; only then can a reader see the new content. If the writer is destroyed without a
// successful Commit() (an error, an early return), the destructor closes and unlinks the
// temporary, so `path` keeps its old content (or stays absent).
//
// Errors: the folder is missing (Create: kInvalidArgument, exit 2: the path is the caller's
// input); otherwise kIOError naming the path and the errno text: the folder is not writable
// (Create), the disk is full (Append), fsync / rename failures (Commit). After a failed
// Append() the writer is poisoned: Commit() returns an error and the temporary is removed.
//
// Move-only. Not thread-safe: one thread uses a writer at a time. Two writers for the same path
// in one process would share the temporary name; callers serialise writes to one path.
class AtomicFileWriter {
 public:
  static Result<AtomicFileWriter> Create(const std::string& path);

  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  // Removes the temporary unless Commit() succeeded.
  ~AtomicFileWriter();

  // Appends `bytes` to the temporary. Error: kIOError (the writer is then poisoned).
  Status Append(std::span<const std::byte> bytes);
  Status Append(std::string_view text);
  // Publishes the file (fsync, rename, fsync folder). Calling it twice, or after a failed
  // Append(), is an error (kIOError).
  Status Commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }
  std::uint64_t bytes_written() const { return bytes_written_; }  // bytes appended so far

 private:
  AtomicFileWriter() = default;
  void Abandon();  // close fd_ and unlink the temporary if we still own it

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  std::uint64_t bytes_written_ = 0;
  bool failed_ = false;     // an Append/Commit step failed; Commit() refuses
  bool owns_temp_ = false;  // temp_path_ exists and is ours to unlink
};

// ---- whole-buffer helpers ----

// kInvalidArgument naming `what` ("--trace-json") and `path` when the folder `path` would be
// written in does not exist or is not a folder (bad input, exit 2); Ok otherwise. Commands call it
// for their output paths before doing any work.
Status CheckOutputFolder(const std::string& path, std::string_view what);

// Replaces `path` with `bytes` atomically (an AtomicFileWriter with one Append). Errors:
// kInvalidArgument for a missing folder (CheckOutputFolder), else kIOError naming the path and
// errno text; on error `path` is unchanged and no temporary is left behind.
Status WriteFileAtomic(const std::string& path, std::span<const std::byte> bytes);
Status WriteFileAtomic(const std::string& path, std::string_view text);

// Reads a whole file. Errors: kNotFound (ENOENT), kIOError (anything else, e.g. a folder or
// permission denied). `max_bytes` guards against absurd sizes (kInvalidArgument when the file
// is larger). Works on files whose size stat() does not know (pipes, /proc).
// Thread-safe (no shared state).
Result<std::string> ReadFile(const std::string& path, std::size_t max_bytes = std::size_t{1} << 30);

// The folder holding `path` ("." for a bare file name).
std::string ParentDir(const std::string& path);
// fsync()s folder `dir` so that entries created or renamed in it are durable. Returns 0 or an
// errno; EINVAL (filesystems that cannot fsync a folder: nothing more could be done) counts as 0.
int FsyncDir(const std::string& dir);

}  // namespace lockstep
