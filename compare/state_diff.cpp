#include "lockstep/compare/state_diff.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "lockstep/engine/window_selection.h"

namespace lockstep {

namespace {

std::string CompactJson(const nlohmann::json& j) { return j.dump(); }

constexpr std::int64_t kBlockBytes = std::int64_t{4}
                                     << 20;  // per side per read: fits L2/L3 streaming well

const char* LabelFor(ItemKind kind) {
  switch (kind) {
    case ItemKind::kK:
    case ItemKind::kV:
      return "committed";
    case ItemKind::kKSpec:
    case ItemKind::kVSpec:
      return "speculative";
    case ItemKind::kConvState:
    case ItemKind::kSsmState:
      return "state";
    case ItemKind::kMtpK:
    case ItemKind::kMtpV:
      return "draft";
    case ItemKind::kHiddenOut:
      return "activations";
    case ItemKind::kSeqState:
      return "sequence state";
    case ItemKind::kLogits:
      break;
  }
  return "logits";
}

struct Job {
  const ExportCheckpoint* cpa = nullptr;
  const ExportCheckpoint* cpb = nullptr;
  const ExportItem* ia = nullptr;
  const ExportItem* ib = nullptr;
  std::size_t result = 0;  // index into DiffResult::items
};

// A worker's read buffers, allocated once and never zero-filled: a fresh (value-initialised)
// vector per item cost more in page faults and memset than the comparison itself.
struct Buffers {
  std::unique_ptr<std::byte[]> a, b;
  std::unique_ptr<float[]> sa, sb;
  std::size_t bytes = 0, scales = 0;
  void Reserve(std::size_t n_bytes, std::size_t n_scales) {
    if (n_bytes > bytes) {
      a.reset(new std::byte[n_bytes]);
      b.reset(new std::byte[n_bytes]);
      bytes = n_bytes;
    }
    if (n_scales > scales) {
      sa.reset(new float[n_scales]);
      sb.reset(new float[n_scales]);
      scales = n_scales;
    }
  }
};

// Streams one matched item pair in row blocks and fills its metrics. Returns the bytes read.
Status CompareItem(const ExportReader& ra, const ExportReader& rb, const Job& job,
                   std::int64_t block_bytes, Buffers& buf, ItemResult& r,
                   std::uint64_t* bytes_read) {
  const ExportItem& ia = *job.ia;
  const ExportItem& ib = *job.ib;
  const std::int64_t rows = ia.rows();
  const std::int64_t row_bytes = ia.row_elems() * static_cast<std::int64_t>(ia.elem_bytes());
  const std::int64_t scale_row = ia.has_scales ? ia.scale_row_elems : 0;
  if (row_bytes <= 0 || rows == 0) {
    r.rows = rows;
    return Status::Ok();
  }
  if (row_bytes > block_bytes)
    return Status::InvalidArgument("--mem-limit", "one row of '" + r.checkpoint + "/" + r.rel +
                                                      "' is " + std::to_string(row_bytes) +
                                                      " bytes, more than the per-read budget");
  const std::int64_t block_rows = std::max<std::int64_t>(1, block_bytes / row_bytes);
  buf.Reserve(static_cast<std::size_t>(std::min(rows, block_rows) * row_bytes),
              static_cast<std::size_t>(std::min(rows, block_rows) * scale_row));
  std::byte* ba = buf.a.get();
  std::byte* bb = buf.b.get();
  float* sa = buf.sa.get();
  float* sb = buf.sb.get();
  F32Accumulator acc;
  KlAccumulator kl;
  const bool logits = ia.kind == ItemKind::kLogits;
  const std::size_t elems = static_cast<std::size_t>(ia.row_elems());
  for (std::int64_t r0 = 0; r0 < rows; r0 += block_rows) {
    const std::int64_t n = std::min(block_rows, rows - r0);
    LOCKSTEP_RETURN_IF_ERROR(ra.ReadRows(*job.cpa, ia, r0, n, ba));
    LOCKSTEP_RETURN_IF_ERROR(rb.ReadRows(*job.cpb, ib, r0, n, bb));
    *bytes_read += static_cast<std::uint64_t>(2 * n * row_bytes);
    const std::size_t count = static_cast<std::size_t>(n) * elems;
    if (ia.dtype == DType::kF32) {
      const auto* fa = reinterpret_cast<const float*>(ba);
      const auto* fb = reinterpret_cast<const float*>(bb);
      acc.Add(fa, fb, count);
      if (logits) kl.AddRows(fa, fb, static_cast<std::size_t>(n), elems);
    } else if (ia.dtype == DType::kBF16) {
      acc.AddBf16(reinterpret_cast<const std::uint16_t*>(ba),
                  reinterpret_cast<const std::uint16_t*>(bb), count);
    } else if (ia.dtype == DType::kU8) {  // opaque bytes (seq_state): compared bitwise
      for (std::size_t e = 0; e < count; ++e)
        if (ba[e] != bb[e]) {
          if (r.first_code_diff < 0)
            r.first_code_diff =
                r0 * static_cast<std::int64_t>(elems) + static_cast<std::int64_t>(e);
          ++r.code_diff;
        }
    } else {  // int8 codes with per-row-per-head scales
      if (scale_row <= 0)
        return Status::InvalidArgument(r.checkpoint + "/" + r.rel, "int8 item without scales");
      LOCKSTEP_RETURN_IF_ERROR(ra.ReadScaleRows(*job.cpa, ia, r0, n, sa));
      LOCKSTEP_RETURN_IF_ERROR(rb.ReadScaleRows(*job.cpb, ib, r0, n, sb));
      *bytes_read += static_cast<std::uint64_t>(2 * n * scale_row * 4);
      const std::size_t heads = static_cast<std::size_t>(scale_row);
      acc.AddInt8(reinterpret_cast<const std::int8_t*>(ba), sa,
                  reinterpret_cast<const std::int8_t*>(bb), sb, static_cast<std::size_t>(n), heads,
                  elems / heads);
    }
  }
  r.rows = rows;
  r.elements = static_cast<std::uint64_t>(rows) * elems;
  r.stats = acc.Finish();
  if (ia.dtype != DType::kU8) {
    r.code_diff = r.stats.code_diff;
    r.first_code_diff = r.stats.first_code_diff;
  } else {  // opaque bytes: no NRMSE (0), the differing bytes are the measure (Judge)
    r.stats.n_diff = r.code_diff;
  }
  if (logits) {
    r.has_kl = true;
    r.kl = kl.Finish();
  }
  return Status::Ok();
}

void Judge(ItemResult& r) {
  if (r.verdict != Verdict::kPass) return;
  auto fail = [&](ItemFailure f, std::string why) {
    r.verdict = Verdict::kFail;
    r.failure = f;
    r.reason = std::move(why);
  };
  if (r.stats.non_finite || (r.has_kl && r.kl.non_finite)) {
    fail(ItemFailure::kNonFinite, "NaN or Inf in the data");
  } else if (r.dtype == dtype_name(DType::kU8) && r.code_diff > 0) {
    fail(ItemFailure::kNrmse, std::to_string(r.code_diff) + " bytes differ (compared bitwise)");
  } else if (!(r.stats.nrmse <= r.nrmse_max)) {
    fail(ItemFailure::kNrmse,
         "NRMSE " + std::to_string(r.stats.nrmse) + " > " + std::to_string(r.nrmse_max));
  } else if (r.has_kl && !(r.kl.kl_max <= r.kl_max)) {
    fail(ItemFailure::kKl, "KL " + std::to_string(r.kl.kl_max) + " > " + std::to_string(r.kl_max));
  }
}

ItemResult SkeletonFor(const ExportCheckpoint& cp, const ExportItem& it, const Thresholds& th) {
  ItemResult r;
  r.checkpoint = cp.name;
  r.window = cp.window;
  r.point = CheckpointPointName(cp.point);
  r.rel = it.rel;
  r.kind = ItemKindName(it.kind);
  r.stage = it.stage;
  r.layer = it.layer;
  r.dtype = dtype_name(it.dtype);
  r.label = LabelFor(it.kind);
  r.capacity_rows = it.capacity_rows;
  r.rows = it.rows();
  r.nrmse_max = th.NrmseFor(r.kind);
  r.kl_max = it.kind == ItemKind::kLogits ? th.kl_max : 0.0;
  return r;
}

std::string ShapeText(const std::vector<std::int64_t>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

}  // namespace

const std::vector<std::string>& ItemKinds() {
  static const std::vector<std::string> kKinds = [] {
    std::vector<std::string> names;
    for (ItemKind k : AllItemKinds()) names.emplace_back(ItemKindName(k));
    return names;
  }();
  return kKinds;
}

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kPass:
      return "pass";
    case Verdict::kFail:
      return "fail";
    case Verdict::kSkip:
      return "skip";
  }
  return "?";
}

