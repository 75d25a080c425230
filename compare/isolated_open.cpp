// ExportReader::Open() in a forked child (export_reader.h, "Isolation"): the parent prepares
// everything (the file's descriptor, a spill file, the pipe, the memory limit) before fork(); the
// child parses with libhdf5, decompresses the chunked items into the spill file and writes one
// message (isolated_wire.h); the parent waits for it against a deadline, checks every received
// offset itself and from then on reads with pread() only. The parent never calls libhdf5 here:
// tests/compare/h5_parent_trap.cpp aborts the process if it does.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "export_index.h"
#include "h5_bounded.h"
#include "isolated_wire.h"

namespace lockstep {
namespace {

constexpr int kOomExit = 86;       // the child's new_handler: operator new failed under the limit
constexpr int kNoResultExit = 87;  // the child could not write its result
constexpr std::int64_t kSpillBlock = std::int64_t{16} << 20;  // bytes per decompressed block

enum class Fault { kNone, kCrash, kHang, kOom };

// Test-only (export_reader.h): LOCKSTEP_TEST_ISOLATE_FAULT=crash|hang|oom.
Fault PlantedFault() {
  const char* f = std::getenv("LOCKSTEP_TEST_ISOLATE_FAULT");
  if (f == nullptr) return Fault::kNone;
  const std::string v = f;
  return v == "crash"  ? Fault::kCrash
         : v == "hang" ? Fault::kHang
         : v == "oom"  ? Fault::kOom
                       : Fault::kNone;
}

bool WriteAll(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<std::size_t>(n);
  }
  return true;
}

bool PwriteAll(int fd, const char* p, std::size_t n, off_t off) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
    off += w;
  }
  return true;
}

