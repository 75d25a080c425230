// The background load of a service arm (background_load.h): `concurrency` client threads take
// request indices k = 0, 1, ... from one counter and send each as a streamed completion (a
// streaming client that goes away cancels its request in the server and frees the slot, so a
// load cut at its deadline does not keep the engine busy; a non-streamed one would run to its
// end).
// Every socket wait is bounded by the time left to the load's deadline, and Finish() / the
// destructor cancel whatever is still in flight at the deadline (httplib's Client::stop() shuts
// the socket from another thread), so the load never outlives LoadSpec::timeout_s by more than a
// thread join.
#include "lockstep/harness/background_load.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "lockstep/engine/splitmix.h"
#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

// A load request the queue refused (429) or that met a server still loading (503) is retried
// after this pause while the deadline allows: it is load that has not arrived yet, not a failure.
constexpr auto kRetryPause = std::chrono::milliseconds(50);
// WaitUntilInFlight: how long it waits for a stream's first event between two GET /slots.
constexpr auto kSlotsPoll = std::chrono::milliseconds(20);

// Seconds from now to `t` (0 when past), as httplib's (sec, usec) timeout.
void SetTimeouts(httplib::Client& c, Clock::time_point deadline) {
  const auto left = std::max<std::int64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()).count(), 1000);
  const time_t sec = static_cast<time_t>(left / 1000000);
  const time_t usec = static_cast<time_t>(left % 1000000);
  c.set_connection_timeout(std::min<time_t>(sec, 5), sec >= 5 ? 0 : usec);
  c.set_read_timeout(sec, usec);
  c.set_write_timeout(sec, usec);
}

std::unique_ptr<httplib::Client> NewClient(const ServiceEndpoint& ep) {
  auto c = std::make_unique<httplib::Client>(ep.host, ep.port);
  c->set_keep_alive(true);
  if (!ep.api_key.empty()) c->set_bearer_token_auth(ep.api_key);
  return c;
}

// The output ids of a streamed completion (`data: {...}` events; the last chunk carries the
// `lockstep` object). False when the stream holds none or was cancelled (a draining server).
bool StreamOutput(const std::string& sse, std::vector<std::int32_t>* out) {
  bool found = false;
  for (std::size_t pos = 0; pos < sse.size();) {
    std::size_t end = sse.find('\n', pos);
    if (end == std::string::npos) end = sse.size();
    const std::string_view line(sse.data() + pos, end - pos);
    pos = end + 1;
    if (!line.starts_with("data: ") || line == "data: [DONE]") continue;
    const json j = json::parse(line.substr(6), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("lockstep")) continue;
    try {
      if (j["choices"].at(0).value("finish_reason", json()) == "cancelled") return false;
      *out = j["lockstep"].at("output_ids").get<std::vector<std::int32_t>>();
      found = true;
    } catch (const json::exception&) {
      return false;
    }
  }
  return found;
}

}  // namespace

std::vector<std::int32_t> LoadPrompt(const LoadSpec& spec, int vocab, int k) {
  const int lo = std::max(1, std::min(spec.prompt_lo, spec.prompt_hi));
  const int hi = std::max(lo, spec.prompt_hi);
  const auto span = static_cast<std::uint64_t>(hi - lo + 1);
  const auto v = static_cast<std::uint64_t>(std::max(1, vocab));
  // The stream of request k: a state mixed from the seed and k, then one SplitMix64 step per
  // draw (the length first, then each id), reduced modulo the range.
  std::uint64_t s = SplitMix64(SplitMix64(spec.seed) + static_cast<std::uint64_t>(k));
  const int n = lo + static_cast<int>(s % span);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (auto& id : ids) {
    s = SplitMix64(s);
    id = static_cast<std::int32_t>(s % v);
  }
  return ids;
}

json LoadOutcome::ToJson() const {
  // `seconds` stays out: the ledger's finished entry must be the same for two runs of a
  // deterministic plan (LedgerDigest), and wall time is not.
  return {{"requests", requests}, {"concurrency", concurrency}, {"completed", completed},
          {"failed", failed},     {"digest", digest},           {"digests", digests}};
}

struct BackgroundLoad::Impl {
  ServiceEndpoint ep;
  LoadSpec spec;
  int vocab = 0;
  Clock::time_point t0, deadline;
  std::vector<std::thread> threads;

  std::mutex mu;
  std::condition_variable cv;
  int next = 0;          // the next request index to send
  int running = 0;       // client threads still working
  int streams_live = 0;  // load streams whose first event arrived and that have not ended
  bool stop = false;
  std::vector<httplib::Client*> clients;  // of the running threads (stop() cancels them)
  std::vector<int> status;                // per request: 0 unsent/failed, 1 completed
  std::vector<std::string> output_digest;

  // Takes the next request index, or -1 when none is left or the load is stopped / past due.
  int Take() {
    std::lock_guard lk(mu);
    if (stop || next >= spec.requests || Clock::now() >= deadline) return -1;
    return next++;
  }

