#include "serve/http_front.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <utility>

#include "lockstep/engine/clock.h"
#include "serve/api_error.h"
#include "serve/auth.h"

namespace lockstep {

namespace {

constexpr std::int64_t kSecNs = 1'000'000'000;
// After a refusal with the request unread, the input is read and dropped this long before the
// close, so the client sees the answer rather than a reset (a close with unread input sends RST).
constexpr std::int64_t kLingerNs = 2 * kSecNs;

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// Loopback by the parsed address: 127.0.0.0/8, ::1, and IPv4-mapped 127.0.0.0/8.
bool LoopbackAddr(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr) >> 24) == 127;
  if (a.ss_family != AF_INET6) return false;
  const in6_addr& v6 = reinterpret_cast<const sockaddr_in6&>(a).sin6_addr;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

std::string AddrText(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {0};
  const void* p =
      a.ss_family == AF_INET
          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in&>(a).sin_addr)
          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr);
  return ::inet_ntop(a.ss_family, p, buf, sizeof(buf)) ? buf : "?";
}

// Writes all of `data` to a non-blocking socket, waiting at most `timeout_s` for each write.
bool SendAll(int fd, const char* data, std::size_t n, int timeout_s) {
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w > 0) {
      data += w;
      n -= static_cast<std::size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, timeout_s * 1000) <= 0 || (p.revents & (POLLERR | POLLHUP))) return false;
  }
  return true;
}

}  // namespace

// One client connection. On the event thread while its request arrives; in a worker while it is
// relayed; back to the event thread when it is kept alive.
struct HttpFront::Conn {
  enum class State { kIdle, kHead, kBody, kLinger };
  int fd = -1;
  bool loopback = false;
  std::string peer;
  State state = State::kIdle;
  std::int64_t since_ns = 0;     // when it entered `state`
  std::int64_t deadline_ns = 0;  // when `state` times out
  int served = 0;                // requests answered on it
  std::string in;                // bytes read and not consumed
  std::size_t scanned = 0;       // head: bytes of `in` searched for its end
  // The parsed head.
  std::string method, target, version, path;
  std::vector<std::pair<std::string, std::string>> headers;  // as sent, minus the front's own
  bool chunked = false, has_length = false, keep_alive = true;
  std::size_t length = 0;  // Content-Length
  // The body: decoded bytes; for chunked, the chunk being read (`chunk_left` bytes + CRLF).
  std::string body;
  std::size_t chunk_left = 0;
  enum class Chunk { kSize, kData, kDataEnd, kTrailer } chunk = Chunk::kSize;
  std::size_t trailer_lines = 0;

  ~Conn() {
    if (fd >= 0) ::close(fd);
  }
  std::string Header(const std::string& lower_name) const {
    for (const auto& [k, v] : headers)
      if (Lower(k) == lower_name) return v;
    return "";
  }
  void Reset() {  // for the next request on a kept connection
    state = State::kIdle;
    scanned = 0;
    method.clear(), target.clear(), version.clear(), path.clear(), headers.clear(), body.clear();
    chunked = has_length = false;
    keep_alive = true;
    length = chunk_left = trailer_lines = 0;
    chunk = Chunk::kSize;
  }
};

