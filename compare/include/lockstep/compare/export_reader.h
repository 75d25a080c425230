// ExportReader: reads a `lockstep.export` v1 file (instrument/SCHEMA.md) for the comparator.
//
// Open() validates the whole structure up front (schema attribute and version, every group and
// attribute the schema requires, every dataset's type and shape against its attributes) and builds
// ExportMeta; afterwards ReadRows() streams row blocks of one item. Every size read from the file
// is checked against ReaderLimits and against the file's length before anything is allocated.
// A file that is not HDF5, truncated, of another schema or version, missing a required group or
// holding absurd shapes is kInvalidArgument (exit 2) with a message naming the offending path
// inside the file. NaN/Inf in data is not a reader error (the comparator fails the item).
//
// Open() errors, all "<file>: <in-file path>: <what is wrong>" where a path applies:
//   kNotFound (exit 2)        the file does not exist;
//   kIOError (exit 3)         it exists but cannot be read (permissions, I/O error);
//   kInvalidArgument (exit 2) anything about its content: not a regular file, no HDF5 signature at
//                             offset 0 (LooksLikeHdf5), truncated (HDF5 refuses to open it), root
//                             attribute `schema` != "lockstep.export" or `schema_version` != 1
//                             ("not a lockstep.export v1 file: schema '...' version N", checked
//                             before anything else), a required dataset / group / attribute
//                             missing (/config, /request/tokens, /output/tokens, /counters/stage{S}
//                             with its 8 attributes, /trace/windows, /trace/samples,
//                             /trace/device_samples; /checkpoints is optional: --export-windows
//                             none; /trace/stages, /trace/steps, /trace/window_steps and the
//                             `request_id` attribute are optional: older files lack them), a
//                             soft or external link, an unexpected entry under /checkpoints, an
//                             item whose attributes disagree with its path or its dataset (kind,
//                             stage, layer, dtype vs HDF5 type, valid_rows == shape[0],
//                             capacity_rows >= valid_rows), scales of the wrong shape,
//                             a compound table missing a field, /trace/steps out of step order
//                             or with negative counts, /trace/window_steps without /trace/steps,
//                             not one row per window or naming a step /trace/steps lacks, or any
//                             ReaderLimits violation.
// Sizes are checked from the dataspace before anything is read or allocated: rank, every
// dimension, and the logical bytes of every dataset (compressed ones too) against both
// max_item_bytes and the file's length. Unknown (-1) values are not errors: ExportMeta::unknowns
// lists them. /trace/events and /residency are not read.
//
// Isolation (ReaderLimits::isolate, on by default). The checks above cover the lockstep structure,
// not HDF5's own metadata: the exporter writes the earliest file format, whose object headers
// carry no checksums, and libhdf5 1.10 crashes on some corrupted headers (about 1 in 300 exports
// damaged by bit flips, inside H5Aexists; 2 of 142 public HDF5 CVE reproducers). So by default
// Open() does all of the above in a forked child process (compare/isolated_open.cpp): the child
// opens and validates the file, reads every item that needs libhdf5 for its data (chunked or
// compressed) into an unlinked temporary file, and sends ExportMeta and the item index (paths,
// dtypes, shapes, file offsets) back over a pipe. This process then never calls libhdf5 for the
// file: it checks every received offset and size against the file's length (or the temporary
// file's) and reads rows with pread() only. The child runs with an address-space limit
// (RLIMIT_AS: its start size + isolate_memory_bytes) and a deadline (isolate_timeout_s); it dies
// with its parent (PR_SET_PDEATHSIG). Its outcomes, all kInvalidArgument (exit 2), one line:
//   "<file>: the HDF5 library crashed while reading its metadata (signal 11: Segmentation
//    fault): the file is damaged or not a lockstep export";
//   "<file>: the HDF5 library did not finish reading its metadata within 30 s (--isolate-timeout):
//    ..."; "<file>: the HDF5 library ran out of memory reading its metadata (limit ...): ...";
//   a child that ends without a well-formed result: "... ended without a result ...";
// and otherwise exactly the Status an in-process Open() returns. fork() or pipe() failing is
// kRuntime (exit 3). Cost: one fork per file (a few ms, see tests/bench/README.md); chunked items
// are decompressed up front, in full, by the child. isolate = false parses in this process (for
// trusted files, e.g. ones this process just wrote): faster by that fork, and a crash in libhdf5
// then takes this process down.
// Test-only hook: LOCKSTEP_TEST_ISOLATE_FAULT=crash|hang|oom makes the child segfault, hang or
// exhaust its memory limit before it opens the file (tests/compare/isolate_test.cpp); never set it
// otherwise.
// Fork with threads: the child is a copy of the calling thread only; it calls libhdf5 and writes
// its pipe, then _exit()s. A process that also uses libhdf5 on other threads (isolate = false,
// the export writer) must not Open() isolated concurrently with them: the child could inherit
// HDF5's lock held (it would then hang until its deadline).
//
// Thread-safety: isolated Open()s may run on several threads at once (their forks are serialised
// so that no child holds another's pipe open); in-process Open()s (isolate = false) on one thread
// at a time, as libhdf5 requires. After Open(), meta() and
// ReadRows()/ReadScaleRows() may be called concurrently from several threads. Contiguous datasets
// (what the exporter writes) are read with pread() at the dataset's file offset: HDF5's global
// library lock would serialise parallel readers, and the offset/size are validated against the
// file length first. Other layouts (chunked, compressed: files written by other tools): isolated,
// pread() from the child's temporary file; in process, H5Dread under a lock.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/engine/dtype.h"
#include "lockstep/engine/observer.h"
#include "lockstep/engine/status.h"
#include "lockstep/engine/window.h"

