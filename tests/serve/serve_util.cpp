#include "serve/serve_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "lockstep/compare/export_reader.h"
#include "lockstep/instrument/export_writer.h"
#include "lockstep/instrument/fingerprint.h"
#include "lockstep/instrument/run_info.h"
#include "test_util.h"

namespace lockstep::test {

namespace {
std::map<std::string, std::string>& PresetOfDir() {
  static std::map<std::string, std::string> m;
  return m;
}
}  // namespace

EngineConfig ServeConfig(int slots, int chunk, const std::string& preset) {
  EngineConfig c;
  c.model = ModelDir(preset);
  PresetOfDir()[c.model] = preset;
  c.threads = 2;
  c.slots = slots;
  c.prefill_chunk = chunk;
  c.batch_tokens = 4 * chunk;
  return c;
}

std::vector<std::int32_t> RandomTokens(int n, std::uint64_t seed, int V) {
  std::vector<std::int32_t> out;
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  for (int i = 0; i < n; ++i) {
    std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    out.push_back(static_cast<std::int32_t>(z % static_cast<std::uint64_t>(V)));
  }
  return out;
}

RequestOptions SpecOptions(int max_new, int spec) {
  RequestOptions o;
  o.max_new = max_new;
  o.ignore_eos = true;
  o.spec = spec;
  o.mtp = true;
  o.spec_max_suffix = 8;
  o.draft_policy = "static";
  return o;
}

namespace {

ExportRunInfo RunInfo(const EngineConfig& cfg, const RequestSpec& spec, const RequestResult& r,
                      const std::string& path) {
  ExportRunInfo m = RequestRunInfo(cfg, spec.prompt, spec.options.max_new, r);
  m.arm = "serve";
  m.run_id = Sha256Hex(path).substr(0, 16);
  m.created_utc = "1970-01-01T00:00:00Z";
  m.model_sha256 = Sha256Hex(std::string("tiny"));
  return m;
}

}  // namespace

ServeRun RunRequests(const EngineConfig& cfg, std::vector<ServeRequest> reqs,
                     const SchedulerOptions& so) {
  const auto preset = PresetOfDir().find(cfg.model);
  return RunRequestsOn(cfg,
                       Model(preset == PresetOfDir().end() ? std::string("tiny") : preset->second),
                       std::move(reqs), so);
}

ServeRun RunRequestsOn(const EngineConfig& cfg, const ModelWeights& weights,
                       std::vector<ServeRequest> reqs, const SchedulerOptions& so) {
  ServeRun run;
  auto made = Engine::Create(cfg, weights);
  if (!made.ok()) {
    ADD_FAILURE() << made.status().ToString();
    return run;
  }
  Engine& engine = **made;
  Scheduler sched(engine, so);
  std::vector<std::unique_ptr<H5Exporter>> exporters(reqs.size());
  std::map<Ticket, std::size_t> index;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    ServeRequest& q = reqs[i];
    if (!q.export_path.empty()) {
      ExportOptions eo;
      eo.path = q.export_path;
      eo.windows = *WindowSelection::Parse("all");
      auto ex = H5Exporter::Create(eo);
      EXPECT_TRUE(ex.ok()) << ex.status().ToString();
      exporters[i] = std::move(ex).value();
      q.spec.hooks.observer = exporters[i].get();
      q.spec.keep = true;  // its slot stays for the export's counters
    }
    auto t = sched.Submit(q.spec);
    run.submit_errors.push_back(t.ok() ? "" : t.status().ToString());
    if (t.ok()) index[*t] = i;
  }
  const Status st = sched.RunUntilIdle();
  EXPECT_TRUE(st.ok()) << st.ToString();
  run.results.resize(reqs.size());
  for (RequestResult& r : sched.TakeFinished()) {
    auto it = index.find(r.ticket);
    if (it == index.end()) continue;
    run.results[it->second] = std::move(r);
  }
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    if (!exporters[i]) continue;
    ExportRunInfo info = RunInfo(cfg, reqs[i].spec, run.results[i], reqs[i].export_path);
    engine.UseSlot(run.results[i].slot);  // /run residency and /counters of the request's slot
    AppendStageInfo(engine, run.results[i].result.n_windows, &info.residency, &info.counters);
    const Status fin = exporters[i]->Finish(info);
    EXPECT_TRUE(fin.ok()) << fin.ToString();
  }
  run.steps = sched.step_records();
  for (const RequestResult& r : run.results)
    if (r.kept) {
      EXPECT_TRUE(sched.Release(r.ticket).ok());
    }
  run.counters = sched.counters();
  return run;
}

DiffResult DiffExact(const std::string& a, const std::string& b) {
  auto ra = ExportReader::Open(a);
  auto rb = ExportReader::Open(b);
  if (!ra.ok() || !rb.ok()) {
    ADD_FAILURE() << "cannot open " << a << " / " << b;
    return DiffResult{};
  }
  DiffOptions o;
  o.thresholds.nrmse_max = 0.0;
  o.thresholds.kl_max = 0.0;
  o.threads = 2;
  auto d = DiffExports(**ra, **rb, o);
  if (!d.ok()) {
    ADD_FAILURE() << d.status().ToString();
    return DiffResult{};
  }
  return std::move(d).value();
}

DiffMax MaxOf(const DiffResult& d) {
  DiffMax m;
  for (const ItemResult& it : d.items) {
    if (it.verdict == Verdict::kSkip) continue;
    ++m.compared;
    if (it.verdict == Verdict::kFail) ++m.failed;
    m.nrmse = std::max(m.nrmse, it.stats.nrmse);
    if (it.has_kl) m.kl = std::max(m.kl, it.kl.kl_max);
  }
  return m;
}

}  // namespace lockstep::test
