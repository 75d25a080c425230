// Every fork of lockstep: RunChild (fork + exec of a campaign arm) and RunIsolated (fork only, a
// function run in a copy of this process). The contracts are in process.h; here, why.
#include "lockstep/harness/process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace lockstep {
namespace {

// The pipe of RunIsolated, to its end: EINTR is retried, any other error is a failed transfer.
bool ReadAll(int fd, std::string* s) {
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n == 0) return true;
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    s->append(buf, static_cast<std::size_t>(n));
  }
}

bool WriteAll(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    off += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

Result<ChildResult> RunChild(const ChildSpec& spec, const std::function<void()>& tick) {
  if (spec.argv.empty()) return Status::InvalidArgument("child process", "empty command");
  // Everything the child needs is prepared before fork(): after it only async-signal-safe calls.
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int out_fd =
      ::open(spec.stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out_fd < 0) return Status::IOError("'" + spec.stdout_path + "'", std::strerror(errno));
  const int err_fd =
      ::open(spec.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (err_fd < 0) {
    ::close(out_fd);
    return Status::IOError("'" + spec.stderr_path + "'", std::strerror(errno));
  }
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out_fd);
    ::close(err_fd);
    return Status::Runtime("fork", std::strerror(errno));
  }
  if (pid == 0) {
    // The arm dies with the runner: a killed runner must not leave an orphan writing into the
    // arm's folder while the resumed runner sends the arm again.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    const char msg[] = "lockstep: exec of the arm's command failed\n";
    [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  ::close(out_fd);
  ::close(err_fd);
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, tick ? WNOHANG : 0);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return Status::Runtime("waitpid", std::strerror(errno));
    if (r == 0) {
      tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  ChildResult res;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (WIFSIGNALED(status)) {
    res.signal = WTERMSIG(status);
  } else if (WIFEXITED(status)) {
    res.exit_code = WEXITSTATUS(status);
  }
  return res;
}

Result<std::string> SelfExecutable() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return Status::Runtime("/proc/self/exe", std::strerror(errno));
  return std::string(buf, static_cast<std::size_t>(n));
}

Status RunIsolated(const std::string& what, const std::function<Status(std::ostream&)>& fn,
                   std::ostream& out) {
  int fds[2];
  if (::pipe(fds) != 0) return Status::Runtime("--isolate", std::strerror(errno));
  std::fflush(nullptr);  // or buffered stdio output would be written twice, once by the child
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return Status::Runtime("--isolate", std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::close(fds[0]);
    std::ostringstream text;
    Status s = fn(text);
    // Message layout: "<code>\n<message length>\n<message><captured output>".
    const std::string msg = s.ok() ? "" : s.message();
    const std::string wire = std::to_string(static_cast<int>(s.code())) + "\n" +
                             std::to_string(msg.size()) + "\n" + msg + text.str();
    const bool ok = WriteAll(fds[1], wire);
    ::close(fds[1]);
    std::fflush(nullptr);
    ::_exit(ok ? 0 : 70);
  }
  ::close(fds[1]);
  // Read to EOF before reaping: a child whose result is larger than the pipe's buffer blocks in
  // its write until we read.
  std::string wire;
  const bool read_ok = ReadAll(fds[0], &wire);
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return Status::InvalidArgument(
        what, fmt::format("the parser crashed in the isolated child process (signal {}: {}); "
                          "the file is malformed or triggers a bug in the HDF5 library",
                          sig, strsignal(sig)));
  }
  if (!read_ok || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return Status::Runtime(what, "the isolated child process failed without a result");
  // Parse "<code>\n<len>\n<msg><text>".
  const std::size_t nl1 = wire.find('\n');
  const std::size_t nl2 = nl1 == std::string::npos ? std::string::npos : wire.find('\n', nl1 + 1);
  if (nl2 == std::string::npos)
    return Status::Runtime(what, "garbled result from the isolated child process");
  const int code = std::atoi(wire.substr(0, nl1).c_str());
  const std::size_t len = static_cast<std::size_t>(
      std::strtoull(wire.substr(nl1 + 1, nl2 - nl1 - 1).c_str(), nullptr, 10));
  if (nl2 + 1 + len > wire.size() || code < 0 || code > static_cast<int>(Status::Code::kGateFailed))
    return Status::Runtime(what, "garbled result from the isolated child process");
  out << wire.substr(nl2 + 1 + len);
  return Status::FromCode(static_cast<Status::Code>(code), wire.substr(nl2 + 1, len));
}

}  // namespace lockstep
