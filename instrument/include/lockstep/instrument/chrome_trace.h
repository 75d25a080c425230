// Chrome trace export: window records as a timeline that opens in Perfetto (ui.perfetto.dev) and
// chrome://tracing.
//
// Output is the trace-event JSON *object* format:
//
//   {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}
//
// with one process (pid 1) and these tracks (threads), named by metadata events
// (ph "M", "process_name" / "thread_name" / "thread_sort_index"):
//
//   tid 0      "driver"   per window: "window <idx>" enclosing everything the window did, and
//                         inside it "draft", "verify", "export" (only when measured) and "commit"
//   tid 1 + s  "stage s"  per window: "wait" (verify start until stage s starts computing) and
//                         "compute" (stage s's forward), for s in [0, n_stages)
//   tid 1 + n_stages  "steps"  only when ChromeTraceOptions::steps is not empty: per engine step
//                         the request had rows in, "step <n>" over [begin_ns, end_ns] (the
//                         step's forward), args step, rows, seqs, verify_rows, prefill_rows,
//                         queue_depth, live, weight_bytes, flops and slots. A step whose end is
//                         before its begin is drawn with dur 0 and args.clamped = true (counted
//                         in otherData.clamped_spans).
//
// Every span is a complete event (ph "X") whose ts and dur are microseconds as floating point,
// ts relative to the earliest begin_ns among the records and steps (the first window's, for
// records in order and no steps), so the trace starts at 0. Each value is one correctly rounded
// division of an exact integer nanosecond count by 1000 (dur is computed from the ns difference,
// not from two ts).
//
// Every span's args carry the window's path fields: idx, p, T, T_mtp, merged, from_sfx, chain_n,
// accepted, source ("none"/"mtp"/"suffix"/"merged") and first_call. Stage spans add "stage";
// compute spans add cpu_ms (StageTiming::cpu_ns / 1e6) and, on device backends,
// dev_compute_ms / dev_wait_ms / dev_copy_ms / init_ms. The window span adds the recorded raw
// values begin_ns, end_ns, draft_ns, verify_ns, commit_ns, wait_ns, compute_ns and export_ns
// (null when unknown).
//
// ---- how a window is laid out (docs/engine.md, "Window records") ----
//
//   begin_ns | draft | (pre_verify export) | verify | (post_verify export) | commit (+ commit
//   export, subtracted from commit_ns) | end_ns
//
// A record gives the durations but not where the export time (export_ns, the sum over the three
// checkpoints) falls, so the verify start is approximated:
//
//   verify_begin = end_ns - commit_ns - verify_ns - max(export_ns, 0)
//                  if that is >= begin_ns + draft_ns, else begin_ns + draft_ns
//
// Both terms are lower bounds of the true verify start (the true one is later by the pre_verify
// export time and the few ns between timer reads), so the later of the two is taken. Measured
// export time is drawn as ONE "export" span of export_ns right after "verify" (it then ends
// exactly where "commit" begins); when the split matters, remember that part of it happened
// before the verify. Time the record does not attribute (e.g. the pre_verify export, or the
// slack when export is unknown) is left as a gap on the driver track, never invented.
// Stage s's spans start at verify_begin: wait = [vb, vb + wait_ns), compute follows it.
//
// ---- unknown and inconsistent data ----
//
// * export_ns < 0 means "not measured": no export span is emitted (unknown is not zero), and
//   otherData.export says "unknown" (every window unknown), "measured" (every window measured) or
//   "partly unknown" (otherData.export_unknown_windows counts the unknown ones).
// * Spans never have negative duration and never overlap the next window on their track: every
//   span is clamped into [begin_ns, min(end_ns, begin_ns of the next window in time)], negative
//   durations count as 0, and driver spans are laid out in order (a span starts no earlier than
//   the previous one ends). Engine-written records never need this (end - begin always covers
//   draft + verify + export + commit); a span whose drawn duration differs from the recorded one
//   gets args.clamped = true, and otherData.clamped_spans counts them.
// * A window with fewer StageTiming entries than n_stages gets no spans on the missing stages;
//   entries beyond n_stages are not drawn. otherData.stage_count_mismatch_windows counts such
//   windows. A negative n_stages is treated as 0.
// * Records are drawn in time order (begin_ns, then input order); the input need not be sorted.
// * Strings (process_name, arm) that are not valid UTF-8 are written with U+FFFD replacements.
//
// otherData also carries schema "lockstep.chrome_trace", schema_version 1, generator, clock
// ("CLOCK_MONOTONIC"), time_origin_ns (null for no windows and no steps), n_windows, n_stages,
// verify_begin (the approximation above, in words), arm (when set), injections (when given: the
// --inject records, ChromeTraceOptions::injections) and n_steps (when steps are given). Without
// steps the text is what it was before the steps track existed.
//
// The JSON text puts one trace event per line, so traces diff well. Output is deterministic:
// the same inputs give the same bytes.
//
// Thread safety: both functions are pure apart from the file write; concurrent calls are safe
// (two concurrent writes to the same path are not: see atomic_file.h).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "lockstep/engine/status.h"
#include "lockstep/engine/step_record.h"
#include "lockstep/engine/window.h"

namespace lockstep {

struct ChromeTraceOptions {
  // Name of the one process (pid 1). With a non-empty `arm` the shown name is
  // "<process_name> (<arm>)", so two arms loaded side by side stay apart.
  std::string process_name = "lockstep";
  // Experiment arm label (e.g. "baseline", "spec4"); also written to otherData.arm when non-empty.
  std::string arm;
  // --inject records (InjectionRecordJson, one JSON object each): otherData.injections holds them
  // and each recorded firing is an instant event (ph "i", name "inject <kind>", cat "inject") on
  // its stage's track at its window's verify begin, args = the firing and the injection's text.
  std::vector<std::string> injections;
  // The engine steps the request had rows in (the scheduler's records, step_record.h): drawn on
  // the "steps" track. Empty: no steps track.
  std::vector<StepRecord> steps;
};

// Returns the trace as JSON text (ends with a newline). `windows` is borrowed for the call only;
// `n_stages` is the number of pipeline stages (stage tracks 0 .. n_stages-1 exist even when no
// window is given). An empty `windows` gives a valid trace holding only metadata events.
// Never throws; returns an empty string only if building the text failed (out of memory),
// which WriteChromeTrace reports as kRuntime.
std::string ChromeTraceJson(std::span<const WindowRecord> windows, int n_stages,
                            const ChromeTraceOptions& opts = {});

// Writes ChromeTraceJson(windows, n_stages, opts) to `path` atomically (WriteFileAtomic: a
// reader sees the old file or the whole new one). Returns OK, kInvalidArgument when the folder is
// missing, kIOError from WriteFileAtomic (e.g. the folder is not writable; `path` is then
// unchanged), or kRuntime if building the JSON failed.
Status WriteChromeTrace(const std::string& path, std::span<const WindowRecord> windows,
                        int n_stages, const ChromeTraceOptions& opts = {});

}  // namespace lockstep