std::vector<std::string> ConfigDifferences(const std::string& ja, const std::string& jb) {
  std::vector<std::string> out;
  nlohmann::json a, b;
  try {
    a = nlohmann::json::parse(ja);
    b = nlohmann::json::parse(jb);
  } catch (const nlohmann::json::exception&) {
    if (ja != jb) out.push_back("config: not comparable (invalid JSON on one side)");
    return out;
  }
  if (!a.is_object() || !b.is_object()) {
    if (a != b) out.push_back("config: not comparable (not a JSON object)");
    return out;
  }
  std::set<std::string> keys;
  for (auto it = a.begin(); it != a.end(); ++it) keys.insert(it.key());
  for (auto it = b.begin(); it != b.end(); ++it) keys.insert(it.key());
  for (const auto& k : keys) {
    if (k == "model" || k == "replay_path") continue;
    const bool in_a = a.contains(k), in_b = b.contains(k);
    if (in_a && in_b && a[k] == b[k]) continue;
    out.push_back(k + ": " + (in_a ? CompactJson(a[k]) : "(absent)") + " | " +
                  (in_b ? CompactJson(b[k]) : "(absent)"));
  }
  return out;
}

std::vector<std::string> IdentityDifferences(const ExportMeta& a, const ExportMeta& b) {
  auto short_hash = [](const std::string& h) { return h.empty() ? "(none)" : h.substr(0, 12); };
  std::vector<std::string> out;
  if (a.model_sha256 != b.model_sha256)
    out.push_back("the models differ: model_sha256 " + short_hash(a.model_sha256) + " | " +
                  short_hash(b.model_sha256));
  if (a.request_sha256 != b.request_sha256 || a.request_tokens != b.request_tokens)
    out.push_back("the requests differ: request_sha256 " + short_hash(a.request_sha256) + " | " +
                  short_hash(b.request_sha256) + " (" + std::to_string(a.request_tokens.size()) +
                  " | " + std::to_string(b.request_tokens.size()) + " prompt tokens)");
  return out;
}

