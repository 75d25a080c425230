// `lockstep serve` end to end (issue 24, Must show 1, 2, 4, 5): the real binary on an ephemeral
// loopback port, spoken to over HTTP. Completions equal `lockstep generate`'s tokens (greedy and
// seeded sampling, streamed and not), streamed chunks concatenate to the text, a request's export
// diffs bitwise against generate's; 16 concurrent clients get their solo outputs and /metrics adds
// up; keys and binding; SIGTERM drains, the drain limit cancels, SIGKILL leaves only `.partial`
// exports; a client that goes away frees its slot; a full queue is 429.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "serve_process.h"
#include "test_util.h"

namespace lockstep::test {
namespace {

using nlohmann::json;

struct Reply {
  int status = -1;
  json body;
  std::string raw;
  std::string retry_after;
};

Reply Post(httplib::Client& cli, const json& body) {
  Reply r;
  auto res = cli.Post("/v1/completions", body.dump(), "application/json");
  if (!res) return r;
  r.status = res->status;
  r.raw = res->body;
  r.retry_after = res->get_header_value("Retry-After");
  if (!body.value("stream", false)) r.body = json::parse(res->body, nullptr, false);
  return r;
}

// A streamed body: the concatenated text and the last chunk (finish_reason, usage, lockstep).
struct Streamed {
  std::string text;
  json last;
  bool done = false;
  int chunks = 0;
};

Streamed ParseSse(const std::string& body) {
  Streamed s;
  std::size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const std::size_t end = body.find("\n\n", at);
    const std::string data = body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") {
      s.done = true;
      continue;
    }
    json j = json::parse(data, nullptr, false);
    s.text += j["choices"][0]["text"].get<std::string>();
    ++s.chunks;
    if (!j["choices"][0]["finish_reason"].is_null()) s.last = j;
  }
  return s;
}

std::vector<int> Ids(const json& j) { return j["lockstep"]["output_ids"].get<std::vector<int>>(); }

// `lockstep generate` of the same request: its output ids.
std::vector<int> GenerateIds(const std::string& args) {
  const CmdResult r =
      RunLockstep("generate --model " + ModelDir("tiny") + " --threads 1 " + args + " --json -");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out, nullptr, false)["output_ids"].get<std::vector<int>>();
}

