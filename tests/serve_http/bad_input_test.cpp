// Bad input against the real `lockstep serve` (issue 24, Must show 3): at least 40 malformed
// requests, each answered with its documented status and an OpenAI-shaped error body, and a
// valid request right after each one succeeds (every error leaves the server serving).
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve_process.h"
#include "test_util.h"

namespace lockstep::test {
namespace {

using nlohmann::json;

struct Bad {
  std::string name;
  std::string bytes;  // the whole HTTP request
  int status;         // -1: the server closes the connection without an answer
};

Bad Body(const std::string& name, const std::string& body, int status = 400) {
  return {name, CompletionRequestBytes(body), status};
}

std::vector<Bad> BadRequests(int max_context) {
  std::string too_long = "[";
  for (int i = 0; i <= max_context; ++i) too_long += (i ? ",1" : "1");
  too_long += "]";
  std::string deep = R"({"prompt":"hi","lockstep":)" + std::string(200, '[');
  return {
      Body("empty body", ""),
      Body("truncated object", "{"),
      Body("truncated after a field", R"({"prompt": "hi")"),
      Body("not JSON", "prompt=hi"),
      Body("an array", "[1,2,3]"),
      Body("null", "null"),
      Body("a string", "\"hi\""),
      Body("trailing garbage", R"({"prompt":"hi"} x)"),
      Body("prompt a number", R"({"prompt": 5})"),
      Body("prompt empty", R"({"prompt": ""})"),
      Body("prompt no ids", R"({"prompt": []})"),
      Body("prompt mixed ids", R"({"prompt": [1, "a"]})"),
      Body("prompt negative id", R"({"prompt": [-1]})"),
      Body("prompt id outside the vocabulary", R"({"prompt": [512]})"),
      Body("prompt huge id", R"({"prompt": [100000000000]})"),
      Body("prompt fractional id", R"({"prompt": [1.5]})"),
      Body("prompt list of strings", R"({"prompt": ["a", "b"]})"),
      Body("prompt missing", R"({"max_tokens": 4})"),
      Body("prompt over the context (ids)", R"({"prompt": )" + too_long + "}"),
      Body("prompt over the context (text)",
           json{{"prompt", std::string(static_cast<std::size_t>(max_context), 'a')}}.dump()),
      Body("max_tokens negative", R"({"prompt":"hi","max_tokens":-1})"),
      Body("max_tokens zero", R"({"prompt":"hi","max_tokens":0})"),
      Body("max_tokens huge", R"({"prompt":"hi","max_tokens":1000000000000})"),
      Body("max_tokens a string", R"({"prompt":"hi","max_tokens":"16"})"),
      Body("max_tokens fractional", R"({"prompt":"hi","max_tokens":16.5})"),
      Body("temperature negative", R"({"prompt":"hi","temperature":-0.1})"),
      Body("temperature huge", R"({"prompt":"hi","temperature":1e308})"),
      Body("temperature a string", R"({"prompt":"hi","temperature":"hot"})"),
      Body("top_p zero", R"({"prompt":"hi","top_p":0})"),
      Body("top_p over one", R"({"prompt":"hi","top_p":1.5})"),
      Body("top_k negative", R"({"prompt":"hi","top_k":-1})"),
      Body("seed negative", R"({"prompt":"hi","seed":-5})"),
      Body("seed fractional", R"({"prompt":"hi","seed":1.5})"),
      Body("five stop strings", R"({"prompt":"hi","stop":["a","b","c","d","e"]})"),
      Body("stop a number", R"({"prompt":"hi","stop":5})"),
      Body("stop empty string", R"({"prompt":"hi","stop":[""]})"),
      Body("stream a string", R"({"prompt":"hi","stream":"yes"})"),
      Body("n = 17", R"({"prompt":"hi","n":17})"),
      Body("logprobs 6", R"({"prompt":"hi","logprobs":6})"),
      Body("logprobs negative", R"({"prompt":"hi","logprobs":-1})"),
      Body("unknown field", R"({"prompt":"hi","logit_bias":{}})"),
      Body("unknown lockstep field", R"({"prompt":"hi","lockstep":{"bogus":1}})"),
      Body("export path from the client",
           R"({"prompt":"hi","lockstep":{"export":{"path":"/tmp/x.h5"}}})"),
      Body("bad export windows", R"({"prompt":"hi","lockstep":{"export":{"windows":"zz"}}})"),
      Body("arm with a slash", R"({"prompt":"hi","lockstep":{"arm":"../etc"}})"),
      Body("another model", R"({"prompt":"hi","model":"gpt-4"})", 404),
      Body("invalid UTF-8 in a string", "{\"prompt\":\"\xff\xfe\"}"),
      Body("invalid UTF-8 outside strings", "{\"prompt\":\"hi\"\xc3}"),
      Body("nested 200 deep", deep),
      {"unknown path", "GET /v1/chat HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404},
      {"wrong method", "GET /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 405},
      {"a 100 MB body",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: "
       "104857600\r\n\r\n" +
           std::string(1 << 16, 'x'),
       413},
      {"a header-only request that never sends its body",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n", -1},
      {"an 20 KB header line",
       "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n", -1},
      {"garbage request line", "HELLO\r\n\r\n", 400},
  };
}

TEST(ServeBadInput, EveryMalformedRequestGetsItsStatusAndTheServerKeepsServing) {
  constexpr int kMaxContext = 256;
  ServeProcess srv({"--model", ModelDir("tiny"), "--port", "0", "--threads", "1", "--max-context",
                    std::to_string(kMaxContext), "--read-timeout", "1", "--max-body", "1M"});
  ASSERT_TRUE(srv.started()) << srv.Log();
  const std::vector<Bad> bad = BadRequests(kMaxContext);
  ASSERT_GE(bad.size(), 40u);
  auto cli = srv.Client();
  const std::string valid = json{{"prompt", "ok"}, {"max_tokens", 2}}.dump();
  for (const Bad& b : bad) {
    const std::string raw = RawExchange(srv.port(), b.bytes, b.status == -1 ? 3 : 5);
    const int status = RawStatus(raw);
    if (b.status == -1) {
      EXPECT_TRUE(status == -1 || status == 400 || status == 408 || status == 431)
          << b.name << ": " << raw.substr(0, 200);
    } else {
      EXPECT_EQ(status, b.status) << b.name << ": " << raw.substr(0, 300);
      const std::size_t at = raw.find("\r\n\r\n");
      const json body =
          json::parse(at == std::string::npos ? "" : raw.substr(at + 4), nullptr, false);
      EXPECT_TRUE(body.contains("error") && body["error"]["message"].is_string() &&
                  body["error"]["type"].is_string())
          << b.name << ": " << raw.substr(0, 300);
      if (b.name == "unknown field") {
        EXPECT_EQ(body["error"]["param"], "logit_bias");
      }
    }
    auto ok = cli->Post("/v1/completions", valid, "application/json");
    ASSERT_TRUE(ok) << "after " << b.name;
    EXPECT_EQ(ok->status, 200) << "after " << b.name << ": " << ok->body;
  }
}

TEST(ServeBadInput, ClientThatDisconnectsMidStreamLeavesTheServerServing) {
  ServeProcess srv({"--model", ModelDir("tiny"), "--port", "0", "--threads", "1"});
  ASSERT_TRUE(srv.started()) << srv.Log();
  for (int i = 0; i < 3; ++i) {
    RawStream s(srv.port(), CompletionRequestBytes(json{
                                {"prompt", "bye"},
                                {"max_tokens", 500},
                                {"ignore_eos", true},
                                {"stream", true}}.dump()));
    ASSERT_TRUE(s.ReadUntil("data: ", 30));
    s.Close();
    auto ok = srv.Client()->Post("/v1/completions", R"({"prompt":"ok","max_tokens":2})",
                                 "application/json");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200);
  }
}

}  // namespace
}  // namespace lockstep::test
