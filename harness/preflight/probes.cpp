// The probes of `lockstep preflight`: one pair of runs per property, compared bitwise. Each
// probe changes the config only as much as it must (PropertyResult::change) and pins the
// timing-dependent knobs (latency policy, async index) where they are not what it probes, so a
// difference is attributed to the property it names. The reference for each probe's design is
// harness/README.md, "Preflight".
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "lockstep/engine/splitmix.h"
#include "lockstep/engine/thread_pool.h"
#include "lockstep/instrument/fingerprint.h"
#include "preflight/probe_run.h"
#include "preflight/sweep.h"

namespace lockstep {

namespace {

using preflight::Arm;
using preflight::ArmSpec;
using preflight::CompareSpec;
using preflight::Comparison;

// Async runs the index_timing probe tries at most, and the time it may take.
constexpr int kAsyncRuns = 16;
constexpr double kAsyncBudgetS = 8.0;
constexpr int kBackground = 3;  // background requests of the load probe

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Ctx {
  const PreflightOptions& opts;
  preflight::ProbeRunner& runner;
  EngineConfig cfg;  // effective, threads resolved
  RequestOptions ropts;
  std::vector<std::int32_t> prompt;
  std::map<std::string, Arm> cache;  // baselines, by name

  // The config with the timing knobs pinned (what every probe but fresh_repeat runs).
  ArmSpec Spec(const std::string& name, bool pinned) const {
    ArmSpec s;
    s.name = name;
    s.cfg = cfg;
    s.opts = ropts;
    s.prompt = prompt;
    if (pinned) {
      if (s.opts.draft_policy == "latency") s.cfg.draft_policy = s.opts.draft_policy = "adaptive";
      if (s.opts.suffix_index == "async") s.cfg.suffix_index = s.opts.suffix_index = "sync";
      // Injections act by window index, which the probes' pairs do not share (spec 0 vs spec K).
      s.cfg.inject.clear();
      s.opts.inject.clear();
    }
    return s;
  }
  std::string PinnedChange() const {
    std::string c;
    if (ropts.draft_policy == "latency") c = "draft_policy latency -> adaptive";
    if (ropts.suffix_index == "async")
      c += (c.empty() ? "" : ", ") + std::string("suffix_index async -> sync");
    if (!ropts.inject.empty()) c += (c.empty() ? "" : ", ") + std::string("inject cleared");
    return c;
  }
  Result<Arm> RunOne(const ArmSpec& s) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Arm> arms, runner.Run(s));
    return arms.front();
  }
  // The config as given ("base") or pinned ("pinned"), run once and kept.
  Result<Arm> Baseline(bool pinned) {
    const bool same = PinnedChange().empty();
    const std::string name = pinned && !same ? "pinned" : "base";
    auto it = cache.find(name);
    if (it != cache.end()) return it->second;
    LOCKSTEP_ASSIGN_OR_RETURN(Arm a, RunOne(Spec(name, pinned && !same)));
    cache.emplace(name, a);
    return a;
  }
  int threads() const { return cfg.threads; }
};

std::string Join(const std::string& a, const std::string& b) {
  return a.empty() ? b : b.empty() ? a : a + "; " + b;
}

// Fills the counts and the result of `r` from a comparison (nothing compared: n/a).
void Apply(PropertyResult& r, const Comparison& c, bool needs_state = true) {
  r.items_compared += c.compared;
  r.items_differ += c.differ;
  r.max_nrmse = std::max(r.max_nrmse, c.max_nrmse);
  r.max_kl = std::max(r.max_kl, c.max_kl);
  r.within_default = r.within_default && c.within_default;
  if (c.first) {
    r.result = ProbeResult::kDiffers;
    if (!r.first) r.first = c.first;
  } else if (needs_state && c.compared == 0) {
    r.result = ProbeResult::kNotApplicable;
    r.reason = "nothing compared (no checkpoint both runs exported)";
  } else if (r.result == ProbeResult::kNotRun) {
    r.result = ProbeResult::kHolds;
  }
}

// ---- fresh_repeat: the same request twice, the second with a stall ----

