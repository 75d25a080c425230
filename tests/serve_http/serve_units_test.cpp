// The HTTP layer of `lockstep serve` without a server: the request parser and its errors, the
// API-key compare, the Prometheus text and the streamed text's cuts (stop strings, UTF-8).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <variant>

#include "serve/auth.h"
#include "serve/completion_request.h"
#include "serve/metrics.h"
#include "serve/text_stream.h"

namespace lockstep {
namespace {

CompletionLimits Limits() {
  CompletionLimits l;
  l.n_vocab = 512;
  l.max_context = 64;
  l.model_name = "tiny";
  return l;
}

// The parse of `body`: the error, or nullopt and the request in `out`.
std::optional<ApiError> Parse(const std::string& body, CompletionRequest* out = nullptr) {
  auto r = ParseCompletionRequest(body, Limits());
  if (auto* e = std::get_if<ApiError>(&r)) return *e;
  if (out) *out = std::get<CompletionRequest>(r);
  return std::nullopt;
}

TEST(ServeRequest, ParsesEveryField) {
  CompletionRequest r;
  ASSERT_FALSE(Parse(R"({"model":"tiny","prompt":[1,2,3],"max_tokens":5,"temperature":0.5,
      "top_p":0.9,"top_k":7,"seed":18446744073709551615,"stop":["a","bc"],"stream":true,"n":1,
      "logprobs":2,"ignore_eos":true,"presence_penalty":-0.5,"frequency_penalty":1.5,
      "repeat_penalty":1.25,"repeat_last_n":-1,"lockstep":{"arm":"A1","export":{"windows":"all"},
      "trace":true}})",
                     &r));
  EXPECT_EQ(r.prompt_ids, (std::vector<std::int32_t>{1, 2, 3}));
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.temperature, 0.5);
  EXPECT_EQ(r.top_p, 0.9);
  EXPECT_EQ(r.top_k, 7);
  EXPECT_EQ(r.seed, 18446744073709551615ull);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.presence_penalty, -0.5);
  EXPECT_EQ(r.frequency_penalty, 1.5);
  EXPECT_EQ(r.repeat_penalty, 1.25);
  EXPECT_EQ(r.repeat_last_n, -1);
  EXPECT_EQ(r.arm, "A1");
  ASSERT_TRUE(r.export_request);
  EXPECT_EQ(r.export_request->windows, "all");
  EXPECT_TRUE(r.trace);
  ASSERT_FALSE(Parse(R"({"prompt":"hi"})", &r));
  EXPECT_EQ(*r.prompt_text, "hi");
  EXPECT_EQ(r.max_tokens, 16);  // OpenAI's defaults
  EXPECT_EQ(r.temperature, 1.0);
}