namespace lockstep {

struct ReaderLimits {
  int max_rank = 4;
  std::int64_t max_dim = std::int64_t{1} << 31;         // any single dimension
  std::int64_t max_item_bytes = std::int64_t{1} << 40;  // also bounded by the file length
  std::int64_t max_items = 4'000'000;                   // checkpoint items in the file
  std::int64_t max_windows = 50'000'000;  // rows of /trace/windows (and of the sample tables)
  std::int64_t max_tokens = 50'000'000;   // request / output token ids
  std::int64_t max_string_bytes = std::int64_t{64} << 20;  // /config and string attributes
  // Locate items through /index/items when the export has one (lockstep's own exports do): one
  // table instead of opening every dataset. Every row is checked against the limits and the file
  // length, and each checkpoint's first item against its dataset. false: walk every dataset.
  bool use_index = true;
  // Parse in a child process (see "Isolation" above); false: in this process (trusted files only).
  bool isolate = true;
  double isolate_timeout_s = 30.0;  // the child's deadline (--isolate-timeout)
  // Address space the child may add to its start size (RLIMIT_AS): metadata cache, tables, the
  // row blocks of chunked items it decompresses.
  std::int64_t isolate_memory_bytes = std::int64_t{4} << 30;
  // The rows the child decompresses from chunked items into its spill file, at most
  // spill_factor x the file's bytes + spill_slack_bytes, checked before any is written: LZ4 on
  // exported state does not even halve it (measured: lz4 exports are larger than plain ones),
  // while a crafted 10 MB file claimed 1.5 GB of chunks.
  std::int64_t spill_factor = 16;
  std::int64_t spill_slack_bytes = std::int64_t{64} << 20;
};

// One checkpoint item (a dataset under /checkpoints/{W:05d}_{point}/...).
struct ExportItem {
  std::string rel;               // path inside the checkpoint, the match key: "stage0/layer3/k"
  ItemKind kind = ItemKind::kK;  // attr `kind` (its name, observer.h), checked against the path
  int stage = -1;                // attr `stage`
  int layer = -1;                // attr `layer` (-1 for mtp / hidden_out / logits)
  DType dtype =
      DType::kF32;  // attr `dtype`: "f32" | "bf16" | "int8", checked against the HDF5 type
  std::vector<std::int64_t> shape;  // dataset dims, rows first (rank >= 1)
  std::int64_t valid_rows = 0;      // attr `valid_rows` (== shape[0])
  std::int64_t capacity_rows = 0;   // attr `capacity_rows` (>= valid_rows)
  bool has_scales = false;          // int8: a sibling `<name>_scale` f32 [rows, heads] exists
  std::int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  std::int64_t row_elems() const;    // product of shape[1..] (1 for rank 1)
  std::int64_t scale_row_elems = 0;  // int8: elements per row of the scale dataset
  std::size_t elem_bytes() const;    // 4 (f32), 2 (bf16), 1 (int8)
};

struct ExportCheckpoint {
  std::string name;                                     // "00000_commit"
  int window = 0;                                       // attr `window`
  CheckpointPoint point = CheckpointPoint::kPreVerify;  // attr `point` (its name, observer.h)
  std::int64_t p = 0, T = 0, committed_rows = 0, spec_rows = 0, recurrent_pos = 0;
  std::vector<ExportItem> items;  // sorted by (stage, layer with -1 last, kind order of the schema)
};

// Resource-sampler summary of /trace/samples and /trace/device_samples (-1 = unknown).
struct SamplerSummary {
  std::int64_t n_samples = 0;
  std::int64_t interval_min_ns = -1, interval_median_ns = -1, interval_max_ns = -1;
  std::string nvml;   // attr `nvml`: "read" or "unknown: <why>"
  std::string guard;  // attr `guard`: empty or the trip description
  std::int64_t min_host_available_bytes = -1;
  std::int64_t max_swap_used_bytes = -1;
  std::int64_t max_rss_bytes = -1;
  std::int64_t n_device_samples = 0;
  std::int64_t min_device_free_bytes = -1;
  std::int32_t max_temperature_c = -1, min_sm_clock_mhz = -1, max_sm_clock_mhz = -1;
  std::int32_t pcie_gen = -1, pcie_width = -1;  // of the first device sample (-1 unknown)
};

// One row of /trace/steps: an engine step the request had rows in (StepRecord without its slot
// list; counts and estimates as the engine recorded them).
struct ExportStep {
  std::int64_t step = 0, begin_ns = 0, end_ns = 0;
  int rows = 0, seqs = 0, verify_rows = 0, prefill_rows = 0, queue_depth = 0, live = 0;
  std::int64_t weight_bytes = 0, flops = 0;
};

// /ops/table (optional, issue 37): one named op of the export's op records.
struct ExportOpName {
  std::string name;
  std::vector<std::string> inputs;  // as op_table.h spells them ("residual|embed", "state:k")
  bool state = false;               // a state item as an op reads it
};

// One row of /ops/records with its /ops/l2 value: an op's output row (or a state read: row -1),
// in execution order.
struct ExportOpRecord {
  std::int32_t window = -1, stage = 0, layer = -1, op = 0, index = -1, position = 0, row = 0;
  std::int64_t digest = 0;                      // the 64-bit row digest's bits
  double l2 = 0.0;                              // -1: not computed (state reads)
  std::int64_t dump_offset = -1, dump_len = 0;  // into ExportMeta::op_dump (-1: not dumped)
};

// Every field of ExportMeta (and of the structs it holds) crosses the isolation pipe: the wire
// (compare/isolated_wire.cpp) names each one in a structured binding, so a field added here does
// not compile until it is added there too, and tests/compare/isolate_test.cpp compares an isolated
// and an in-process Open() field by field through DumpExportMeta.
struct ExportMeta {
  // root attributes
  std::string schema;  // "lockstep.export"
  std::int64_t schema_version = 0;
  std::string arm, run_id, created_utc, executable_sha256, config_sha256, model_sha256,
      request_sha256;
  std::string request_id;  // attr `request_id`; "" when absent (one-request runs, older files)
  std::string host;        // attr `host`: the host fingerprint (JSON); "" in older files
  // attrs `prefix_reuse` / `prompt_tokens_reused` (issue 40): "" and -1 when absent
  std::string prefix_reuse;
  std::int64_t prompt_tokens_reused = -1;
  // attr `preemptions` (issue 40): the JSON array of the request's preemptions; "" when absent
  std::string preemptions;
  std::int64_t seed = 0;
  std::string config_json;  // /config (canonical JSON of the effective engine config)
  std::vector<std::int32_t> request_tokens;  // /request/tokens
  std::int64_t max_new = 0;
  std::vector<std::int32_t> output_tokens;  // /output/tokens
  std::string stop_reason, text_sha256;
  std::vector<ExportCheckpoint> checkpoints;  // sorted by (window, point order pre/post/commit)
  // /trace/windows: path and timing fields (draft, emitted and per-stage timings are not in the
  // HDF5 trace and stay empty, so WindowRecord::SamePath against a JSON-lines record is false;
  // `source` is derived from T, merged and from_sfx). Fields are read by name. The step fields
  // (step, step_rows, step_seqs, step_prefill_rows) come from /trace/window_steps and
  // /trace/steps; without them (older exports, runs without steps) step is -1 and the rest 0.
  std::vector<WindowRecord> windows;
  // /trace/steps (optional): the engine steps the request had rows in, in step order; empty
  // when the export has none.
  std::vector<ExportStep> steps;
  std::map<std::string, std::map<std::string, std::int64_t>> counters;  // "stage0" -> attr -> value
  SamplerSummary sampler;
  // Everything the export records as unknown, one line each:
  //   "counters/stage0 first_call_ns"                        a counters attribute that is -1
  //   "trace/windows export_ns: unknown in 12 of 40 windows"  a timing field -1 in some windows
  //   "trace/samples rss_bytes: unknown in 3 of 9 samples"    likewise host / device sample fields
  //   "trace/device_samples temperature_c: unknown in ..."
  //   "trace/samples interval_median_ns"                     a sampler interval statistic -1
  //   "nvml: unknown: <why>"                                 the sampler's nvml attribute
  //   "executable_sha256: empty (the binary was unreadable)"
  std::vector<std::string> unknowns;
  // /injections (absent: none): one JSON object per --inject of the run, in the order given,
  // recording whether and where it fired (instrument/SCHEMA.md).
  std::vector<std::string> injections;
  // /ops (optional, issue 37; absent: the run recorded no op digests): the op table, the op
  // records in execution order, and the dumped rows they point into (instrument/SCHEMA.md).
  std::vector<ExportOpName> op_table;
  std::vector<ExportOpRecord> op_records;
  std::vector<float> op_dump;
  std::int64_t file_bytes = 0;  // length of the file when it was opened
};

class ExportReader {
 public:
  static Result<std::unique_ptr<ExportReader>> Open(const std::string& path,
                                                    const ReaderLimits& limits = {});
  ~ExportReader();
  ExportReader(const ExportReader&) = delete;
  ExportReader& operator=(const ExportReader&) = delete;