  // Sends request k until it is answered, fails, or the deadline passes; true on a completion.
  bool Send(httplib::Client& cli, int k) {
    const std::vector<std::int32_t> prompt = LoadPrompt(spec, vocab, k);
    const std::string body = json{
        {"prompt", prompt},
        {"max_tokens", spec.max_new},
        {"temperature", 0},
        {"ignore_eos", true},
        {"stream", true}}.dump();
    while (Clock::now() < deadline) {
      {
        std::lock_guard lk(mu);
        if (stop) return false;
      }
      SetTimeouts(cli, deadline);
      // The stream is read as it comes: its first event means the request runs in the server
      // (WaitUntilInFlight counts such streams, so a load shorter than a GET /slots round trip
      // is still seen).
      std::string sse;
      bool live = false;
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.headers = {{"Content-Type", "application/json"}};
      req.body = body;
      req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
        sse.append(data, n);
        if (!live && sse.find("data: ") != std::string::npos) {
          live = true;
          std::lock_guard lk(mu);
          ++streams_live;
          cv.notify_all();
        }
        return true;
      };
      auto res = cli.send(req);
      if (live) {
        std::lock_guard lk(mu);
        --streams_live;
      }
      if (!res) return false;  // transport error, or cancelled at the deadline
      if (res->status == 429 || res->status == 503) {
        std::this_thread::sleep_for(kRetryPause);
        continue;
      }
      if (res->status != 200) return false;
      std::vector<std::int32_t> out;
      if (!StreamOutput(sse, &out)) return false;
      std::lock_guard lk(mu);
      output_digest[static_cast<std::size_t>(k)] = Sha256Tokens(out);
      return true;
    }
    return false;
  }

  void Worker() {
    auto cli = NewClient(ep);
    {
      std::lock_guard lk(mu);
      clients.push_back(cli.get());
    }
    for (int k = Take(); k >= 0; k = Take()) {
      const bool ok = Send(*cli, k);
      std::lock_guard lk(mu);
      status[static_cast<std::size_t>(k)] = ok ? 1 : 0;
    }
    std::lock_guard lk(mu);
    clients.erase(std::find(clients.begin(), clients.end(), cli.get()));
    --running;
    cv.notify_all();
  }

  // Cancels every request in flight and joins the threads.
  void StopAndJoin() {
    {
      // A thread may be between its stop check and the start of its request when the flag is
      // set, so the clients are stopped again until every thread has seen it.
      std::unique_lock lk(mu);
      stop = true;
      while (running > 0) {
        for (httplib::Client* c : clients) c->stop();
        cv.wait_for(lk, std::chrono::milliseconds(10));
      }
    }
    for (auto& t : threads)
      if (t.joinable()) t.join();
    threads.clear();
  }
};

BackgroundLoad::BackgroundLoad(ServiceEndpoint ep, LoadSpec spec, int vocab)
    : impl_(std::make_unique<Impl>()) {
  impl_->ep = std::move(ep);
  impl_->spec = spec;
  impl_->vocab = vocab;
  const auto n = static_cast<std::size_t>(std::max(0, spec.requests));
  impl_->status.assign(n, 0);
  impl_->output_digest.assign(n, "");
}

BackgroundLoad::~BackgroundLoad() { impl_->StopAndJoin(); }

void BackgroundLoad::Start() {
  Impl& m = *impl_;
  if (!m.threads.empty()) return;
  m.t0 = Clock::now();
  m.deadline = m.t0 + std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double>(std::max(0.0, m.spec.timeout_s)));
  const int n = std::max(1, std::min(m.spec.concurrency, std::max(1, m.spec.requests)));
  m.running = n;
  for (int i = 0; i < n; ++i) m.threads.emplace_back([&m] { m.Worker(); });
}

bool BackgroundLoad::WaitUntilInFlight(double timeout_s) {
  Impl& m = *impl_;
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(timeout_s));
  auto cli = NewClient(m.ep);
  while (Clock::now() < until) {
    {
      std::unique_lock lk(m.mu);
      m.cv.wait_until(lk, std::min(until, Clock::now() + kSlotsPoll),
                      [&] { return m.streams_live > 0 || m.running == 0; });
      if (m.streams_live > 0) return true;
      // Nothing is or will be in flight any more: waiting longer cannot help.
      if (m.running == 0) return false;
    }
    SetTimeouts(*cli, std::min(until, Clock::now() + std::chrono::seconds(2)));
    if (auto res = cli->Get("/slots"); res && res->status == 200) {
      const json j = json::parse(res->body, nullptr, false);
      if (!j.is_discarded() && j.contains("slots") && j["slots"].is_array())
        for (const auto& s : j["slots"])
          if (s.is_object() && s.value("state", "") == "busy") return true;
    }
  }
  return false;
}

LoadOutcome BackgroundLoad::Finish() {
  Impl& m = *impl_;
  {
    std::unique_lock lk(m.mu);
    m.cv.wait_until(lk, m.deadline, [&] { return m.running == 0; });
  }
  m.StopAndJoin();
  LoadOutcome o;
  o.requests = m.spec.requests;
  o.concurrency = m.spec.concurrency;
  std::string joined;
  for (int k = 0; k < m.spec.requests; ++k) {
    const auto i = static_cast<std::size_t>(k);
    const bool ok = m.status[i] == 1;
    (ok ? o.completed : o.failed) += 1;
    const std::vector<std::int32_t> prompt = LoadPrompt(m.spec, m.vocab, k);
    o.digests.push_back(Sha256Tokens(prompt) + ":" + (ok ? m.output_digest[i] : "failed"));
    joined += (k ? "\n" : "") + o.digests.back();
  }
  o.digest = Sha256Hex(joined);
  o.seconds = m.t0 == Clock::time_point{}
                  ? 0.0
                  : std::chrono::duration<double>(Clock::now() - m.t0).count();
  return o;
}

}  // namespace lockstep