TEST(ServeRequest, RefusesWithTheFieldNamed) {
  struct Case {
    const char* body;
    int status;
    const char* param;
  };
  const Case cases[] = {
      {"", 400, ""},
      {"{", 400, ""},
      {R"({"prompt":"hi")", 400, ""},
      {"[1]", 400, ""},
      {R"({"prompt":"hi","frequency_penalty":2.5})", 400, "frequency_penalty"},
      {R"({"prompt":"hi","presence_penalty":-3})", 400, "presence_penalty"},
      {R"({"prompt":"hi","repeat_penalty":0})", 400, "repeat_penalty"},
      {R"({"prompt":"hi","repeat_last_n":-2})", 400, "repeat_last_n"},
      {R"({"prompt":"hi","logit_bias":{}})", 400, "logit_bias"},
      {R"({"prompt":"hi","n":17})", 400, "n"},
      {R"({"prompt":"hi","echo":true})", 400, "echo"},
      {R"({"prompt":"hi","best_of":2})", 400, "best_of"},
      {R"({"prompt":"hi","stream_options":{"x":1}})", 400, "stream_options.x"},
      {R"({"prompt":"hi","user":7})", 400, "user"},
      {R"({"prompt":5})", 400, "prompt"},
      {R"({"prompt":[]})", 400, "prompt"},
      {R"({"prompt":[512]})", 400, "prompt"},
      {R"({"prompt":[-1]})", 400, "prompt"},
      {R"({"prompt":[1.0]})", 400, "prompt"},
      {R"({"prompt":["a"]})", 400, "prompt"},
      {R"({"max_tokens":5})", 400, "prompt"},
      {R"({"prompt":"hi","max_tokens":0})", 400, "max_tokens"},
      {R"({"prompt":"hi","max_tokens":65})", 400, "max_tokens"},
      {R"({"prompt":"hi","max_tokens":"5"})", 400, "max_tokens"},
      {R"({"prompt":"hi","max_tokens":18446744073709551615})", 400, "max_tokens"},
      {R"({"prompt":"hi","temperature":2.5})", 400, "temperature"},
      {R"({"prompt":"hi","top_p":0})", 400, "top_p"},
      {R"({"prompt":"hi","top_k":-1})", 400, "top_k"},
      {R"({"prompt":"hi","seed":-1})", 400, "seed"},
      {R"({"prompt":"hi","stop":["a","b","c","d","e"]})", 400, "stop"},
      {R"({"prompt":"hi","logprobs":6})", 400, "logprobs"},
      {R"({"prompt":"hi","stream":1})", 400, "stream"},
      {R"({"prompt":"hi","lockstep":{"export":{"path":"/etc/x"}}})", 400, "lockstep.export.path"},
      {R"({"prompt":"hi","lockstep":{"arm":"../x"}})", 400, "lockstep.arm"},
      {R"({"prompt":"hi","model":"other"})", 404, ""},
      {R"({"prompt":[1,2,3],"max_tokens":62})", 400, "prompt"},
      {"{\"prompt\":\"\xff\"}", 400, ""},
  };
  for (const Case& c : cases) {
    auto e = Parse(c.body);
    ASSERT_TRUE(e) << c.body;
    EXPECT_EQ(e->status, c.status) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body << ": " << e->message;
    const auto body = nlohmann::json::parse(e->Body());
    EXPECT_TRUE(body["error"]["message"].is_string()) << e->Body();
    EXPECT_TRUE(body["error"]["type"].is_string()) << e->Body();
  }
  std::string deep = R"({"prompt":"hi","lockstep":)";
  for (int i = 0; i < 40; ++i) deep += "[";
  EXPECT_EQ(Parse(deep)->code, "invalid_json");
}