  const ExportMeta& meta() const;
  // Rows [row0, row0 + n) of `item` of checkpoint `cp` as raw elements (row_elems() * elem_bytes()
  // bytes per row, the dataset's dtype) into dst. Bounds are checked (kInvalidArgument).
  Status ReadRows(const ExportCheckpoint& cp, const ExportItem& item, std::int64_t row0,
                  std::int64_t n, void* dst) const;
  // int8 items: the f32 scales of rows [row0, row0 + n) (scale_row_elems floats per row).
  Status ReadScaleRows(const ExportCheckpoint& cp, const ExportItem& item, std::int64_t row0,
                       std::int64_t n, float* dst) const;
  // True when the item's rows are read with pread() at a validated file offset (contiguous,
  // unfiltered, stored in the native type: what the exporter writes); false when ReadRows() uses
  // the serialised H5Dread fallback, or for an item of another export.
  bool ReadsDirectly(const ExportCheckpoint& cp, const ExportItem& item) const;

  struct Impl;

 private:
  explicit ExportReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// True when the first 8 bytes of the file are the HDF5 signature (at offset 0).
bool LooksLikeHdf5(const std::string& path);

// Every field of `m` (and of everything it holds), one "name=value" line each, in declaration
// order: a canonical text for comparing two metas (the isolated and the in-process Open()).
std::string DumpExportMeta(const ExportMeta& m);

}  // namespace lockstep