double Thresholds::NrmseFor(const std::string& kind) const {
  auto it = nrmse_by_kind.find(kind);
  return it == nrmse_by_kind.end() ? nrmse_max : it->second;
}

Status Thresholds::SetKindOverride(std::string_view spec) {
  const auto eq = spec.find('=');
  const std::string kind(spec.substr(0, eq));
  if (eq == std::string_view::npos || !ParseItemKind(kind)) {
    std::string names;
    for (const std::string& k : ItemKinds()) names += (names.empty() ? "" : ", ") + k;
    return Status::InvalidArgument("--nrmse-kind '" + std::string(spec) + "'",
                                   "expected KIND=VALUE with KIND one of " + names);
  }
  const std::string value(spec.substr(eq + 1));
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (value.empty() || end != value.c_str() + value.size() || !(v >= 0.0))
    return Status::InvalidArgument("--nrmse-kind '" + std::string(spec) + "'",
                                   "'" + value + "' is not a number >= 0");
  nrmse_by_kind[kind] = v;
  return Status::Ok();
}

namespace {

// The options' errors, before anything is read.
Status CheckDiffOptions(const DiffOptions& opts) {
  if (!(opts.thresholds.nrmse_max >= 0.0) || !(opts.thresholds.kl_max >= 0.0))
    return Status::InvalidArgument("thresholds", "NRMSE and KL thresholds must be numbers >= 0");
  const std::int64_t min_mem = std::int64_t{16} << 20;
  if (opts.mem_limit_bytes < min_mem)
    return Status::InvalidArgument(
        "--mem-limit",
        "at least 16 MiB (" + std::to_string(opts.mem_limit_bytes) + " bytes given)");
  return Status::Ok();
}

// A selected checkpoint by name, on side A and/or B (null where that side has none).
struct CheckpointPair {
  std::string name;
  const ExportCheckpoint* a = nullptr;
  const ExportCheckpoint* b = nullptr;
  const ExportCheckpoint& any() const { return a ? *a : *b; }
};

// The checkpoints of either export in the selection, in (window, point) order.
std::vector<CheckpointPair> PairCheckpoints(const ExportMeta& ma, const ExportMeta& mb,
                                            const WindowSelection& windows,
                                            const std::set<CheckpointPoint>& points) {
  auto selected = [&](const ExportCheckpoint& cp) {
    return windows.Contains(cp.window) && points.count(cp.point) > 0;
  };
  std::map<std::string, CheckpointPair> by_name;
  for (const auto& cp : ma.checkpoints)
    if (selected(cp)) by_name[cp.name].a = &cp;
  for (const auto& cp : mb.checkpoints)
    if (selected(cp)) by_name[cp.name].b = &cp;
  std::vector<CheckpointPair> pairs;
  for (auto& [name, pair] : by_name) {
    pair.name = name;
    pairs.push_back(pair);
  }
  std::stable_sort(pairs.begin(), pairs.end(),
                   [](const CheckpointPair& x, const CheckpointPair& y) {
                     return std::make_pair(x.any().window, x.any().point) <
                            std::make_pair(y.any().window, y.any().point);
                   });
  return pairs;
}

// Why a whole checkpoint is not compared (empty: it is): the items are not the same state
// boundary.
std::string CheckpointSkipReason(const CheckpointPair& pair, const std::string& not_comparable) {
  const ExportCheckpoint* ca = pair.a;
  const ExportCheckpoint* cb = pair.b;
  std::string skip;
  if (!not_comparable.empty())
    skip = not_comparable;
  else if (!ca)
    skip = "checkpoint exported by B only";
  else if (!cb)
    skip = "checkpoint exported by A only";
  else if (ca->p != cb->p || ca->T != cb->T)
    skip = "different windows at this index (A p=" + std::to_string(ca->p) +
           " T=" + std::to_string(ca->T) + ", B p=" + std::to_string(cb->p) +
           " T=" + std::to_string(cb->T) + "): not the same state boundary";
  return skip;
}

// The item results of one checkpoint pair, in (stage, layer, kind) order, appended to d.items;
// the items both sides hold with the same kind, dtype and shape become jobs.
void PlanCheckpoint(const CheckpointPair& pair, const std::string& skip, const DiffOptions& opts,
                    DiffResult& d, std::vector<Job>& jobs) {
  const ExportCheckpoint* ca = pair.a;
  const ExportCheckpoint* cb = pair.b;
  const ExportCheckpoint& any = pair.any();
  std::map<std::string, const ExportItem*> ia, ib;
  if (ca)
    for (const auto& it : ca->items) ia[it.rel] = &it;
  if (cb)
    for (const auto& it : cb->items) ib[it.rel] = &it;
  std::vector<const ExportItem*> order;
  for (const auto& [rel, it] : ia) order.push_back(it);
  for (const auto& [rel, it] : ib)
    if (!ia.count(rel)) order.push_back(it);
  std::sort(order.begin(), order.end(), [](const ExportItem* x, const ExportItem* y) {
    auto key = [](const ExportItem* i) {
      return std::make_tuple(i->stage, i->layer < 0 ? 1 << 30 : i->layer, i->kind, i->rel);
    };
    return key(x) < key(y);
  });
  for (const ExportItem* it : order) {
    const ExportItem* xa = ia.count(it->rel) ? ia[it->rel] : nullptr;
    const ExportItem* xb = ib.count(it->rel) ? ib[it->rel] : nullptr;
    ItemResult r = SkeletonFor(any, *it, opts.thresholds);
    if (!skip.empty()) {
      r.verdict = Verdict::kSkip;
      r.failure = ItemFailure::kSkipped;
      r.reason = skip;
    } else if (!xa || !xb) {
      r.verdict = Verdict::kFail;
      r.failure = ItemFailure::kMissing;
      r.reason = std::string("missing in ") + (xa ? "B" : "A");
    } else if (xa->kind != xb->kind || xa->dtype != xb->dtype) {
      r.verdict = Verdict::kFail;
      r.failure = ItemFailure::kKindDtype;
      r.reason = std::string("kind/dtype differ: A ") + ItemKindName(xa->kind) + "/" +
                 std::string(dtype_name(xa->dtype)) + ", B " + ItemKindName(xb->kind) + "/" +
                 std::string(dtype_name(xb->dtype));
    } else if (xa->shape != xb->shape) {
      r.verdict = Verdict::kFail;
      r.failure = ItemFailure::kShape;
      r.reason = "shape differs: A " + ShapeText(xa->shape) + ", B " + ShapeText(xb->shape);
    } else if (xa->has_scales != xb->has_scales) {
      r.verdict = Verdict::kFail;
      r.failure = ItemFailure::kScales;
      r.reason = "int8 scales present on one side only";
    } else {
      jobs.push_back(Job{ca, cb, xa, xb, d.items.size()});
    }
    d.items.push_back(std::move(r));
  }
}

// Compares every job's item pair, in parallel over items: workers pull the next job; each holds
// two read buffers of at most block bytes (plus scales), so the whole diff stays under mem_limit.
Status RunJobs(const ExportReader& a, const ExportReader& b, const std::vector<Job>& jobs,
               const DiffOptions& opts, DiffResult& d) {
  int threads = opts.threads > 0
                    ? opts.threads
                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(threads),
                                                   std::max<std::size_t>(1, jobs.size())));
  const std::int64_t budget_per_worker =
      opts.mem_limit_bytes / 2 / threads;  // half for buffers, half headroom
  const std::int64_t block =
      std::max<std::int64_t>(std::int64_t{1} << 16, std::min(kBlockBytes, budget_per_worker / 2));
  std::atomic<std::size_t> next{0};
  std::vector<Status> errors(static_cast<std::size_t>(threads));
  std::vector<std::uint64_t> bytes(static_cast<std::size_t>(threads), 0);
  auto work = [&](int w) {
    Buffers buffers;
    for (std::size_t j = next.fetch_add(1); j < jobs.size(); j = next.fetch_add(1)) {
      ItemResult& r = d.items[jobs[j].result];
      Status s = CompareItem(a, b, jobs[j], block, buffers, r, &bytes[static_cast<std::size_t>(w)]);
      if (!s.ok()) {
        errors[static_cast<std::size_t>(w)] = s;
        next.store(jobs.size());
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < threads; ++w) pool.emplace_back(work, w);
  work(0);
  for (auto& t : pool) t.join();
  for (const auto& s : errors) LOCKSTEP_RETURN_IF_ERROR(s);
  for (auto x : bytes) d.bytes_read += x;

  return Status::Ok();
}

// Judges every item and counts the verdicts per checkpoint and in all.
void Tally(DiffResult& d) {
  std::size_t ic = 0;
  for (auto& cs : d.checkpoints) {
    for (; ic < d.items.size() && d.items[ic].checkpoint == cs.name; ++ic) {
      ItemResult& r = d.items[ic];
      Judge(r);
      switch (r.verdict) {
        case Verdict::kPass:
          ++cs.passed;
          break;
        case Verdict::kFail:
          ++cs.failed;
          break;
        case Verdict::kSkip:
          ++cs.skipped, ++cs.skip_reasons[r.reason];
          break;
      }
      if (r.verdict == Verdict::kFail && d.first_failure < 0)
        d.first_failure = static_cast<std::int64_t>(ic);
    }
    cs.compared = cs.passed + cs.failed;
    d.compared += cs.compared;
    d.passed += cs.passed;
    d.failed += cs.failed;
    d.skipped += cs.skipped;
  }
}

}  // namespace

