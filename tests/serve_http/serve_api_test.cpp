// What the campaign runner (issue 25) needs from `lockstep serve`: a request's export downloaded
// over HTTP (streamed, authenticated, with its digest; only names the server wrote; never a
// partial file), the server's identity (`engine_instance`, effective config and its digest) in
// /v1/lockstep/info, /health and every completion, and `"lockstep": {"cache": "bypass"}` (a
// request that neither reads nor writes the prefix cache).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "lockstep/compare/export_reader.h"
#include "lockstep/instrument/fingerprint.h"
#include "serve_process.h"
#include "test_util.h"

namespace lockstep::test {
namespace {

using nlohmann::json;

std::vector<std::string> Args(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model", ModelDir("tiny"), "--port", "0", "--threads", "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

json PostJson(httplib::Client& cli, const json& body, int* status) {
  auto res = cli.Post("/v1/completions", body.dump(), "application/json");
  *status = res ? res->status : -1;
  return res ? json::parse(res->body, nullptr, false) : json();
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool Hex(const std::string& s, std::size_t n) {
  return s.size() == n && std::regex_match(s, std::regex("[0-9a-f]+"));
}

constexpr const char* kKey = "campaign-key";

TEST(ServeApi, ExportDownloadIsTheFileWithItsDigest) {
  const std::string dir = NewDir("api-exports");
  ServeProcess srv(Args({"--export-dir", dir, "--api-key", kKey}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client(kKey);
  int status = 0;
  const json r = PostJson(*cli,
                          {{"prompt", {1, 2, 3, 4, 5, 6}},
                           {"max_tokens", 12},
                           {"temperature", 0},
                           {"lockstep", {{"export", {{"windows", "all"}}}, {"arm", "A1"}}}},
                          &status);
  ASSERT_EQ(status, 200) << r;
  const std::string name = r["lockstep"]["export"].get<std::string>();
  const std::string sha = r["lockstep"]["export_sha256"].get<std::string>();
  const std::string file = ReadAll(dir + "/" + name);
  ASSERT_GT(file.size(), 1000u);
  EXPECT_EQ(sha, Sha256Hex(file));
  auto got = cli->Get(("/v1/exports/" + name).c_str());
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(got->get_header_value("X-Lockstep-Sha256"), sha);
  EXPECT_EQ(got->get_header_value("Content-Length"), std::to_string(file.size()));
  EXPECT_TRUE(got->body == file) << got->body.size() << " bytes vs " << file.size();
  // Authenticated like every endpoint but /health.
  auto anon = srv.Client(), wrong = srv.Client("campaign-kez");
  EXPECT_EQ(anon->Get(("/v1/exports/" + name).c_str())->status, 401);
  EXPECT_EQ(wrong->Get(("/v1/exports/" + name).c_str())->status, 401);
  // Only names the server wrote: a file someone put into the folder, the partial name, paths.
  std::ofstream(dir + "/planted.h5") << "not the server's";
  std::filesystem::create_directories(dir + "/sub");
  std::ofstream(dir + "/sub/" + name) << "nested";
  const std::string up = "..%2F" + std::filesystem::path(dir).filename().string() + "%2F";
  const std::vector<std::string> refused = {
      "planted.h5",    name + ".partial", "..",  "%2E%2E", "..%2F..%2Fetc%2Fpasswd", "sub/" + name,
      "sub%2F" + name, up + name,         "%00", "",       "cmpl-00000000-000001.h5"};
  for (const std::string& bad : refused) {
    auto res = cli->Get(("/v1/exports/" + bad).c_str());
    ASSERT_TRUE(res) << bad;
    EXPECT_EQ(res->status, 404) << bad << ": " << res->body;
    EXPECT_EQ(res->get_header_value("X-Lockstep-Sha256"), "") << bad;
  }
  auto raw = RawExchange(srv.port(),
                         "GET /v1/exports/../../" + name +
                             " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + kKey +
                             "\r\nConnection: close\r\n\r\n",
                         10);
  EXPECT_NE(RawStatus(raw), 200) << raw.substr(0, 200);
  // The server keeps serving, and the download stays the same bytes.
  PostJson(*cli, {{"prompt", {7, 8}}, {"max_tokens", 2}}, &status);
  EXPECT_EQ(status, 200);
  auto again = cli->Get(("/v1/exports/" + name).c_str());
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200);
  EXPECT_TRUE(again->body == file);
  // The log never names the folder.
  EXPECT_EQ(srv.Log().find(dir), std::string::npos);
}

// The id of a response from its raw headers ("X-Request-Id: cmpl-...").
std::string RequestId(const std::string& raw) {
  const std::size_t at = raw.find("X-Request-Id: ");
  if (at == std::string::npos) return "";
  return raw.substr(at + 14, raw.find("\r\n", at) - at - 14);
}

TEST(ServeApi, AnExportBeingWrittenIsNeverServed) {
  const std::string dir = NewDir("api-partial");
  ServeProcess srv(Args({"--export-dir", dir, "--max-context", "4096"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  std::string name;
  {
    RawStream s(srv.port(), CompletionRequestBytes(json{
                                {"prompt", "long"},
                                {"max_tokens", 3000},
                                {"ignore_eos", true},
                                {"stream", true},
                                {"lockstep",
                                 {{"export", true}}}}.dump()));
    ASSERT_TRUE(s.ReadUntil("data: ", 30)) << s.data();
    name = RequestId(s.data()) + ".h5";
    ASSERT_GT(name.size(), 3u) << s.data();
    auto res = cli->Get(("/v1/exports/" + name).c_str());
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 409) << res->body;
    EXPECT_EQ(json::parse(res->body)["error"]["code"], "export_not_finished");
  }  // the client goes away: the request is cancelled, its export stays .partial
  for (int i = 0; i < 100; ++i) {
    auto res = cli->Get(("/v1/exports/" + name).c_str());
    ASSERT_TRUE(res);
    if (res->status == 404) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(cli->Get(("/v1/exports/" + name).c_str())->status, 404);
  EXPECT_EQ(cli->Get(("/v1/exports/" + name + ".partial").c_str())->status, 404);
}

// An export over --max-export-mib (issue 43): the all-windows export of a long request is
// answered 413 naming the budget, plain and streamed, and leaves no file (no .partial either);
// an export within the budget is written as before.
TEST(ServeApi, AnExportOverItsBudgetIs413AndLeavesNoFile) {
  const std::string dir = NewDir("api-budget");
  ServeProcess srv(Args({"--export-dir", dir, "--max-export-mib", "1"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  const json big = {{"prompt", "hello there"},
                    {"max_tokens", 200},
                    {"ignore_eos", true},
                    {"lockstep", {{"export", {{"windows", "all"}}}}}};
  int status = 0;
  const json r = PostJson(*cli, big, &status);
  EXPECT_EQ(status, 413) << r.dump();
  EXPECT_EQ(r["error"]["code"], "export_too_large") << r.dump();
  EXPECT_EQ(r["error"]["param"], "lockstep.export") << r.dump();
  EXPECT_NE(r["error"]["message"].get<std::string>().find("--max-export-mib (1.0 MiB)"),
            std::string::npos)
      << r.dump();
  // It ended at the budget, not after its 200 tokens (the export stopped it at its first
  // checkpoint: a few tokens at most).
  auto m = cli->Get("/metrics");
  ASSERT_TRUE(m);
  const auto at = m->body.find("\nlockstep_generated_tokens_total ");
  ASSERT_NE(at, std::string::npos) << m->body;
  EXPECT_LT(std::stod(m->body.substr(at + 33)), 10.0) << m->body.substr(at, 60);
  // Counted as the error it was answered as, never as a completion that stopped.
  EXPECT_NE(m->body.find("lockstep_completions_total{finish_reason=\"error\"} 1\n"),
            std::string::npos)
      << m->body;
  EXPECT_EQ(m->body.find("lockstep_completions_total{finish_reason=\"stop\"}"), std::string::npos)
      << m->body;
  json streamed = big;
  streamed["stream"] = true;
  auto res = cli->Post("/v1/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_NE(res->body.find("export_too_large"), std::string::npos) << res->body;
  EXPECT_EQ(res->body.find("\"finish_reason\":\"stop\""), std::string::npos) << res->body;
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "an export over its budget left a file";
  const json small = {{"prompt", "hello there"},
                      {"max_tokens", 8},
                      {"lockstep", {{"export", {{"windows", "0-2"}}}}}};
  const json ok = PostJson(*cli, small, &status);
  ASSERT_EQ(status, 200) << ok.dump();
  EXPECT_TRUE(std::filesystem::exists(dir + "/" + ok["lockstep"]["export"].get<std::string>()))
      << ok.dump();
}

// Leftovers of earlier processes (issue 43): unfinished exports and atomic-write temp files
// older than a minute before the start are removed at start and counted in /metrics; a fresh
// one (a live process may be writing it), other names, a symlink and a folder are left alone.
TEST(ServeApi, StaleLeftoversAreRemovedAtStartAndCounted) {
  namespace fs = std::filesystem;
  const std::string ex = NewDir("api-stale-ex"), sl = NewDir("api-stale-sl");
  auto put = [](const std::string& path, std::size_t bytes, bool old) {
    std::ofstream(path, std::ios::binary) << std::string(bytes, 'x');
    if (old) fs::last_write_time(path, fs::file_time_type::clock::now() - std::chrono::hours(2));
  };
  put(ex + "/cmpl-1-000001.h5.partial", 1000, true);
  put(sl + "/conv.slot.tmp.4242", 24, true);
  put(ex + "/cmpl-2-000001.h5.partial", 10, false);  // fresh: kept
  put(ex + "/kept.h5", 10, true);                    // a finished export: kept
  put(sl + "/conv.tmp.x1", 10, true);                // not <name>.tmp.<pid>: kept
  put(ex + "/target", 10, true);
  fs::create_symlink(ex + "/target", ex + "/link.h5.partial");  // a symlink: kept, and its target
  fs::create_directory(ex + "/dir.partial");
  ServeProcess srv(Args({"--export-dir", ex, "--slot-dir", sl}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  EXPECT_FALSE(fs::exists(ex + "/cmpl-1-000001.h5.partial"));
  EXPECT_FALSE(fs::exists(sl + "/conv.slot.tmp.4242"));
  for (const std::string& kept : {ex + "/cmpl-2-000001.h5.partial", ex + "/kept.h5",
                                  sl + "/conv.tmp.x1", ex + "/target", ex + "/dir.partial"})
    EXPECT_TRUE(fs::exists(kept)) << kept;
  EXPECT_TRUE(fs::is_symlink(ex + "/link.h5.partial"));
  auto m = srv.Client()->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("\nlockstep_stale_files_removed_total 2\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("\nlockstep_stale_bytes_removed_total 1024\n"), std::string::npos);
}

TEST(ServeApi, InfoHealthAndCompletionsNameTheEngineInstance) {
  ServeProcess srv(Args({"--api-key", kKey, "--slots", "3"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client(kKey), anon = srv.Client();
  EXPECT_EQ(anon->Get("/v1/lockstep/info")->status, 401);
  auto res = cli->Get("/v1/lockstep/info");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json info = json::parse(res->body);
  const std::string inst = info["engine_instance"].get<std::string>();
  EXPECT_TRUE(Hex(inst, 32)) << inst;
  EXPECT_TRUE(Hex(info["config_sha256"].get<std::string>(), 64)) << info;
  EXPECT_EQ(info["config_sha256"], Sha256Hex(info["config"].dump())) << info;
  EXPECT_EQ(info["config"]["slots"], 3) << info;
  EXPECT_EQ(info["config"]["threads"], 1) << info;
  EXPECT_EQ(info["model"]["name"], std::filesystem::path(ModelDir("tiny")).filename().string());
  EXPECT_TRUE(Hex(info["model"]["sha256"].get<std::string>(), 64)) << info;
  EXPECT_FALSE(info["version"].get<std::string>().empty());
  EXPECT_GT(info["started_unix"].get<std::int64_t>(), 1'700'000'000);
  const json health = json::parse(anon->Get("/health")->body);
  EXPECT_EQ(health["engine_instance"], inst);
  int status = 0;
  const json r = PostJson(*cli, {{"prompt", {1, 2, 3}}, {"max_tokens", 2}}, &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(r["lockstep"]["engine_instance"], inst);
  EXPECT_EQ(info["completions_run"], 0);
  EXPECT_EQ(json::parse(cli->Get("/v1/lockstep/info")->body)["completions_run"], 1);
  EXPECT_TRUE(r["lockstep"]["export_sha256"].is_null());
  // Another server is another instance.
  ServeProcess other(Args({}));
  ASSERT_TRUE(other.started());
  const json h2 = json::parse(other.Client()->Get("/health")->body);
  EXPECT_TRUE(Hex(h2["engine_instance"].get<std::string>(), 32));
  EXPECT_NE(h2["engine_instance"], inst);
}

// A tiny model with the handwritten BPE tokenizer.json of the tokenizer tests.
const std::string& TinyBpeModel() {
  static const std::string dir = [] {
    const std::string d = NewDir("api-bpe-model") + "/m";
    const CmdResult r = RunLockstep("model init --preset tiny --seed 7 --tokenizer " +
                                    std::string(LOCKSTEP_SOURCE_DIR) +
                                    "/tests/tokenizer/data/tiny_tokenizer.json --out " + d);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return d;
  }();
  return dir;
}

TEST(ServeApi, TextPromptsAndOutputsGoThroughTheModelsTokenizer) {
  const std::string m = TinyBpeModel();
  ServeProcess srv({"--model", m, "--port", "0", "--threads", "1"});
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  for (const char* prompt :
       {"hello world", "hello world<|sp|> abc", "h\xC3\xA9llo, w\xC3\xB6rld!"}) {
    const CmdResult g = RunLockstep("generate --model " + m + " --threads 1 --prompt '" + prompt +
                                    "' --max-new 24 --ignore-eos --json -");
    ASSERT_EQ(g.exit_code, 0) << g.err;
    const json want = json::parse(g.out);
    int status = 0;
    const json req = {
        {"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
    const json r = PostJson(*cli, req, &status);
    ASSERT_EQ(status, 200) << r;
    EXPECT_EQ(r["usage"]["prompt_tokens"], want["prompt_tokens"]) << prompt;
    EXPECT_EQ(r["lockstep"]["output_ids"], want["output_ids"]) << prompt;
    EXPECT_EQ(r["choices"][0]["text"], want["text"]) << prompt;
    // Streamed, window by window, the text is the same.
    json sreq = req;
    sreq["stream"] = true;
    auto res = cli->Post("/v1/completions", sreq.dump(), "application/json");
    ASSERT_TRUE(res);
    std::string text;
    for (std::size_t at = 0; (at = res->body.find("data: {", at)) != std::string::npos;) {
      const std::size_t end = res->body.find("\n\n", at);
      text += json::parse(res->body.substr(at + 6, end - at - 6))["choices"][0]["text"]
                  .get<std::string>();
      at = end;
    }
    EXPECT_EQ(text, want["text"].get<std::string>()) << prompt;
  }
  EXPECT_EQ(RunLockstep("tokenize --model " + m + " 'hello world'").out, "261 266\n");
}

// The /counters of an export, "stage0" -> attribute -> value.
std::map<std::string, std::map<std::string, std::int64_t>> Counters(const std::string& path) {
  auto r = ExportReader::Open(path);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? (*r)->meta().counters : decltype((*r)->meta().counters){};
}

TEST(ServeApi, ExportCountersAreTheRequestsOwnAsGenerateCountsThem) {
  const std::string dir = NewDir("api-counters");
  ServeProcess srv(Args({"--export-dir", dir, "--slots", "2"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  int status = 0;
  // Another request first: the counters must be the exported request's alone.
  PostJson(*cli, {{"prompt", "before"}, {"max_tokens", 30}, {"ignore_eos", true}}, &status);
  ASSERT_EQ(status, 200);
  const json r = PostJson(*cli,
                          {{"prompt", "count my experts"},
                           {"max_tokens", 20},
                           {"temperature", 0},
                           {"ignore_eos", true},
                           {"lockstep", {{"export", {{"windows", "all"}}}}}},
                          &status);
  ASSERT_EQ(status, 200) << r;
  const std::string gen = NewDir("api-counters-gen") + "/gen.h5";
  const CmdResult g = RunLockstep("generate --model " + ModelDir("tiny") +
                                  " --threads 1 --prompt 'count my experts' --max-new 20 "
                                  "--ignore-eos --export " +
                                  gen + " --export-windows all");
  ASSERT_EQ(g.exit_code, 0) << g.err;
  const auto want = Counters(gen);
  const auto got = Counters(dir + "/" + r["lockstep"]["export"].get<std::string>());
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(got, want);
  std::int64_t routed = 0;
  for (const auto& [stage, attrs] : got)
    routed += attrs.at("expert_hits") + attrs.at("expert_misses");
  EXPECT_GT(routed, 0);
  // The run metadata that follows from the request is generate's too.
  auto a = ExportReader::Open(gen);
  auto b = ExportReader::Open(dir + "/" + r["lockstep"]["export"].get<std::string>());
  ASSERT_TRUE(a.ok() && b.ok());
  const ExportMeta &ma = (*a)->meta(), &mb = (*b)->meta();
  ASSERT_FALSE(ma.output_tokens.empty());
  EXPECT_EQ(mb.request_tokens, ma.request_tokens);
  EXPECT_EQ(mb.request_sha256, ma.request_sha256);
  EXPECT_EQ(mb.output_tokens, ma.output_tokens);
  EXPECT_EQ(mb.stop_reason, ma.stop_reason);
  EXPECT_EQ(mb.text_sha256, ma.text_sha256);
  EXPECT_EQ(mb.seed, ma.seed);
  EXPECT_EQ(mb.max_new, ma.max_new);
}

// The value of an unlabelled series in Prometheus text; -1 when absent.
std::int64_t Metric(const std::string& text, const std::string& series) {
  const std::size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::atoll(text.c_str() + at + series.size() + 2);
}

TEST(ServeApi, PrefixCacheEvictionsAreInMetrics) {
  // A budget of 1 MiB holds a few of tiny's snapshots: distinct prompts evict the oldest.
  ServeProcess srv(Args({"--prefix-cache", "on", "--prefill", "32", "--prefix-cache-mib", "1"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  const std::string before = cli->Get("/metrics")->body;
  EXPECT_EQ(Metric(before, "lockstep_prefix_cache_evictions_total"), 0) << before;
  EXPECT_EQ(Metric(before, "lockstep_prefix_cache_budget_bytes"), 1 << 20);
  for (int p = 0; p < 12; ++p) {
    std::vector<int> ids;
    for (int i = 0; i < 200; ++i) ids.push_back((p * 37 + i * 11) % 500);
    int status = 0;
    PostJson(*cli, {{"prompt", ids}, {"max_tokens", 2}}, &status);
    ASSERT_EQ(status, 200);
  }
  const std::string m = cli->Get("/metrics")->body;
  const std::int64_t inserts = Metric(m, "lockstep_prefix_cache_inserts_total"),
                     evictions = Metric(m, "lockstep_prefix_cache_evictions_total"),
                     entries = Metric(m, "lockstep_prefix_cache_entries");
  EXPECT_EQ(inserts, 12 * 6) << m;  // 32, 64, ..., 192 of each prompt
  EXPECT_GT(evictions, 0) << m;
  EXPECT_EQ(inserts - evictions, entries) << m;
  EXPECT_LE(Metric(m, "lockstep_prefix_cache_bytes"), 1 << 20) << m;
  EXPECT_EQ(Metric(m, "lockstep_prefix_cache_queries_total"), 12);
  // Without a cache the series are absent.
  ServeProcess off(Args({}));
  ASSERT_TRUE(off.started());
  EXPECT_EQ(Metric(off.Client()->Get("/metrics")->body, "lockstep_prefix_cache_queries_total"), -1);
}

// Non-blocking connects to 127.0.0.1:port; the fds.
std::vector<int> Connect(int port, int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    (void)::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    fds.push_back(fd);
  }
  return fds;
}

// How many of `fds` completed their handshake within `ms`.
int Established(const std::vector<int>& fds, int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  int n = 0;
  for (int fd : fds) {
    pollfd p{fd, POLLOUT, 0};
    int err = -1;
    socklen_t len = sizeof(err);
    if (::poll(&p, 1, 0) == 1 && (p.revents & POLLOUT) &&
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0)
      ++n;
  }
  return n;
}

TEST(ServeApi, ABurstOfConnectsWaitsInTheBacklog) {
  // The cause of the rare unanswered request: cpp-httplib's listen backlog of 5. With the server
  // stopped (its accept thread cannot run, as on a loaded machine), the kernel completes only as
  // many handshakes as the backlog holds and drops the other SYNs (each then waits 1 s, 3 s, 7 s
  // for a retransmit). The server's backlog is --max-connections.
  ServeProcess srv(Args({"--max-connections", "64", "--http-threads", "48"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  srv.Signal(SIGSTOP);
  const std::vector<int> fds = Connect(srv.port(), 40);
  const int established = Established(fds, 300);
  srv.Signal(SIGCONT);
  EXPECT_EQ(established, 40) << "the accept backlog held only " << established;
  // Every one of them is then served.
  int answered = 0;
  for (int fd : fds) {
    const int flags = ::fcntl(fd, F_GETFL);
    ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (::send(fd, get.data(), get.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(get.size()))
      continue;
    char buf[256];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 12 && std::string(buf, 12) == "HTTP/1.1 200") ++answered;
  }
  for (int fd : fds) ::close(fd);
  EXPECT_EQ(answered, 40);
}

TEST(ServeApi, CacheBypassNeitherReadsNorWritesThePrefixCache) {
  ServeProcess srv(Args({"--prefix-cache", "on", "--prefill", "32", "--slots", "2"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  auto ask = [&](int seed, const char* cache) {
    std::vector<int> ids;
    for (int i = 0; i < 100; ++i) ids.push_back((seed * 131 + i * 17) % 500);
    json req = {{"prompt", ids}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}};
    if (cache) req["lockstep"] = {{"cache", cache}};
    int status = 0;
    json r = PostJson(*cli, req, &status);
    EXPECT_EQ(status, 200) << r;
    return r;
  };
  const json cold = ask(1, nullptr);
  EXPECT_EQ(cold["lockstep"]["prompt_tokens_reused"], 0);
  const json warm = ask(1, "use");
  EXPECT_EQ(warm["lockstep"]["prompt_tokens_reused"], 96) << warm["lockstep"];
  EXPECT_EQ(warm["lockstep"]["cache"], "use");
  const json bypassed = ask(1, "bypass");
  EXPECT_EQ(bypassed["lockstep"]["prompt_tokens_reused"], 0) << bypassed["lockstep"];
  EXPECT_EQ(bypassed["lockstep"]["snapshot_position"], -1);
  EXPECT_EQ(bypassed["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(bypassed["lockstep"]["cache"], "bypass");
  EXPECT_EQ(bypassed["lockstep"]["output_ids"], cold["lockstep"]["output_ids"]);
  EXPECT_EQ(warm["lockstep"]["output_ids"], cold["lockstep"]["output_ids"]);
  // A bypassed request stores nothing: the same prompt afterwards is cold.
  const json first = ask(2, "bypass");
  const json after = ask(2, "use");
  EXPECT_EQ(after["lockstep"]["prompt_tokens_reused"], 0) << after["lockstep"];
  EXPECT_EQ(after["lockstep"]["output_ids"], first["lockstep"]["output_ids"]);
  // /metrics counts the cache's own lookups: the three requests that used it.
  const std::string m = cli->Get("/metrics")->body;
  EXPECT_EQ(Metric(m, "lockstep_prefix_cache_queries_total"), 3) << m;
  EXPECT_EQ(Metric(m, "lockstep_prefix_cache_hits_total"), 1);
  EXPECT_EQ(Metric(m, "lockstep_prefix_cache_misses_total"), 2);
  EXPECT_EQ(Metric(m, "lockstep_prefix_cache_tokens_reused_total"), 96);
  // 32, 64 and 96 of each prompt, stored by its first request that used the cache.
  EXPECT_EQ(Metric(m, "lockstep_prefix_cache_inserts_total"), 3 + 3);
  EXPECT_EQ(Metric(m, "lockstep_prefix_cache_entries"), 3 + 3);
  EXPECT_EQ(Metric(m, "lockstep_prefix_cache_evictions_total"), 0);
  int status = 0;
  const json bad = PostJson(*cli, {{"prompt", {1}}, {"lockstep", {{"cache", "off"}}}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(bad["error"]["param"], "lockstep.cache") << bad;
}

}  // namespace
}  // namespace lockstep::test
