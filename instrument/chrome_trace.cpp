#include "lockstep/instrument/chrome_trace.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "lockstep/engine/atomic_file.h"

namespace lockstep {
namespace {

using Json = nlohmann::ordered_json;  // insertion order: "traceEvents" first, args as written

constexpr int kPid = 1;
constexpr int kDriverTid = 0;

// Records read from a file (--replay-path, hand-edited JSONL) may hold any int64, so interval
// arithmetic saturates instead of overflowing (UB).
std::int64_t SatAdd(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return b > 0 ? std::numeric_limits<std::int64_t>::max()
               : std::numeric_limits<std::int64_t>::min();
}
std::int64_t SatSub(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (!__builtin_sub_overflow(a, b, &r)) return r;
  return b < 0 ? std::numeric_limits<std::int64_t>::max()
               : std::numeric_limits<std::int64_t>::min();
}
std::int64_t NonNeg(std::int64_t v) { return v > 0 ? v : 0; }

// ns -> us as one correctly rounded division of an exact integer, so a test can compare the
// result with a hand-computed literal exactly. (Counts beyond 2^53 ns = 104 days lose ns
// precision in the conversion, nothing more.)
double Us(std::int64_t ns) { return static_cast<double>(ns) / 1000.0; }

struct Span {
  std::int64_t b = 0;  // ns, absolute
  std::int64_t e = 0;  // ns, absolute, >= b
  std::int64_t Len() const { return SatSub(e, b); }
};

// The closed range a window's spans must stay in: [begin_ns, min(end_ns, next begin_ns)].
struct Bounds {
  std::int64_t lo = 0;
  std::int64_t hi = 0;  // >= lo
  std::int64_t Clamp(std::int64_t x) const { return std::clamp(x, lo, hi); }
};

// The path fields every span carries (docs/engine.md, "Window records").
Json PathArgs(const WindowRecord& w) {
  // Every scalar field but the timings (WindowFields order): idx, the path, source, first_call.
  Json a = Json::object();
  for (const WindowField& f : WindowFields()) {
    if (f.kind == WindowFieldKind::kInt) a[f.name] = static_cast<int>(f.get(w));
    if (f.kind == WindowFieldKind::kBool) a[f.name] = f.get(w) != 0;
    if (f.kind == WindowFieldKind::kSource) a[f.name] = DraftSourceName(w.source);
  }
  return a;
}

class TraceBuilder {
 public:
  TraceBuilder(int n_stages, std::int64_t t0) : n_stages_(n_stages), t0_(t0) {}

  // The "steps" track after the stage tracks (only when there are steps).
  int steps_tid() const { return 1 + n_stages_; }
  void StepsMetadata() {
    events_.push_back(Meta("thread_name", steps_tid(), {{"name", "steps"}}));
    events_.push_back(Meta("thread_sort_index", steps_tid(), {{"sort_index", steps_tid()}}));
  }
  void Step(const StepRecord& s) {
    Json args = {{"step", s.step},
                 {"rows", s.rows},
                 {"seqs", s.seqs},
                 {"verify_rows", s.verify_rows},
                 {"prefill_rows", s.prefill_rows},
                 {"queue_depth", s.queue_depth},
                 {"live", s.live},
                 {"weight_bytes", s.weight_bytes},
                 {"flops", s.flops},
                 {"slots", s.slots}};
    const Span span{s.begin_ns, std::max(s.begin_ns, s.end_ns)};
    Emit("step " + std::to_string(s.step), "step", steps_tid(), span, s.end_ns < s.begin_ns,
         std::move(args));
  }

  void Metadata(const std::string& process_name) {
    events_.push_back(Meta("process_name", kDriverTid, {{"name", process_name}}));
    events_.push_back(Meta("thread_name", kDriverTid, {{"name", "driver"}}));
    events_.push_back(Meta("thread_sort_index", kDriverTid, {{"sort_index", kDriverTid}}));
    for (int is = 0; is < n_stages_; ++is) {
      events_.push_back(Meta("thread_name", 1 + is, {{"name", "stage " + std::to_string(is)}}));
      events_.push_back(Meta("thread_sort_index", 1 + is, {{"sort_index", 1 + is}}));
    }
  }

