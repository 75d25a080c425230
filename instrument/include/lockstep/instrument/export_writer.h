// H5Exporter: the Observer that writes `lockstep.export` v1 HDF5 files (instrument/SCHEMA.md).
//
// The engine thread only copies each state view into a buffer and queues it; a writer thread
// does all HDF5 work from a bounded queue (the engine blocks only when `max_queue_bytes` of
// copies are waiting), so the time the engine spends handing state over (export_ns) is the copy,
// not the I/O. The file is written as `<path>.partial`; Finish() writes the trace and metadata,
// closes, fsyncs and renames it to `<path>` (then fsyncs the folder). A killed run therefore never
// leaves a file that looks complete. A failed write (disk full, RLIMIT_FSIZE: SIGXFSZ is ignored
// process-wide so the write returns EFBIG) makes every later write a no-op and Finish() return a
// kIOError naming the dataset and the system error; the `.partial` file stays for inspection.
// An export past its byte budget (ExportOptions::max_bytes, ExportQuota) copies nothing more, and
// Finish() removes its `.partial` file and returns the budget's error.
//
// Engine steps (continuous batching): OnStep records each step the request had rows in and
// OnWindow the step each window ran in (WindowRecord::step); Finish writes them as /trace/steps
// and /trace/window_steps. An exporter that saw no OnStep writes neither, so a run without steps
// has the layout it always had.
//
// Thread safety: the Observer callbacks and Finish() are called from the engine's driver thread;
// the writer thread is internal.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lockstep/engine/observer.h"
#include "lockstep/engine/status.h"
#include "lockstep/engine/step_record.h"
#include "lockstep/engine/trace_ring.h"
#include "lockstep/engine/window_selection.h"
#include "lockstep/instrument/export_quota.h"
#include "lockstep/instrument/op_export.h"
#include "lockstep/instrument/resource_sampler.h"

namespace lockstep {

class Engine;

// The `schema_version` attribute this writer puts on "/" (schema "lockstep.export").
inline constexpr int kExportSchemaVersion = 1;

struct ExportOptions {
  std::string path;         // final file; written as path + ".partial"
  WindowSelection windows;  // default: none (trace only)
  std::set<CheckpointPoint> points{CheckpointPoint::kPreVerify, CheckpointPoint::kPostVerify,
                                   CheckpointPoint::kCommit};
  std::size_t max_queue_bytes = std::size_t{256} << 20;
  // The export's byte budget (ExportQuota: 0 = none) and the most windows the request can run
  // (0 = unknown: no projection). Over it, Finish() removes the `.partial` file and fails.
  std::uint64_t max_bytes = 0;
  int max_windows = 0;
  // "" (contiguous, uncompressed) or "lz4": chunked datasets (rows of ~1 MiB per chunk, following
  // the rows the engine appends) through the LZ4 HDF5 filter plugin (id 32004, Debian package
  // hdf5-filter-plugin). Create() fails with kNotSupported when the plugin is not available.
  std::string compress;
  // Op digests (issue 37, op_export.h): the windows whose ops are recorded (none: no /ops) and
  // the ops whose rows are stored in full.
  OpWindows op_digests;
  std::vector<OpDump> op_dumps;
};

// HDF5 filter id of the LZ4 plugin (registered with The HDF Group).
inline constexpr int kH5FilterLz4 = 32004;

// What Finish() writes besides the checkpoints (DESIGN.md root attributes and groups).
struct ExportRunInfo {
  std::string arm, run_id, created_utc;
  std::string request_id;  // root attribute `request_id`; "" = not written (one-request runs)
  std::string host_json;   // root attribute `host` (the host fingerprint); "" = not written
  // Root attributes `engine` ("llama.cpp") and `llama_cpp_commit` (issue 38); "" = not written
  // (the lockstep engine's exports are the files they always were).
  std::string engine, engine_commit;
  // Root attributes `prefix_reuse` (ReuseReasonText) and `prompt_tokens_reused`: why the request
  // reused what it did of its prompt (issue 40); "" = neither is written.
  std::string prefix_reuse;
  std::int64_t prompt_tokens_reused = 0;
  // Root attribute `preemptions`: the request's PreemptionsJson (scheduler.h); "" = not written.
  std::string preemptions;
  std::string config_json;   // canonical effective config
  std::string weights_json;  // /weights: resident weight bytes per stage ("" = not written)
  std::string executable_sha256, config_sha256, model_sha256, request_sha256;
  std::uint64_t seed = 0;
  int max_new = 0;
  std::vector<std::int32_t> request_tokens;
  std::vector<std::int32_t> output_tokens;
  std::string stop_reason, text_sha256;
  struct Residency {
    int stage = 0;
    int layers = 0, experts = 0;
    std::vector<std::uint8_t> map;  // uint8 [layers, experts]
  };
  std::vector<Residency> residency;
  // /counters/stage{S}: int64 attributes; -1 = not measured on this backend (never zero).
  struct Counters {
    int stage = 0;
    std::int64_t expert_hits = 0, expert_misses = 0, expert_bytes_fetched = 0,
                 host_expert_tokens = 0;
    std::int64_t verify_calls = 0, first_calls = -1, graph_captures = -1, first_call_ns = -1;
    std::int64_t graph_launches = -1;
  };
  std::vector<Counters> counters;
  std::vector<TraceEvent> events;       // /trace/events: hot-path layer/stage events
  std::uint64_t events_dropped = 0;     // older events overwritten in the ring
  std::vector<ResourceSample> samples;  // /trace/samples (+ /trace/device_samples)
  IntervalStats sample_intervals;
  std::string nvml_unavailable;  // why GPU fields are unknown ("" when NVML was read)
  std::string guard;             // "" or "tripped: <source> free <bytes> at <t_ns>"
  // /injections: one JSON object per --inject (InjectionRecordJson); none: the dataset is absent.
  std::vector<std::string> injections;
};

// Appends each stage's expert residency map and /counters (expert hits, misses, bytes fetched,
// host tokens, one-time set-up counters; `verify_calls` windows) for the engine's current slot
// (Engine::UseSlot): what an export of that request records in /run and /counters.
void AppendStageInfo(Engine& engine, std::int64_t verify_calls,
                     std::vector<ExportRunInfo::Residency>* residency,
                     std::vector<ExportRunInfo::Counters>* counters);

class H5Exporter final : public Observer {
 public:
  // Creates `<path>.partial` and starts the writer. Errors: kIOError (cannot create).
  static Result<std::unique_ptr<H5Exporter>> Create(const ExportOptions& opts);
  ~H5Exporter() override;
  H5Exporter(const H5Exporter&) = delete;
  H5Exporter& operator=(const H5Exporter&) = delete;

