#include "lockstep/compare/align.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include "lockstep/engine/median.h"

namespace lockstep {
namespace {

// The alignable path fields: WindowRecord's integer and bool path fields (window.h's table), read
// as integers (bools as 0/1) so the walk compares without formatting text per window;
// FieldValue() formats only for reports.
const std::vector<const WindowField*>& PathFields() {
  static const std::vector<const WindowField*> kFields = [] {
    std::vector<const WindowField*> v;
    for (const WindowField& f : WindowFields())
      if (f.role == WindowFieldRole::kPath &&
          (f.kind == WindowFieldKind::kInt || f.kind == WindowFieldKind::kBool))
        v.push_back(&f);
    return v;
  }();
  return kFields;
}

const WindowField* FindPathField(std::string_view name) {
  for (const WindowField* f : PathFields())
    if (name == f->name) return f;
  return nullptr;
}

struct TimingField {
  const char* name;
  std::int64_t (*ns)(const WindowRecord&);  // the window's interval; < 0 = unknown
};

template <std::int64_t WindowRecord::*F>
std::int64_t RecordNs(const WindowRecord& w) {
  return w.*F;
}

// A per-stage device interval summed over the window's stages; unknown (-1) when the window has no
// stages, any stage did not measure it (the cpu backend records -1 for all of them) or the sum
// overflows.
template <std::int64_t StageTiming::*F>
std::int64_t StageSum(const WindowRecord& w) {
  if (w.stages.empty()) return -1;
  std::int64_t sum = 0;
  for (const StageTiming& st : w.stages) {
    // A sum past int64 can only come from a damaged trace: unknown, not a wrapped duration.
    if (st.*F < 0 || __builtin_add_overflow(sum, st.*F, &sum)) return -1;
  }
  return sum;
}

// Same order as TimingIntervals(): AlignResult::timing starts with these, indexed alike.
const TimingField kTimingFields[] = {
    {"verify", &RecordNs<&WindowRecord::verify_ns>},
    {"wait", &RecordNs<&WindowRecord::wait_ns>},
    {"compute", &RecordNs<&WindowRecord::compute_ns>},
    {"draft", &RecordNs<&WindowRecord::draft_ns>},
    {"commit", &RecordNs<&WindowRecord::commit_ns>},
    {"export", &RecordNs<&WindowRecord::export_ns>},
};

// Same order as DeviceTimingIntervals(); appended to AlignResult::timing only when a trace has
// them.
const TimingField kDeviceTimingFields[] = {
    {"dev_wait", &StageSum<&StageTiming::dev_wait_ns>},
    {"dev_compute", &StageSum<&StageTiming::dev_compute_ns>},
    {"dev_copy", &StageSum<&StageTiming::dev_copy_ns>},
    {"init", &StageSum<&StageTiming::init_ns>},
};

// Whether any window of either trace measured any device interval: a device backend ran one side.
bool AnyDeviceTiming(const std::vector<WindowRecord>& a, const std::vector<WindowRecord>& b) {
  for (const auto* side : {&a, &b})
    for (const WindowRecord& w : *side)
      for (const StageTiming& st : w.stages)
        if (st.dev_wait_ns >= 0 || st.dev_compute_ns >= 0 || st.dev_copy_ns >= 0 || st.init_ns >= 0)
          return true;
  return false;
}

constexpr double kNsPerMs = 1e6;

double NsToMs(std::int64_t ns) { return static_cast<double>(ns) / kNsPerMs; }

// A negative interval is not a measurement: -1 is the documented "unknown" (export_ns without an
// observer) and any other negative value can only come from a damaged trace, so it is treated the
// same way rather than summed as a real duration.
bool IsKnown(std::int64_t ns) { return ns >= 0; }

std::string JoinNames(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

IntervalDiff DiffInterval(const TimingField& tf, const std::vector<WindowRecord>& a,
                          const std::vector<WindowRecord>& b, std::size_t matched) {
  IntervalDiff d;
  d.name = tf.name;
  for (std::size_t i = 0; i < matched; ++i) {
    if (!IsKnown(tf.ns(a[i])) || !IsKnown(tf.ns(b[i]))) {
      // Unknown is never zero (STYLE 17): a partial sum or median would look like a measurement.
      d.known = false;
      return d;
    }
  }
  d.delta_ms.reserve(matched);
  std::vector<double> abs_delta;
  abs_delta.reserve(matched);
  for (std::size_t i = 0; i < matched; ++i) {
    const std::int64_t ns_a = tf.ns(a[i]), ns_b = tf.ns(b[i]);
    // Both are non-negative here, so the int64 difference cannot overflow and stays exact.
    const double delta = NsToMs(ns_b - ns_a);
    d.delta_ms.push_back(delta);
    abs_delta.push_back(std::fabs(delta));
    if (d.max_at < 0 ||
        std::fabs(delta) > d.max_abs_delta_ms) {  // strict: the lowest index wins ties
      d.max_abs_delta_ms = std::fabs(delta);
      d.max_at = static_cast<int>(i);
    }
    d.sum_a_ms += NsToMs(ns_a);
    d.sum_b_ms += NsToMs(ns_b);
  }
  d.median_delta_ms = Median(d.delta_ms);
  d.median_abs_delta_ms = Median(std::move(abs_delta));
  if (d.sum_a_ms != 0.0) {
    d.rel_diff = (d.sum_b_ms - d.sum_a_ms) / d.sum_a_ms;
  } else if (d.sum_b_ms != 0.0) {
    d.rel_diff = std::numeric_limits<double>::infinity();
  }
  return d;
}

// Median verify time of one side over its whole trace; windows with an unknown verify time are
// left out rather than counted as zero.
double SideMedianVerifyMs(const std::vector<WindowRecord>& w) {
  std::vector<double> v;
  v.reserve(w.size());
  for (const WindowRecord& r : w)
    if (IsKnown(r.verify_ns)) v.push_back(NsToMs(r.verify_ns));
  return Median(std::move(v));
}

// One side's windows far above its own median, largest first. Per side on purpose: after a
// divergence an index on A and the same index on B are different work (seed: B's window 45).
std::vector<NotableWindow> SideNotable(const std::vector<WindowRecord>& w, double median_ms,
                                       const AlignOptions& opts, bool diverged, int div_idx) {
  std::vector<NotableWindow> out;
  if (opts.max_notable <= 0) return out;
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (!IsKnown(w[i].verify_ns)) continue;
    const double ms = NsToMs(w[i].verify_ns);
    if (!(ms >= opts.notable_ratio * median_ms) || !(ms >= opts.notable_min_ms)) continue;
    NotableWindow n;
    // The position in the side's own trace: the same index div_idx and rest_* use
    // (ReadWindowRecords guarantees it equals the record's idx).
    n.idx = static_cast<int>(i);
    n.p = w[i].p;
    n.T = w[i].T;
    n.verify_ms = ms;
    n.ratio_to_median = median_ms > 0.0 ? ms / median_ms : std::numeric_limits<double>::infinity();
    n.after_divergence = diverged && n.idx >= div_idx;
    out.push_back(n);
  }
  std::stable_sort(out.begin(), out.end(), [](const NotableWindow& x, const NotableWindow& y) {
    if (x.verify_ms != y.verify_ms) return x.verify_ms > y.verify_ms;
    return x.idx < y.idx;
  });
  if (out.size() > static_cast<std::size_t>(opts.max_notable))
    out.resize(static_cast<std::size_t>(opts.max_notable));
  return out;
}

}  // namespace

const std::vector<std::string>& AlignableFields() {
  static const std::vector<std::string> kFields = [] {
    std::vector<std::string> v;
    for (const WindowField* f : PathFields()) v.emplace_back(f->name);
    return v;
  }();
  return kFields;
}

const std::vector<std::string>& DefaultAlignFields() {
  // `accepted` is alignable but not a default: it is an outcome of the verify, not the path that
  // was chosen before it, and the seed issue matched on the six fields below.
  static const std::vector<std::string> kFields = {"p",      "T",        "T_mtp",
                                                   "merged", "from_sfx", "chain_n"};
  return kFields;
}

Result<std::vector<std::string>> ParseAlignFields(std::string_view csv) {
  const std::string valid = "valid: " + JoinNames(AlignableFields());
  if (Trim(csv).empty())
    return Status::InvalidArgument("align fields", "empty list (" + valid + ")");
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = csv.find(',', start);
    const std::string_view tok = Trim(csv.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (tok.empty())
      return Status::InvalidArgument("align fields '" + std::string(csv) + "'",
                                     "empty field name (" + valid + ")");
    if (FindPathField(tok) == nullptr)
      return Status::InvalidArgument("align field '" + std::string(tok) + "'",
                                     "unknown (" + valid + ")");
    if (std::find(out.begin(), out.end(), tok) != out.end())
      return Status::InvalidArgument("align field '" + std::string(tok) + "'", "listed twice");
    out.emplace_back(tok);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string FieldValue(const WindowRecord& w, const std::string& field) {
  const WindowField* f = FindPathField(field);
  if (f == nullptr)
    return "";  // not a path field: nothing to show (ParseAlignFields rejects it earlier)
  const std::int64_t v = f->get(w);
  if (f->kind == WindowFieldKind::kBool) return v != 0 ? "true" : "false";
  return std::to_string(v);
}

std::string DescribeWindow(const WindowRecord& w, const std::vector<std::string>& fields) {
  std::string out;
  for (const std::string& f : fields) {
    if (!out.empty()) out += ", ";
    out += f + "=" + FieldValue(w, f);
  }
  return out;
}

namespace {
template <std::size_t N>
std::vector<std::string> NamesOf(const TimingField (&fields)[N]) {
  std::vector<std::string> v;
  for (const TimingField& t : fields) v.emplace_back(t.name);
  return v;
}
}  // namespace

const std::vector<std::string>& TimingIntervals() {
  static const std::vector<std::string> kNames = NamesOf(kTimingFields);
  return kNames;
}

const std::vector<std::string>& DeviceTimingIntervals() {
  static const std::vector<std::string> kNames = NamesOf(kDeviceTimingFields);
  return kNames;
}

AlignResult AlignWindows(const std::vector<WindowRecord>& a, const std::vector<WindowRecord>& b,
                         const AlignOptions& opts) {
  AlignResult r;
  r.fields = opts.fields;
  r.n_a = static_cast<int>(a.size());
  r.n_b = static_cast<int>(b.size());

  // Resolve names once. A name that is not a path field (callers should have used
  // ParseAlignFields) has no value on either side, so it can never cause a divergence.
  std::vector<const WindowField*> fields;
  for (const std::string& name : opts.fields)
    if (const WindowField* f = FindPathField(name)) fields.push_back(f);

  const std::size_t common = std::min(a.size(), b.size());
  std::size_t matched = 0;
  for (; matched < common; ++matched) {
    bool same = true;
    for (const WindowField* f : fields) same = same && f->get(a[matched]) == f->get(b[matched]);
    if (!same) break;
  }
  r.matched = static_cast<int>(matched);
  r.diverged = matched < a.size() || matched < b.size();
  if (r.diverged) {
    r.div_idx = r.matched;
    if (matched < a.size()) r.div_a = a[matched];
    if (matched < b.size()) r.div_b = b[matched];
    if (r.div_a && r.div_b) {
      for (const WindowField* f : fields)
        if (f->get(*r.div_a) != f->get(*r.div_b)) r.differing_fields.emplace_back(f->name);
    }
    // Windows from the divergence on are listed per side, never paired by index: after a path
    // difference the same index no longer means the same work.
    r.rest_a.assign(a.begin() + static_cast<std::ptrdiff_t>(matched), a.end());
    r.rest_b.assign(b.begin() + static_cast<std::ptrdiff_t>(matched), b.end());
  }

  // Timing only over [0, matched): past the divergence a per-index delta compares different work.
  for (const TimingField& tf : kTimingFields) r.timing.push_back(DiffInterval(tf, a, b, matched));
  if (AnyDeviceTiming(a, b))
    for (const TimingField& tf : kDeviceTimingFields)
      r.timing.push_back(DiffInterval(tf, a, b, matched));

  if (!r.diverged) {
    bool drafts = false;
    for (std::size_t i = 0; i < matched; ++i)
      drafts = drafts || a[i].T != 1 || a[i].T_mtp != 0 || a[i].merged || a[i].from_sfx;
    if (matched == 0)
      r.path_unchecked = "neither trace holds a verify window: there is no path to compare";
    else if (!drafts)
      r.path_unchecked = "every one of the " + std::to_string(matched) +
                         " windows has T = 1 and no draft (e.g. --spec 0): the path fields "
                         "cannot differ, only the window count was compared";
  }

  r.median_verify_ms_a = SideMedianVerifyMs(a);
  r.median_verify_ms_b = SideMedianVerifyMs(b);
  r.notable_a = SideNotable(a, r.median_verify_ms_a, opts, r.diverged, r.div_idx);
  r.notable_b = SideNotable(b, r.median_verify_ms_b, opts, r.diverged, r.div_idx);
  return r;
}

bool AlignResult::comparable() const {
  for (const auto& f : fingerprint_differences)
    if (f.rfind("config: ", 0) != 0) return false;
  return true;
}

}  // namespace lockstep