namespace {

using Conn = HttpFront::Conn;

enum class Step { kMore, kReady, kRefused };

// A refusal the front answers itself: the status, an ApiError body, and the connection closed
// (after lingering: the unread rest of the request is dropped).
struct Refusal {
  int status = 0;
  std::string message, code;
};

std::string RefusalBytes(const Refusal& r) {
  ApiError e = ApiError::BadRequest(r.message, "", r.code);
  e.status = r.status;
  if (r.status == 401) e = ApiError::Unauthorized();
  if (r.status == 413) e = ApiError::TooLarge(r.message);
  if (r.status == 503) e = ApiError::Unavailable(r.message, r.code);
  const std::string body = e.Body();
  static const std::pair<int, const char*> kReason[] = {
      {400, "Bad Request"},        {401, "Unauthorized"}, {408, "Request Timeout"},
      {413, "Payload Too Large"},  {414, "URI Too Long"}, {431, "Request Header Fields Too Large"},
      {503, "Service Unavailable"}};
  const char* reason = "Error";
  for (const auto& [s, text] : kReason)
    if (s == r.status) reason = text;
  std::string out =
      "HTTP/1.1 " + std::to_string(r.status) + " " + reason +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\nConnection: close\r\n";
  if (r.status == 503) out += "Retry-After: 1\r\n";
  if (r.status == 401) out += "WWW-Authenticate: Bearer\r\n";
  return out + "\r\n" + body;
}

// Parses the head in c.in[0, end) (end: just past the blank line).
std::optional<Refusal> ParseHead(Conn& c, std::size_t end, const FrontLimits& lim) {
  std::size_t pos = 0;
  auto line = [&]() {
    const std::size_t e = c.in.find("\r\n", pos);
    std::string l = c.in.substr(pos, e - pos);
    pos = e + 2;
    return l;
  };
  const std::string request_line = line();
  const auto s1 = request_line.find(' '), s2 = request_line.rfind(' ');
  if (s1 == std::string::npos || s2 == s1 || s1 == 0)
    return Refusal{400, "malformed HTTP request line", "bad_http"};
  c.method = request_line.substr(0, s1);
  c.target = request_line.substr(s1 + 1, s2 - s1 - 1);
  c.version = request_line.substr(s2 + 1);
  if (c.version != "HTTP/1.1" && c.version != "HTTP/1.0")
    return Refusal{400, "malformed HTTP request line (version)", "bad_http"};
  if (c.target.empty() || c.target.find(' ') != std::string::npos)
    return Refusal{400, "malformed HTTP request line (target)", "bad_http"};
  c.path = c.target.substr(0, c.target.find('?'));
  while (pos + 2 < end) {
    const std::string l = line();
    const auto colon = l.find(':');
    if (colon == std::string::npos || colon == 0)
      return Refusal{400, "malformed HTTP header line", "bad_http"};
    std::string name = l.substr(0, colon);
    if (Lower(name).rfind("x-lockstep-", 0) == 0) continue;  // the front's own
    c.headers.emplace_back(std::move(name), Trim(l.substr(colon + 1)));
  }
  const std::string connection = Lower(c.Header("connection"));
  c.keep_alive = c.version == "HTTP/1.1" ? connection.find("close") == std::string::npos
                                         : connection.find("keep-alive") != std::string::npos;
  c.chunked = Lower(c.Header("transfer-encoding")).find("chunked") != std::string::npos;
  const std::string len = c.Header("content-length");
  if (!c.chunked && !len.empty()) {
    if (len.size() > 18 || len.find_first_not_of("0123456789") != std::string::npos)
      return Refusal{400, "Content-Length is not a number", "bad_http"};
    c.has_length = true;
    c.length = std::stoull(len);
  }
  const bool has_body = c.chunked || c.length > 0;
  if (has_body && c.path != "/health" && !BearerAllowed(c.Header("authorization"), lim.api_key))
    return Refusal{401, "", ""};
  if (c.has_length && c.length > lim.max_body)
    return Refusal{
        413,
        "the request body is larger than --max-body (" + std::to_string(lim.max_body) + " bytes)",
        ""};
  return std::nullopt;
}

// Reads what the head needs from c.in; kReady with the head parsed (its bytes consumed).
Step AdvanceHead(Conn& c, const FrontLimits& lim, std::int64_t now, Refusal* why) {
  // Blank lines before a request line are skipped (RFC 9112 2.2).
  while (c.state == Conn::State::kIdle && c.in.rfind("\r\n", 0) == 0) c.in.erase(0, 2);
  if (c.in.empty()) return Step::kMore;
  if (c.state == Conn::State::kIdle) {
    c.state = Conn::State::kHead;
    c.since_ns = now;
    c.deadline_ns = now + std::int64_t{lim.read_timeout_s} * kSecNs;
  }
  const std::size_t from = c.scanned >= 3 ? c.scanned - 3 : 0;
  const std::size_t end = c.in.find("\r\n\r\n", from);
  const std::size_t limit = end == std::string::npos ? c.in.size() : end + 4;
  // The request line, then one header per line break, counted on what arrived.
  const std::size_t first = c.in.find("\r\n");
  if ((first == std::string::npos ? c.in.size() : first) > FrontLimits::kMaxRequestLine) {
    *why = {414,
            "the request line is longer than " + std::to_string(FrontLimits::kMaxRequestLine) +
                " bytes",
            "uri_too_long"};
    return Step::kRefused;
  }
  const auto lines =
      static_cast<std::size_t>(std::count(c.in.begin() + static_cast<std::ptrdiff_t>(from),
                                          c.in.begin() + static_cast<std::ptrdiff_t>(limit), '\n'));
  c.scanned = limit;
  c.trailer_lines += lines;  // (the head's line count until the head is parsed)
  if (c.trailer_lines > FrontLimits::kMaxHeaderCount + 2 || limit > FrontLimits::kMaxHeadBytes) {
    *why = {431,
            "the request head has more than " + std::to_string(FrontLimits::kMaxHeaderCount) +
                " header lines or " + std::to_string(FrontLimits::kMaxHeadBytes) + " bytes",
            "header_too_large"};
    return Step::kRefused;
  }
  if (end == std::string::npos) return Step::kMore;
  c.trailer_lines = 0;
  if (auto r = ParseHead(c, end + 4, lim)) {
    *why = *r;
    return Step::kRefused;
  }
  c.in.erase(0, end + 4);
  c.state = Conn::State::kBody;
  c.since_ns = now;
  return Step::kReady;
}

// Moves body bytes from c.in to c.body; kReady when the body is complete.
Step AdvanceBody(Conn& c, const FrontLimits& lim, Refusal* why) {
  if (!c.chunked) {
    const std::size_t take = std::min(c.length - c.body.size(), c.in.size());
    c.body.append(c.in, 0, take);
    c.in.erase(0, take);
    return c.body.size() == c.length ? Step::kReady : Step::kMore;
  }
  std::size_t pos = 0;
  Step step = Step::kMore;
  while (step == Step::kMore) {
    if (c.chunk == Conn::Chunk::kData) {
      const std::size_t take = std::min(c.chunk_left, c.in.size() - pos);
      c.body.append(c.in, pos, take);
      pos += take;
      c.chunk_left -= take;
      if (c.chunk_left > 0) break;
      c.chunk = Conn::Chunk::kDataEnd;
      continue;
    }
    const std::size_t eol = c.in.find("\r\n", pos);
    if (eol == std::string::npos) {
      if (c.in.size() - pos > FrontLimits::kMaxChunkLine) {
        *why = {400, "a chunk-size or trailer line is longer than 1024 bytes", "bad_chunk"};
        return Step::kRefused;
      }
      break;
    }
    const std::string l = c.in.substr(pos, eol - pos);
    pos = eol + 2;
    if (c.chunk == Conn::Chunk::kDataEnd) {
      if (!l.empty()) {
        *why = {400, "a chunk's data is not followed by CRLF", "bad_chunk"};
        return Step::kRefused;
      }
      c.chunk = Conn::Chunk::kSize;
    } else if (c.chunk == Conn::Chunk::kTrailer) {
      if (l.empty()) step = Step::kReady;
      if (++c.trailer_lines > FrontLimits::kMaxHeaderCount) {
        *why = {431, "more than 100 trailer lines", "header_too_large"};
        return Step::kRefused;
      }
    } else {
      const std::string hex = Trim(l.substr(0, l.find(';')));
      if (hex.empty() || hex.size() > 15 ||
          hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
        *why = {400, "a chunk size is not a hex number", "bad_chunk"};
        return Step::kRefused;
      }
      const std::size_t n = std::stoull(hex, nullptr, 16);
      // Counted as soon as the size is known: a chunk that would cross the limit is not read.
      if (n > lim.max_body - c.body.size()) {
        *why = {413,
                "the chunked request body is larger than --max-body (" +
                    std::to_string(lim.max_body) + " bytes)",
                ""};
        return Step::kRefused;
      }
      c.chunk_left = n;
      c.chunk = n == 0 ? Conn::Chunk::kTrailer : Conn::Chunk::kData;
    }
  }
  c.in.erase(0, pos);
  return step;
}

}  // namespace