// The stall's window: the one before the run's first draft after window 1 (where a latency
// policy would have to stop drafting), else window 1; its length: 4 x the slowest verify up to
// it, at least 200 ms (a latency policy's stall rule: > max(3 x mean, mean + 50 ms)).
std::pair<int, int> StallOf(const std::vector<WindowRecord>& w) {
  int at = w.size() > 1 ? 1 : 0;
  for (std::size_t j = 2; j < w.size(); ++j)
    if (w[j].T > 1) {
      at = static_cast<int>(j) - 1;
      break;
    }
  std::int64_t slowest = 0;
  for (int j = 0; j <= at && j < static_cast<int>(w.size()); ++j)
    slowest = std::max(slowest, w[static_cast<std::size_t>(j)].verify_ns);
  const int ms = static_cast<int>(std::clamp<std::int64_t>(4 * slowest / 1000000, 200, 3000));
  return {at, ms};
}

bool InjectionFired(const RequestResult& r) {
  for (const std::string& j : r.injections) {
    const auto o = nlohmann::json::parse(j, nullptr, false);
    if (o.is_object() && o.value("fired", false)) return true;
  }
  return false;
}

Status ProbeFreshRepeat(Ctx& x, PropertyResult& r) {
  LOCKSTEP_ASSIGN_OR_RETURN(Arm a, x.Baseline(false));
  const auto [at, ms] = StallOf(a.result.result.windows);
  ArmSpec s = x.Spec("stall", false);
  s.opts.inject.push_back("delay:stage=0:window=" + std::to_string(at) +
                          ":ms=" + std::to_string(ms));
  LOCKSTEP_ASSIGN_OR_RETURN(Arm b, x.RunOne(s));
  r.probe = "two fresh engines; the second sleeps " + std::to_string(ms) +
            " ms in stage 0 of window " + std::to_string(at);
  if (!InjectionFired(b.result)) {
    r.result = ProbeResult::kNotApplicable;
    r.reason = "the stall did not fire (the request ended first)";
    return Status::Ok();
  }
  LOCKSTEP_ASSIGN_OR_RETURN(Comparison c, CompareArms(a, b, CompareSpec{}, x.threads()));
  Apply(r, c);
  return Status::Ok();
}

// ---- index_timing: drafts against an index that is always caught up ----

Status ProbeIndexTiming(Ctx& x, PropertyResult& r) {
  const EngineConfig& c = x.cfg;
  if (!(c.spec > 0 && c.replay_path.empty() && c.spec_max_suffix > 0)) {
    r.result = ProbeResult::kNotApplicable;
    r.reason = "no suffix drafts: the index cannot act";
    return Status::Ok();
  }
  if (x.ropts.suffix_index != "async") {
    r.result = ProbeResult::kHolds;
    r.probe = "none needed: suffix_index sync indexes every token before the next draft";
    return Status::Ok();
  }
  // Sync is the async index's own fastest timing (every token indexed before the next draft):
  // an async run whose path differs from it proves its drafts depend on the index's timing.
  ArmSpec ref = x.Spec("index-sync", true);
  ref.export_state = false;
  if (x.ropts.draft_policy == "latency") r.change = "draft_policy latency -> adaptive";
  LOCKSTEP_ASSIGN_OR_RETURN(Arm sync, x.RunOne(ref));
  ArmSpec as = ref;
  as.cfg.suffix_index = as.opts.suffix_index = "async";
  const auto t0 = std::chrono::steady_clock::now();
  int tried = 0;
  while (tried < kAsyncRuns && Since(t0) < kAsyncBudgetS) {
    as.name = "index-async" + std::to_string(++tried);
    LOCKSTEP_ASSIGN_OR_RETURN(Arm a, x.RunOne(as));
    if (auto d = preflight::PathDifference(sync.result.result.windows, a.result.result.windows)) {
      d->text += " (async run " + std::to_string(tried) + " against the caught-up index)";
      r.first = d;
      r.result = ProbeResult::kDiffers;
      r.within_default = false;
      break;
    }
  }
  r.probe = std::to_string(tried) + " async run(s) against the same request with every token " +
            "indexed before each draft (sync)";
  if (r.result != ProbeResult::kDiffers) {
    r.result = ProbeResult::kHolds;
    r.reason = "no async run drafted from a lagging index in " + std::to_string(tried) + " runs";
  }
  return Status::Ok();
}

