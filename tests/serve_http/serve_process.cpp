#include "serve_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "test_util.h"

namespace lockstep::test {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Starts `lockstep serve args...` with stdout on a pipe (returned) and stderr on `log`.
pid_t Spawn(const std::string& exe, const std::vector<std::string>& args, const std::string& log,
            int* out_fd) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    const int err = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err >= 0) ::dup2(err, 2);
    ::close(fds[0]);
    std::vector<std::string> argv_s = {exe.empty() ? std::string(LOCKSTEP_BIN_PATH) : exe, "serve"};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  *out_fd = fds[0];
  return pid;
}

// The port of "lockstep serve: listening on http://HOST:PORT", read from `fd` within `timeout_s`.
int ReadPort(int fd, double timeout_s) {
  std::string line;
  const auto t0 = Clock::now();
  while (Since(t0) < timeout_s) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char c;
    if (::read(fd, &c, 1) != 1) return -1;
    if (c == '\n') break;
    line += c;
  }
  const auto colon = line.rfind(':');
  if (line.find("listening on") == std::string::npos || colon == std::string::npos) return -1;
  return std::atoi(line.c_str() + colon + 1);
}

}  // namespace

ServeProcess::ServeProcess(const std::vector<std::string>& args, bool wait_ready,
                           const std::string& exe) {
  log_path_ = NewDir("serve") + "/stderr.log";
  int out_fd = -1;
  pid_ = Spawn(exe, args, log_path_, &out_fd);
  if (pid_ < 0) return;
  port_ = ReadPort(out_fd, 30);
  ::close(out_fd);
  if (port_ <= 0 || !wait_ready) return;
  auto cli = Client();
  const auto t0 = Clock::now();
  while (Since(t0) < 30) {
    auto r = cli->Get("/health");
    if (r && r->status == 200) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  port_ = -1;
}

ServeProcess::~ServeProcess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
  }
}

std::unique_ptr<httplib::Client> ServeProcess::Client(const std::string& key) const {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
  c->set_read_timeout(60, 0);
  c->set_write_timeout(60, 0);
  c->set_connection_timeout(5, 0);
  if (!key.empty()) c->set_bearer_token_auth(key);
  return c;
}

void ServeProcess::Signal(int sig) const {
  if (pid_ > 0 && !reaped_) ::kill(pid_, sig);
}

int ServeProcess::Wait(double timeout_s) {
  const auto t0 = Clock::now();
  while (!reaped_ && Since(t0) < timeout_s) {
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      reaped_ = true;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

std::string ServeProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int ServeExitCode(const std::vector<std::string>& args, double timeout_s, std::string* err) {
  const std::string log = NewDir("serve-exit") + "/stderr.log";
  int out_fd = -1;
  const pid_t pid = Spawn("", args, log, &out_fd);
  ::close(out_fd);
  const auto t0 = Clock::now();
  int code = -1;
  while (Since(t0) < timeout_s) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) {
      code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (code < 0) {
    ::kill(pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
  }
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  if (err) *err = ss.str();
  return code;
}

RawStream::RawStream(int port, const std::string& bytes) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    Close();
    return;
  }
  std::size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server answered early and closed (413)
    off += static_cast<std::size_t>(n);
  }
}

RawStream::~RawStream() { Close(); }

void RawStream::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool RawStream::ReadUntil(const std::string& needle, double timeout_s) {
  const auto t0 = Clock::now();
  while (fd_ >= 0 && Since(t0) < timeout_s) {
    if (!needle.empty() && data_.find(needle) != std::string::npos) return true;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) break;
    data_.append(buf, static_cast<std::size_t>(n));
  }
  return !needle.empty() && data_.find(needle) != std::string::npos;
}

void RawStream::ReadAll(double timeout_s) { ReadUntil("", timeout_s); }

std::string RawExchange(int port, const std::string& bytes, double timeout_s) {
  RawStream s(port, bytes);
  s.ReadAll(timeout_s);
  return s.data();
}

std::string CompletionRequestBytes(const std::string& body, const std::string& key) {
  std::string r = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!key.empty()) r += "Authorization: Bearer " + key + "\r\n";
  r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
       "\r\n\r\n" + body;
  return r;
}

int RawStatus(const std::string& response) {
  if (response.rfind("HTTP/1.", 0) != 0 || response.size() < 12) return -1;
  return std::atoi(response.c_str() + 9);
}

Answer Post(httplib::Client& cli, const std::string& path, const nlohmann::json& body) {
  auto res = cli.Post(path.c_str(), body.dump(), "application/json");
  if (!res) return {};
  return {res->status, nlohmann::json::parse(res->body, nullptr, false)};
}

}  // namespace lockstep::test