HttpFront::HttpFront(FrontLimits limits, int backend_port, std::string token,
                     FrontRefusal on_refusal)
    : limits_(std::move(limits)),
      backend_port_(backend_port),
      token_(std::move(token)),
      on_refusal_(std::move(on_refusal)) {}

HttpFront::~HttpFront() {
  Stop();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

Result<int> HttpFront::Bind(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const auto refuse = [&] {
    return Status::InvalidArgument("--host/--port", "cannot listen on " + host + ":" + service +
                                                        " (in use, or not an address here)");
  };
  if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &res) != 0) return refuse();
  for (addrinfo* ai = res; ai && listen_fd_ < 0; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    // The accept backlog holds --max-connections (a burst of connects must not drop SYNs: each
    // drop cost a client a 1 s / 3 s / 7 s retransmit; the kernel caps it at somaxconn).
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::listen(fd, std::max(limits_.max_connections, 16)) == 0)
      listen_fd_ = fd;
    else
      ::close(fd);
  }
  ::freeaddrinfo(res);
  if (listen_fd_ < 0) return refuse();
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0)
    return Status::Runtime("serve", std::string("eventfd: ") + std::strerror(errno));
  return static_cast<int>(ntohs(a.ss_family == AF_INET
                                    ? reinterpret_cast<sockaddr_in&>(a).sin_port
                                    : reinterpret_cast<sockaddr_in6&>(a).sin6_port));
}