// An unlinked file for the rows the child decompresses: O_TMPFILE in $TMPDIR (or /tmp), else
// memory (memfd). Never named, so nothing is left behind whatever happens.
int OpenSpill() {
  const char* dir = std::getenv("TMPDIR");
  int fd = ::open(dir != nullptr && *dir != 0 ? dir : "/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) fd = ::memfd_create("lockstep-isolate-spill", MFD_CLOEXEC);
  return fd;
}

// Address space of this process now (bytes): the child's limit is this plus its budget.
std::int64_t AddressSpaceBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  unsigned long long pages = 0;
  if (f != nullptr) {
    if (std::fscanf(f, "%llu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return static_cast<std::int64_t>(pages) * ::sysconf(_SC_PAGESIZE);
}

[[noreturn]] void OomExit() { ::_exit(kOomExit); }

// Every chunked / compressed / unallocated dataset, read through libhdf5 into the spill file;
// refused before a byte is written when their rows in all pass the limits' spill bound.
Status Spill(ExportReader::Impl* impl, const ReaderLimits& limits) {
  std::int64_t need = 0;
  for (const auto& [key, il] : impl->locs)
    for (const Loc* loc : {&il.data, &il.scale})
      if (!loc->path.empty() && loc->offset < 0) need += loc->rows * loc->row_bytes;
  const std::int64_t file_bytes = impl->meta.file_bytes;
  const std::int64_t bound = limits.spill_factor * file_bytes + limits.spill_slack_bytes;
  if (need > bound)
    return Status::InvalidArgument(
        impl->file_path,
        fmt::format("its chunked items claim {} bytes of rows, more than the spill bound of {} "
                    "bytes ({}x the file's {} bytes + {}): refused before decompressing",
                    need, bound, limits.spill_factor, file_bytes, limits.spill_slack_bytes));
  std::vector<char> buf;
  for (auto& [key, il] : impl->locs) {
    for (Loc* loc : {&il.data, &il.scale}) {
      if (loc->path.empty() || loc->offset >= 0) continue;
      const std::int64_t per =
          std::max<std::int64_t>(1, kSpillBlock / std::max<std::int64_t>(1, loc->row_bytes));
      for (std::int64_t r0 = 0; r0 < loc->rows; r0 += per) {
        const std::int64_t n = std::min(per, loc->rows - r0);
        buf.resize(static_cast<std::size_t>(n * loc->row_bytes));
        LOCKSTEP_RETURN_IF_ERROR(impl->Read(*loc, r0, n, buf.data()));
        if (!PwriteAll(impl->spill_fd, buf.data(), buf.size(),
                       static_cast<off_t>(impl->spill_bytes + r0 * loc->row_bytes)))
          return Status::IOError(impl->file_path,
                                 std::string("writing the spill file: ") + std::strerror(errno));
      }
      loc->offset = impl->spill_bytes;
      loc->spilled = true;
      impl->spill_bytes += loc->rows * loc->row_bytes;
    }
  }
  return Status::Ok();
}

struct ChildArgs {
  std::string path;
  ReaderLimits limits;
  int file_fd, spill_fd, out_fd;
  struct stat st;
  pid_t parent;
  std::int64_t as_limit;
  Fault fault;
};

[[noreturn]] void Child(const ChildArgs& a) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != a.parent) ::_exit(kNoResultExit);
  // A crash is the child's death by its signal, not a handler inherited from the caller.
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTERM}) std::signal(sig, SIG_DFL);
  const rlimit no_core{0, 0};  // a parser crash on a damaged file leaves no core file behind
  ::setrlimit(RLIMIT_CORE, &no_core);
  if (a.as_limit > 0) {
    const rlimit rl{static_cast<rlim_t>(a.as_limit), static_cast<rlim_t>(a.as_limit)};
    ::setrlimit(RLIMIT_AS, &rl);
  }
  std::set_new_handler(OomExit);
  if (a.fault == Fault::kCrash) std::raise(SIGSEGV);
  if (a.fault == Fault::kHang)
    for (;;) ::pause();
  if (a.fault == Fault::kOom) {
    static volatile char* sink = nullptr;
    for (;;) {
      sink = new char[std::size_t{64} << 20];
      sink[0] = 1;
    }
  }
  ReaderLimits in = a.limits;
  in.isolate = false;
  // Never freed, and libhdf5's file never closed: this process only exits (its teardown is the
  // kernel's, after the parent has its answer).
  auto opened = OpenInProcess(a.path, in, /*close_hdf5=*/false);
  Status s = opened.ok() ? Status::Ok() : opened.status();
  ExportReader::Impl* impl = opened.ok() ? std::move(opened).value().release() : nullptr;
  struct stat mine;
  if (s.ok() &&
      (::fstat(impl->fd, &mine) != 0 || mine.st_dev != a.st.st_dev || mine.st_ino != a.st.st_ino))
    s = Status::IOError(a.path, "the file changed while it was being opened");
  if (s.ok()) {
    impl->spill_fd = a.spill_fd;
    s = Spill(impl, a.limits);
  }
  const std::string wire = EncodeOpenResult(s, s.ok() ? impl : nullptr);
  const bool sent = WriteAll(a.out_fd, wire);
  ::close(a.out_fd);  // the parent's end-of-file now, not after this process's teardown
  ::_exit(sent ? 0 : kNoResultExit);
}

constexpr const char* kTail = "the file is damaged or not a lockstep export";

using Clock = std::chrono::steady_clock;

// Reads the child's message to end-of-file; false at the deadline or on a read error.
bool ReadToEof(int fd, Clock::time_point deadline, std::string* wire, bool* timed_out) {
  char buf[65536];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      *timed_out = true;
      return false;
    }
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count() + 1, 1000)));
    if (r < 0 && errno != EINTR) return false;
    if (r <= 0) continue;
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) return true;
    wire->append(buf, static_cast<std::size_t>(n));
  }
}

// Children that delivered their result and were still exiting: reaped at a later open (a zombie
// holds no memory). Not waiting for them keeps a large caller's open fast: the child closes its
// pipe first, and the kernel's teardown of its copy of the address space takes ~15 ms per GiB.
std::mutex g_exiting_mu;
std::vector<pid_t> g_exiting;
std::mutex g_fork_mu;  // OpenIsolated's pipe + fork + close of the write end (see there)

