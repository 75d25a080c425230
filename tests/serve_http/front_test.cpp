// The HTTP front under abuse (issue 43, must show 1), against the real `lockstep serve` on
// 127.0.0.1 with --http-threads 4: each attack at 2x the thread count, /health answering within
// 1 s throughout, each abusive connection answered with its status (431 / 414 / 408 / 413 /
// 401), the header flood's RSS growth under 64 MB, SIGTERM within --drain-s + 1 s with
// dribbling clients still connected. Loops are bounded in count and time.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "serve_process.h"
#include "test_util.h"

namespace lockstep::test {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kThreads = 4;

std::vector<std::string> Args(std::vector<std::string> extra,
                              const std::string& read_timeout = "2") {
  std::vector<std::string> a = {"--model",        ModelDir("tiny"),
                                "--port",         "0",
                                "--threads",      "1",
                                "--read-timeout", read_timeout,
                                "--http-threads", std::to_string(kThreads)};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

double Ms(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// A raw connection the test writes to a piece at a time.
class Dribbler {
 public:
  explicit Dribbler(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~Dribbler() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  void Send(const std::string& s) {
    if (fd_ >= 0) (void)::send(fd_, s.data(), s.size(), MSG_NOSIGNAL);
  }
  // Reads whatever arrived (without waiting); true when the server closed.
  bool Poll() {
    while (fd_ >= 0) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) return false;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return true;
      data_.append(buf, static_cast<std::size_t>(n));
    }
    return true;
  }
  const std::string& data() const { return data_; }

 private:
  int fd_ = -1;
  std::string data_;
};

long RssKb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

// GET /health on a fresh connection; its time in ms, or a large number when it failed.
double HealthMs(int port) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(2, 0);
  cli.set_read_timeout(2, 0);
  const auto t0 = Clock::now();
  auto r = cli.Get("/health");
  return r && r->status == 200 ? Ms(t0) : 1e9;
}

TEST(ServeFront, HeaderFloodAndLongLinesAreRefusedWithBoundedMemory) {
  ServeProcess srv(Args({}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  // 101 header lines: 431 (100 pass).
  std::string head = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
  for (int i = 0; i < 98; ++i) head += "X-A" + std::to_string(i) + ": b\r\n";
  EXPECT_EQ(RawStatus(RawExchange(srv.port(), head + "\r\n", 5)), 200);
  EXPECT_EQ(RawStatus(RawExchange(srv.port(), head + "X-B: c\r\nX-C: d\r\n\r\n", 5)), 431);
  // A request line of 9000 bytes: 414.
  EXPECT_EQ(
      RawStatus(RawExchange(srv.port(), "GET /" + std::string(9000, 'a') + " HTTP/1.1\r\n\r\n", 5)),
      414);
  // The issue's flood: 3,000,000 header lines in one request (it added ~328 MB), twice.
  const long rss0 = RssKb(srv.pid());
  std::string flood = "GET /health HTTP/1.1\r\nHost: x\r\n";
  flood.reserve(flood.size() + 3'000'000 * 8);
  for (int i = 0; i < 3'000'000; ++i) flood += "X-a: b\r\n";
  for (int round = 0; round < 2; ++round) {
    const std::string r = RawExchange(srv.port(), flood, 10);
    EXPECT_EQ(RawStatus(r), 431) << r.substr(0, 200);
  }
  const long rss1 = RssKb(srv.pid());
  EXPECT_LT(rss1 - rss0, 64 * 1024) << "RSS " << rss0 << " kB -> " << rss1 << " kB";
  EXPECT_LT(HealthMs(srv.port()), 1000.0);
}

TEST(ServeFront, SlowHeadsSlowBodiesAndIdleKeepAlivesHoldNoThread) {
  ServeProcess srv(Args({"--max-connections", "32", "--keep-alive", "30"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  const int port = srv.port();
  // 2x the threads of each: heads dribbled a byte at a time, bodies dribbled after a complete
  // head, and keep-alive connections left idle after one answer.
  std::vector<std::unique_ptr<Dribbler>> heads, bodies, idle;
  const std::string head = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ";
  const std::string body_head =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n";
  for (int i = 0; i < 2 * kThreads; ++i) {
    heads.push_back(std::make_unique<Dribbler>(port));
    bodies.push_back(std::make_unique<Dribbler>(port));
    bodies.back()->Send(body_head);
  }
  for (int i = 0; i < 2 * kThreads; ++i) {
    idle.push_back(std::make_unique<Dribbler>(port));
    idle.back()->Send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  }
  // One byte every 0.25 s on each dribbler, /health probed throughout (the deadline is 2 s).
  double worst = 0;
  const auto t0 = Clock::now();
  for (int tick = 0; tick < 14; ++tick) {
    for (auto& d : heads) d->Send(tick == 0 ? head : "x");
    for (auto& d : bodies) d->Send("x");
    worst = std::max(worst, HealthMs(port));
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  EXPECT_LT(worst, 1000.0) << "the slowest /health took " << worst << " ms";
  for (auto& d : heads) {
    d->Poll();
    EXPECT_EQ(RawStatus(d->data()), 408) << d->data();
    EXPECT_NE(d->data().find("request head"), std::string::npos) << d->data();
  }
  for (auto& d : bodies) {
    d->Poll();
    EXPECT_EQ(RawStatus(d->data()), 408) << d->data();
  }
  for (auto& d : idle) {
    d->Poll();
    EXPECT_EQ(RawStatus(d->data()), 200) << d->data();
  }
  EXPECT_LT(Ms(t0), 8000.0);
  heads.clear();
  bodies.clear();
  // Over --max-connections (32): 8 idle + 30 new kept-alive ones; the oldest idle connections
  // are closed to make room, and a live client still gets its answer.
  std::vector<std::unique_ptr<Dribbler>> more;
  for (int i = 0; i < 30; ++i) {
    more.push_back(std::make_unique<Dribbler>(port));
    more.back()->Send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_LT(HealthMs(port), 1000.0);
  int closed = 0;
  for (auto& d : idle) closed += d->Poll() ? 1 : 0;
  EXPECT_GE(closed, 6) << "the oldest idle connections make room";
  for (auto& d : more) {
    d->Poll();
    EXPECT_EQ(RawStatus(d->data()), 200) << d->data();
  }
}

TEST(ServeFront, ChunkedBodiesAreCountedAgainstMaxBody) {
  ServeProcess srv(Args({"--max-body", "4096"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  const std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
      "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
  // A small chunked body is decoded and served.
  const std::string body = R"({"prompt": "ab", "max_tokens": 1})";
  char size[16];
  std::snprintf(size, sizeof(size), "%zx", body.size());
  std::string r = RawExchange(srv.port(), head + size + "\r\n" + body + "\r\n0\r\n\r\n", 10);
  EXPECT_EQ(RawStatus(r), 200) << r;
  // A chunk that claims 50 MB: 413 on its size line, nothing of it read.
  auto t0 = Clock::now();
  r = RawExchange(srv.port(), head + "3200000\r\n" + std::string(1000, 'a'), 5);
  EXPECT_EQ(RawStatus(r), 413) << r;
  EXPECT_NE(r.find("max-body"), std::string::npos) << r;
  EXPECT_LT(Ms(t0), 3000.0);
  // 5 MB in 1 KiB chunks: 413 once the total crosses 4096 bytes, not after reading it all.
  const long rss0 = RssKb(srv.pid());
  std::string many = head;
  for (int i = 0; i < 5 * 1024; ++i) many += "400\r\n" + std::string(1024, 'a') + "\r\n";
  r = RawExchange(srv.port(), many, 10);
  EXPECT_EQ(RawStatus(r), 413) << r.substr(0, 200);
  EXPECT_LT(RssKb(srv.pid()) - rss0, 16 * 1024);
  EXPECT_LT(HealthMs(srv.port()), 1000.0);
}

TEST(ServeFront, KeyIsCheckedBeforeTheBodyIsRead) {
  ServeProcess srv(Args({"--api-key", "k3y"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  // Content-Length 100000 and no body sent: 401 at once (not a wait for the body).
  const auto t0 = Clock::now();
  const std::string r = RawExchange(
      srv.port(),
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n", 5);
  EXPECT_EQ(RawStatus(r), 401) << r;
  EXPECT_LT(Ms(t0), 1000.0);
}

TEST(ServeFront, SigtermEndsWithinTheDrainWhileClientsDribble) {
  ServeProcess srv(Args({"--drain-s", "1"}, "30"));
  ASSERT_TRUE(srv.started()) << srv.Log();
  std::vector<std::unique_ptr<Dribbler>> ds;
  for (int i = 0; i < 2 * kThreads; ++i) {
    ds.push_back(std::make_unique<Dribbler>(srv.port()));
    ds.back()->Send(i % 2 ? "GET /health HTTP/1.1\r\nX: "
                          : "POST /v1/completions HTTP/1.1\r\n"
                            "Content-Length: 100\r\n\r\n{");
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = Clock::now();
  srv.Signal(SIGTERM);
  int code = -1;
  for (int i = 0; i < 12 && code < 0; ++i) {
    for (auto& d : ds) d->Send("x");
    code = srv.Wait(0.25);
  }
  EXPECT_EQ(code, 0) << srv.Log();
  EXPECT_LT(Ms(t0), 2000.0);
}

}  // namespace
}  // namespace lockstep::test