  void Window(const WindowRecord& w, const Bounds& bounds) {
    const Json path = PathArgs(w);
    // The window span: raw recorded values too, to cross-reference the JSONL.
    Json wargs = path;
    wargs["begin_ns"] = w.begin_ns;
    wargs["end_ns"] = w.end_ns;
    wargs["draft_ns"] = w.draft_ns;
    wargs["verify_ns"] = w.verify_ns;
    wargs["commit_ns"] = w.commit_ns;
    wargs["wait_ns"] = w.wait_ns;
    wargs["compute_ns"] = w.compute_ns;
    wargs["export_ns"] = w.export_ns >= 0 ? Json(w.export_ns) : Json(nullptr);
    const Span window{bounds.lo, bounds.hi};
    Emit("window " + std::to_string(w.idx), "window", kDriverTid, window,
         window.Len() != SatSub(w.end_ns, w.begin_ns), std::move(wargs));

    // Driver spans, in order; each starts no earlier than the previous one ends.
    const std::int64_t draft_ns = NonNeg(w.draft_ns);
    const std::int64_t verify_ns = NonNeg(w.verify_ns);
    const std::int64_t commit_ns = NonNeg(w.commit_ns);
    const Span draft{bounds.lo, bounds.Clamp(SatAdd(w.begin_ns, draft_ns))};
    Emit("draft", "driver", kDriverTid, draft, draft.Len() != w.draft_ns, path);

    // Verify start (header: the later of two lower bounds of the true start).
    const std::int64_t vb_late =
        SatSub(SatSub(SatSub(w.end_ns, commit_ns), verify_ns), NonNeg(w.export_ns));
    const std::int64_t vb_early = SatAdd(w.begin_ns, draft_ns);
    const std::int64_t vb = bounds.Clamp(std::max(vb_late, vb_early));  // >= draft.e
    const Span verify{vb, bounds.Clamp(SatAdd(vb, verify_ns))};
    verify_begin_[w.idx] = vb;
    Emit("verify", "driver", kDriverTid, verify, verify.Len() != w.verify_ns, path);

    std::int64_t cursor = verify.e;
    if (w.export_ns >= 0) {
      const Span exp{cursor, bounds.Clamp(SatAdd(cursor, w.export_ns))};
      Emit("export", "driver", kDriverTid, exp, exp.Len() != w.export_ns, path);
      cursor = exp.e;
    }
    const Span commit{std::max(bounds.Clamp(SatSub(w.end_ns, commit_ns)), cursor), bounds.hi};
    Emit("commit", "driver", kDriverTid, commit, commit.Len() != w.commit_ns, path);

    // Stage tracks: wait then compute, both measured from the verify start.
    const int n_drawn = std::min(n_stages_, static_cast<int>(std::min<std::size_t>(
                                                w.stages.size(), std::numeric_limits<int>::max())));
    if (static_cast<std::size_t>(n_stages_) != w.stages.size()) ++stage_count_mismatch_windows_;
    for (int is = 0; is < n_drawn; ++is) {
      const StageTiming& st = w.stages[static_cast<std::size_t>(is)];
      const std::int64_t wait_ns = NonNeg(st.wait_ns);
      const std::int64_t compute_ns = NonNeg(st.compute_ns);
      Json sargs = path;
      sargs["stage"] = is;
      const Span wait{vb, bounds.Clamp(SatAdd(vb, wait_ns))};
      Emit("wait", "stage", 1 + is, wait, wait.Len() != st.wait_ns, sargs);
      const Span compute{wait.e, bounds.Clamp(SatAdd(wait.e, compute_ns))};
      sargs["cpu_ms"] = static_cast<double>(st.cpu_ns) / 1e6;
      // Device backends: the device-event split of the same window (absent on the CPU).
      if (st.dev_compute_ns >= 0) {
        sargs["dev_compute_ms"] = static_cast<double>(st.dev_compute_ns) / 1e6;
        if (st.dev_wait_ns >= 0) sargs["dev_wait_ms"] = static_cast<double>(st.dev_wait_ns) / 1e6;
        if (st.dev_copy_ns >= 0) sargs["dev_copy_ms"] = static_cast<double>(st.dev_copy_ns) / 1e6;
        if (st.init_ns >= 0) sargs["init_ms"] = static_cast<double>(st.init_ns) / 1e6;
        if (st.graph != GraphUse::kNone) sargs["graph"] = GraphUseName(st.graph);
      }
      Emit("compute", "stage", 1 + is, compute, compute.Len() != st.compute_ns, std::move(sargs));
    }
  }