// ---- load: alone vs among background requests ----

Status ProbeLoad(Ctx& x, PropertyResult& r) {
  if (x.cfg.backend == "cuda") {
    r.result = ProbeResult::kNotApplicable;
    r.reason = "--backend cuda runs one sequence per engine";
    return Status::Ok();
  }
  LOCKSTEP_ASSIGN_OR_RETURN(Arm a, x.Baseline(true));
  ArmSpec s = x.Spec("load", true);
  r.change = x.PinnedChange();
  if (s.cfg.slots < 2) {
    s.cfg.slots = 4;
    r.change = Join(r.change, "slots 1 -> 4");
  }
  s.background = kBackground;
  LOCKSTEP_ASSIGN_OR_RETURN(Arm b, x.RunOne(s));
  r.probe = "alone vs among " + std::to_string(kBackground) + " background requests (" +
            std::to_string(b.shared_windows) + " of " +
            std::to_string(b.result.result.windows.size()) + " windows shared a step)";
  if (b.shared_windows == 0) {
    r.result = ProbeResult::kNotApplicable;
    r.reason = "the request never shared a step";
    return Status::Ok();
  }
  LOCKSTEP_ASSIGN_OR_RETURN(Comparison c, CompareArms(a, b, CompareSpec{}, x.threads()));
  Apply(r, c);
  return Status::Ok();
}

// ---- cold_warm: the prompt twice on one engine with the prefix cache ----

Status ProbeColdWarm(Ctx& x, PropertyResult& r) {
  if (x.cfg.backend == "cuda") {
    r.result = ProbeResult::kNotApplicable;
    r.reason = "--backend cuda refuses --prefix-cache on";
    return Status::Ok();
  }
  ArmSpec s = x.Spec("prefix", true);
  r.change = x.PinnedChange();
  if (!s.cfg.prefix_cache) {
    s.cfg.prefix_cache = true;
    r.change = Join(r.change, "prefix_cache off -> on");
  }
  const int grid = s.cfg.SnapshotGrid();
  const std::size_t want = static_cast<std::size_t>(grid) + 32;
  if (want > 8192) {
    r.result = ProbeResult::kNotApplicable;
    r.reason = "snapshot grid " + std::to_string(grid) + " is too coarse for a bounded probe";
    return Status::Ok();
  }
  if (s.prompt.size() < want) {
    while (s.prompt.size() < want) s.prompt.push_back(x.prompt[s.prompt.size() % x.prompt.size()]);
    r.change = Join(r.change, "prompt repeated to " + std::to_string(want) +
                                  " tokens (past the snapshot at " + std::to_string(grid) + ")");
  }
  s.warm = true;
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Arm> arms, x.runner.Run(s));
  const PrefixReport& p = arms[1].result.prefix;
  r.probe = "the prompt twice on one engine: the second reused " + std::to_string(p.reused_tokens) +
            " tokens (snapshot at " + std::to_string(p.snapshot_position) + ")";
  if (p.reused_tokens == 0) {
    r.result = ProbeResult::kNotApplicable;
    r.reason = "the warm request reused nothing";
    return Status::Ok();
  }
  LOCKSTEP_ASSIGN_OR_RETURN(Comparison c,
                            CompareArms(arms[0], arms[1], CompareSpec{}, x.threads()));
  Apply(r, c);
  return Status::Ok();
}

// ---- verify_single: verify windows vs the same tokens one by one ----

