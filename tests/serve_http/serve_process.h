// A real `lockstep serve` for the HTTP tests: started on 127.0.0.1 with --port 0 (the bound port
// is read from its first stdout line), killed with SIGKILL by the destructor unless it has
// already exited; stderr goes to a file the test can read (the server's log).
#pragma once

#include <sys/types.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace httplib {
class Client;
}

namespace lockstep::test {

class ServeProcess {
 public:
  // `args`: everything after `lockstep serve` (model, flags). Waits (up to 30 s) for the port
  // line and then for GET /health to answer 200. `exe`: another lockstep executable ("" the
  // built one).
  explicit ServeProcess(const std::vector<std::string>& args, bool wait_ready = true,
                        const std::string& exe = "");
  ~ServeProcess();
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  bool started() const { return port_ > 0; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  // A new client for this server (timeouts of 60 s; `key` adds the bearer header).
  std::unique_ptr<httplib::Client> Client(const std::string& key = "") const;
  void Signal(int sig) const;
  // Waits up to `timeout_s` for the process to exit; its exit code, 128 + signal, or -1.
  int Wait(double timeout_s);
  std::string Log() const;  // the server's stderr so far

 private:
  pid_t pid_ = -1;
  int port_ = -1;
  bool reaped_ = false;
  std::string log_path_;
};

// The exit code of `lockstep serve <args>` when it exits by itself within `timeout_s` (a refused
// configuration), its stderr in `err`; -1 when it kept running (then it is killed).
int ServeExitCode(const std::vector<std::string>& args, double timeout_s, std::string* err);

// Sends `bytes` on a fresh loopback connection, then reads until the server closes or
// `timeout_s` passes; returns what was read ("" when the server closed without answering).
std::string RawExchange(int port, const std::string& bytes, double timeout_s);

// One raw loopback connection held open by the test (a streaming client that can vanish).
class RawStream {
 public:
  RawStream(int port, const std::string& bytes);  // connects and sends
  ~RawStream();                                   // Close()
  RawStream(const RawStream&) = delete;
  RawStream& operator=(const RawStream&) = delete;
  // Reads until what was read contains `needle` (true) or `timeout_s` passes / the server closes.
  bool ReadUntil(const std::string& needle, double timeout_s);
  // Reads until the server closes or `timeout_s` passes.
  void ReadAll(double timeout_s);
  void Close();  // the client goes away (RST if the server still writes)
  const std::string& data() const { return data_; }

 private:
  int fd_ = -1;
  std::string data_;
};

// A JSON request's answer: the status (-1 when no response came) and the body parsed (a discarded
// value when it is not JSON).
struct Answer {
  int status = -1;
  nlohmann::json body;
};
// POST `body` as JSON to `path` on `cli`.
Answer Post(httplib::Client& cli, const std::string& path, const nlohmann::json& body);

// `POST /v1/completions` with `body` as raw bytes (Connection: close).
std::string CompletionRequestBytes(const std::string& body, const std::string& key = "");

// The status code of a raw HTTP response ("HTTP/1.1 413 ..."), -1 when there is none.
int RawStatus(const std::string& response);

}  // namespace lockstep::test