void ReapLater(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, WNOHANG) == pid) return;
  std::lock_guard<std::mutex> lock(g_exiting_mu);
  g_exiting.push_back(pid);
}

void ReapExited() {
  std::lock_guard<std::mutex> lock(g_exiting_mu);
  std::erase_if(g_exiting, [](pid_t pid) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    return r == pid || (r < 0 && errno == ECHILD);
  });
}

// A child that gave no usable result: reaped (killed at the deadline) and what ended it said;
// *clean: it exited 0 (its message was then what went wrong).
Status Classify(pid_t pid, Clock::time_point deadline, bool timed_out, const std::string& file,
                const ReaderLimits& limits, bool* clean) {
  int status = 0;
  *clean = false;
  for (;;) {
    if (timed_out) ::kill(pid, SIGKILL);
    const pid_t r = ::waitpid(pid, &status, timed_out ? 0 : WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR)
      return Status::Runtime(file, std::string("waitpid: ") + std::strerror(errno));
    if (r == 0 && Clock::now() >= deadline) timed_out = true;
    if (r == 0 && !timed_out) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (timed_out)
    return Status::InvalidArgument(
        file, fmt::format("the HDF5 library did not finish reading its metadata within {:g} s "
                          "(--isolate-timeout): {}",
                          limits.isolate_timeout_s, kTail));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return Status::InvalidArgument(
        file, fmt::format("the HDF5 library crashed while reading its metadata (signal {}: {}): {}",
                          sig, strsignal(sig), kTail));
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  *clean = code == 0;
  if (code == kOomExit)
    return Status::InvalidArgument(
        file, fmt::format("the HDF5 library ran out of memory reading its metadata (limit {} MiB "
                          "for the isolated reader): {}",
                          limits.isolate_memory_bytes >> 20, kTail));
  return Status::InvalidArgument(
      file, fmt::format("the isolated HDF5 reader ended without a result (exit code {}): {}", code,
                        kTail));
}

// What the parent checks itself before trusting the child's index: every item has a location
// whose shape and row size match it, inside the file (or the spill file); enums are known values.
Status CheckIndex(const ExportReader::Impl& impl, std::int64_t file_bytes) {
  const std::string& file = impl.file_path;
  const Status bad = Status::InvalidArgument(
      file, std::string("the isolated HDF5 reader sent an inconsistent item index: ") + kTail);
  if (impl.meta.file_bytes != file_bytes || impl.spill_bytes < 0) return bad;
  auto within = [](const Loc& l, std::int64_t limit) {
    if (l.offset < 0 || l.rows < 0 || l.row_bytes < 0) return false;
    if (l.rows != 0 && l.row_bytes > limit / l.rows) return false;
    return l.offset <= limit && l.rows * l.row_bytes <= limit - l.offset;
  };
  std::size_t n = 0;
  for (const ExportCheckpoint& cp : impl.meta.checkpoints) {
    if (ParseCheckpointPoint(CheckpointPointName(cp.point)) != cp.point) return bad;
    for (const ExportItem& it : cp.items) {
      ++n;
      const ExportReader::Impl::ItemLoc* il = impl.Find(cp, it);
      if (il == nullptr || it.shape.empty() || it.shape.size() > 8 ||
          ParseItemKind(ItemKindName(it.kind)) != it.kind ||
          (it.dtype != DType::kF32 && it.dtype != DType::kBF16 && it.dtype != DType::kI8 &&
           it.dtype != DType::kU8))
        return bad;
      std::int64_t elems = 1;
      for (std::size_t d = 1; d < it.shape.size(); ++d) {
        if (it.shape[d] < 0 || (it.shape[d] != 0 && elems > (std::int64_t{1} << 40) / it.shape[d]))
          return bad;
        elems *= it.shape[d];
      }
      const Loc& d = il->data;
      const std::int64_t limit = d.spilled ? impl.spill_bytes : file_bytes;
      if (d.rows != it.shape[0] ||
          (d.rows > 0 && d.row_bytes != elems * static_cast<std::int64_t>(it.elem_bytes())) ||
          !within(d, limit))
        return bad;
      if (it.has_scales) {
        const Loc& s = il->scale;
        if (s.path.empty() || s.rows != it.shape[0] || it.scale_row_elems < 0 ||
            (s.rows > 0 && s.row_bytes != it.scale_row_elems * 4) ||
            !within(s, s.spilled ? impl.spill_bytes : file_bytes))
          return bad;
      } else if (!il->scale.path.empty()) {
        return bad;
      }
    }
  }
  return n == impl.locs.size() ? Status::Ok() : bad;
}

}  // namespace

