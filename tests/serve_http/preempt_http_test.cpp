// POST /slots/{id}?action=preempt over loopback (issue 40, item 2): a streaming completion is
// preempted twice while it decodes; its stream goes on, and its tokens are those of the same
// request unpreempted (seeded sampling, batch_invariant on), its final chunk listing both
// preemptions (reason "request", resumed by recompute). A slot that runs nothing answers 409.
// With one slot, a request sent with "lockstep": {"priority": 1} preempts the running priority-0
// stream (reason "priority"), which then ends with its unpreempted tokens.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "serve_process.h"
#include "test_util.h"

namespace lockstep::test {
namespace {

using nlohmann::json;

json Body(bool stream) {
  std::vector<int> prompt;
  for (int i = 0; i < 50; ++i) prompt.push_back((i * 37 + 5) % 500);
  return {{"prompt", prompt},
          {"max_tokens", 600},
          {"temperature", 0.8},
          {"seed", 11},
          {"ignore_eos", true},
          {"stream", stream},
          {"lockstep", {{"arm", "preempt"}}}};
}

// The last SSE chunk that carries the lockstep object (the final one).
json LastLockstepChunk(const std::string& raw) {
  json last;
  for (std::size_t at = raw.find("data: {"); at != std::string::npos;
       at = raw.find("data: {", at + 1)) {
    const std::size_t end = raw.find("\n\n", at);
    json j = json::parse(raw.substr(at + 6, end - at - 6), nullptr, false);
    if (j.is_object() && j.contains("lockstep")) last = std::move(j);
  }
  return last;
}

TEST(ServePreempt, PreemptActionIsInvisibleToTheStreamingClient) {
  ServeProcess srv({"--model", ModelDir("tiny"), "--port", "0", "--threads", "1", "--slots", "2",
                    "--prefill", "16", "--prefix-cache", "on", "--spec", "4", "--max-context",
                    "1024"});
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  auto ref = cli->Post("/v1/completions", Body(false).dump(), "application/json");
  ASSERT_TRUE(ref && ref->status == 200) << (ref ? ref->body : "no answer");
  const json want = json::parse(ref->body);
  ASSERT_FALSE(want["lockstep"].contains("preemptions"));

  // Nothing runs: 409.
  auto idle = cli->Post("/slots/0?action=preempt", "", "application/json");
  ASSERT_TRUE(idle);
  EXPECT_EQ(idle->status, 409) << idle->body;
  EXPECT_EQ(json::parse(idle->body)["error"]["code"], "slot_idle") << idle->body;

  RawStream s(srv.port(), CompletionRequestBytes(Body(true).dump()));
  ASSERT_TRUE(s.ReadUntil("data: {", 30)) << s.data();
  int preempted = 0;
  for (int i = 0; i < 2; ++i) {
    // The request runs in slot 0 (the lowest free) and, resumed, again in slot 0.
    auto a = cli->Post("/slots/0?action=preempt", "", "application/json");
    ASSERT_TRUE(a);
    if (a->status == 200) {
      const json j = json::parse(a->body);
      EXPECT_EQ(j["id_slot"], 0);
      EXPECT_GT(j["n_tokens"].get<int>(), 50);
      ++preempted;
    } else {
      ADD_FAILURE() << a->status << " " << a->body;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  s.ReadAll(120);
  EXPECT_NE(s.data().find("data: [DONE]"), std::string::npos) << s.data().substr(0, 2000);
  const json last = LastLockstepChunk(s.data());
  ASSERT_TRUE(last.is_object()) << s.data().substr(0, 2000);
  EXPECT_EQ(last["lockstep"]["output_ids"], want["lockstep"]["output_ids"]);
  const json& pre = last["lockstep"]["preemptions"];
  ASSERT_TRUE(pre.is_array()) << last.dump();
  EXPECT_EQ(static_cast<int>(pre.size()), preempted);
  EXPECT_EQ(preempted, 2);
  for (const json& p : pre) {
    EXPECT_EQ(p["reason"], "request");
    EXPECT_GE(p["resume_step"].get<int>(), p["step"].get<int>());
    EXPECT_EQ(p["windows_diverged"], 0);
    EXPECT_NE(p["resumed_from"], "slot_file");
  }
  EXPECT_NE(srv.Log().find("preempted"), std::string::npos);
  std::printf("served preemptions: %s\n", pre.dump().c_str());
}

TEST(ServePreempt, AHigherPriorityRequestPreemptsTheRunningStream) {
  ServeProcess srv({"--model", ModelDir("tiny"), "--port", "0", "--threads", "1", "--slots", "1",
                    "--prefill", "16", "--spec", "4", "--max-context", "1024"});
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  auto ref = cli->Post("/v1/completions", Body(false).dump(), "application/json");
  ASSERT_TRUE(ref && ref->status == 200) << (ref ? ref->body : "no answer");
  const json want = json::parse(ref->body);

  RawStream s(srv.port(), CompletionRequestBytes(Body(true).dump()));
  ASSERT_TRUE(s.ReadUntil("data: {", 30)) << s.data();
  json urgent = {{"prompt", "urgent"}, {"max_tokens", 8}, {"lockstep", {{"priority", 1}}}};
  auto u = cli->Post("/v1/completions", urgent.dump(), "application/json");
  ASSERT_TRUE(u && u->status == 200) << (u ? u->body : "no answer");
  EXPECT_FALSE(json::parse(u->body)["lockstep"].contains("preemptions"));
  urgent["lockstep"]["priority"] = 1001;
  auto bad = cli->Post("/v1/completions", urgent.dump(), "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  s.ReadAll(120);
  const json last = LastLockstepChunk(s.data());
  ASSERT_TRUE(last.is_object()) << s.data().substr(0, 2000);
  EXPECT_EQ(last["lockstep"]["output_ids"], want["lockstep"]["output_ids"]);
  const json& pre = last["lockstep"]["preemptions"];
  ASSERT_TRUE(pre.is_array() && pre.size() == 1) << last.dump();
  EXPECT_EQ(pre[0]["reason"], "priority");
  EXPECT_EQ(pre[0]["windows_diverged"], 0);
  EXPECT_EQ(pre[0]["resumed_from"], "scratch");  // no prefix cache on this server
}

}  // namespace
}  // namespace lockstep::test