namespace {

// "0-2", "1,5", "none": the windows an export holds checkpoints of, compactly.
std::string WindowsText(const ExportMeta& m) {
  std::set<int> ws;
  for (const auto& cp : m.checkpoints) ws.insert(cp.window);
  if (ws.empty()) return "none";
  std::string out;
  for (auto it = ws.begin(); it != ws.end();) {
    const int lo = *it;
    int hi = lo;
    for (++it; it != ws.end() && *it == hi + 1; ++it) hi = *it;
    out +=
        (out.empty() ? "" : ",") + std::to_string(lo) + (hi > lo ? "-" + std::to_string(hi) : "");
  }
  return out;
}

}  // namespace

std::string VacuousReason(const DiffResult& d, const ExportMeta& ma, const ExportMeta& mb,
                          const DiffOptions& opts) {
  if (d.model_differs || d.request_differs) return "";  // failed, and says why on its own
  const std::string held =
      " (A exported windows " + WindowsText(ma) + ", B windows " + WindowsText(mb) + ")";
  if (d.compared == 0) {
    const std::string none = "nothing compared: ";
    if (ma.checkpoints.empty() || mb.checkpoints.empty())
      return none +
             (ma.checkpoints.empty() && mb.checkpoints.empty()
                  ? std::string("neither export holds a")
              : ma.checkpoints.empty() ? std::string("export A holds no")
                                       : std::string("export B holds no")) +
             " checkpoint (an empty export: --max-new 0, --export-windows none, or no window "
             "ran)";
    if (d.checkpoints.empty())
      return none + "no exported checkpoint is in --windows " + opts.windows + " --points " +
             opts.points + held;
    bool shared = false;
    for (const auto& cs : d.checkpoints)
      for (const auto& [why, n] : cs.skip_reasons)
        shared = shared || why.find("exported by") == std::string::npos;
    if (!shared && d.skipped > 0)
      return none + "the exports share no window in the selection" + held;
    if (d.skipped > 0) {
      std::map<std::string, int> reasons;
      for (const auto& cs : d.checkpoints)
        for (const auto& [why, n] : cs.skip_reasons) reasons[why] += n;
      std::string list;
      for (const auto& [why, n] : reasons)
        list += (list.empty() ? "" : "; ") + std::to_string(n) + ": " + why;
      return none + "every item was skipped (" + list + ")";
    }
    return none + "the selected checkpoints hold no items";
  }
  if (opts.max_skipped >= 0 && d.skipped > opts.max_skipped)
    return std::to_string(d.skipped) + " items skipped, more than --max-skipped " +
           std::to_string(opts.max_skipped) + " (" + std::to_string(d.compared) + " compared)";
  return "";
}

