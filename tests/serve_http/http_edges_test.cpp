// HTTP that never hangs and answers what clients send (issue 42, must show 4): an empty POST is a
// 400 at once (< 100 ms), a stalled body a 408 after --read-timeout, a known path with the wrong
// method a 405 with Allow, CORS headers and preflight only with --cors (and only for its origin),
// the server still serving after a bounded loop of 200 bad requests; every response counted in
// lockstep_requests_total{endpoint,code}; seeds drawn for seedless sampled requests (or fixed
// with --seed-default fixed); stop strings: finish_reason "stop" when one ended the text on the
// last allowed token, and never matched inside byte level's "<id>" placeholders.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "lockstep/engine/tokenizer.h"
#include "serve/text_stream.h"
#include "serve_process.h"
#include "test_util.h"

namespace lockstep::test {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::vector<std::string> Args(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model", ModelDir("tiny"), "--port", "0", "--threads",
                                "1",       "--read-timeout", "2"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

double Ms(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string Header(const std::string& response, const std::string& name) {
  const std::string key = "\r\n" + name + ": ";
  const auto at = response.find(key);
  if (at == std::string::npos) return "";
  const auto end = response.find("\r\n", at + key.size());
  return response.substr(at + key.size(), end - at - key.size());
}

std::string Request(const std::string& method, const std::string& path,
                    const std::string& extra_headers = "") {
  return method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
         extra_headers + "\r\n";
}

double Metric(const std::string& text, const std::string& name) {
  const auto at = text.find(name + " ");
  return at == std::string::npos ? -1 : std::stod(text.substr(at + name.size() + 1));
}

TEST(ServeHttpEdges, AnswersBadHttpAtOnceAndKeepsServing) {
  ServeProcess srv(Args({}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  const int port = srv.port();

  // No body at all (no Content-Length), and Content-Length: 0: 400 at once.
  for (const std::string& req :
       {Request("POST", "/v1/completions"),
        Request("POST", "/v1/chat/completions", "Content-Length: 0\r\n")}) {
    const auto t0 = Clock::now();
    const std::string r = RawExchange(port, req, 5);
    EXPECT_EQ(RawStatus(r), 400) << r;
    EXPECT_LT(Ms(t0), 100.0) << r;
  }
  // A body that stalls: 408 once --read-timeout (2 s) passed, not a 400.
  {
    const auto t0 = Clock::now();
    const std::string r = RawExchange(
        port, Request("POST", "/v1/completions", "Content-Length: 100\r\n") + "{\"prompt\": \"x",
        10);
    EXPECT_EQ(RawStatus(r), 408) << r;
    EXPECT_GE(Ms(t0), 1500.0);
    EXPECT_LT(Ms(t0), 6000.0);
    EXPECT_NE(r.find("read-timeout"), std::string::npos) << r;
  }
  // A known path with the wrong method: 405 naming what it allows; an unknown path stays 404.
  {
    std::string r = RawExchange(port, Request("GET", "/v1/completions"), 5);
    EXPECT_EQ(RawStatus(r), 405) << r;
    EXPECT_EQ(Header(r, "Allow"), "POST");
    r = RawExchange(port, Request("DELETE", "/health"), 5);
    EXPECT_EQ(RawStatus(r), 405) << r;
    EXPECT_EQ(Header(r, "Allow"), "GET");
    r = RawExchange(port, Request("POST", "/slots", "Content-Length: 2\r\n") + "{}", 5);
    EXPECT_EQ(RawStatus(r), 405) << r;
    EXPECT_EQ(RawStatus(RawExchange(port, Request("GET", "/v1/nothing"), 5)), 404);
  }
  // CORS is off by default: a preflight is a 405 without CORS headers, answers carry none.
  {
    const std::string r =
        RawExchange(port,
                    Request("OPTIONS", "/v1/completions",
                            "Origin: http://page.test\r\nAccess-Control-Request-Method: POST\r\n"),
                    5);
    EXPECT_EQ(RawStatus(r), 405) << r;
    EXPECT_EQ(Header(r, "Access-Control-Allow-Origin"), "");
  }
  // 200 bad requests of every kind above (the stalled one aside), then a good one.
  const std::string bad[] = {
      Request("POST", "/v1/completions"),
      Request("POST", "/v1/completions", "Content-Length: 0\r\n"),
      Request("GET", "/v1/chat/completions"),
      Request("PUT", "/metrics"),
      Request("POST", "/v1/completions", "Content-Length: 5\r\n") + "nope!",
      Request("POST", "/v1/chat/completions", "Content-Length: 2\r\n") + "{}",
  };
  int answered = 0;
  for (int k = 0; k < 200; ++k) {
    const int s = RawStatus(RawExchange(port, bad[k % 6], 5));
    answered += s >= 400 && s < 500;
  }
  EXPECT_EQ(answered, 200);
  auto cli = srv.Client();
  Answer good = Post(*cli, "/v1/completions", {{"prompt", "hi"}, {"max_tokens", 3}});
  EXPECT_EQ(good.status, 200) << good.body;

  // Every response is counted by endpoint and code.
  auto m = cli->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(Metric(m->body, "lockstep_requests_total{endpoint=\"/v1/completions\",code=\"200\"}"),
            1);
  EXPECT_GE(Metric(m->body, "lockstep_requests_total{endpoint=\"/v1/completions\",code=\"400\"}"),
            100);
  EXPECT_EQ(Metric(m->body, "lockstep_requests_total{endpoint=\"/v1/completions\",code=\"408\"}"),
            1);
  EXPECT_GE(Metric(m->body, "lockstep_requests_total{endpoint=\"/metrics\",code=\"405\"}"), 33);
  EXPECT_GE(Metric(m->body, "lockstep_requests_total{endpoint=\"/health\",code=\"200\"}"), 1);
  EXPECT_EQ(Metric(m->body, "lockstep_requests_total{endpoint=\"other\",code=\"404\"}"), 1);
}

TEST(ServeHttpEdges, CorsOnlyWithTheFlagAndForItsOrigin) {
  ServeProcess srv(Args({"--cors", "http://page.test", "--api-key", "k"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  const std::string pre =
      RawExchange(srv.port(),
                  Request("OPTIONS", "/v1/chat/completions",
                          "Origin: http://page.test\r\nAccess-Control-Request-Method: POST\r\n"
                          "Access-Control-Request-Headers: authorization, content-type\r\n"),
                  5);
  EXPECT_EQ(RawStatus(pre), 204) << pre;  // no key needed for a preflight
  EXPECT_EQ(Header(pre, "Access-Control-Allow-Origin"), "http://page.test");
  EXPECT_EQ(Header(pre, "Access-Control-Allow-Methods"), "POST, OPTIONS");
  EXPECT_NE(Header(pre, "Access-Control-Allow-Headers").find("Authorization"), std::string::npos);
  const std::string body = json{{"prompt", "hi"}, {"max_tokens", 2}}.dump();
  const std::string post =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: "
      "close\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n";
  std::string r = RawExchange(srv.port(), post + "Origin: http://page.test\r\n\r\n" + body, 30);
  EXPECT_EQ(RawStatus(r), 200) << r;
  EXPECT_EQ(Header(r, "Access-Control-Allow-Origin"), "http://page.test");
  r = RawExchange(srv.port(), post + "Origin: http://other.test\r\n\r\n" + body, 30);
  EXPECT_EQ(RawStatus(r), 200) << r;
  EXPECT_EQ(Header(r, "Access-Control-Allow-Origin"), "");  // another origin gets no grant
  // Still a key for everything else.
  EXPECT_EQ(RawStatus(RawExchange(srv.port(), Request("GET", "/v1/models"), 5)), 401);
}

TEST(ServeHttpEdges, SeedlessSampledRequestsDrawSeedsUnlessFixed) {
  ServeProcess srv(Args({}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  const json body = {{"prompt", "seed me"}, {"max_tokens", 16}, {"temperature", 0.8}};
  Answer a = Post(*cli, "/v1/completions", body), b = Post(*cli, "/v1/completions", body);
  ASSERT_EQ(a.status, 200) << a.body;
  ASSERT_EQ(b.status, 200) << b.body;
  EXPECT_TRUE(a.body["lockstep"]["seed_drawn"].get<bool>());
  EXPECT_NE(a.body["lockstep"]["seed"], b.body["lockstep"]["seed"]);
  EXPECT_NE(a.body["lockstep"]["output_ids"], b.body["lockstep"]["output_ids"]);
  // The reported seed replays the answer.
  json replay = body;
  replay["seed"] = a.body["lockstep"]["seed"];
  Answer again = Post(*cli, "/v1/completions", replay);
  EXPECT_EQ(again.body["lockstep"]["output_ids"], a.body["lockstep"]["output_ids"]);
  EXPECT_FALSE(again.body["lockstep"]["seed_drawn"].get<bool>());
  // Greedy requests keep seed 0 (their digest stays the same); --seed-default fixed keeps 0.
  Answer greedy =
      Post(*cli, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}, {"temperature", 0}});
  EXPECT_EQ(greedy.body["lockstep"]["seed"], 0);
  ServeProcess fixed(Args({"--seed-default", "fixed"}));
  ASSERT_TRUE(fixed.started()) << fixed.Log();
  auto fcli = fixed.Client();
  Answer f1 = Post(*fcli, "/v1/completions", body), f2 = Post(*fcli, "/v1/completions", body);
  EXPECT_EQ(f1.body["lockstep"]["seed"], 0);
  EXPECT_EQ(f1.body["lockstep"]["output_ids"], f2.body["lockstep"]["output_ids"]);
}

TEST(ServeHttpEdges, StopStringsEndOnTheLastTokenAndSkipPlaceholders) {
  ServeProcess srv(Args({}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  const json base = {{"prompt", "the stop test"}, {"max_tokens", 40}, {"temperature", 0}};
  Answer full = Post(*cli, "/v1/completions", base);
  ASSERT_EQ(full.status, 200) << full.body;
  const std::vector<std::int32_t> ids = full.body["lockstep"]["output_ids"];
  // The last token that is a real byte whose text first occurs there (as a stop string it
  // ends the text exactly at that token).
  int last = -1;
  std::string stop;
  for (int i = static_cast<int>(ids.size()) - 1; i >= 0 && last < 0; --i) {
    if (ids[static_cast<std::size_t>(i)] >= 256 || ids[static_cast<std::size_t>(i)] < 0x21 ||
        ids[static_cast<std::size_t>(i)] > 0x7e)
      continue;
    const std::string head = DecodeTokens({ids.begin(), ids.begin() + i});
    const std::string s(1, static_cast<char>(ids[static_cast<std::size_t>(i)]));
    if (head.find(s) == std::string::npos) last = i, stop = s;
  }
  ASSERT_GE(last, 0) << "no printable byte token first seen in " << full.body;
  json at_end = base;
  at_end["max_tokens"] = last + 1;
  at_end["stop"] = stop;
  Answer a = Post(*cli, "/v1/completions", at_end);
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.body["choices"][0]["finish_reason"], "stop") << a.body;
  EXPECT_EQ(a.body["choices"][0]["text"],
            SanitizeUtf8(DecodeTokens({ids.begin(), ids.begin() + last})));
  at_end["stream"] = true;
  auto s = cli->Post("/v1/completions", at_end.dump(), "application/json");
  ASSERT_TRUE(s);
  EXPECT_NE(s->body.find("\"finish_reason\":\"stop\""), std::string::npos) << s->body;

  // A placeholder's text as a stop string never matches it.
  int ph = -1;
  for (std::size_t i = 0; i < ids.size() && ph < 0; ++i)
    if (ids[i] >= 256) ph = ids[i];
  ASSERT_GE(ph, 0) << "no id >= 256 in " << full.body;
  json p = base;
  p["stop"] = "<" + std::to_string(ph) + ">";
  Answer pa = Post(*cli, "/v1/completions", p);
  ASSERT_EQ(pa.status, 200) << pa.body;
  EXPECT_EQ(pa.body["choices"][0]["text"], full.body["choices"][0]["text"]);
  EXPECT_EQ(pa.body["choices"][0]["finish_reason"], full.body["choices"][0]["finish_reason"]);
}

}  // namespace
}  // namespace lockstep::test