void HttpFront::Start() {
  loop_ = std::thread([this] { Loop(); });
  for (int i = 0; i < limits_.workers; ++i) workers_.emplace_back([this] { Work(); });
}

void HttpFront::Stop(std::chrono::milliseconds grace) {
  if (!loop_.joinable()) return;
  stopping_ = true;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // A request that finished in the drain may still be writing its answer (a long completion's
    // JSON, a stream's last chunk): it gets `grace` to reach its client.
    relayed_.wait_for(lock, grace, [this] { return relaying_.empty(); });
    for (int fd : relaying_) ::shutdown(fd, SHUT_RDWR);  // the relay's next read or write ends
  }
  cv_.notify_all();
  const std::uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof(one)) < 0) { /* the loop also wakes on its own timeout */
  }
  loop_.join();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  conns_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  queue_.clear();
  back_.clear();
}

bool HttpFront::Evict() {
  Conn* pick = nullptr;
  for (const auto& c : conns_) {
    const bool idle = c->state == Conn::State::kIdle && c->in.empty();
    const bool head = c->state == Conn::State::kHead || c->state == Conn::State::kLinger;
    if (!idle && !head) continue;
    const bool pick_idle = pick && pick->state == Conn::State::kIdle;
    if (!pick || (idle && !pick_idle) || (idle == pick_idle && c->since_ns < pick->since_ns))
      pick = c.get();
  }
  if (!pick) return false;
  conns_.erase(std::find_if(conns_.begin(), conns_.end(),
                            [pick](const auto& c) { return c.get() == pick; }));
  --n_open_;
  return true;
}

void HttpFront::Accept(std::int64_t now) {
  for (int i = 0; i < 64; ++i) {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    const int fd =
        ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->loopback = LoopbackAddr(a);
    c->peer = AddrText(a);
    c->since_ns = now;
    c->deadline_ns = now + std::int64_t{limits_.keep_alive_s} * kSecNs;
    if (n_open_ >= limits_.max_connections && !Evict()) {
      const std::string r =
          RefusalBytes({503, "too many connections (--max-connections)", "too_many_connections"});
      (void)::send(fd, r.data(), r.size(), MSG_NOSIGNAL);
      on_refusal_("", "", 503, c->loopback);
      continue;  // closed by ~Conn
    }
    ++n_open_;
    conns_.push_back(std::move(c));
  }
}

void HttpFront::Hand(std::unique_ptr<Conn> c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(c));
  }
  cv_.notify_one();
}