TEST(ServeAuth, BearerComparedWhole) {
  EXPECT_TRUE(ConstantTimeEqual("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEqual("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEqual("secre", "secret"));
  EXPECT_FALSE(ConstantTimeEqual("secretsecret", "secret"));  // a repeat of the key is no key
  EXPECT_FALSE(ConstantTimeEqual("", "secret"));
  EXPECT_TRUE(BearerAllowed("Bearer secret", "secret"));
  EXPECT_FALSE(BearerAllowed("Bearer secre", "secret"));
  EXPECT_FALSE(BearerAllowed("Basic secret", "secret"));
  EXPECT_FALSE(BearerAllowed("", "secret"));
  EXPECT_TRUE(BearerAllowed("", ""));  // no key configured
  // The scheme in any case, then one or more spaces (issue 43); the key itself is exact.
  EXPECT_TRUE(BearerAllowed("bearer secret", "secret"));
  EXPECT_TRUE(BearerAllowed("BEARER  secret", "secret"));
  EXPECT_FALSE(BearerAllowed("bearer Secret", "secret"));
  EXPECT_FALSE(BearerAllowed("Bearersecret", "secret"));
  EXPECT_FALSE(BearerAllowed("Bearer", "secret"));
}

// A body is one JSON object and nothing else: a byte-order mark, a NUL byte (nlohmann's parser
// stops there, so `{...}\0junk` read as `{...}`), trailing bytes, or a non-object: 400
// invalid_json, naming why; whitespace around the object is fine.
TEST(ServeRequest, BodiesWithABomANulOrTrailingBytesAreRefused) {
  using namespace std::string_literals;
  const std::string ok = R"({"prompt":"hi"})";
  EXPECT_FALSE(Parse(ok));
  EXPECT_FALSE(Parse(" \n" + ok + "\r\n "));
  const struct {
    std::string body, says;
  } bad[] = {
      {"\xEF\xBB\xBF" + ok, "byte-order mark"},
      {ok + "\0junk"s, "NUL byte at offset 15"},
      {ok + "\0"s, "NUL"},
      {R"({"prompt":"h)" + "\0"s + R"(i"})", "NUL"},
      {ok + "junk", "invalid JSON"},
      {ok + ok, "invalid JSON"},
      {"[1]", "JSON object"},
  };
  for (const auto& c : bad) {
    auto e = Parse(c.body);
    ASSERT_TRUE(e) << c.body;
    EXPECT_EQ(e->status, 400) << c.body;
    EXPECT_EQ(e->code, "invalid_json") << c.body;
    EXPECT_NE(e->message.find(c.says), std::string::npos) << c.body << ": " << e->message;
  }
}

TEST(ServeMetrics, PrometheusTextAddsUp) {
  ServeMetrics m;
  m.CountResponse("/v1/completions", 200);
  m.CountResponse("/v1/completions", 200);
  m.CountResponse("/v1/completions", 429);
  m.CountResponse("/health", 200);
  m.CountTokens(5, 7, 2);
  m.ObserveStep(0.003);
  m.ObserveStep(0.2);
  ServeGauges g;
  g.slots_total = 4;
  g.slots_busy = 1;
  const std::string t = m.Text(g);
  EXPECT_NE(t.find("lockstep_requests_total{endpoint=\"/v1/completions\",code=\"200\"} 2\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("lockstep_requests_total{endpoint=\"/v1/completions\",code=\"429\"} 1\n"),
            std::string::npos);
  EXPECT_NE(t.find("lockstep_requests_total{endpoint=\"/health\",code=\"200\"} 1\n"),
            std::string::npos);
  EXPECT_NE(t.find("lockstep_generated_tokens_total 7\n"), std::string::npos);
  EXPECT_NE(t.find("lockstep_cached_tokens_total 2\n"), std::string::npos);
  EXPECT_NE(t.find("lockstep_slots_busy 1\n"), std::string::npos);
  EXPECT_NE(t.find("lockstep_step_seconds_bucket{le=\"0.005\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("lockstep_step_seconds_bucket{le=\"0.25\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("lockstep_step_seconds_bucket{le=\"+Inf\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("lockstep_step_seconds_count 2\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE lockstep_step_seconds histogram\n"), std::string::npos);
}

TEST(ServeTextStream, ChunksConcatenateToTheText) {
  // Every cut of the same bytes, streamed piece by piece, gives the same text as all at once,
  // including invalid bytes, a split 3-byte character and a stop string across pieces.
  const std::string bytes =
      "ab\xE2\x82\xAC"
      "c\xFF"
      "\xF0\x9F\x98"
      "dSTOPe";
  TextStream whole({"STOP"});
  whole.Append(bytes);
  const std::string want = whole.Take(true);
  EXPECT_EQ(want,
            "ab\xE2\x82\xAC"
            "c\xEF\xBF\xBD\xEF\xBF\xBD"
            "d");
  for (std::size_t cut = 0; cut <= bytes.size(); ++cut) {
    TextStream s({"STOP"});
    std::string got;
    s.Append(bytes.substr(0, cut));
    got += s.Take(false);
    if (!s.stopped()) s.Append(bytes.substr(cut));
    got += s.Take(false);
    got += s.Take(true);
    EXPECT_EQ(got, want) << "cut at " << cut;
    EXPECT_TRUE(s.stopped());
  }
  EXPECT_EQ(SanitizeUtf8("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  // One U+FFFD per maximal ill-formed subpart, as the tokenizers decode (generate's text).
  EXPECT_EQ(SanitizeUtf8("\xE2\x82"
                         "A"),
            "\xEF\xBF\xBD"
            "A");
  EXPECT_EQ(SanitizeUtf8("\xF0\x9F\x98"), "\xEF\xBF\xBD");  // cut at the end: one
  EXPECT_EQ(SanitizeUtf8("\xE0\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(StableUtf8Prefix("a\xE2\x82"), 1u);
}

TEST(ServeTextStream, StopStringsMatchTextNeverPlaceholders) {
  // Byte level renders ids >= 256 as "<id>": a stop string never matches inside one or across
  // its edge, and matches the same characters when they are real text.
  TextStream s({"<30", "0>x"});
  EXPECT_FALSE(s.Append("<300>", /*opaque=*/true));
  EXPECT_FALSE(s.Append("x"));  // "0>x" spans the placeholder's end: no match
  EXPECT_TRUE(s.Append("a<30"));
  EXPECT_EQ(s.Take(true), "<300>xa");
  // Through AppendTokens: the byte tokenizer's ids >= 256 are the placeholders.
  auto tok = MakeByteTokenizer();
  TextStream t({"<2"});
  EXPECT_FALSE(t.AppendTokens(*tok, {65, 257, 66}));
  EXPECT_TRUE(t.AppendTokens(*tok, {'<', '2'}));
  EXPECT_EQ(t.Take(true), "A<257>B");
}

}  // namespace
}  // namespace lockstep