Status ProbeVerifySingle(Ctx& x, PropertyResult& r) {
  ArmSpec s = x.Spec("verify", true);
  r.change = x.PinnedChange();
  Arm a;
  if (s.opts.spec == 0 && s.opts.replay_path.empty()) {
    s.cfg.spec = s.opts.spec = 4;
    r.change = Join(r.change, "spec 0 -> 4");
    LOCKSTEP_ASSIGN_OR_RETURN(a, x.RunOne(s));
  } else {
    LOCKSTEP_ASSIGN_OR_RETURN(a, x.Baseline(true));
  }
  // Window w of the speculative run commits position p + accepted + 1; the spec-0 run's window
  // j commits position n + j. Its commits at those positions are labelled as window w's.
  struct At {
    int window, p, T;
  };
  auto commits = std::make_shared<std::map<int, At>>();
  int max_T = 1;
  for (const WindowRecord& w : a.result.result.windows) {
    (*commits)[w.p + w.accepted + 1] = {w.idx, w.p, w.T};
    max_T = std::max(max_T, w.T);
  }
  const int n = static_cast<int>(x.prompt.size());
  ArmSpec b = x.Spec("single", true);
  b.cfg.spec = b.opts.spec = 0;
  b.cfg.replay_path.clear();
  b.opts.replay_path.clear();
  b.map.wants = [commits, n](int window, CheckpointPoint point) {
    return point == CheckpointPoint::kCommit && commits->count(n + window) > 0;
  };
  b.map.relabel = [commits, n](CheckpointInfo& info) {
    const At& at = commits->at(n + info.window);
    info.window = at.window;
    info.p = at.p;
    info.T = at.T;
  };
  LOCKSTEP_ASSIGN_OR_RETURN(Arm single, x.RunOne(b));
  r.probe = "windows of up to T = " + std::to_string(max_T) + " vs spec 0 (T = 1): committed " +
            "state at the " + std::to_string(commits->size()) + " matching commits (draft K/V " +
            "left out: spec 0 extends none)";
  CompareSpec cs;
  cs.points = "commit";
  cs.exclude = {ItemKind::kMtpK, ItemKind::kMtpV};
  cs.compare_path = false;
  LOCKSTEP_ASSIGN_OR_RETURN(Comparison c, CompareArms(a, single, cs, x.threads()));
  Apply(r, c);
  return Status::Ok();
}

// ---- threads: 1 vs 2 ----

Status ProbeThreads(Ctx& x, PropertyResult& r) {
  r.change = x.PinnedChange();
  Arm side[2];
  for (int t : {1, 2}) {
    ArmSpec s = x.Spec("threads" + std::to_string(t), true);
    if (s.cfg.threads == t) {
      LOCKSTEP_ASSIGN_OR_RETURN(side[t - 1], x.Baseline(true));
    } else {
      s.cfg.threads = t;
      LOCKSTEP_ASSIGN_OR_RETURN(side[t - 1], x.RunOne(s));
    }
  }
  r.probe = "fresh engines with 1 and 2 threads";
  LOCKSTEP_ASSIGN_OR_RETURN(Comparison c, CompareArms(side[0], side[1], CompareSpec{}, 2));
  Apply(r, c);
  return Status::Ok();
}

// ---- engine_age: request 1 on a fresh engine vs request k on an engine that served k - 1 ----

// The requests served first: seeded prompts of 1 .. 3 x the probe's length (some shorter than
// it, some longer, some past a prefill chunk) and max_new 1 .. 8, each run to its end alone.
preflight::BackgroundShape AgeShape(int prompt) {
  preflight::BackgroundShape b;
  b.prompt_lo = 1;
  b.prompt_hi = 3 * prompt;
  b.max_new_lo = 1;
  b.max_new_hi = 8;
  b.arrive_hi = 0;
  b.seed = 0xa9e40u;
  return b;
}