void HttpFront::Loop() {
  std::vector<pollfd> fds;
  std::vector<char> buf(64 * 1024);
  while (!stopping_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& c : back_) conns_.push_back(std::move(c));
      back_.clear();
    }
    std::int64_t now = MonotonicNs();
    // Each connection: parse what it has (a kept connection may hold a pipelined request),
    // time out, or wait for input.
    std::vector<std::unique_ptr<Conn>> keep;
    for (auto& c : conns_) {
      Refusal why;
      Step step = Step::kMore;
      if (c->state == Conn::State::kIdle || c->state == Conn::State::kHead)
        step = AdvanceHead(*c, limits_, now, &why);
      if (step == Step::kReady) {
        const bool has_body = c->chunked || c->length > 0;
        c->deadline_ns = now + std::int64_t{limits_.read_timeout_s} * kSecNs;
        if (has_body && Lower(c->Header("expect")) == "100-continue") {
          const std::string cont = "HTTP/1.1 100 Continue\r\n\r\n";
          (void)::send(c->fd, cont.data(), cont.size(), MSG_NOSIGNAL);
        }
        step = Step::kMore;
      }
      if (c->state == Conn::State::kBody) {
        step = AdvanceBody(*c, limits_, &why);
        // The body's deadline grows with what arrived: one second per kMinBodyRate bytes.
        c->deadline_ns =
            c->since_ns + std::int64_t{limits_.read_timeout_s} * kSecNs +
            static_cast<std::int64_t>(c->body.size() / FrontLimits::kMinBodyRate) * kSecNs;
      }
      if (step == Step::kReady) {
        Hand(std::move(c));
        continue;
      }
      if (step == Step::kMore && c->state != Conn::State::kLinger && now >= c->deadline_ns) {
        if (c->state == Conn::State::kIdle) {  // an idle keep-alive connection: closed quietly
          --n_open_;
          continue;
        }
        why = {408,
               std::string("the request ") + (c->state == Conn::State::kHead ? "head" : "body") +
                   " did not arrive within --read-timeout (" +
                   std::to_string(limits_.read_timeout_s) + " s)",
               "request_timeout"};
        step = Step::kRefused;
      }
      if (step == Step::kRefused) {
        const std::string r = RefusalBytes(why);
        (void)::send(c->fd, r.data(), r.size(), MSG_NOSIGNAL);
        ::shutdown(c->fd, SHUT_WR);
        on_refusal_(c->method, c->path, why.status, c->loopback);
        c->state = Conn::State::kLinger;
        c->in.clear();
        c->deadline_ns = now + kLingerNs;
      }
      if (c->state == Conn::State::kLinger && now >= c->deadline_ns) {
        --n_open_;
        continue;
      }
      keep.push_back(std::move(c));
    }
    conns_ = std::move(keep);

    std::int64_t next = now + kSecNs;
    fds.assign({{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}});
    for (const auto& c : conns_) {
      fds.push_back({c->fd, POLLIN, 0});
      next = std::min(next, c->deadline_ns);
    }
    const int wait_ms = static_cast<int>(std::max<std::int64_t>(0, next - now) / 1'000'000) + 1;
    if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) break;
    now = MonotonicNs();
    if (fds[0].revents & POLLIN) {
      std::uint64_t n = 0;
      (void)!::read(wake_fd_, &n, sizeof(n));
    }
    // Input first (the connections polled are conns_[0, fds.size() - 2)), then new ones.
    std::vector<std::unique_ptr<Conn>> live;
    for (std::size_t i = 0; i < conns_.size(); ++i) {
      auto& c = conns_[i];
      bool gone = false;
      if (fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) {
        // Read what is there, at most 256 KiB a turn (the others get theirs), and never past the
        // head limit while the head is unparsed (the flood stays in the kernel's buffer).
        for (int turn = 0; turn < 4; ++turn) {
          const ssize_t r = ::recv(c->fd, buf.data(), buf.size(), 0);
          if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            gone = true;
            break;
          }
          if (r < 0) break;
          if (c->state != Conn::State::kLinger) c->in.append(buf.data(), static_cast<size_t>(r));
          if (c->state != Conn::State::kBody && c->in.size() > FrontLimits::kMaxHeadBytes) break;
        }
      }
      if (gone) {
        --n_open_;
        continue;
      }
      live.push_back(std::move(c));
    }
    conns_ = std::move(live);
    if (fds[1].revents & POLLIN) Accept(now);
  }
  n_open_ -= static_cast<int>(conns_.size());
  conns_.clear();
}

