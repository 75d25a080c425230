// SpawnChild / RunChild (fork + exec of a campaign arm or a server). The contract is in process.h;
// here, why.
#include "lockstep/harness/process.h"

#include <fcntl.h>
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
#include <string>
#include <thread>
#include <vector>

namespace lockstep {

Result<pid_t> SpawnChild(const ChildSpec& spec) {
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
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out_fd);
    ::close(err_fd);
    return Status::Runtime("fork", std::strerror(errno));
  }
  if (pid == 0) {
    // The child dies with the runner: a killed runner must not leave an orphan (an arm writing
    // into the folder the resumed runner reuses, a server nobody stops); the getppid check
    // covers a runner killed before prctl ran.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    const char msg[] = "lockstep: exec of the child's command failed\n";
    [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  ::close(out_fd);
  ::close(err_fd);
  return pid;
}

Result<ChildResult> RunChild(const ChildSpec& spec, const std::function<void()>& tick) {
  const auto t0 = std::chrono::steady_clock::now();
  LOCKSTEP_ASSIGN_OR_RETURN(const pid_t pid, SpawnChild(spec));
  int status = 0;
  ChildResult res;
  const bool poll = tick || spec.timeout_s > 0.0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, poll ? WNOHANG : 0);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return Status::Runtime("waitpid", std::strerror(errno));
    if (r == 0) {
      if (tick) tick();
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (spec.timeout_s > 0.0 && elapsed >= spec.timeout_s && !res.timed_out) {
        ::kill(pid, SIGKILL);  // reaped by the next waitpid
        res.timed_out = true;
      }
      // A bounded child (a probe) is polled finely; the progress tick keeps its 200 ms.
      std::this_thread::sleep_for(std::chrono::milliseconds(tick ? 200 : 5));
    }
  }
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

}  // namespace lockstep
