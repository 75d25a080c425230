#include "preflight/probe_run.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>

#include "lockstep/compare/align.h"
#include "lockstep/compare/export_reader.h"
#include "lockstep/compare/state_diff.h"
#include "lockstep/engine/clock.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/splitmix.h"
#include "lockstep/instrument/export_writer.h"
#include "lockstep/instrument/fingerprint.h"
#include "lockstep/instrument/run_info.h"

namespace lockstep::preflight {

namespace {

// Forwards to the exporter the checkpoints `map` wants, relabelled by it. Views are passed on
// during the call, as the Observer contract requires.
class MappedObserver final : public Observer {
 public:
  MappedObserver(H5Exporter& out, const CheckpointMap& map) : out_(out), map_(map) {}
  bool WantsCheckpoint(int window, CheckpointPoint point) const override {
    if (map_.wants) return map_.wants(window, point);
    return point != CheckpointPoint::kPreVerify || window == 0;
  }
  void OnCheckpointBegin(const CheckpointInfo& info) override {
    out_.OnCheckpointBegin(Relabel(info));
  }
  void OnState(const CheckpointInfo& info, const StateView& view) override {
    // At post_verify the committed K/V rows and the GDN checkpoint are still those of the
    // previous commit (or of window 0's pre_verify), which is exported: only the window's own
    // items (k_spec, v_spec, hidden_out, logits, draft K/V) are new there.
    const bool committed = view.kind == ItemKind::kK || view.kind == ItemKind::kV ||
                           view.kind == ItemKind::kConvState || view.kind == ItemKind::kSsmState;
    if (!map_.wants && info.point == CheckpointPoint::kPostVerify && committed) return;
    out_.OnState(Relabel(info), view);
  }
  void OnCheckpointEnd(const CheckpointInfo& info) override { out_.OnCheckpointEnd(Relabel(info)); }
  void OnWindow(const WindowRecord& rec) override { out_.OnWindow(rec); }
  void OnStep(const StepRecord& step) override { out_.OnStep(step); }

