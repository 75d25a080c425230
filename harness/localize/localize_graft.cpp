// `localize --graft` (localize_run.h, "graft"): is a path divergence carried by the state? A and
// B are re-run exporting every commit; B is re-run again with A's state items at the commit
// before the first divergent window, then with halves of the items that differ there, until one
// item (or the smallest set found) whose graft alone makes B's path agree is left. Each trial is a
// fresh process, so the cost is about 2 + 2 log2(items that differ) re-runs of the request.
#include "localize/localize_rerun.h"
#include "lockstep/engine/graft.h"

namespace lockstep {

namespace {

std::string Joined(const std::vector<std::string>& v, const char* none) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? std::string(none) : s;
}

const ExportCheckpoint* FindCommit(const ExportMeta& m, int window) {
  for (const ExportCheckpoint& cp : m.checkpoints)
    if (cp.window == window && cp.point == CheckpointPoint::kCommit) return &cp;
  return nullptr;
}

// The item's stored rows (and int8 scales) as bytes.
Result<std::vector<std::byte>> ItemBytes(const ExportReader& r, const ExportCheckpoint& cp,
                                         const ExportItem& it) {
  const std::size_t row = static_cast<std::size_t>(it.row_elems()) * it.elem_bytes();
  std::vector<std::byte> out(static_cast<std::size_t>(it.rows()) * row);
  if (it.rows() > 0) LOCKSTEP_RETURN_IF_ERROR(r.ReadRows(cp, it, 0, it.rows(), out.data()));
  if (it.has_scales && it.rows() > 0) {
    std::vector<float> s(static_cast<std::size_t>(it.rows() * it.scale_row_elems));
    LOCKSTEP_RETURN_IF_ERROR(r.ReadScaleRows(cp, it, 0, it.rows(), s.data()));
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out.insert(out.end(), p, p + s.size() * sizeof(float));
  }
  return out;
}

// The graftable items of A's commit `window`, and those whose bytes differ in B's.
Status DifferingItems(const ExportReader& a, const ExportReader& b, int window,
                      std::vector<std::string>* all, std::vector<std::string>* differing) {
  const ExportCheckpoint* ca = FindCommit(a.meta(), window);
  const ExportCheckpoint* cb = FindCommit(b.meta(), window);
  if (ca == nullptr || cb == nullptr)
    return Status::Runtime("localize --graft",
                           "a re-run exported no commit of window " + std::to_string(window));
  for (const ExportItem& ia : ca->items) {
    if (!IsGraftable(ia.kind)) continue;
    all->push_back(ia.rel);
    const ExportItem* ib = nullptr;
    for (const ExportItem& x : cb->items)
      if (x.rel == ia.rel) ib = &x;
    if (ib == nullptr || ib->shape != ia.shape || ib->dtype != ia.dtype) {
      differing->push_back(ia.rel);
      continue;
    }
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<std::byte> xa, ItemBytes(a, *ca, ia));
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<std::byte> xb, ItemBytes(b, *cb, *ib));
    if (xa != xb) differing->push_back(ia.rel);
  }
  return Status::Ok();
}

}  // namespace

