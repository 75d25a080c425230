// HTTP cost of `lockstep serve` (issue 24, Must show 6): aggregate tokens/s of N concurrent
// completions through HTTP (the real server on loopback, N client threads) against the same N
// requests submitted to an in-process Scheduler over an Engine with the same options, at
// N = 1, 4, 16, in one run. Also checks that both give every request the same tokens.
//
//   build/tests/bench/http_bench [--model DIR] [--threads 2] [--tokens 32] [--prompt 16]
//                                [--repeats 3]
//
// Without --model it writes the `small` preset (seed 7) to a scratch folder. The figures and the
// command are in tests/bench/README.md ("Serving over HTTP").
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/engine/engine.h"
#include "lockstep/engine/scheduler.h"
#include "lockstep/engine/weights.h"
#include "serve_http/serve_process.h"
#include "test_util.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "http_bench: %s\n", why.c_str());
  std::exit(3);
}

struct Options {
  std::string model;
  int threads = 2, tokens = 32, prompt = 16, repeats = 3;
};

std::vector<std::int32_t> Prompt(int i, int n) {
  std::vector<std::int32_t> ids;
  for (int k = 0; k < n; ++k) ids.push_back((i * 131 + k * 17) % 4000);
  return ids;
}

struct Run {
  double seconds = 0;
  long tokens = 0;
  std::vector<std::vector<int>> outputs;
};

Run InProcess(lockstep::Engine& engine, int n, const Options& o) {
  lockstep::Scheduler sched(engine);
  Run run;
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    lockstep::RequestSpec spec;
    spec.id = "bench-" + std::to_string(i);
    spec.prompt = Prompt(i, o.prompt);
    spec.options.max_new = o.tokens;
    spec.options.ignore_eos = true;
    auto t = sched.Submit(std::move(spec));
    if (!t.ok()) Die("in-process submit: " + t.status().message());
  }
  if (auto st = sched.RunUntilIdle(); !st.ok()) Die("in-process run: " + st.message());
  run.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  run.outputs.resize(static_cast<std::size_t>(n));
  for (auto& r : sched.TakeFinished()) {
    run.tokens += static_cast<long>(r.result.output.size());
    run.outputs[static_cast<std::size_t>(std::stoi(r.id.substr(6)))] =
        std::vector<int>(r.result.output.begin(), r.result.output.end());
  }
  return run;
}

Run OverHttp(const lockstep::test::ServeProcess& srv, int n, const Options& o) {
  Run run;
  run.outputs.resize(static_cast<std::size_t>(n));
  std::vector<std::thread> clients;
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i)
    clients.emplace_back([&, i] {
      auto cli = srv.Client();
      const nlohmann::json req = {{"prompt", Prompt(i, o.prompt)},
                                  {"max_tokens", o.tokens},
                                  {"ignore_eos", true},
                                  {"temperature", 0}};
      auto res = cli->Post("/v1/completions", req.dump(), "application/json");
      if (!res || res->status != 200)
        Die("HTTP: " + (res ? res->body : "no answer: " + httplib::to_string(res.error())));
      run.outputs[static_cast<std::size_t>(i)] =
          nlohmann::json::parse(res->body)["lockstep"]["output_ids"].get<std::vector<int>>();
    });
  for (auto& t : clients) t.join();
  run.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (const auto& out : run.outputs) run.tokens += static_cast<long>(out.size());
  return run;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") o.model = v;
    if (k == "--threads") o.threads = std::atoi(v.c_str());
    if (k == "--tokens") o.tokens = std::atoi(v.c_str());
    if (k == "--prompt") o.prompt = std::atoi(v.c_str());
    if (k == "--repeats") o.repeats = std::max(1, std::atoi(v.c_str()));
  }
  if (o.model.empty()) o.model = lockstep::test::ModelDir("small");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  lockstep::EngineConfig cfg;
  cfg.model = o.model;
  cfg.threads = o.threads;
  cfg.slots = 16;
  auto weights = lockstep::ModelWeights::Load(cfg.model);
  if (!weights.ok()) return std::fprintf(stderr, "%s\n", weights.status().message().c_str()), 2;
  auto engine = lockstep::Engine::Create(cfg, **weights);
  if (!engine.ok()) return std::fprintf(stderr, "%s\n", engine.status().message().c_str()), 2;
  lockstep::test::ServeProcess srv(
      {"--model", o.model, "--port", "0", "--threads", std::to_string(o.threads), "--slots", "16"});
  if (!srv.started()) return std::fprintf(stderr, "serve did not start\n%s", srv.Log().c_str()), 3;
  InProcess(**engine, 1, o);  // warm-up: first calls, page faults
  OverHttp(srv, 1, o);
  std::printf(
      "| concurrent requests | in-process tok/s | HTTP tok/s | HTTP / in-process | same tokens "
      "|\n");
  std::printf("|---|---|---|---|---|\n");
  // Each round runs both sides back to back so that load from elsewhere on the machine falls on
  // both; the medians of the rounds are compared.
  for (int n : {1, 4, 16}) {
    std::vector<double> ta, tb;
    bool same = true;
    for (int r = 0; r < o.repeats; ++r) {
      // Odd rounds run HTTP first: a drift of the machine's load favours neither side.
      Run a, b;
      if (r % 2) b = OverHttp(srv, n, o);
      a = InProcess(**engine, n, o);
      if (r % 2 == 0) b = OverHttp(srv, n, o);
      ta.push_back(static_cast<double>(a.tokens) / a.seconds);
      tb.push_back(static_cast<double>(b.tokens) / b.seconds);
      same = same && a.outputs == b.outputs;
    }
    const double ma = Median(ta), mb = Median(tb);
    std::printf("| %d | %.1f | %.1f | %.3f | %s |\n", n, ma, mb, mb / ma, same ? "yes" : "NO");
    std::fflush(stdout);
  }
  return 0;
}