 private:
  CheckpointInfo Relabel(CheckpointInfo info) const {
    if (map_.relabel) map_.relabel(info);
    return info;
  }
  H5Exporter& out_;
  const CheckpointMap& map_;
};

// One target request being run: its exporter (optional) and ticket.
struct Target {
  std::string name, path;
  std::unique_ptr<H5Exporter> exporter;
  std::unique_ptr<MappedObserver> observer;
  Ticket ticket = 0;
};

// One seeded request of `shape` (x: the seed stream, advanced).
RequestSpec SeededRequest(const ArmSpec& s, const BackgroundShape& shape, std::uint64_t& x,
                          int n_vocab, std::string id) {
  auto in = [&x](int lo, int hi) {
    x = SplitMix64(x);
    return lo + static_cast<int>(x % static_cast<std::uint64_t>(hi - lo + 1));
  };
  RequestSpec r;
  r.id = std::move(id);
  r.options = s.opts;
  r.options.inject.clear();
  r.options.replay_path.clear();
  r.options.max_new = in(shape.max_new_lo, shape.max_new_hi);
  r.arrive_step = in(0, shape.arrive_hi);
  r.prompt.resize(static_cast<std::size_t>(in(shape.prompt_lo, shape.prompt_hi)));
  for (auto& t : r.prompt) {
    x = SplitMix64(x);
    t = static_cast<std::int32_t>(x % static_cast<std::uint64_t>(n_vocab));
  }
  return r;
}

Status SubmitBackground(Scheduler& sched, const ArmSpec& s, int n_vocab) {
  std::uint64_t x = s.shape.seed;
  for (int i = 0; i < s.background; ++i)
    LOCKSTEP_RETURN_IF_ERROR(
        sched.Submit(SeededRequest(s, s.shape, x, n_vocab, "background" + std::to_string(i)))
            .status());
  return Status::Ok();
}

// The requests served before the target, each run to its end alone.
Status ServeBefore(Scheduler& sched, const ArmSpec& s, int n_vocab) {
  std::uint64_t x = s.before.seed;
  for (int i = 0; i < s.served_before; ++i) {
    RequestSpec r = SeededRequest(s, s.before, x, n_vocab, "served" + std::to_string(i));
    r.arrive_step = 0;
    LOCKSTEP_RETURN_IF_ERROR(sched.Submit(std::move(r)).status());
    LOCKSTEP_RETURN_IF_ERROR(sched.RunUntilIdle());
    for (RequestResult& f : sched.TakeFinished())
      if (f.end != RequestEnd::kFinished)
        return Status::Runtime("preflight " + s.name,
                               "an earlier request failed: " + f.status.ToString());
  }
  return Status::Ok();
}

ExportRunInfo RunInfo(const ArmSpec& s, const std::string& name, const RequestResult& r,
                      const std::string& model_sha256) {
  ExportRunInfo m = RequestRunInfo(s.cfg, s.prompt, s.opts.max_new, r);
  m.arm = name;
  m.run_id = Sha256Hex("preflight/" + name + "/" + std::to_string(MonotonicNs())).substr(0, 16);
  m.created_utc = "1970-01-01T00:00:00Z";
  m.model_sha256 = model_sha256;
  return m;
}

// Submits target `k` of `s` (0: the arm, 1: its warm repeat) with its exporter.
Result<Target> SubmitTarget(Scheduler& sched, const ArmSpec& s, int k, const std::string& dir) {
  Target t;
  t.name = s.name + (s.warm ? (k == 0 ? "-cold" : "-warm") : "");
  RequestSpec r;
  r.id = t.name;
  r.prompt = s.prompt;
  r.options = s.opts;
  r.keep = true;  // the slot stays open for the export's counters; released after
  if (s.export_state) {
    t.path = dir + "/" + t.name + ".h5";
    ExportOptions eo;
    eo.path = t.path;
    LOCKSTEP_ASSIGN_OR_RETURN(eo.windows, WindowSelection::Parse("all"));
    LOCKSTEP_ASSIGN_OR_RETURN(t.exporter, H5Exporter::Create(eo));
    t.observer = std::make_unique<MappedObserver>(*t.exporter, s.map);
    r.hooks.observer = t.observer.get();
  }
  LOCKSTEP_ASSIGN_OR_RETURN(t.ticket, sched.Submit(std::move(r)));
  return t;
}

// Runs the scheduler until idle and finishes target `t` (its export, its slot).
Result<Arm> FinishTarget(Engine& engine, Scheduler& sched, Target& t, const ArmSpec& s,
                         const std::string& model_sha256) {
  LOCKSTEP_RETURN_IF_ERROR(sched.RunUntilIdle());
  std::optional<RequestResult> mine;
  for (RequestResult& r : sched.TakeFinished()) {
    if (r.ticket == t.ticket) {
      mine = std::move(r);
    } else if (r.end != RequestEnd::kFinished) {
      return Status::Runtime("preflight " + s.name,
                             "a background request failed: " + r.status.ToString());
    }
  }
  if (!mine) return Status::Runtime("preflight " + s.name, "the request did not finish");
  LOCKSTEP_RETURN_IF_ERROR(mine->status.WithContext("preflight " + s.name));
  Arm arm;
  arm.name = t.name;
  if (t.exporter) {
    ExportRunInfo info = RunInfo(s, t.name, *mine, model_sha256);
    engine.UseSlot(mine->slot);
    AppendStageInfo(engine, mine->result.n_windows, &info.residency, &info.counters);
    LOCKSTEP_RETURN_IF_ERROR(t.exporter->Finish(info));
    arm.export_path = t.path;
  }
  if (mine->kept) LOCKSTEP_RETURN_IF_ERROR(sched.Release(mine->ticket));
  for (const WindowRecord& w : mine->result.windows) {
    arm.shared_windows += w.step_seqs > 1;
    arm.seqs_max = std::max(arm.seqs_max, w.step_seqs);
  }
  arm.result = std::move(*mine);
  return arm;
}

}  // namespace

Result<std::vector<Arm>> ProbeRunner::Run(const ArmSpec& s) {
  LOCKSTEP_ASSIGN_OR_RETURN(EnginePtr engine, Engine::Create(s.cfg, weights_));
  Scheduler sched(*engine);
  if (s.served_before > 0) LOCKSTEP_RETURN_IF_ERROR(ServeBefore(sched, s, weights_.config.n_vocab));
  std::vector<Arm> arms;
  for (int k = 0; k < (s.warm ? 2 : 1); ++k) {
    LOCKSTEP_ASSIGN_OR_RETURN(Target t, SubmitTarget(sched, s, k, dir_));
    if (k == 0 && s.background > 0)
      LOCKSTEP_RETURN_IF_ERROR(SubmitBackground(sched, s, weights_.config.n_vocab));
    LOCKSTEP_ASSIGN_OR_RETURN(Arm a, FinishTarget(*engine, sched, t, s, model_sha256_));
    arms.push_back(std::move(a));
    ++runs_;
  }
  return arms;
}

namespace {

bool Excluded(const CompareSpec& s, const std::string& kind) {
  return std::any_of(s.exclude.begin(), s.exclude.end(),
                     [&](ItemKind k) { return kind == ItemKindName(k); });
}

// A bitwise-differing item as a FirstDifference, judged against the default thresholds.
FirstDifference StateDifference(const ItemResult& it) {
  const Thresholds defaults;
  FirstDifference f;
  f.what = "state";
  f.window = it.window;
  f.point = it.point;
  f.stage = it.stage;
  f.layer = it.layer;
  f.item = it.kind;
  f.rel = it.rel;
  // A structural failure (missing, shape, dtype) carries no metric.
  const bool measured = IsMeasured(it.failure);
  f.nrmse = measured ? it.stats.nrmse : -1.0;
  f.kl = it.has_kl ? it.kl.kl_max : -1.0;
  f.within_default = measured && !it.stats.non_finite &&
                     it.stats.nrmse <= defaults.NrmseFor(it.kind) &&
                     (!it.has_kl || (!it.kl.non_finite && it.kl.kl_max <= defaults.kl_max));
  char buf[96];
  std::snprintf(buf, sizeof(buf), "NRMSE %.2g", it.stats.nrmse);
  std::string metric = measured ? buf : it.reason;
  if (it.has_kl) {
    std::snprintf(buf, sizeof(buf), ", KL %.2g", it.kl.kl_max);
    metric += buf;
  }
  f.text =
      "window " + std::to_string(it.window) + " " + it.point + ", stage " +
      std::to_string(it.stage) +
      (it.layer >= 0 ? ", layer " + std::to_string(it.layer) : std::string()) + ", " + it.kind +
      ": " + metric +
      (f.within_default ? " (within the default thresholds)" : " (fails the default thresholds)");
  return f;
}

}  // namespace

std::optional<FirstDifference> PathDifference(const std::vector<WindowRecord>& a,
                                              const std::vector<WindowRecord>& b) {
  const AlignResult al = AlignWindows(a, b);
  if (!al.diverged) return std::nullopt;
  FirstDifference f;
  f.what = "path";
  f.window = al.div_idx;
  for (const std::string& field : al.differing_fields)
    f.item += (f.item.empty() ? "" : ",") + field;
  f.a = al.div_a ? DescribeWindow(*al.div_a, al.fields) : std::string("(ended)");
  f.b = al.div_b ? DescribeWindow(*al.div_b, al.fields) : std::string("(ended)");
  std::string fields;
  for (const std::string& field : al.differing_fields) {
    fields += (fields.empty() ? "" : ", ") + field + " " +
              (al.div_a ? FieldValue(*al.div_a, field) : "-") + " | " +
              (al.div_b ? FieldValue(*al.div_b, field) : "-");
  }
  f.text = "window " + std::to_string(al.div_idx) + ": path " +
           (fields.empty() ? std::string("one run has no window here") : fields);
  return f;
}

Result<Comparison> CompareArms(const Arm& a, const Arm& b, const CompareSpec& spec, int threads) {
  Comparison c;
  c.output_equal = a.result.result.output == b.result.result.output;
  // After a path divergence windows are not paired by index (DESIGN.md): state is compared on
  // the windows before it only.
  std::optional<FirstDifference> path;
  if (spec.compare_path) path = PathDifference(a.result.result.windows, b.result.result.windows);
  const int state_windows = path ? path->window : std::numeric_limits<int>::max();
  std::optional<FirstDifference> state;
  if (!a.export_path.empty() && !b.export_path.empty()) {
    ReaderLimits lim;
    lim.isolate = false;  // files this process just wrote
    LOCKSTEP_ASSIGN_OR_RETURN(auto ra, ExportReader::Open(a.export_path, lim));
    LOCKSTEP_ASSIGN_OR_RETURN(auto rb, ExportReader::Open(b.export_path, lim));
    DiffOptions o;
    o.thresholds.nrmse_max = 0.0;
    o.thresholds.kl_max = 0.0;
    o.points = spec.points;
    o.max_skipped = -1;  // after a path divergence the windows are not the same boundaries
    o.threads = threads;
    LOCKSTEP_ASSIGN_OR_RETURN(DiffResult d, DiffExports(*ra, *rb, o));
    for (const ItemResult& it : d.items) {
      if (Excluded(spec, it.kind)) continue;
      ++c.total;
      if (it.verdict == Verdict::kSkip || it.window >= state_windows) continue;
      ++c.compared;
      if (it.verdict != Verdict::kFail) continue;
      ++c.differ;
      const FirstDifference f = StateDifference(it);
      c.max_nrmse = std::max(c.max_nrmse, f.nrmse);
      if (f.kl > 0) c.max_kl = std::max(c.max_kl, f.kl);
      c.within_default = c.within_default && f.within_default;
      if (!state) state = f;
    }
  }
  if (state) {
    c.first = state;
  } else if (path) {
    c.first = path;
    c.within_default = false;
  } else if (!c.output_equal) {
    FirstDifference f;
    f.what = "output";
    f.text = "the output tokens differ";
    c.first = f;
    c.within_default = false;
  }
  return c;
}

}  // namespace lockstep::preflight