  // One injection firing (instant event, thread scope) at its window's verify begin on its stage's
  // track; a window the records do not hold puts it at the trace's start.
  void Injection(const Json& record, const Json& firing) {
    const int window = firing.value("window", -1), stage = firing.value("stage", -1);
    auto it = verify_begin_.find(window);
    Json e;
    e["name"] = "inject " + record.value("kind", std::string("?"));
    e["cat"] = "inject";
    e["ph"] = "i";
    e["s"] = "t";
    e["pid"] = kPid;
    e["tid"] = stage >= 0 && stage < n_stages_ ? 1 + stage : kDriverTid;
    e["ts"] = Us(SatSub(it == verify_begin_.end() ? t0_ : it->second, t0_));
    Json args = firing;
    args["text"] = record.value("text", std::string());
    e["args"] = std::move(args);
    events_.push_back(std::move(e));
  }

  std::size_t clamped_spans() const { return clamped_spans_; }
  std::size_t stage_count_mismatch_windows() const { return stage_count_mismatch_windows_; }
  const std::vector<Json>& events() const { return events_; }

 private:
  static Json Meta(const char* name, int tid, Json args) {
    Json e;
    e["name"] = name;
    e["ph"] = "M";
    e["pid"] = kPid;
    e["tid"] = tid;
    e["args"] = std::move(args);
    return e;
  }

  void Emit(const std::string& name, const char* cat, int tid, const Span& s, bool clamped,
            Json args) {
    Json e;
    e["name"] = name;
    e["cat"] = cat;
    e["ph"] = "X";
    e["pid"] = kPid;
    e["tid"] = tid;
    e["ts"] = Us(SatSub(s.b, t0_));
    e["dur"] = Us(s.Len());  // s.e >= s.b by construction; the exact ns difference
    if (clamped) {
      args["clamped"] = true;
      ++clamped_spans_;
    }
    e["args"] = std::move(args);
    events_.push_back(std::move(e));
  }

  int n_stages_;
  std::int64_t t0_;
  std::vector<Json> events_;
  std::size_t clamped_spans_ = 0;
  std::size_t stage_count_mismatch_windows_ = 0;
  std::map<int, std::int64_t> verify_begin_;  // window idx -> drawn verify start (ns)
};

// Builds the whole text; may throw (allocation). Callers catch.
std::string BuildTrace(std::span<const WindowRecord> windows, int n_stages_in,
                       const ChromeTraceOptions& opts) {
  const int n_stages = std::max(n_stages_in, 0);

  // Time order, ties broken by input order, so "the next window" is well defined for clamping.
  std::vector<std::size_t> order(windows.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return windows[a].begin_ns < windows[b].begin_ns;
  });
  std::int64_t t0 = windows.empty() ? 0 : windows[order.front()].begin_ns;
  if (!opts.steps.empty()) {  // a request's first steps (its prefill) come before any window
    const std::int64_t first =
        std::min_element(opts.steps.begin(), opts.steps.end(), [](const auto& a, const auto& b) {
          return a.begin_ns < b.begin_ns;
        })->begin_ns;
    t0 = windows.empty() ? first : std::min(t0, first);
  }
  const bool any = !windows.empty() || !opts.steps.empty();

