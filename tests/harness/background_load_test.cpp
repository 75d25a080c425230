// The background load client (harness/background_load.h) against a real `lockstep serve` on
// loopback (tiny model): every request counted, digests recomputable from LoadPrompt and the
// server's own answers, failures counted when the server dies mid-load, the deadline honoured,
// and a destructor that joins without waiting for the load.
#include "lockstep/harness/background_load.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <csignal>
#include <nlohmann/json.hpp>

#include "campaign_files.h"
#include "lockstep/instrument/fingerprint.h"
#include "serve_http/serve_process.h"
#include "test_util.h"

namespace lockstep {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using test::ModelDir;
using test::ServeProcess;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int TinyVocab() {
  return test::ReadJson(ModelDir("tiny") + "/config.json")["vocab_size"].get<int>();
}

std::vector<std::string> Args(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model", ModelDir("tiny"), "--port", "0", "--threads", "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

ServiceEndpoint Endpoint(const ServeProcess& srv) {
  ServiceEndpoint ep;
  ep.port = srv.port();
  return ep;
}

// The output digest of load request k asked again, alone (what the load must have recorded).
std::string AloneDigest(const ServeProcess& srv, const LoadSpec& spec, int vocab, int k) {
  auto cli = srv.Client();
  const json body = {{"prompt", LoadPrompt(spec, vocab, k)},
                     {"max_tokens", spec.max_new},
                     {"temperature", 0},
                     {"ignore_eos", true}};
  auto res = cli->Post("/v1/completions", body.dump(), "application/json");
  EXPECT_TRUE(res && res->status == 200);
  if (!res || res->status != 200) return "";
  const json j = json::parse(res->body);
  return Sha256Tokens(j["lockstep"]["output_ids"].get<std::vector<std::int32_t>>());
}

TEST(BackgroundLoad, PromptsAreAPinnedFunctionOfSeedAndIndex) {
  LoadSpec spec;
  spec.prompt_lo = 50;
  spec.prompt_hi = 400;
  spec.seed = 1;
  const int vocab = 1000;
  for (int k = 0; k < 20; ++k) {
    const auto p = LoadPrompt(spec, vocab, k);
    EXPECT_EQ(p, LoadPrompt(spec, vocab, k));
    EXPECT_GE(p.size(), 50u);
    EXPECT_LE(p.size(), 400u);
    for (auto id : p) ASSERT_TRUE(id >= 0 && id < vocab);
  }
  EXPECT_NE(LoadPrompt(spec, vocab, 0), LoadPrompt(spec, vocab, 1));
  LoadSpec other = spec;
  other.seed = 2;
  EXPECT_NE(LoadPrompt(spec, vocab, 0), LoadPrompt(other, vocab, 0));
  // Pinned: the generator is part of what a ledger's load digests mean.
  const auto p0 = LoadPrompt(spec, vocab, 0);
  EXPECT_EQ(Sha256Tokens(p0).substr(0, 16), "8d7ce2e3ec41bc63") << p0.size();
  LoadSpec fixed = spec;
  fixed.prompt_lo = fixed.prompt_hi = 7;
  EXPECT_EQ(LoadPrompt(fixed, vocab, 3).size(), 7u);
}

TEST(BackgroundLoad, CountsEveryRequestAndItsDigestsAreRecomputable) {
  ServeProcess srv(Args({"--slots", "4"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  const int vocab = TinyVocab();
  LoadSpec spec;
  spec.requests = 6;
  spec.concurrency = 3;
  spec.prompt_lo = 20;
  spec.prompt_hi = 80;
  spec.max_new = 64;  // long enough to be seen in flight on a loaded machine
  spec.seed = 5;
  spec.timeout_s = 120;
  BackgroundLoad load(Endpoint(srv), spec, vocab);
  load.Start();
  EXPECT_TRUE(load.WaitUntilInFlight(30));
  const LoadOutcome o = load.Finish();
  EXPECT_EQ(o.requests, 6);
  EXPECT_EQ(o.concurrency, 3);
  EXPECT_EQ(o.completed, 6);
  EXPECT_EQ(o.failed, 0);
  ASSERT_EQ(o.digests.size(), 6u);
  std::string joined;
  for (int k = 0; k < 6; ++k) {
    const std::string want =
        Sha256Tokens(LoadPrompt(spec, vocab, k)) + ":" + AloneDigest(srv, spec, vocab, k);
    EXPECT_EQ(o.digests[static_cast<std::size_t>(k)], want) << "request " << k;
    joined += (k ? "\n" : "") + want;
  }
  EXPECT_EQ(o.digest, Sha256Hex(joined));
  const json j = o.ToJson();
  EXPECT_EQ(j["requests"], 6);
  EXPECT_EQ(j["completed"], 6);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["digest"], o.digest);
  EXPECT_EQ(j["digests"].size(), 6u);
  EXPECT_FALSE(j.contains("seconds")) << "wall time stays out of the ledger";
  // A second load of the same spec sends the same requests and gets the same answers.
  BackgroundLoad again(Endpoint(srv), spec, vocab);
  again.Start();
  EXPECT_EQ(again.Finish().digest, o.digest);
}

TEST(BackgroundLoad, AServerStoppedMidLoadCountsFailures) {
  ServeProcess srv(Args({"--slots", "2"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  LoadSpec spec;
  spec.requests = 12;
  spec.concurrency = 2;
  spec.prompt_lo = spec.prompt_hi = 200;
  spec.max_new = 400;
  spec.timeout_s = 60;
  BackgroundLoad load(Endpoint(srv), spec, TinyVocab());
  load.Start();
  ASSERT_TRUE(load.WaitUntilInFlight(30));
  srv.Signal(SIGKILL);
  EXPECT_GE(srv.Wait(10), 0);
  const auto t0 = Clock::now();
  const LoadOutcome o = load.Finish();
  EXPECT_LT(Since(t0), 10.0) << "a dead server fails fast, not at the deadline";
  EXPECT_EQ(o.completed + o.failed, 12);
  EXPECT_GE(o.failed, 1);
  ASSERT_EQ(o.digests.size(), 12u);
  int failed_digests = 0;
  for (const auto& d : o.digests) failed_digests += d.ends_with(":failed");
  EXPECT_EQ(failed_digests, o.failed);
}

TEST(BackgroundLoad, TheDeadlineIsHonoured) {
  ServeProcess srv(Args({"--slots", "2"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  LoadSpec spec;
  spec.requests = 40;
  spec.concurrency = 2;
  spec.prompt_lo = spec.prompt_hi = 100;
  spec.max_new = 3900;  // far more than 3 s of decoding on tiny (prompt + max_new < 4096)
  spec.timeout_s = 3;
  BackgroundLoad load(Endpoint(srv), spec, TinyVocab());
  const auto t0 = Clock::now();
  load.Start();
  EXPECT_TRUE(load.WaitUntilInFlight(2.5)) << "the requests run (not refused) until cut";
  const LoadOutcome o = load.Finish();
  const double took = Since(t0);
  EXPECT_GE(took, 2.9);
  EXPECT_LT(took, 4.5) << "Finish() returns at the deadline";
  EXPECT_LT(o.seconds, 4.5);
  EXPECT_EQ(o.completed + o.failed, 40);
  EXPECT_GE(o.failed, 34) << "the in-flight and unsent requests count as failed";
  int failed_digests = 0;
  for (const auto& d : o.digests) failed_digests += d.ends_with(":failed");
  EXPECT_EQ(failed_digests, o.failed);
  // The server keeps serving after its clients were cancelled.
  auto cli = srv.Client();
  auto h = cli->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST(BackgroundLoad, TheDestructorCancelsAndJoins) {
  ServeProcess srv(Args({"--slots", "2"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  LoadSpec spec;
  spec.requests = 4;
  spec.concurrency = 2;
  spec.prompt_lo = spec.prompt_hi = 100;
  spec.max_new = 3000;  // prompt + max_new within the default --max-context 4096
  spec.timeout_s = 300;
  const auto t0 = Clock::now();
  {
    BackgroundLoad load(Endpoint(srv), spec, TinyVocab());
    load.Start();
    ASSERT_TRUE(load.WaitUntilInFlight(30));
  }
  EXPECT_LT(Since(t0), 10.0) << "destroyed without Finish(): cancelled, not waited for";
  // Nothing was started: no threads, an all-failed outcome at once.
  BackgroundLoad idle(Endpoint(srv), spec, TinyVocab());
  const LoadOutcome o = idle.Finish();
  EXPECT_EQ(o.failed, 4);
  EXPECT_FALSE(idle.WaitUntilInFlight(5));
}

}  // namespace
}  // namespace lockstep