Status LocalizeByGraft(const ExportMeta& ma, const ExportMeta& mb, const LocalizeRunOptions& o,
                       const std::string& work, LocalizeRun* run) {
  LocalizeGraft& g = run->graft;
  LocalizeRerun& rr = run->rerun;
  LocalizeResult& r = run->result;
  if (FirstDeparture(ma, mb) < 0)
    return Status::InvalidArgument(
        "localize --graft",
        "the two exports' window paths and tokens agree: --graft bisects a path divergence "
        "(localize them without it)");
  g.ran = rr.ran = true;
  rr.originals_differ = true;
  rr.knobs = TimingKnobs(ma, mb);
  const std::string knobs = Joined(rr.knobs, "none active");
  RerunSpec spec{"a.graft", false, "all", "commit", {}, false};
  LOCKSTEP_ASSIGN_OR_RETURN(rr.a, RerunRequest(ma, spec, o, work));
  spec.stem = "b.graft";
  spec.side_b = true;
  LOCKSTEP_ASSIGN_OR_RETURN(rr.b, RerunRequest(mb, spec, o, work));
  LOCKSTEP_ASSIGN_OR_RETURN(auto xa, OpenOwn(rr.a));
  LOCKSTEP_ASSIGN_OR_RETURN(auto xb, OpenOwn(rr.b));
  g.divergence = FirstDeparture(xa->meta(), xb->meta());
  r.verdict = LocalizeVerdict::kPath;
  r.kind = "path";
  if (g.divergence < 0) {
    r.verdict = LocalizeVerdict::kNoDifference;
    r.kind = "did not reproduce";
    g.finding =
        "did not reproduce: the re-runs take the same path (timing-dependent; timing-dependent "
        "knobs: " +
        knobs + ")";
    r.why = g.finding;
    return Status::Ok();
  }
  if (g.divergence == 0)
    return Status::InvalidArgument("localize --graft",
                                   "the re-runs' paths part at window 0: there is no commit "
                                   "before it to graft at");
  g.reproduced = true;
  g.graft_window = g.divergence - 1;
  r.first.window = g.divergence;
  std::vector<std::string> all;
  LOCKSTEP_RETURN_IF_ERROR(DifferingItems(*xa, *xb, g.graft_window, &all, &g.differing));
  g.items = static_cast<int>(all.size());

  int n_trials = 0;
  auto trial = [&](const std::vector<std::string>& items) -> Result<bool> {
    RerunSpec t{"b.graft" + std::to_string(++n_trials), false, "none", "", {}, true};
    for (const std::string& rel : items)
      t.grafts.push_back(rr.a + ":" + rel + "@" + std::to_string(g.graft_window) + ":commit");
    LOCKSTEP_ASSIGN_OR_RETURN(std::string path, RerunRequest(mb, t, o, work));
    LOCKSTEP_ASSIGN_OR_RETURN(auto x, OpenOwn(path));
    GraftTrial gt;
    gt.items = items;
    gt.first_divergence = FirstDeparture(xa->meta(), x->meta());
    gt.agrees = gt.first_divergence < 0 || gt.first_divergence > g.divergence;
    g.trials.push_back(gt);
    return gt.agrees;
  };
  const std::string where = "part from window " + std::to_string(g.divergence) + "; ";
  const std::string given = "window " + std::to_string(g.graft_window) + "'s commit";
  LOCKSTEP_ASSIGN_OR_RETURN(const bool all_agree, trial(all));
  if (!all_agree) {
    g.finding = where + "grafting A's state at " + given + " (" + std::to_string(all.size()) +
                " items, " + std::to_string(g.differing.size()) +
                " differing) into B does not remove it: the state is not the cause (timing- or "
                "policy-dependent knobs: " +
                knobs + ")";
    r.why = g.finding;
    return Status::Ok();
  }
  if (g.differing.empty()) {
    g.finding = where + "A's state at " + given +
                " equals B's, and B re-run with it took A's path: did not reproduce under the "
                "graft (timing-dependent; knobs: " +
                knobs + ")";
    r.why = g.finding;
    return Status::Ok();
  }
  g.state_is_cause = true;
  std::vector<std::string> s = g.differing;
  bool tested_alone = s.size() == all.size();
  while (s.size() > 1) {
    const auto mid = s.begin() + static_cast<std::ptrdiff_t>(s.size() / 2);
    const std::vector<std::string> lo(s.begin(), mid), hi(mid, s.end());
    LOCKSTEP_ASSIGN_OR_RETURN(const bool lo_agrees, trial(lo));
    if (lo_agrees) {
      s = lo, tested_alone = true;
      continue;
    }
    LOCKSTEP_ASSIGN_OR_RETURN(const bool hi_agrees, trial(hi));
    if (!hi_agrees) break;
    s = hi, tested_alone = true;
  }
  if (!tested_alone) {
    LOCKSTEP_ASSIGN_OR_RETURN(const bool alone, trial(s));
    if (!alone) s = g.differing;
  }
  g.culprit = s;
  r.item = s.size() == 1 ? s[0] : "";
  g.finding = where + (s.size() == 1 ? "grafting A's " + s[0] + " at " + given +
                                           " alone into B removes it: that state item is the "
                                           "cause"
                                     : "grafting these " + std::to_string(s.size()) +
                                           " items of A's state at " + given +
                                           " together into B removes it (no half of them "
                                           "alone does): " +
                                           Joined(s, ""));
  r.why = g.finding;
  return Status::Ok();
}

}  // namespace lockstep