  TraceBuilder tb(n_stages, t0);
  const std::string process_name =
      opts.arm.empty() ? opts.process_name : opts.process_name + " (" + opts.arm + ")";
  tb.Metadata(process_name);
  if (!opts.steps.empty()) tb.StepsMetadata();

  std::size_t export_unknown = 0;
  for (std::size_t k = 0; k < order.size(); ++k) {
    const WindowRecord& w = windows[order[k]];
    if (w.export_ns < 0) ++export_unknown;
    std::int64_t hi = w.end_ns;
    if (k + 1 < order.size()) hi = std::min(hi, windows[order[k + 1]].begin_ns);
    tb.Window(w, Bounds{w.begin_ns, std::max(hi, w.begin_ns)});
  }

  for (const StepRecord& s : opts.steps) tb.Step(s);

  Json injections = Json::array();
  for (const std::string& text : opts.injections) {
    Json rec = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (rec.is_discarded()) continue;  // not ours to repair: the engine writes valid JSON
    for (const Json& f : rec.value("firings", Json::array())) tb.Injection(rec, f);
    injections.push_back(std::move(rec));
  }

  Json other;
  other["schema"] = "lockstep.chrome_trace";
  other["schema_version"] = 1;
  other["generator"] = "lockstep ChromeTraceJson (instrument/chrome_trace.cpp)";
  other["clock"] = "CLOCK_MONOTONIC";
  other["time_origin_ns"] = any ? Json(t0) : Json(nullptr);
  other["n_windows"] = windows.size();
  other["n_stages"] = n_stages;
  if (!opts.arm.empty()) other["arm"] = opts.arm;
  other["export"] = export_unknown == windows.size() ? "unknown"
                    : export_unknown == 0            ? "measured"
                                                     : "partly unknown";
  other["export_unknown_windows"] = export_unknown;
  other["verify_begin"] =
      "end_ns - commit_ns - verify_ns - max(export_ns, 0) if >= begin_ns + draft_ns, else "
      "begin_ns + draft_ns; measured export drawn as one span after verify";
  other["clamped_spans"] = tb.clamped_spans();
  other["stage_count_mismatch_windows"] = tb.stage_count_mismatch_windows();
  if (!injections.empty()) other["injections"] = std::move(injections);
  if (!opts.steps.empty()) other["n_steps"] = opts.steps.size();

  // One event per line: the file stays valid JSON and diffs line by line. Invalid UTF-8 in user
  // strings (process name, arm) is replaced rather than thrown on.
  constexpr auto kReplace = nlohmann::json::error_handler_t::replace;
  std::string out = "{\"traceEvents\": [\n";
  const std::vector<Json>& events = tb.events();
  for (std::size_t i = 0; i < events.size(); ++i) {
    out += events[i].dump(-1, ' ', false, kReplace);
    out += i + 1 < events.size() ? ",\n" : "\n";
  }
  out += "],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": ";
  out += other.dump(-1, ' ', false, kReplace);
  out += "}\n";
  return out;
}

Result<std::string> TryBuildTrace(std::span<const WindowRecord> windows, int n_stages,
                                  const ChromeTraceOptions& opts) {
  try {
    return BuildTrace(windows, n_stages, opts);
  } catch (const std::exception& e) {
    return Status::Runtime("building the Chrome trace JSON", e.what());
  }
}

}  // namespace

std::string ChromeTraceJson(std::span<const WindowRecord> windows, int n_stages,
                            const ChromeTraceOptions& opts) {
  Result<std::string> r = TryBuildTrace(windows, n_stages, opts);
  return r.ok() ? std::move(r).value() : std::string();
}

Status WriteChromeTrace(const std::string& path, std::span<const WindowRecord> windows,
                        int n_stages, const ChromeTraceOptions& opts) {
  LOCKSTEP_ASSIGN_OR_RETURN(const std::string text, TryBuildTrace(windows, n_stages, opts));
  return WriteFileAtomic(path, std::string_view(text));
}

}  // namespace lockstep