  bool WantsCheckpoint(int window, CheckpointPoint point) const override;
  void OnCheckpointBegin(const CheckpointInfo& info) override;
  void OnState(const CheckpointInfo& info, const StateView& view) override;
  void OnCheckpointEnd(const CheckpointInfo& info) override;
  void OnWindow(const WindowRecord& rec) override;
  void OnStep(const StepRecord& step) override;
  bool WantsOps(int window) const override;
  void OnOp(const OpRecord& rec) override;

  // Writes /trace/windows and the metadata, drains the queue, closes, fsyncs, renames.
  // Errors: the first write error (kIOError), or one from close/fsync/rename.
  Status Finish(const ExportRunInfo& meta);

  // Items written per exported checkpoint, in order, by point (the seed's "93 / 94 / 93").
  const std::map<CheckpointPoint, std::vector<int>>& item_counts() const { return counts_; }
  const std::string& partial_path() const { return partial_; }
  // True once the export passed its byte budget (ExportOptions::max_bytes): nothing more is
  // copied and Finish() will fail. Any thread may ask (a request's stop check does).
  bool over_budget() const { return quota_.over(); }

 private:
  using Job = std::function<Status()>;
  explicit H5Exporter(const ExportOptions& opts);
  void Enqueue(Job job, std::size_t bytes);
  void WriterLoop();
  Status Drain();

  ExportOptions opts_;
  std::string partial_;
  struct File;
  std::unique_ptr<File> file_;  // HDF5 handles; used by the writer thread only
  std::vector<WindowRecord> windows_;
  std::vector<StepRecord> steps_;  // OnStep, in call order
  OpCollector ops_;                // OnOp, in call order
  ExportQuota quota_;
  std::map<CheckpointPoint, std::vector<int>> counts_;
  int items_in_checkpoint_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;                     // work available / space available / drained
  std::deque<std::pair<Job, std::size_t>> queue_;  // GUARDED_BY(mu_)
  std::size_t queued_bytes_ = 0;                   // GUARDED_BY(mu_)
  bool busy_ = false;                              // GUARDED_BY(mu_): the writer runs a popped job
  bool stop_ = false;                              // GUARDED_BY(mu_)
  Status error_;                                   // GUARDED_BY(mu_): first failure
  // Copy buffers handed back by the writer for reuse: fresh multi-MiB allocations would fault in
  // every page again on each checkpoint (measured: ~2x slower export).
  // Uninitialised storage: a copy buffer is overwritten whole, so zero-filling it first
  // (std::vector<std::byte>::resize) would only add a memset of every exported byte.
  struct Buffer {
    std::shared_ptr<std::byte[]> data;
    std::size_t capacity = 0;
  };
  std::vector<Buffer> pool_;  // GUARDED_BY(mu_)
  Buffer TakeBuffer(std::size_t bytes);
  void ReturnBuffer(Buffer buf);
  std::thread writer_;
  bool finished_ = false;
};

}  // namespace lockstep