namespace {

// The request as the internal server gets it: the client's head minus hop-by-hop and framing
// headers, with Content-Length, `Connection: close` and the front's headers.
std::string BackendRequest(const Conn& c, const std::string& token) {
  std::string out = c.method + " " + c.target + " HTTP/1.1\r\n";
  for (const auto& [k, v] : c.headers) {
    const std::string lk = Lower(k);
    if (lk == "connection" || lk == "keep-alive" || lk == "transfer-encoding" ||
        lk == "content-length" || lk == "expect")
      continue;
    out += k + ": " + v + "\r\n";
  }
  // A POST that came without Content-Length (and not chunked) keeps lacking it: the handlers
  // answer that with 400 at once.
  if (c.chunked || c.has_length) out += "Content-Length: " + std::to_string(c.body.size()) + "\r\n";
  out += "Connection: close\r\nX-Lockstep-Front: " + token + "\r\nX-Lockstep-Peer: " + c.peer +
         "\r\nX-Lockstep-Loopback: " + (c.loopback ? "1" : "0") + "\r\n\r\n";
  return out;
}

// The response head for the client: the internal server's, with its Connection / Keep-Alive
// lines replaced by the front's decision. `keep` turns false when the body is not framed.
std::string ClientHead(const std::string& head, const Conn& c, bool* keep, int keep_alive_s,
                       int left) {
  std::string out;
  bool framed = c.method == "HEAD";
  std::size_t pos = 0;
  int status = 0;
  while (pos < head.size()) {
    const std::size_t e = head.find("\r\n", pos);
    const std::string l = head.substr(pos, e - pos);
    pos = e + 2;
    if (l.empty()) break;
    if (out.empty()) {
      status = std::atoi(l.c_str() + std::min<std::size_t>(9, l.size()));
      out = l + "\r\n";
      continue;
    }
    const std::string lk = Lower(l.substr(0, l.find(':')));
    if (lk == "connection" || lk == "keep-alive") continue;
    if (lk == "content-length" ||
        (lk == "transfer-encoding" && Lower(l).find("chunked") != std::string::npos))
      framed = true;
    out += l + "\r\n";
  }
  if (status == 204 || status == 304) framed = true;
  *keep = *keep && framed;
  out += *keep ? "Keep-Alive: timeout=" + std::to_string(keep_alive_s) +
                     ", max=" + std::to_string(left) + "\r\n"
               : "Connection: close\r\n";
  return out + "\r\n";
}

int ConnectBackend(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Relays one complete request to the internal server and its answer to the client. True when
// the client's connection stays open for its next request.
bool Relay(Conn& c, int backend_port, const std::string& token, const FrontLimits& lim,
           const std::atomic<bool>& stopping) {
  const int be = ConnectBackend(backend_port);
  if (be < 0) return false;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{be};
  const std::string head = BackendRequest(c, token);
  if (!SendAll(be, head.data(), head.size(), lim.write_timeout_s) ||
      !SendAll(be, c.body.data(), c.body.size(), lim.write_timeout_s))
    return false;
  std::string().swap(c.body);
  bool keep = c.keep_alive && c.served + 1 < lim.keep_alive_max && !stopping;
  std::string got;
  bool head_sent = false;
  std::vector<char> buf(64 * 1024);
  for (;;) {
    // The answer may take as long as the completion; a client that hangs up meanwhile ends the
    // relay (the internal server then sees its write fail and cancels the request).
    pollfd p[2] = {{be, POLLIN, 0}, {c.fd, POLLRDHUP, 0}};
    if (::poll(p, 2, 1000) < 0 && errno != EINTR) return false;
    if (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR)) return false;
    if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    const ssize_t r = ::recv(be, buf.data(), buf.size(), 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (head_sent) {
      if (!SendAll(c.fd, buf.data(), static_cast<std::size_t>(r), lim.write_timeout_s))
        return false;
      continue;
    }
    got.append(buf.data(), static_cast<std::size_t>(r));
    const std::size_t end = got.find("\r\n\r\n");
    if (end == std::string::npos) {
      if (got.size() > FrontLimits::kMaxHeadBytes) return false;
      continue;
    }
    const std::string out = ClientHead(got.substr(0, end + 4), c, &keep, lim.keep_alive_s,
                                       lim.keep_alive_max - c.served - 1) +
                            got.substr(end + 4);
    if (!SendAll(c.fd, out.data(), out.size(), lim.write_timeout_s)) return false;
    head_sent = true;
  }
  return head_sent && keep;
}

}  // namespace

void HttpFront::Work() {
  for (;;) {
    std::unique_ptr<Conn> c;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      c = std::move(queue_.front());
      queue_.pop_front();
      relaying_.insert(c->fd);
    }
    const bool keep = Relay(*c, backend_port_, token_, limits_, stopping_);
    std::lock_guard<std::mutex> lock(mu_);
    relaying_.erase(c->fd);
    relayed_.notify_all();
    if (!keep || stopping_) {
      c.reset();
      --n_open_;
      continue;
    }
    ++c->served;
    c->Reset();
    c->since_ns = MonotonicNs();
    c->deadline_ns = c->since_ns + std::int64_t{limits_.keep_alive_s} * kSecNs;
    back_.push_back(std::move(c));
    const std::uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
}

}  // namespace lockstep
