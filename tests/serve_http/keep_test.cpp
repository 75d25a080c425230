// Kept conversations ("lockstep": {"keep": true}) never starve `lockstep serve`: a new request
// waiting while every slot is held takes the least recently used kept conversation's slot
// (evicted), a kept conversation not continued for --keep-idle seconds is released (idle), and
// keeping more than --keep-max releases the oldest (cap). Each release is counted in
// lockstep_kept_released_total{reason}, GET /slots shows it, and a continuation of a released
// slot gets 409 naming why. A kept conversation that is not released continues bitwise.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "serve_process.h"
#include "test_util.h"

namespace lockstep::test {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::vector<std::string> Args(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model", ModelDir("tiny"), "--port", "0", "--threads", "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<int> Prompt(int salt) {
  std::vector<int> p;
  for (int i = 0; i < 24; ++i) p.push_back((i * 29 + 3 + salt * 7) % 500);
  return p;
}

json Turn(const std::vector<int>& prompt, bool keep) {
  json j = {{"prompt", prompt},
            {"max_tokens", 8},
            {"temperature", 0.8},
            {"seed", 3},
            {"ignore_eos", true}};
  if (keep) j["lockstep"] = {{"keep", true}};
  return j;
}

// A kept turn: its slot and the conversation's tokens so far (prompt + output).
struct KeptTurn {
  int slot = -1;
  std::vector<int> tokens;
};

KeptTurn Keep(httplib::Client& cli, int salt) {
  const Answer a = Post(cli, "/v1/completions", Turn(Prompt(salt), true));
  EXPECT_EQ(a.status, 200) << a.body;
  if (a.status != 200) return {};
  KeptTurn k{a.body["lockstep"]["slot"].get<int>(), Prompt(salt)};
  for (int t : a.body["lockstep"]["output_ids"]) k.tokens.push_back(t);
  return k;
}

// The continuation of `k` with three more tokens.
Answer Continue(httplib::Client& cli, const KeptTurn& k) {
  std::vector<int> next = k.tokens;
  next.insert(next.end(), {7, 8, 9});
  json j = Turn(next, false);
  j["id_slot"] = k.slot;
  return Post(cli, "/v1/completions", j);
}

json Slot(httplib::Client& cli, int slot) {
  return json::parse(cli.Get("/slots")->body)["slots"][slot];
}

// lockstep_kept_released_total{reason="..."}; -1 when absent.
long long Released(httplib::Client& cli, const std::string& reason) {
  const std::string text = cli.Get("/metrics")->body;
  const std::string series = "\nlockstep_kept_released_total{reason=\"" + reason + "\"} ";
  const std::size_t at = text.find(series);
  return at == std::string::npos ? -1 : std::atoll(text.c_str() + at + series.size());
}

long long Gauge(httplib::Client& cli, const std::string& name) {
  const std::string text = cli.Get("/metrics")->body;
  const std::size_t at = text.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::atoll(text.c_str() + at + name.size() + 2);
}

bool Has(const json& body, const std::string& word) {
  return body.dump().find(word) != std::string::npos;
}

TEST(ServeKeep, KeptConversationsDoNotStarveNewRequests) {
  ServeProcess srv(Args({"--slots", "2", "--keep-max", "2"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  const KeptTurn a = Keep(*cli, 1);
  const KeptTurn b = Keep(*cli, 2);
  ASSERT_NE(a.slot, b.slot);
  ASSERT_EQ(Slot(*cli, a.slot)["state"], "kept");
  ASSERT_EQ(Slot(*cli, b.slot)["state"], "kept");
  EXPECT_EQ(Gauge(*cli, "lockstep_slots_kept"), 2);
  // Every slot is held: a new request must still run (bounded: not the client's 60 s).
  auto quick = srv.Client();
  quick->set_read_timeout(20, 0);
  const auto t0 = Clock::now();
  const Answer c = Post(*quick, "/v1/completions", Turn(Prompt(3), false));
  ASSERT_EQ(c.status, 200) << c.body << srv.Log();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 20.0);
  EXPECT_EQ(c.body["lockstep"]["slot"], a.slot);  // the least recently kept one went
  EXPECT_EQ(Released(*cli, "evicted"), 1);
  EXPECT_EQ(Gauge(*cli, "lockstep_slots_kept"), 1);
  const json sa = Slot(*cli, a.slot), sb = Slot(*cli, b.slot);
  EXPECT_EQ(sa["state"], "idle") << sa;
  EXPECT_EQ(sa["released"], "evicted") << sa;
  EXPECT_EQ(sb["state"], "kept") << sb;
  EXPECT_GE(sb["kept_age_s"].get<double>(), 0.0) << sb;
  // The evicted conversation: 409 saying so (resend it whole); the other continues.
  const Answer ra = Continue(*cli, a);
  EXPECT_EQ(ra.status, 409) << ra.body;
  EXPECT_TRUE(Has(ra.body, "evicted")) << ra.body;
  EXPECT_TRUE(Has(ra.body, "without id_slot")) << ra.body;
  const Answer rb = Continue(*cli, b);
  ASSERT_EQ(rb.status, 200) << rb.body;
  EXPECT_EQ(Released(*cli, "continued"), 1);
  // Bitwise: the same conversation kept and continued on a server without pressure.
  ServeProcess calm(Args({"--slots", "2"}));
  ASSERT_TRUE(calm.started()) << calm.Log();
  auto cc = calm.Client();
  const KeptTurn b2 = Keep(*cc, 2);
  EXPECT_EQ(b2.tokens, b.tokens);
  const Answer rb2 = Continue(*cc, b2);
  ASSERT_EQ(rb2.status, 200) << rb2.body;
  EXPECT_EQ(rb2.body["lockstep"]["output_ids"], rb.body["lockstep"]["output_ids"]);
}

// Slots free but memory held: with --memory-mib 3 a small request (2 to 3 MiB of K/V and state)
// does not fit beside a kept one, so the kept one's reservation is what admission waits for.
TEST(ServeKeep, KeptConversationsDoNotStarveAdmissionByMemory) {
  ServeProcess srv(Args({"--slots", "4", "--keep-max", "3", "--memory-mib", "3"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  const KeptTurn a = Keep(*cli, 1);
  ASSERT_EQ(Slot(*cli, a.slot)["state"], "kept");
  auto quick = srv.Client();
  quick->set_read_timeout(20, 0);
  const Answer b = Post(*quick, "/v1/completions", Turn(Prompt(2), false));
  ASSERT_EQ(b.status, 200) << b.body << srv.Log();
  EXPECT_EQ(Slot(*cli, a.slot)["released"], "evicted");
  EXPECT_EQ(Released(*cli, "evicted"), 1);
}

// The client's answer to an eviction: the whole conversation again without id_slot, which runs
// and (with the prefix cache on) reuses the prefix the evicted conversation's prefill stored.
TEST(ServeKeep, AnEvictedConversationResentWholeHitsThePrefixCache) {
  ServeProcess srv(
      Args({"--slots", "2", "--keep-max", "2", "--prefix-cache", "on", "--prefill", "16"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  const KeptTurn a = Keep(*cli, 1);
  const KeptTurn b = Keep(*cli, 2);
  auto quick = srv.Client();
  quick->set_read_timeout(20, 0);
  ASSERT_EQ(Post(*quick, "/v1/completions", Turn(Prompt(3), false)).status, 200);
  ASSERT_EQ(Slot(*cli, a.slot)["released"], "evicted");
  EXPECT_EQ(Continue(*cli, a).status, 409);
  std::vector<int> whole = a.tokens;
  whole.insert(whole.end(), {7, 8, 9});
  const Answer r = Post(*cli, "/v1/completions", Turn(whole, false));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_GE(r.body["lockstep"]["prompt_tokens_reused"].get<int>(), 16) << r.body["lockstep"];
  EXPECT_EQ(Slot(*cli, b.slot)["state"], "kept");
}

TEST(ServeKeep, IdleKeptConversationIsReleased) {
  ServeProcess srv(Args({"--slots", "2", "--keep-idle", "1"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  const KeptTurn a = Keep(*cli, 1);
  const auto t0 = Clock::now();
  EXPECT_EQ(Slot(*cli, a.slot)["state"], "kept");
  json s;
  for (int i = 0; i < 200; ++i) {  // up to 10 s
    s = Slot(*cli, a.slot);
    if (s["state"] != "kept") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(s["state"], "idle") << s;
  EXPECT_EQ(s["released"], "idle") << s;
  EXPECT_GE(waited, 0.5);
  EXPECT_LT(waited, 5.0);
  EXPECT_EQ(Released(*cli, "idle"), 1);
  const Answer r = Continue(*cli, a);
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_TRUE(Has(r.body, "idle")) << r.body;
}

TEST(ServeKeep, KeepMaxReleasesTheOldest) {
  ServeProcess srv(Args({"--slots", "3", "--keep-max", "1"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  const KeptTurn a = Keep(*cli, 1);
  const KeptTurn b = Keep(*cli, 2);
  EXPECT_EQ(Slot(*cli, a.slot)["released"], "cap");
  EXPECT_EQ(Slot(*cli, b.slot)["state"], "kept");
  EXPECT_EQ(Released(*cli, "cap"), 1);
  EXPECT_EQ(Gauge(*cli, "lockstep_slots_kept"), 1);
  const Answer ra = Continue(*cli, a);
  EXPECT_EQ(ra.status, 409) << ra.body;
  EXPECT_TRUE(Has(ra.body, "cap")) << ra.body;
  EXPECT_EQ(Continue(*cli, b).status, 200);
  // erase is a release too, and its continuation says so.
  const KeptTurn c = Keep(*cli, 3);
  ASSERT_EQ(Post(*cli, "/slots/" + std::to_string(c.slot) + "?action=erase", json::object()).status,
            200);
  EXPECT_EQ(Released(*cli, "erased"), 1);
  const Answer rc = Continue(*cli, c);
  EXPECT_EQ(rc.status, 409) << rc.body;
  EXPECT_TRUE(Has(rc.body, "erase")) << rc.body;
  // The default keeps one slot free for new work: --slots 2 keeps one conversation.
  ServeProcess two(Args({"--slots", "2"}));
  ASSERT_TRUE(two.started()) << two.Log();
  auto tc = two.Client();
  const KeptTurn d = Keep(*tc, 1);
  const KeptTurn e = Keep(*tc, 2);
  EXPECT_EQ(Slot(*tc, d.slot)["released"], "cap");
  EXPECT_EQ(Slot(*tc, e.slot)["state"], "kept");
}

TEST(ServeKeep, BadKeepFlagsExit2) {
  for (const std::vector<std::string>& extra : std::vector<std::vector<std::string>>{
           {"--keep-max", "-1"},
           {"--slots", "2", "--keep-max", "3"},
           {"--keep-idle", "-1"},
           {"--keep-idle", "soon"},
       }) {
    std::string err;
    EXPECT_EQ(ServeExitCode(Args(extra), 30, &err), 2) << extra[extra.size() - 2] << ": " << err;
    EXPECT_NE(err.find("--keep-"), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace lockstep::test