Status ProbeEngineAge(Ctx& x, PropertyResult& r) {
  r.change = x.PinnedChange();
  std::string ks;
  for (int k : x.opts.age_k) ks += (ks.empty() ? "" : ", ") + std::to_string(k);
  r.probe = "request 1 on a fresh engine vs the same request as request k = " + ks +
            " (k - 1 seeded requests of 1 .. " + std::to_string(3 * x.prompt.size()) +
            " tokens served first), prefix cache on and off";
  for (bool cache : {x.cfg.prefix_cache, !x.cfg.prefix_cache}) {
    const std::string tag = cache ? "age_cache_on" : "age_cache_off";
    ArmSpec s = x.Spec(tag + "-1", true);
    s.cfg.prefix_cache = cache;
    LOCKSTEP_ASSIGN_OR_RETURN(Arm fresh, x.RunOne(s));
    for (int k : x.opts.age_k) {
      SweepPoint p;
      p.axis = tag;
      p.value = k;
      s.name = tag + "-" + std::to_string(k);
      s.served_before = k - 1;
      s.before = AgeShape(static_cast<int>(x.prompt.size()));
      LOCKSTEP_ASSIGN_OR_RETURN(Arm aged, x.RunOne(s));
      LOCKSTEP_RETURN_IF_ERROR(preflight::JudgePoint(fresh, aged, x.threads(), p));
      if (aged.result.prefix.reused_tokens > 0) {
        // Not this property's question (that is cold_warm): an earlier request shared a prefix.
        p.result = ProbeResult::kNotApplicable;
        p.reason = "the aged request reused " + std::to_string(aged.result.prefix.reused_tokens) +
                   " cached tokens";
      }
      r.items_compared += p.items_compared;
      r.items_differ += p.items_differ;
      r.max_nrmse = std::max(r.max_nrmse, p.max_nrmse);
      if (p.first) {
        r.within_default = r.within_default && p.first->within_default;
        if (!r.first) {
          r.first = p.first;
          r.first->text = p.Label() + ": " + r.first->text;
        }
      }
      if (p.result == ProbeResult::kDiffers) {
        r.result = ProbeResult::kDiffers;
      } else if (p.result == ProbeResult::kNotApplicable && r.result != ProbeResult::kDiffers) {
        r.result = ProbeResult::kNotApplicable;
        if (r.reason.empty()) r.reason = p.Label() + ": " + p.reason;
      } else if (r.result == ProbeResult::kNotRun) {
        r.result = ProbeResult::kHolds;
      }
      r.points.push_back(p);
    }
  }
  return Status::Ok();
}

Status RunProbe(Ctx& x, PropertyResult& r) {
  switch (r.property) {
    case PreflightProperty::kFreshRepeat:
      return ProbeFreshRepeat(x, r);
    case PreflightProperty::kIndexTiming:
      return ProbeIndexTiming(x, r);
    case PreflightProperty::kLoad:
      return ProbeLoad(x, r);
    case PreflightProperty::kColdWarm:
      return ProbeColdWarm(x, r);
    case PreflightProperty::kVerifySingle:
      return ProbeVerifySingle(x, r);
    case PreflightProperty::kThreads:
      return ProbeThreads(x, r);
    case PreflightProperty::kEngineAge:
      return ProbeEngineAge(x, r);
  }
  return Status::Ok();
}

// A temporary probe folder, removed when it goes (unless it is the user's --work folder).
struct ProbeDir {
  std::string path;
  bool owned = false;
  ~ProbeDir() {
    std::error_code ec;
    if (owned) std::filesystem::remove_all(path, ec);
  }
};

Status MakeProbeDir(const std::string& work, ProbeDir& d) {
  if (!work.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(work, ec);
    if (ec || !std::filesystem::is_directory(work))
      return Status::InvalidArgument("--work '" + work + "'", "cannot create the folder");
    d.path = work;
    return Status::Ok();
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/lockstep-preflight-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr)
    return Status::IOError("preflight", "cannot create a temporary folder in " + tmpl);
  d.path = tmpl;
  d.owned = true;
  return Status::Ok();
}

std::set<PreflightProperty> Selected(const PreflightOptions& o) {
  std::set<PreflightProperty> s;
  if (o.skip_probes || (o.sweep && o.probes.empty())) return s;
  for (const std::string& id : o.probes)
    if (auto p = ParsePropertyId(id)) s.insert(*p);
  if (o.probes.empty()) s.insert(AllPreflightProperties().begin(), AllPreflightProperties().end());
  return s;
}

