// `lockstep preflight --sweep` (issue 40, item 1): the probe request beside k co-resident
// background requests for each declared k, and with prefill chunks straddling every tile
// boundary of the CPU backend, each point an A/A against the probe's solo run (same config) on
// every exported item. harness/README.md, "Sweeps", is the reference.
#include "preflight/sweep.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

namespace lockstep {

std::string SweepPoint::Label() const { return axis + "=" + std::to_string(value); }

bool SweepReport::passed() const { return ran && !points.empty() && FirstFailing() == nullptr; }

const SweepPoint* SweepReport::FirstFailing() const {
  for (const SweepPoint& p : points)
    if (p.result != ProbeResult::kHolds) return &p;
  return nullptr;
}

std::vector<int> DefaultSweepK(int slots) {
  std::vector<int> k;
  for (int v : {0, 1, 2, 3, 7, 8, 15, 16, 31, 32, 63, 64, slots - 1})
    if (v >= 0 && v <= slots - 1) k.push_back(v);
  std::sort(k.begin(), k.end());
  k.erase(std::unique(k.begin(), k.end()), k.end());
  return k;
}

namespace preflight {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Background requests of a k point: short prompts (8 .. 24 tokens: every one is admitted
// within the first steps) arriving at once, and a max_new past the probe's, so all k are
// co-resident with the probe's windows.
BackgroundShape KShape(int probe_tokens) {
  BackgroundShape b;
  b.prompt_lo = 8;
  b.prompt_hi = 24;
  b.max_new_lo = probe_tokens + 4;
  b.max_new_hi = probe_tokens + 8;
  b.arrive_hi = 0;
  b.seed = 0x5eed40u;
  return b;
}

// Background requests of a rows point: prompts of the probe's length to 2 R more (their chunks of
// R rows share the probe's prefill steps; none ends its prefill before the probe's, so they decode
// beside its windows), arriving in the first steps.
BackgroundShape RowsShape(int prompt, int rows, int probe_tokens) {
  BackgroundShape b;
  b.prompt_lo = prompt;
  b.prompt_hi = prompt + 2 * rows;
  b.max_new_lo = probe_tokens;
  b.max_new_hi = probe_tokens + 4;
  b.arrive_hi = 2;
  b.seed = 0x5eed41u;
  return b;
}

void Remove(const Arm& a, bool keep) {
  std::error_code ec;
  if (!keep && !a.export_path.empty()) std::filesystem::remove(a.export_path, ec);
}

void Progress(const SweepOptions& o, const SweepPoint& p) {
  if (!o.progress) return;
  std::fprintf(stderr, "preflight: sweep %s: %s, %d of %d items compared, %d differ (%.1f s)\n",
               p.Label().c_str(), ProbeResultName(p.result), p.items_compared, p.items_total,
               p.items_differ, p.seconds);
}

}  // namespace

Status JudgePoint(const Arm& a, const Arm& b, int threads, SweepPoint& p) {
  LOCKSTEP_ASSIGN_OR_RETURN(Comparison c, CompareArms(a, b, CompareSpec{}, threads));
  p.windows = static_cast<int>(b.result.result.windows.size());
  p.shared_windows = b.shared_windows;
  p.seqs_max = b.seqs_max;
  p.items_total = c.total;
  p.items_compared = c.compared;
  p.items_differ = c.differ;
  p.max_nrmse = c.max_nrmse;
  p.output_equal = c.output_equal;
  p.first = c.first;
  if (c.first) {
    p.result = ProbeResult::kDiffers;
  } else if (c.compared == 0) {
    p.result = ProbeResult::kNotApplicable;
    p.reason = "nothing compared (no checkpoint both runs exported)";
  } else if (p.background > 0 && b.shared_windows == 0) {
    p.result = ProbeResult::kNotApplicable;
    p.reason = "the probe never shared a step";
  } else {
    p.result = ProbeResult::kHolds;
  }
  return Status::Ok();
}

Status RunSweep(const SweepOptions& o, ProbeRunner& runner, const ArmSpec& base, SweepReport& rep) {
  rep.ran = true;
  rep.slots = base.cfg.slots;
  rep.k_declared = o.k.empty() ? DefaultSweepK(base.cfg.slots) : o.k;
  rep.tiles = CpuRowTiles();
  const int probe_tokens = base.opts.max_new;
  std::vector<int> ks;
  for (int k : rep.k_declared) (k <= base.cfg.slots - 1 ? ks : rep.k_clipped).push_back(k);
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());

  // The k points: one solo run, then the probe beside k background requests.
  if (!ks.empty()) {
    ArmSpec solo = base;
    solo.name = "sweep-solo";
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Arm> ref, runner.Run(solo));
    for (int k : ks) {
      const auto t0 = Clock::now();
      SweepPoint p;
      p.axis = "k";
      p.value = p.background = k;
      ArmSpec s = base;
      s.name = "sweep-k" + std::to_string(k);
      s.background = k;
      s.shape = KShape(probe_tokens);
      LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Arm> b, runner.Run(s));
      LOCKSTEP_RETURN_IF_ERROR(JudgePoint(ref.front(), b.front(), base.cfg.threads, p));
      Remove(b.front(), o.keep_exports);
      p.seconds = Since(t0);
      Progress(o, p);
      rep.points.push_back(p);
    }
    Remove(ref.front(), o.keep_exports);
  }

  // The rows points: prefill chunks of R rows, alone and beside a few background requests.
  const std::vector<int> rows = o.rows ? *o.rows : StraddlingRows(rep.tiles);
  rep.rows_background = std::min(3, base.cfg.slots - 1);
  for (int r : rows) {
    const auto t0 = Clock::now();
    SweepPoint p;
    p.axis = "rows";
    p.value = r;
    p.background = rep.rows_background;
    ArmSpec s = base;
    s.cfg.prefill_chunk = r;
    // Snapshots sit on the chunk grid: the config's grid rounded up to a multiple of R (not R
    // itself, which at R = 1 would snapshot every GDN state of every prompt).
    const int grid = base.cfg.SnapshotGrid();
    s.cfg.snapshot_every = (grid + r - 1) / r * r;
    s.name = "sweep-rows" + std::to_string(r) + "-solo";
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Arm> a, runner.Run(s));
    s.name = "sweep-rows" + std::to_string(r);
    s.background = rep.rows_background;
    s.shape = RowsShape(static_cast<int>(base.prompt.size()), r, probe_tokens);
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Arm> b, runner.Run(s));
    LOCKSTEP_RETURN_IF_ERROR(JudgePoint(a.front(), b.front(), base.cfg.threads, p));
    Remove(a.front(), o.keep_exports);
    Remove(b.front(), o.keep_exports);
    p.seconds = Since(t0);
    Progress(o, p);
    rep.points.push_back(p);
  }
  return Status::Ok();
}

}  // namespace preflight
}  // namespace lockstep
