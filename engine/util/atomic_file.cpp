#include "lockstep/engine/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <system_error>
#include <utility>

#include "lockstep/engine/errno_text.h"

namespace lockstep {
namespace {

// Writes all of `bytes` to `fd`, retrying partial writes and EINTR. Returns 0 or an errno.
int WriteAll(int fd, const std::byte* p, std::size_t n) {
  // Linux writes at most 0x7ffff000 bytes per call; asking for less keeps every call simple.
  constexpr std::size_t kMaxChunk = std::size_t{1} << 30;
  while (n > 0) {
    const std::size_t want = n < kMaxChunk ? n : kMaxChunk;
    const ssize_t w = ::write(fd, p, want);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;  // a regular file never returns 0 for a non-empty write
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return 0;
}

}  // namespace

std::string ParentDir(const std::string& path) {
  std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? std::string(".") : parent;
}

int FsyncDir(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return errno;
  int err = 0;
  if (::fsync(dfd) != 0 && errno != EINVAL) err = errno;
  ::close(dfd);
  return err;
}

// ---- AtomicFileWriter ----

Status CheckOutputFolder(const std::string& path, std::string_view what) {
  const std::string dir = ParentDir(path);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 && (errno == ENOENT || errno == ENOTDIR))
    return Status::InvalidArgument(fmt::format("{} '{}'", what, path),
                                   fmt::format("the folder '{}' does not exist ({}); create it "
                                               "first",
                                               dir, ErrnoText(ENOENT)));
  if (::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    return Status::InvalidArgument(fmt::format("{} '{}'", what, path),
                                   fmt::format("'{}' is not a folder", dir));
  return Status::Ok();
}

Result<AtomicFileWriter> AtomicFileWriter::Create(const std::string& path) {
  // A missing folder is the caller's input, not a failure of the write (exit 2, not 3).
  LOCKSTEP_RETURN_IF_ERROR(CheckOutputFolder(path, "writing"));
  AtomicFileWriter w;
  w.path_ = path;
  w.temp_path_ = fmt::format("{}.tmp.{}", path, ::getpid());
  w.fd_ = ::open(w.temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w.fd_ < 0) {
    const int err = errno;
    return Status::IOError(
        fmt::format("writing '{}'", path),
        fmt::format("cannot create temporary file '{}': {} (hint: does the folder '{}' exist and "
                    "is it writable?)",
                    w.temp_path_, ErrnoText(err), ParentDir(path)));
  }
  w.owns_temp_ = true;
  return w;
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)),
      fd_(std::exchange(other.fd_, -1)),
      bytes_written_(other.bytes_written_),
      failed_(other.failed_),
      owns_temp_(std::exchange(other.owns_temp_, false)) {}  // moved-from owns nothing

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    path_ = std::move(other.path_);
    temp_path_ = std::move(other.temp_path_);
    fd_ = std::exchange(other.fd_, -1);
    bytes_written_ = other.bytes_written_;
    failed_ = other.failed_;
    owns_temp_ = std::exchange(other.owns_temp_, false);
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() { Abandon(); }

void AtomicFileWriter::Abandon() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (owns_temp_) {
    ::unlink(temp_path_.c_str());  // best effort: nothing useful to do if this fails
    owns_temp_ = false;
  }
}

Status AtomicFileWriter::Append(std::span<const std::byte> bytes) {
  if (fd_ < 0 || failed_) {
    return Status::IOError(fmt::format("writing '{}'", path_),
                           "append after the writer failed, was committed or was moved from");
  }
  if (const int err = WriteAll(fd_, bytes.data(), bytes.size()); err != 0) {
    failed_ = true;
    return Status::IOError(fmt::format("writing '{}'", path_),
                           fmt::format("write to '{}' failed after {} bytes: {} (hint: is the "
                                       "disk full?)",
                                       temp_path_, bytes_written_, ErrnoText(err)));
  }
  bytes_written_ += bytes.size();
  return Status::Ok();
}

Status AtomicFileWriter::Append(std::string_view text) {
  return Append(std::as_bytes(std::span<const char>(text.data(), text.size())));
}

Status AtomicFileWriter::Commit() {
  const std::string what = fmt::format("writing '{}'", path_);
  if (fd_ < 0 || failed_) {
    return Status::IOError(what, "commit after the writer failed, was committed or was moved from");
  }
  // Data must be on disk before the rename makes it visible, or a crash could publish a file
  // whose blocks were never written.
  if (::fsync(fd_) != 0) {
    const int err = errno;
    failed_ = true;
    return Status::IOError(what, fmt::format("fsync of '{}': {}", temp_path_, ErrnoText(err)));
  }
  const int close_rc = ::close(fd_);
  fd_ = -1;
  if (close_rc != 0) {
    const int err = errno;
    failed_ = true;
    return Status::IOError(what, fmt::format("close of '{}': {}", temp_path_, ErrnoText(err)));
  }
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    failed_ = true;
    return Status::IOError(
        what, fmt::format("rename '{}' -> '{}': {}", temp_path_, path_, ErrnoText(err)));
  }
  owns_temp_ = false;  // the temporary no longer exists under its name
  if (const int err = FsyncDir(ParentDir(path_)); err != 0) {
    return Status::IOError(
        what, fmt::format("fsync of folder '{}': {}", ParentDir(path_), ErrnoText(err)));
  }
  return Status::Ok();
}

// ---- whole-buffer helpers ----

Status WriteFileAtomic(const std::string& path, std::span<const std::byte> bytes) {
  LOCKSTEP_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Create(path));
  LOCKSTEP_RETURN_IF_ERROR(w.Append(bytes));
  return w.Commit();
}

Status WriteFileAtomic(const std::string& path, std::string_view text) {
  return WriteFileAtomic(path, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

Result<std::string> ReadFile(const std::string& path, std::size_t max_bytes) {
  const std::string what = fmt::format("reading '{}'", path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(fmt::format("file '{}'", path), "does not exist");
    return Status::IOError(what, ErrnoText(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::IOError(what, fmt::format("fstat: {}", ErrnoText(err)));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return Status::IOError(what, "is a folder, expected a file");
  }
  const auto too_big = [&](std::uint64_t n) {
    return Status::InvalidArgument(
        what,
        fmt::format("file is {} bytes or more, larger than the limit of {} bytes", n, max_bytes));
  };
  const auto st_size = static_cast<std::uint64_t>(st.st_size > 0 ? st.st_size : 0);
  if (st_size > max_bytes) {
    ::close(fd);
    return too_big(st_size);
  }

  // Read until EOF rather than trusting st_size: the file may be growing, or (pipes, /proc)
  // report a size of 0.
  std::string out;
  out.resize(static_cast<std::size_t>(st_size) + 1);  // +1 so EOF is seen without a resize
  std::size_t got = 0;
  for (;;) {
    if (got == out.size()) {
      if (got > max_bytes) {
        ::close(fd);
        return too_big(got);
      }
      // Grow geometrically, but never past max_bytes + 1 (enough to detect "too big").
      const std::size_t cap = max_bytes < SIZE_MAX ? max_bytes + 1 : max_bytes;
      std::size_t grown = out.size() < 2048 ? 4096 : out.size() * 2;
      out.resize(grown < cap ? grown : cap);
    }
    const ssize_t r = ::read(fd, out.data() + got, out.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return Status::IOError(what, ErrnoText(err));
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  ::close(fd);
  if (got > max_bytes) return too_big(got);
  out.resize(got);
  return out;
}

}  // namespace lockstep