// The knobs that break `r.property` by design, and the result that makes of a probe that
// found nothing.
void Finalize(PropertyResult& r, const std::vector<KnobFinding>& knobs) {
  // A fresh A/A is also broken by what breaks the index's timing (its drafts are in the path).
  for (const KnobFinding& k : knobs)
    if (k.active && k.breaks &&
        (*k.breaks == r.property || (r.property == PreflightProperty::kFreshRepeat &&
                                     *k.breaks == PreflightProperty::kIndexTiming)))
      r.broken_by.push_back(k.knob);
  if (!r.broken_by.empty() && r.result == ProbeResult::kHolds) {
    r.result = ProbeResult::kNotProvoked;
    if (r.reason.empty()) r.reason = "the probe found no difference this time";
  }
}

}  // namespace

std::vector<std::int32_t> BuiltinPreflightPrompt(int n_vocab) {
  std::vector<std::int32_t> tail, block;
  std::uint64_t x = 0x9f1e5eedu;
  auto next = [&] {
    x = SplitMix64(x);
    return static_cast<std::int32_t>(x % static_cast<std::uint64_t>(std::max(1, n_vocab)));
  };
  for (int i = 0; i < 32; ++i) tail.push_back(next());
  for (int i = 0; i < 48; ++i) block.push_back(next());
  std::vector<std::int32_t> p = tail;
  for (int k = 0; k < 3; ++k) p.insert(p.end(), block.begin(), block.end());
  return p;
}

Result<PreflightReport> RunPreflight(const PreflightOptions& opts, const ModelWeights& weights,
                                     std::span<const std::int32_t> prompt) {
  const auto t0 = std::chrono::steady_clock::now();
  PreflightReport rep;
  // The knobs and claims read the config as given (threads 0 is "auto"), the probes the
  // resolved one.
  rep.knobs = StaticKnobs(opts.config, ThreadPool::HardwareThreads());
  rep.config = opts.config;
  if (rep.config.threads == 0) rep.config.threads = ThreadPool::HardwareThreads();
  rep.config_sha256 = Sha256Hex(rep.config.ToJson());
  rep.prompt_tokens = static_cast<int>(prompt.size());
  rep.probe_tokens = opts.probe_tokens;
  const std::set<PreflightProperty> selected = Selected(opts);
  for (PreflightProperty p : AllPreflightProperties()) {
    PropertyResult r;
    r.property = p;
    r.claim = ClaimOf(opts.config, p);
    rep.properties.push_back(r);
  }
  if (!selected.empty() || opts.sweep) {
    LOCKSTEP_ASSIGN_OR_RETURN(rep.model_sha256, Sha256Files(weights.files));
    ProbeDir dir;
    LOCKSTEP_RETURN_IF_ERROR(MakeProbeDir(opts.work_dir, dir));
    rep.work_dir = dir.owned ? "" : dir.path;
    preflight::ProbeRunner runner(weights, dir.path, rep.model_sha256);
    Ctx x{opts,
          runner,
          rep.config,
          RequestOptions::FromConfig(rep.config),
          std::vector<std::int32_t>(prompt.begin(), prompt.end()),
          {}};
    x.ropts.max_new = opts.probe_tokens;
    x.ropts.ignore_eos = true;
    for (PropertyResult& r : rep.properties) {
      if (!selected.count(r.property)) continue;
      const auto p0 = std::chrono::steady_clock::now();
      const int runs0 = runner.runs();
      LOCKSTEP_RETURN_IF_ERROR(
          RunProbe(x, r).WithContext(std::string("probe ") + PropertyId(r.property)));
      r.runs = runner.runs() - runs0;
      r.seconds = Since(p0);
      if (opts.progress)
        std::fprintf(stderr, "preflight: %s: %s (%.1f s)\n", PropertyId(r.property),
                     ProbeResultName(r.result), r.seconds);
    }
    if (opts.sweep) {
      preflight::SweepOptions so;
      so.k = opts.sweep_k;
      so.rows = opts.sweep_rows;
      so.keep_exports = !dir.owned;
      so.progress = opts.progress;
      LOCKSTEP_RETURN_IF_ERROR(
          preflight::RunSweep(so, runner, x.Spec("sweep", true), rep.sweep).WithContext("sweep"));
      rep.sweep.change = x.PinnedChange();
    }
  }
  for (PropertyResult& r : rep.properties) Finalize(r, rep.knobs);
  rep.seconds = Since(t0);
  return rep;
}

}  // namespace lockstep
