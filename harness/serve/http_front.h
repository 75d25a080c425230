// HttpFront: the public sockets of `lockstep serve` (issue 43, "the HTTP front"). It accepts the
// connections, reads each request's head and body under bounds on one event-driven thread, and
// only then hands the complete request to one of `workers` threads, which relays it to the
// handlers (cpp-httplib, listening on an internal loopback port) and the answer back.
//
// Why a front of our own: Debian's compiled cpp-httplib (0.11.4) reads the head and the body on
// a pool thread with a per-recv timeout only: no limit on the header count or total size (a
// 3,000,000-line head kept ~328 MB), no deadline for the whole head or body (32 dribbling
// clients held every thread and /health timed out; SIGTERM waited 66.7 s for them), chunked
// bodies read whole before --max-body was looked at, and idle keep-alive connections each held a
// thread. None of that has a hook in the compiled library, so the bounded part lives here:
//
//   connection ──accept──> [idle] ──first byte──> [head] ──head parsed──> [body] ──> worker
//        ^                   │ keep-alive_s           │ read_timeout_s        │ deadline
//        └── answered, keep-alive ───────────────────────────────────────────┘
//
// - head: request line <= kMaxRequestLine bytes (else 414), <= kMaxHeaderCount header lines and
//   <= kMaxHeadBytes in all (else 431), the whole head within read_timeout_s of its first byte
//   (else 408); each refusal is answered and the connection closed.
// - body: Content-Length over max_body is 413 before a byte is read; a chunked body is counted
//   as its chunk sizes arrive, 413 as soon as the total would cross max_body (never read
//   whole); the body must arrive within read_timeout_s plus one second per kMinBodyRate bytes
//   (else 408). With an API key, a request with a body is refused (401) before its body is read.
// - connections: at most max_connections; one more evicts the oldest idle keep-alive connection
//   (then the oldest unfinished head), else it is answered 503. Waiting clients hold no thread:
//   a live request always reaches a worker.
// - Stop(grace): closes the listener and every waiting connection at once; answers already being
//   relayed (requests the caller's drain let finish) get up to `grace` to reach their clients,
//   then their connections are shut too, so SIGTERM is bounded whatever the clients do.
//
// The handlers see each request as sent, but always with Content-Length (a chunked body arrives
// decoded), `Connection: close` (the front keeps the client's connection), and three headers of
// the front's own (a client's copies are dropped): X-Lockstep-Front (the per-process token the
// internal server requires), X-Lockstep-Peer (the client's address) and X-Lockstep-Loopback (1
// when that address is a loopback one, decided on the parsed address).
//
// Threading: Bind/Start/Stop from one thread; the callbacks run on the front's threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep {

struct FrontLimits {
  std::size_t max_body = std::size_t{1} << 20;  // bytes of a body (decoded)
  int max_connections = 128;
  int workers = 32;          // requests relayed at once (--http-threads)
  int read_timeout_s = 10;   // the whole head; the body (plus its size at kMinBodyRate)
  int write_timeout_s = 10;  // each write to the client
  int keep_alive_s = 5;      // an idle connection is closed after this long
  int keep_alive_max = 100;  // requests per connection
  std::string api_key;       // "" = none
  // Fixed bounds (the handlers need no more; cpp-httplib's own line limit is 8192 bytes).
  static constexpr std::size_t kMaxRequestLine = 8192;     // bytes, else 414
  static constexpr std::size_t kMaxHeaderCount = 100;      // header lines, else 431
  static constexpr std::size_t kMaxHeadBytes = 64 * 1024;  // the whole head, else 431
  static constexpr std::size_t kMinBodyRate = 64 * 1024;   // bytes per second a body keeps
  static constexpr std::size_t kMaxChunkLine = 1024;       // a chunk-size line, else 400
};

// What the front answered itself (a refusal, or 503 to a connection over the limit): for the
// metrics and the log. `method` / `path` are "" when the head was not parsed.
using FrontRefusal = std::function<void(const std::string& method, const std::string& path,
                                        int status, bool loopback)>;

class HttpFront {
 public:
  // `backend_port`: the internal server on 127.0.0.1; `token`: its X-Lockstep-Front value.
  HttpFront(FrontLimits limits, int backend_port, std::string token, FrontRefusal on_refusal);
  ~HttpFront();  // Stop()
  HttpFront(const HttpFront&) = delete;
  HttpFront& operator=(const HttpFront&) = delete;

  // Listens on host:port (0: any free port); returns the port, kInvalidArgument when it cannot.
  Result<int> Bind(const std::string& host, int port);
  void Start();  // the event thread and the workers
  // Closes the listener and every connection, joins. A connection whose answer is being relayed
  // gets up to `grace` to finish it, then is shut down (its relay ends).
  void Stop(std::chrono::milliseconds grace = std::chrono::milliseconds(0));

  struct Conn;  // one client connection (http_front.cpp)

 private:
  void Loop();
  void Work();
  void Accept(std::int64_t now);
  void Hand(std::unique_ptr<Conn> c);  // to the worker queue
  bool Evict();                        // closes the oldest idle (or unfinished-head) connection

  const FrontLimits limits_;
  const int backend_port_;
  const std::string token_;
  const FrontRefusal on_refusal_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: a worker returned a connection, or Stop()
  std::atomic<bool> stopping_{false};
  std::thread loop_;
  std::vector<std::thread> workers_;
  std::vector<std::unique_ptr<Conn>> conns_;  // the event thread's (not in a worker)

  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable relayed_;          // a worker finished relaying (Stop waits on relaying_)
  std::deque<std::unique_ptr<Conn>> queue_;  // GUARDED_BY(mu_): complete requests
  std::vector<std::unique_ptr<Conn>> back_;  // GUARDED_BY(mu_): kept alive, for the loop
  std::set<int> relaying_;                   // GUARDED_BY(mu_): client fds in a worker
  std::atomic<int> n_open_{0};               // connections open (loop + queue + workers)
};

}  // namespace lockstep