Result<std::unique_ptr<ExportReader::Impl>> OpenIsolated(const std::string& path,
                                                         const ReaderLimits& limits) {
  ReapExited();
  auto impl = std::make_unique<ExportReader::Impl>();
  impl->limits = limits;
  impl->file_path = path;
  // What an in-process Open() says first is said here without libhdf5 (same messages).
  struct stat st;
  LOCKSTEP_RETURN_IF_ERROR(OpenExportFile(path, *impl, &st));
  ChildArgs a{path, limits, impl->fd, -1, -1, st, ::getpid(), 0, PlantedFault()};
  impl->spill_fd = OpenSpill();
  if (impl->spill_fd < 0)
    return Status::Runtime(path, std::string("cannot create the isolated reader's spill file: ") +
                                     std::strerror(errno));
  a.spill_fd = impl->spill_fd;
  const std::int64_t start = AddressSpaceBytes();
  a.as_limit =
      start > 0 && limits.isolate_memory_bytes > 0 ? start + limits.isolate_memory_bytes : 0;
  int fds[2];
  pid_t pid = -1;
  {
    // Opens on several threads at once (the two sides of a diff) fork one at a time, and each
    // parent closes its write end before the next fork: otherwise another child could inherit a
    // pending write end and hold that pipe's end-of-file back until it exits itself.
    std::lock_guard<std::mutex> lock(g_fork_mu);
    if (::pipe2(fds, O_CLOEXEC) != 0)
      return Status::Runtime(path,
                             std::string("pipe for the isolated reader: ") + std::strerror(errno));
    a.out_fd = fds[1];
    pid = ::fork();
    if (pid < 0) {
      const int e = errno;
      ::close(fds[0]);
      ::close(fds[1]);
      return Status::Runtime(path, std::string("fork of the isolated reader: ") + std::strerror(e));
    }
    if (pid == 0) {
      ::close(fds[0]);
      Child(a);
    }
    ::close(fds[1]);
  }
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(std::max(0.001, limits.isolate_timeout_s)));
  std::string wire;
  bool timed_out = false;
  const bool eof = ReadToEof(fds[0], deadline, &wire, &timed_out);
  ::close(fds[0]);
  // A whole, well-formed message is the child's answer whatever happens to it afterwards; any
  // other outcome is said by how the child ended.
  bool garbled = false;
  Status s = eof ? DecodeOpenResult(wire, path, impl.get(), &garbled) : Status::Ok();
  if (!eof || garbled) {
    bool clean = false;
    const Status ended = Classify(pid, deadline, timed_out, path, limits, &clean);
    return eof && clean ? s : ended;
  }
  ReapLater(pid);
  LOCKSTEP_RETURN_IF_ERROR(s);
  LOCKSTEP_RETURN_IF_ERROR(CheckIndex(*impl, static_cast<std::int64_t>(a.st.st_size)));
  if (impl->spill_bytes == 0) {
    ::close(impl->spill_fd);
    impl->spill_fd = -1;
  }
  return impl;
}

}  // namespace lockstep