std::vector<std::string> FingerprintDifferences(const ExportMeta& a, const ExportMeta& b,
                                                bool configs) {
  std::vector<std::string> out = IdentityDifferences(a, b);
  if (configs)
    for (const std::string& c : ConfigDifferences(a.config_json, b.config_json))
      out.push_back("config: " + c);
  return out;
}

Result<DiffResult> DiffExports(const ExportReader& a, const ExportReader& b,
                               const DiffOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  LOCKSTEP_ASSIGN_OR_RETURN(WindowSelection windows,
                            WindowSelection::Parse(opts.windows, "--windows"));
  LOCKSTEP_ASSIGN_OR_RETURN(auto points, ParseExportPoints(opts.points, "--points"));
  LOCKSTEP_RETURN_IF_ERROR(CheckDiffOptions(opts));

  if (opts.max_skipped < -1)
    return Status::InvalidArgument("--max-skipped", "a count >= 0, or -1 for any number");
  const ExportMeta& ma = a.meta();
  const ExportMeta& mb = b.meta();
  if (!opts.allow_self && !ma.run_id.empty() && ma.run_id == mb.run_id)
    return Status::InvalidArgument(
        "diff", "both exports are of the same run (run_id " + ma.run_id +
                    "): comparing a run with itself proves nothing (--allow-self to do it anyway)");
  DiffResult d;
  d.thresholds = opts.thresholds;
  d.config_differences = ConfigDifferences(ma.config_json, mb.config_json);
  d.model_differs = ma.model_sha256 != mb.model_sha256;
  d.request_differs =
      ma.request_sha256 != mb.request_sha256 || ma.request_tokens != mb.request_tokens;
  d.output_differs = ma.output_tokens != mb.output_tokens || ma.stop_reason != mb.stop_reason;
  std::string not_comparable;
  if (d.model_differs)
    not_comparable = "the models differ (model_sha256)";
  else if (d.request_differs)
    not_comparable = "the requests differ (request tokens)";

  std::vector<Job> jobs;
  for (const CheckpointPair& pair : PairCheckpoints(ma, mb, windows, points)) {
    const ExportCheckpoint& any = pair.any();
    CheckpointSummary cs;
    cs.name = pair.name;
    cs.window = any.window;
    cs.point = CheckpointPointName(any.point);
    cs.p = any.p;
    cs.T = any.T;
    PlanCheckpoint(pair, CheckpointSkipReason(pair, not_comparable), opts, d, jobs);
    d.checkpoints.push_back(std::move(cs));
  }
  LOCKSTEP_RETURN_IF_ERROR(RunJobs(a, b, jobs, opts, d));
  Tally(d);
  d.vacuous = VacuousReason(d, ma, mb, opts);
  d.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return d;
}

}  // namespace lockstep
