// WindowRecord: what happened in one verify window (docs/engine.md, "Window records", defines every
// field).
//
// Path fields (p, T, T_mtp, merged, from_sfx, chain_n, accepted, source, draft) are what the
// comparator aligns on; timing fields are CLOCK_MONOTONIC nanoseconds around the instrumented
// calls; context fields (step, step_rows, step_seqs, step_prefill_rows) say which engine step the
// window ran in and what shared it, and like timing are never compared. Records serialise to one
// JSON object per line ("lockstep.window" v1), the format of
// `--trace-jsonl` and the input of `--replay-path`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep {

enum class DraftSource : std::uint8_t {
  kNone,    // no draft (T = 1)
  kMtp,     // MTP head, chained
  kSuffix,  // suffix index continuation
  kMerged,  // suffix prefix continued by the MTP head
};
const char* DraftSourceName(DraftSource s);
Result<DraftSource> ParseDraftSource(std::string_view s);

// How a device stage ran its layers in a window (CUDA graphs, cuda_graphs.cpp RunLayers).
enum class GraphUse : std::int8_t {
  kNone = -1,  // not a device stage (cpu backend): no key in the record
  kEager,      // every kernel launched from the host (prefill, a size's first windows, graphs off)
  kCapture,    // captured into a graph, then launched (one-time set-up, counted in init_ns)
  kReplay,     // replayed from the graph captured for this window size
};
const char* GraphUseName(GraphUse g);

struct StageTiming {
  std::int64_t wait_ns = 0;     // from the window's verify start until this stage starts computing
  std::int64_t compute_ns = 0;  // wall time of this stage's forward (includes injected delays)
  std::int64_t cpu_ns = 0;      // driver thread CPU time of that forward (CLOCK_THREAD_CPUTIME_ID)
  // ---- device backends (CUDA events on the stage's stream); -1 = not measured (cpu backend) ----
  // Host-side compute_ns of a device stage is only the time to enqueue its work; these split the
  // device's own time line:
  std::int64_t dev_wait_ns =
      -1;  // sync: from the stage's stream reaching the window until its input is there
           // (previous stage's kernels + the hand-off copy / NCCL receive; stage 0: token upload)
  std::int64_t dev_compute_ns = -1;  // this stage's kernels, first to last (model work)
  std::int64_t dev_copy_ns =
      -1;  // host<->device copies of this stage in the window (tokens up, logits down); 0 = none
  std::int64_t init_ns = -1;  // host time in one-time set-up during this call (device allocations,
                              // cuBLAS handle and workspace, graph capture); 0 = none happened
  GraphUse graph = GraphUse::kNone;  // the verify forward's layers: eager, captured or replayed
};

struct WindowRecord {
  // ---- path ----
  int idx = 0;            // zero-based window index in the request
  int p = 0;              // position of the window's first row (= committed tokens before it)
  int T = 1;              // rows verified: the current token plus the drafts
  int T_mtp = 0;          // draft tokens that came from the MTP head
  bool merged = false;    // the draft is a suffix prefix continued by the MTP head
  bool from_sfx = false;  // the draft (or its prefix) came from the suffix index
  int chain_n = 0;        // preceding windows in a row that accepted all of their drafts
  int accepted = 0;       // drafts accepted (0 .. T-1); the window emits accepted + 1 tokens
  DraftSource source = DraftSource::kNone;
  std::vector<std::int32_t> draft;    // the T-1 draft tokens
  std::vector<std::int32_t> emitted;  // the accepted + 1 tokens this window produced
  // ---- timing (CLOCK_MONOTONIC ns) ----
  std::int64_t begin_ns = 0;  // window start (before drafting)
  std::int64_t end_ns = 0;    // after commit
  std::int64_t draft_ns =
      0;  // drafting: MTP extend over the previous window + MTP chain + suffix lookup
  std::int64_t verify_ns = 0;   // the pipeline forward of T rows through every stage + logits
  std::int64_t wait_ns = 0;     // sum over stages of StageTiming::wait_ns
  std::int64_t compute_ns = 0;  // sum over stages of StageTiming::compute_ns
  std::int64_t commit_ns = 0;   // acceptance + commit of every stage
  std::int64_t export_ns = -1;  // handing state to the observer; -1 = not measured (no observer)
  bool first_call = false;      // first verify with this T in the process (allocation/warm-up cost)
  std::vector<StageTiming> stages;
  // ---- context: the engine step the window's verify ran in (scheduler); never compared ----
  std::int64_t step = -1;     // engine step index; -1 = unknown (older traces)
  int step_rows = 0;          // rows of that step (every request's)
  int step_seqs = 0;          // row groups (sequences) of that step
  int step_prefill_rows = 0;  // of which prefill rows

  // Same path fields (not timing).
  bool SamePath(const WindowRecord& o) const;
  std::string ToJsonLine() const;  // one line, no trailing newline
  static Result<WindowRecord> FromJsonLine(std::string_view line, const std::string& label);
};

// ---- fields: one table of WindowRecord's fields for every writer and reader of records ----
// JSON lines (ToJsonLine / FromJsonLine), the HDF5 trace (instrument/ writes /trace/windows and
// compare/ reads it, matching h5/rows.h's columns to these names), the Chrome trace's span args,
// align's path fields and SamePath all go through WindowFields(). Order: the JSON-lines order.
// `stages` (per-stage timings, nested) is not in the table.
enum class WindowFieldKind : std::uint8_t {
  kInt,     // int; JSON integer, required
  kBool,    // bool; JSON true / false
  kSource,  // DraftSource; JSON its DraftSourceName, required
  kTokens,  // std::vector<std::int32_t>; JSON array of integers, required
  kNs,      // std::int64_t (nanoseconds, or the step index); JSON integer
};
enum class WindowFieldRole : std::uint8_t {
  kIndex,    // idx
  kPath,     // what the comparator aligns on (SamePath compares these and idx)
  kTiming,   // measured, never compared for equality
  kContext,  // what else shared the window's engine step (scheduler); never compared
};

struct WindowField {
  const char* name;  // the JSON key, HDF5 column and Chrome trace arg
  WindowFieldKind kind;
  WindowFieldRole role;
  bool optional;  // JSON lines: may be absent (older traces); reads as 0 / false
  bool nullable;  // kNs: -1 = unknown, written as null; absent, null or not a number read as -1
  // Scalars (every kind but kTokens): the value as an integer (bools 0/1, source its enum value);
  // set() takes it back unchecked (callers range-check first).
  std::int64_t (*get)(const WindowRecord& w);
  void (*set)(WindowRecord& w, std::int64_t v);
  std::vector<std::int32_t> WindowRecord::*tokens;  // kTokens only, else null
};

// Every field in JSON-lines order (idx, p, T, T_mtp, merged, from_sfx, chain_n, accepted, source,
// draft, emitted, begin_ns, end_ns, draft_ns, verify_ns, wait_ns, compute_ns, commit_ns,
// export_ns, first_call, step, step_rows, step_seqs, step_prefill_rows). Static storage;
// thread-safe.
const std::vector<WindowField>& WindowFields();
// The field called `name`; null when there is none.
const WindowField* FindWindowField(std::string_view name);

// Reads a JSON-lines file of window records (e.g. written by --trace-jsonl). An unterminated
// last line that does not parse is the torn record of a writer killed mid-write: it is dropped,
// and described in *torn_tail when given (cleared otherwise); any other bad line is an error.
Result<std::vector<WindowRecord>> ReadWindowRecords(const std::string& path,
                                                    std::string* torn_tail = nullptr);

}  // namespace lockstep