std::vector<std::string> Args(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model", ModelDir("tiny"), "--port", "0", "--threads", "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(ServeHttp, CompletionsEqualGenerateStreamedAndNot) {
  const std::string dir = NewDir("serve-exports");
  ServeProcess srv(Args({"--export-dir", dir}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  struct Case {
    json req;
    std::string gen;
  };
  const std::vector<Case> cases = {
      {{{"prompt", "Hello there"}, {"max_tokens", 12}, {"temperature", 0}},
       "--prompt 'Hello there' --max-new 12"},
      {{{"prompt", "Seeded"},
        {"max_tokens", 10},
        {"temperature", 0.9},
        {"top_k", 40},
        {"top_p", 0.95},
        {"seed", 11}},
       "--prompt Seeded --max-new 10 --temperature 0.9 --top-k 40 --top-p 0.95 --seed 11"},
      {{{"prompt", "aaaa aaaa aaaa"},
        {"max_tokens", 12},
        {"temperature", 0},
        {"presence_penalty", 0.5},
        {"frequency_penalty", 1.25},
        {"repeat_penalty", 1.5},
        {"repeat_last_n", 16}},
       "--prompt 'aaaa aaaa aaaa' --max-new 12 --presence-penalty 0.5 --frequency-penalty 1.25 "
       "--repeat-penalty 1.5 --repeat-last-n 16"},
  };
  for (const Case& c : cases) {
    const std::vector<int> want = GenerateIds(c.gen);
    const Reply plain = Post(*cli, c.req);
    ASSERT_EQ(plain.status, 200) << plain.raw;
    EXPECT_EQ(Ids(plain.body), want) << c.gen;
    json sreq = c.req;
    sreq["stream"] = true;
    const Reply streamed = Post(*cli, sreq);
    ASSERT_EQ(streamed.status, 200) << streamed.raw;
    const Streamed s = ParseSse(streamed.raw);
    EXPECT_TRUE(s.done);
    EXPECT_GE(s.chunks, 2);
    EXPECT_EQ(Ids(s.last), want) << c.gen;
    EXPECT_EQ(s.text, plain.body["choices"][0]["text"].get<std::string>());
    EXPECT_EQ(s.last["usage"], plain.body["usage"]);
  }
  // The export of a request diffs bitwise against generate's export of the same request.
  json ereq = cases[1].req;
  ereq["lockstep"] = {{"export", {{"windows", "all"}}}, {"arm", "served"}};
  const Reply ex = Post(*cli, ereq);
  ASSERT_EQ(ex.status, 200) << ex.raw;
  const std::string name = ex.body["lockstep"]["export"].get<std::string>();
  EXPECT_EQ(name, ex.body["id"].get<std::string>() + ".h5");
  ASSERT_TRUE(std::filesystem::exists(dir + "/" + name));
  const std::string gen_h5 = NewDir("serve-gen") + "/gen.h5";
  ASSERT_EQ(RunLockstep("generate --model " + ModelDir("tiny") + " --threads 1 " + cases[1].gen +
                        " --export " + gen_h5 + " --export-windows all")
                .exit_code,
            0);
  const CmdResult diff =
      RunLockstep("diff " + gen_h5 + " " + dir + "/" + name + " --nrmse-max 0 --kl-max 0 --quiet");
  EXPECT_EQ(diff.exit_code, 0) << diff.out << diff.err;
  // The log names requests by id, never the prompt or the export path.
  const std::string log = srv.Log();
  EXPECT_EQ(log.find("Hello there"), std::string::npos) << log;
  EXPECT_EQ(log.find(dir), std::string::npos) << log;
}

// The request of client c, round k: mixed prompt lengths and output lengths, greedy and seeded.
json LoadRequest(int variant) {
  const int n_prompt = 2 + (variant * 7) % 37, max_tokens = 4 + (variant * 5) % 21;
  std::vector<int> ids;
  for (int i = 0; i < n_prompt; ++i) ids.push_back((variant * 31 + i * 17) % 500);
  json r = {{"prompt", ids}, {"max_tokens", max_tokens}, {"ignore_eos", true}};
  r["temperature"] = variant % 2 ? 0.8 : 0.0;
  r["seed"] = variant;
  return r;
}

std::int64_t MetricValue(const std::string& text, const std::string& series) {
  const std::size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::atoll(text.c_str() + at + series.size() + 2);
}

std::int64_t PeakRssKib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6);
  return -1;
}

TEST(ServeHttp, SixteenClientsGetTheirSoloOutputs) {
  constexpr int kClients = 16, kRounds = 8, kVariants = 8;
  ServeProcess srv(Args({"--slots", "16", "--memory-mib", "256"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  std::map<int, std::vector<int>> solo;
  auto cli = srv.Client();
  for (int v = 0; v < kVariants; ++v) {
    const Reply r = Post(*cli, LoadRequest(v));
    ASSERT_EQ(r.status, 200) << r.raw;
    solo[v] = Ids(r.body);
  }
  const std::int64_t base_kib = PeakRssKib(srv.pid());
  std::atomic<int> ok{0}, mismatched{0}, failed{0};
  std::atomic<std::int64_t> generated{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c)
    clients.emplace_back([&, c] {
      auto my = srv.Client();
      for (int k = 0; k < kRounds; ++k) {
        const int v = (c + k) % kVariants;
        json req = LoadRequest(v);
        if ((c + k) % 3 == 0) req["stream"] = true;
        const Reply r = Post(*my, req);
        if (r.status != 200) {
          std::fprintf(stderr, "request %d/%d: status %d %s\n", c, k, r.status, r.raw.c_str());
          ++failed;
          continue;
        }
        const json& j = req.value("stream", false) ? ParseSse(r.raw).last : r.body;
        (Ids(j) == solo[v] ? ok : mismatched)++;
        generated += static_cast<std::int64_t>(solo[v].size());
      }
    });
  for (auto& t : clients) t.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(ok, kClients * kRounds);
  EXPECT_EQ(mismatched, 0);
  EXPECT_EQ(failed, 0);
  EXPECT_LT(wall, 90.0);
  // /metrics adds up: every completion counted once by status, every token once.
  auto res = cli->Get("/metrics");
  ASSERT_TRUE(res);
  const int n_total = kVariants + kClients * kRounds;
  std::int64_t solo_tokens = 0;
  for (const auto& [v, ids] : solo) solo_tokens += static_cast<std::int64_t>(ids.size());
  EXPECT_EQ(
      MetricValue(res->body, "lockstep_requests_total{endpoint=\"/v1/completions\",code=\"200\"}"),
      n_total)
      << res->body;
  EXPECT_EQ(MetricValue(res->body, "lockstep_generated_tokens_total"), solo_tokens + generated);
  EXPECT_EQ(MetricValue(res->body, "lockstep_completions_total{finish_reason=\"length\"}"),
            n_total);
  EXPECT_EQ(MetricValue(res->body, "lockstep_slots_busy"), 0);
  EXPECT_EQ(MetricValue(res->body, "lockstep_time_to_first_token_seconds_count"), n_total);
  // The peak RSS grew by no more than the --memory-mib reservation.
  EXPECT_LE(PeakRssKib(srv.pid()) - base_kib, 256 * 1024) << base_kib;
}

TEST(ServeHttp, KeysAndBinding) {
  std::string err;
  EXPECT_EQ(ServeExitCode(Args({"--host", "0.0.0.0"}), 30, &err), 2);
  EXPECT_NE(err.find("API key"), std::string::npos) << err;
  ServeProcess srv(Args({"--api-key", "s3cret-key"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto none = srv.Client(), wrong = srv.Client("s3cret-kex"), longer = srv.Client("s3cret-key2"),
       repeated = srv.Client("s3cret-keys3cret-key"), good = srv.Client("s3cret-key");
  EXPECT_EQ(none->Get("/health")->status, 200);  // a load balancer's probe needs no key
  for (const char* path : {"/v1/models", "/slots", "/metrics"}) {
    EXPECT_EQ(none->Get(path)->status, 401) << path;
    EXPECT_EQ(wrong->Get(path)->status, 401) << path;
    EXPECT_EQ(longer->Get(path)->status, 401) << path;
    EXPECT_EQ(repeated->Get(path)->status, 401) << path;
    EXPECT_EQ(good->Get(path)->status, 200) << path;
  }
  const json req = {{"prompt", "hi"}, {"max_tokens", 2}};
  const Reply refused = Post(*wrong, req);
  EXPECT_EQ(refused.status, 401);
  EXPECT_EQ(refused.body["error"]["type"], "authentication_error") << refused.raw;
  EXPECT_EQ(Post(*good, req).status, 200);
  EXPECT_EQ(srv.Log().find("s3cret"), std::string::npos);
}

// Waits until /slots shows `n` requests in the server, holding a slot or queued for one (or
// `timeout_s` passes): admission by memory reservation may queue some of them.
bool WaitLive(const ServeProcess& srv, int n, double timeout_s) {
  auto cli = srv.Client();
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < timeout_s) {
    auto r = cli->Get("/slots");
    const json j = r ? json::parse(r->body, nullptr, false) : json();
    if (j.is_object() && j.value("live", 0) + j.value("queue_depth", 0) >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

TEST(ServeHttp, SigtermDrainsRunningRequests) {
  // 3,000 tokens each: on `tiny` a request of a few hundred can end before the last client has
  // connected, and then the 8 are never in the server together.
  ServeProcess srv(Args({"--slots", "8", "--drain-s", "60", "--max-context", "4096"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  std::vector<Reply> replies(8);
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i)
    clients.emplace_back([&, i] {
      auto cli = srv.Client();
      json req = {{"prompt", "drain " + std::to_string(i)},
                  {"max_tokens", 3000},
                  {"ignore_eos", true},
                  {"temperature", 0}};
      if (i % 2) req["stream"] = true;
      replies[static_cast<std::size_t>(i)] = Post(*cli, req);
    });
  const bool all_live = WaitLive(srv, 8, 30);  // all 8 running when the signal comes
  srv.Signal(SIGTERM);
  for (auto& t : clients) t.join();
  ASSERT_TRUE(all_live);
  for (const Reply& r : replies) {
    ASSERT_EQ(r.status, 200) << r.raw;
    const json& j = r.body.is_object() ? r.body : ParseSse(r.raw).last;
    EXPECT_EQ(j["usage"]["completion_tokens"], 3000) << r.raw;
  }
  EXPECT_EQ(srv.Wait(30), 0) << srv.Log();
}

// The export files of `dir`: complete (".h5") and partial (".h5.partial").
std::pair<int, int> Exports(const std::string& dir) {
  int complete = 0, partial = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 3 && n.substr(n.size() - 3) == ".h5") ++complete;
    if (n.find(".h5.partial") != std::string::npos) ++partial;
  }
  return {complete, partial};
}

// All 3,000 windows exported: far over the default --max-export-mib, so the servers that take it
// run with --max-export-mib 0 (no budget: the request must still be writing when it is stopped).
std::string LongExportRequest() {
  return json{{"prompt", "long"},
              {"max_tokens", 3000},
              {"ignore_eos", true},
              {"stream", true},
              {"lockstep", {{"export", {{"windows", "all"}}}}}}
      .dump();
}

TEST(ServeHttp, DrainLimitCancelsAndKillLeavesOnlyPartialExports) {
  {
    const std::string dir = NewDir("serve-drain");
    ServeProcess srv(Args({"--export-dir", dir, "--drain-s", "0.3", "--max-context", "4096",
                           "--max-export-mib", "0"}));
    ASSERT_TRUE(srv.started()) << srv.Log();
    RawStream s(srv.port(), CompletionRequestBytes(LongExportRequest()));
    ASSERT_TRUE(s.ReadUntil("data: ", 30)) << s.data();
    srv.Signal(SIGTERM);
    EXPECT_EQ(srv.Wait(20), 0) << srv.Log();
    s.ReadAll(5);
    EXPECT_NE(s.data().find("\"finish_reason\":\"cancelled\""), std::string::npos);
    EXPECT_EQ(Exports(dir), std::make_pair(0, 1));
  }
  const std::string dir = NewDir("serve-kill");
  ServeProcess srv(Args({"--export-dir", dir, "--max-context", "4096", "--max-export-mib", "0"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  RawStream s(srv.port(), CompletionRequestBytes(LongExportRequest()));
  ASSERT_TRUE(s.ReadUntil("data: ", 30)) << s.data();
  srv.Signal(SIGKILL);
  EXPECT_EQ(srv.Wait(10), 128 + SIGKILL);
  EXPECT_EQ(Exports(dir), std::make_pair(0, 1));
}

TEST(ServeHttp, ClientThatGoesAwayFreesItsSlot) {
  ServeProcess srv(Args({"--slots", "1", "--max-context", "8192"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  {
    RawStream s(srv.port(), CompletionRequestBytes(json{
                                {"prompt", "gone"},
                                {"max_tokens", 8000},
                                {"ignore_eos", true},
                                {"stream", true}}.dump()));
    ASSERT_TRUE(s.ReadUntil("data: ", 30)) << s.data();
  }  // closed mid-stream
  auto cli = srv.Client();
  cli->set_read_timeout(15, 0);
  const auto t0 = std::chrono::steady_clock::now();
  const Reply next = Post(*cli, {{"prompt", "next"}, {"max_tokens", 3}});
  EXPECT_EQ(next.status, 200) << next.raw;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  const auto metrics = cli->Get("/metrics");
  EXPECT_EQ(MetricValue(metrics->body, "lockstep_completions_total{finish_reason=\"cancelled\"}"),
            1)
      << metrics->body;
  const json slots = json::parse(cli->Get("/slots")->body);
  EXPECT_EQ(slots["slots"][0]["state"], "idle") << slots;
}

TEST(ServeHttp, FullQueueIs429WithRetryAfter) {
  ServeProcess srv(Args({"--slots", "1", "--queue-depth", "1", "--max-context", "8192"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  const std::string hold =
      json{{"prompt", "hold"}, {"max_tokens", 8000}, {"ignore_eos", true}, {"stream", true}}.dump();
  RawStream running(srv.port(), CompletionRequestBytes(hold));
  ASSERT_TRUE(running.ReadUntil("data: ", 30));
  RawStream waiting(srv.port(), CompletionRequestBytes(hold));
  ASSERT_TRUE(waiting.ReadUntil("200 OK", 30));  // queued: the stream has started, no token yet
  auto cli = srv.Client();
  const Reply full = Post(*cli, {{"prompt", "third"}, {"max_tokens", 2}});
  EXPECT_EQ(full.status, 429) << full.raw;
  EXPECT_EQ(full.retry_after, "1");
  EXPECT_EQ(full.body["error"]["code"], "queue_full") << full.raw;
  // Both clients go away: their places free once the server notices (its next write fails, an
  // idle stream writes every second); a client that honours Retry-After then gets through.
  running.Close();
  waiting.Close();
  int status = 0;
  for (int i = 0; i < 20 && status != 200; ++i) {
    status = Post(*cli, {{"prompt", "after"}, {"max_tokens", 2}}).status;
    if (status == 429) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  EXPECT_EQ(status, 200);
}

}  // namespace
}  // namespace lockstep::test
