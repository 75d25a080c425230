// Scheduler: continuous batching over an Engine's slots (issue 22). Requests are submitted with
// their own options and hooks, wait in a bounded FIFO queue, are admitted into free slots while
// their memory reservation fits, and then share engine steps: every step carries each decoding
// request's verify window (ascending slot) and then whole prefill chunks of admitted requests in
// admission order up to `batch_tokens` rows (a step that would carry no prefill row takes the
// head chunk anyway). Prefill chunks sit on a grid of absolute positions: a chunk starting at p
// ends at min(next multiple of prefill_chunk above p, prefill end), whatever shares the step.
//
// Determinism: planning never reads a clock. A step's composition is a function of the
// submissions (their arrive_step), cancellations and the requests' own tokens, so a rerun of the
// same submissions gives the same steps. With batch_invariant on every request's tokens and
// state are bitwise what it gets alone (tests/serve/needle_test.cpp).
//
// Requests end by eos, max_new, a stop_check reason (ends only that request), cancellation or an
// error of their own (status in the result); each frees its slot at once (Engine::CloseSlot)
// unless it was submitted with keep = true, which keeps the slot and the decode state as a
// conversation for Continue / ExportConversation until Release.
//
// `Generate()` (generate.h) is the one-request case: a scheduler over slot 0 of a fresh engine.
//
// Preemption (issue 40): Preempt(), a waiting request of higher priority (a free slot or memory
// it needs held by a lower-priority one) or a RequestSpec::preempt_at test hook frees a running
// request's slot between two steps; the request waits at the front of its priority class and,
// when admitted again, recomputes its state: from the deepest prefix-cache snapshot of its prompt
// (else from position 0), prefill chunks on the same absolute grid, then every window it had run
// replayed with its recorded tokens (cur + draft) and committed to its recorded length; or, with
// SchedulerOptions::preempt_slot_dir, it was saved to a slot file and is read back (nothing
// recomputed). Recompute is invisible to the request's hooks (no observer checkpoints, window
// records or op records, no on_window / on_record / on_prefill): its export and output are those
// of an unpreempted run. With batch_invariant on the recomputed state is bitwise the original
// (tests/serve/preempt_test.cpp). RequestResult::preemptions records each preemption.
//
// Borrowed: the engine outlives the scheduler. Not thread-safe: one driver thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "lockstep/engine/conversation.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/expert_cache.h"
#include "lockstep/engine/generate.h"
#include "lockstep/engine/prefix_cache.h"
#include "lockstep/engine/request_options.h"
#include "lockstep/engine/status.h"
#include "lockstep/engine/step_record.h"

namespace lockstep {

class Sequence;     // engine/decode/sequence.h: one request's decode state
class PrefixCache;  // lockstep/engine/prefix_cache.h

using Ticket = std::int64_t;  // one per submitted request, from 1 per scheduler; 0 = none

// A test hook (RequestSpec::preempt_at): preempt the request right after the engine step that ran
// its prefill chunk `index` (0-based, counting the chunks it ran; decode = false) or its window
// `index` (decode = true); it re-enters the queue `hold_steps` steps later.
struct PreemptAt {
  bool decode = false;
  int index = 0;
  int hold_steps = 0;
};

enum class PreemptReason : std::uint8_t {
  kMemory,    // a waiting request of higher priority needed the memory it reserved
  kPriority,  // a waiting request of higher priority needed its slot
  kRequest,   // Scheduler::Preempt (lockstep serve: POST /slots/{id}?action=preempt)
  kTest,      // RequestSpec::preempt_at
};
const char* PreemptReasonName(PreemptReason r);
enum class ResumeFrom : std::uint8_t {
  kSnapshot,  // a prefix-cache snapshot of its prompt, then recompute
  kSlotFile,  // the slot file written at preemption (SchedulerOptions::preempt_slot_dir)
  kScratch,   // position 0, then recompute
};
const char* ResumeFromName(ResumeFrom r);

// One preemption of a request (RequestResult::preemptions; exports: root attribute
// `preemptions`, instrument/SCHEMA.md).
struct PreemptionRecord {
  PreemptReason reason = PreemptReason::kRequest;
  std::int64_t step = -1;  // the first engine step it was out of (its slot freed before it)
  bool decode = false;     // preempted while decoding (else during prefill)
  int position = 0;        // its slot's committed positions then
  int window = -1;         // decode: windows it had run (the next window's index); prefill: -1
  // Filled when it is admitted again (resume_step -1: never resumed, e.g. cancelled).
  std::int64_t resume_step = -1;  // the step at whose start it was admitted again
  int resume_slot = -1;
  ResumeFrom from = ResumeFrom::kScratch;
  int from_position = 0;      // the position recompute started at
  int tokens_recomputed = 0;  // prefill rows and committed window rows recomputed
  int windows_replayed = 0;
  // Replayed windows whose logits did not give the recorded tokens again (0 with batch_invariant
  // on; with it off the recorded tokens are kept and the state is the recompute's).
  int windows_diverged = 0;
};
// The records as the export's JSON array (one object per record, the fields above by name).
std::string PreemptionsJson(const std::vector<PreemptionRecord>& records);

struct RequestSpec {
  std::string id;                    // the request id (exports, traces, results)
  std::vector<std::int32_t> prompt;  // at least one token, each inside the vocabulary
  RequestOptions options;
  // Hooks: `borrowed_hooks` when set (must outlive the request), else a copy of `hooks`.
  GenerateHooks hooks;
  const GenerateHooks* borrowed_hooks = nullptr;
  std::int64_t arrive_step = 0;  // joins the queue at this step (0 or the past: at once)
  bool keep = false;             // keep the slot as a conversation when the request ends
  // false: this request neither looks up nor stores prefix-cache entries (it runs cold and
  // leaves the cache as it was; `lockstep serve`'s "lockstep": {"cache": "bypass"}).
  bool use_prefix_cache = true;
  // Admission order: a waiting request of higher priority is admitted first and may preempt a
  // running one of lower priority (PreemptReason kPriority / kMemory); equal priorities: FIFO.
  int priority = 0;
  std::vector<PreemptAt> preempt_at;  // test hook (see PreemptAt)
};

enum class RequestEnd : std::uint8_t {
  kFinished,   // eos, max_new or a stop_check reason (GenerateResult::stop_reason)
  kCancelled,  // Cancel()
  kFailed,     // its own error (status): a hook, a replay mismatch, an engine call
  kRefused,    // never admitted: the queue was full when it arrived (status says so)
};
const char* RequestEndName(RequestEnd e);

// Why Scheduler::Submit returned an error, typed for a caller that maps refusals to answers of
// its own (lockstep serve: 400, 429, 500) without reading the message.
enum class SubmitError : std::uint8_t {
  kNone,       // Submit succeeded
  kInvalid,    // the request itself is bad (kInvalidArgument)
  kQueueFull,  // it would arrive now into a full queue (kRuntime "queue full: ...")
  kOther,      // anything else
};

struct PrefixReport {
  int reused_tokens = 0;       // prompt tokens whose state came from the prefix cache
  int snapshot_position = -1;  // the snapshot position it resumed from; -1 = cold
  int prefill_computed = 0;    // prompt rows this request's prefill actually ran
  // Why it reused no more than reused_tokens (prefix_cache.h ReuseReason); `reason_at` is P of
  // kPrefixMismatch (the first prompt token no cached prefix shares), else -1.
  ReuseReason reason = ReuseReason::kCacheOff;
  int reason_at = -1;
  int kept_tokens = 0;  // kKeptSlot: the conversation's committed tokens the slot held
};
// "no_entry", "prefix_mismatch_at=P", "snapshot_grid", ...: the reason as responses and exports
// write it.
std::string ReuseReasonText(const PrefixReport& p);

struct RequestResult {
  std::string id;
  Ticket ticket = 0;
  RequestEnd end = RequestEnd::kFinished;
  Status status;          // Ok unless kFailed / kRefused
  GenerateResult result;  // output, stop_reason, windows (each with its step fields)
  int slot = -1;          // the slot it ran in; -1 = never admitted
  std::int64_t arrive_step = 0;
  std::int64_t admit_step = -1;  // step at whose start it was admitted
  std::int64_t first_step = -1;  // first and last engine step it had rows in
  std::int64_t last_step = -1;
  PrefixReport prefix;
  std::vector<std::string> injections;  // Engine::InjectionReport() of its slot at the end
  bool kept = false;  // its slot is held as a conversation (keep = true): Continue / Release
  // Per stage, its slot's expert counters as it ended (read before the slot is freed: an
  // export's /counters); empty when it was never admitted.
  std::vector<ExpertCounters> expert_counters;
  std::vector<PreemptionRecord> preemptions;  // in order
};

struct SchedulerCounters {
  std::int64_t steps = 0;   // engine steps run
  int queue_depth = 0;      // requests waiting for a slot now
  int max_queue_depth = 0;  // the most ever waiting (after admission)
  int live = 0;             // requests holding a slot now (kept conversations too)
  std::int64_t submitted = 0;
  std::int64_t admitted = 0;
  std::int64_t finished = 0;  // ended after admission (finished, cancelled, failed)
  std::int64_t cancelled = 0;
  std::int64_t refused = 0;          // Submit refusals and queue-full arrivals
  std::uint64_t reserved_bytes = 0;  // memory reservations of the requests holding slots now
  std::uint64_t max_reserved_bytes = 0;
  std::int64_t preempted = 0;  // preemptions (a request can be preempted more than once)
  std::int64_t resumed = 0;
};

struct SchedulerOptions {
  // The slots it may use: [0, slots); 0 = every slot of the engine. Slots already open and
  // untouched (slot 0 of a fresh engine) are taken as they are.
  int slots = 0;
  // Take a slot the engine already has open as it is (its injections, no OpenSlot): Generate on
  // slot 0 of a fresh engine. false: every admission opens its slot with the request's
  // injections.
  bool adopt_open_slots = false;
  // Leave every slot as it is when the scheduler is destroyed (Generate: the engine keeps the
  // request's state for the caller to read). false: live slots are closed.
  bool leave_slots_open = false;
  // Non-empty: a preempted request's state is saved to a slot file in this folder
  // (`preempt-<ticket>-<n>.slot`, slot_file.h) and read back when it resumes (then removed);
  // empty: it resumes by recompute.
  std::string preempt_slot_dir;
};

class Scheduler {
 public:
  explicit Scheduler(Engine& engine, SchedulerOptions opts = {});
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Validates `spec` at once and queues it (or holds it until arrive_step); a request due now
  // is admitted at once while a slot is free and its reservation fits. Errors:
  // kInvalidArgument: empty prompt, a token outside the vocabulary, bad options (policy,
  // --inject, --replay-path), a request that can never fit the engine (its reservation for
  // prompt + max_new positions beyond --memory-mib: the message says how much; the model has no
  // position limit of its own);
  // kRuntime "queue full: N waiting (--queue-depth)" when it would arrive now into a full queue.
  // `why` (when given) says which, as a type.
  Result<Ticket> Submit(RequestSpec spec, SubmitError* why = nullptr);
  // Ends a waiting or live request (RequestEnd::kCancelled, output so far kept); its slot is
  // free before the next step. kInvalidArgument for an unknown or already ended ticket.
  Status Cancel(Ticket t);
  // One engine step (admission, plan, RunStep, finishing every group). false when there was
  // nothing to do: no live request, nothing queued and nothing due to arrive. When only future
  // arrivals remain, it jumps to the next arrival step (no engine step) and returns true.
  Result<bool> Step();
  // Preempts the running request `t` now (its slot is free before the next step; see the file
  // comment). kInvalidArgument for a ticket that is not running (waiting, ended, a kept
  // conversation) or cannot be preempted: --inject or grafts (their firings are not replayed), a
  // continuation or imported conversation without preempt_slot_dir (its state holds rows of
  // earlier requests' windows). kIOError when the slot file cannot be written (it keeps running).
  Status Preempt(Ticket t, PreemptReason why = PreemptReason::kRequest);
  // The ticket of the request running in `slot`; 0 when the slot is free or holds a kept
  // conversation.
  Ticket RunningIn(int slot) const;
  // Step() until it returns false.
  Status RunUntilIdle();
  // Requests that ended since the last call, in the order they ended.
  std::vector<RequestResult> TakeFinished();

  const SchedulerCounters& counters() const { return counters_; }
  // The engine's prefix cache (cfg.prefix_cache on; its counters), else null.
  const PrefixCache* prefix_cache() const { return prefix_cache_.get(); }
  // The index the next engine step will get (== counters().steps plus skipped arrival steps).
  std::int64_t step() const { return step_; }
  // One record per engine step run, in order.
  const std::vector<StepRecord>& step_records() const { return records_; }
  // Called after each engine step with its record (after the groups are finished).
  void SetStepCallback(std::function<void(const StepRecord&)> cb) { on_step_ = std::move(cb); }
  // The memory reservation Submit would charge for `spec` (engine/serve/memory.h).
  std::uint64_t ReservationBytes(const RequestSpec& spec) const;

  // ---- conversations (keep = true) ----
  // Continues a kept conversation with `more` tokens (at least one): prefill of [cur] + more
  // [0, n-1) from its committed position P on the absolute grid, then windows from more.back().
  // Returns the new ticket (the old one is spent); the slot is the same. Runs as a new request
  // through the queue-free path (its slot is already held). kInvalidArgument for a ticket that
  // is not a kept conversation or a token outside the vocabulary.
  Result<Ticket> Continue(Ticket t, std::vector<std::int32_t> more, RequestOptions opts,
                          const GenerateHooks* hooks = nullptr, bool keep = true);
  // Frees a kept conversation's slot.
  Status Release(Ticket t);
  // The kept conversation's state (its slot's snapshot shares K/V pages).
  Result<ConversationState> ExportConversation(Ticket t);
  // A kept conversation in the lowest free slot (or in `slot` when >= 0) from `state` (all or
  // nothing); its ticket. kRuntime when no slot is free (`slot` is not free) or the reservation
  // does not fit.
  Result<Ticket> ImportConversation(const ConversationState& state, int slot = -1);

 private:
  struct Entry;  // one request: spec, its Sequence, slot, result so far
  struct Plan;   // one step: the engine plan, its tokens and the entry of each group

  // ---- prefix cache hook points (engine/serve/prefix_hooks.h) ----
  // On admission, after the slot is open and before the first prefill chunk: may open the slot
  // from a snapshot (Engine::OpenSlotFrom) and move the sequence's prefill start
  // (Sequence::ResumeAt), filling the result's prefix report. Default: cold (nothing).
  Status PrefixLookupOnAdmit(Entry& e);
  // After each prefill chunk of `e` (its slot selected): capture a snapshot when the chunk end
  // is on cfg.SnapshotGrid(). Default: nothing.
  Status PrefixCaptureAfterChunk(Entry& e, int chunk_end);

  Result<std::unique_ptr<Entry>> MakeEntry(RequestSpec spec, Ticket ticket);
  void Arrive();
  void Enqueue(std::unique_ptr<Entry> e);
  void Admit();
  // The queue head needs a slot or memory held by lower-priority requests: preempts them (the
  // lowest priority, latest admitted first) while that helps; true when any was preempted.
  bool PreemptFor(const Entry& head);
  // Frees `e`'s slot (a slot file first with preempt_slot_dir); it waits again, from
  // `hold_steps` steps on.
  Status PreemptNow(Entry& e, PreemptReason why, int hold_steps);
  Status AdmitInto(Entry& e, int slot);
  // Admission of a preempted request: reopens its state (engine/serve/preempt.cpp).
  Status ResumeInto(Entry& e, int slot);
  // RequestSpec::preempt_at after a step that ran a chunk or window of `e`.
  void PreemptAtHook(Entry& e, bool decode);
  int FreeSlot() const;
  void PlanStep(Plan& plan);
  void FinishStep(Plan& plan, const Engine::StepOutputs& out, const StepRecord& rec);
  // Ends a request: its result into finished_, its slot freed (kept for a finished keep = true).
  void Finish(Entry& e, RequestEnd end, Status st);
  void EndUnadmitted(std::unique_ptr<Entry> e, RequestEnd end, Status st);
  Entry* FindLive(Ticket t);
  void Count();

  Engine& engine_;
  const SchedulerOptions opts_;
  int n_slots_ = 0;
  std::int64_t step_ = 0;
  Ticket next_ticket_ = 1;
  std::int64_t admit_seq_ = 0;                  // admission order
  std::int64_t queue_seq_ = 0;                  // first-enqueue order (FIFO within a priority)
  std::vector<std::unique_ptr<Entry>> future_;  // arrive_step > step_, submission order
  std::vector<std::unique_ptr<Entry>> queue_;   // FIFO waiting for a slot
  std::vector<std::unique_ptr<Entry>> live_;    // indexed by slot; null = free
  std::vector<RequestResult> finished_;
  std::vector<StepRecord> records_;
  std::function<void(const StepRecord&)> on_step_;
  SchedulerCounters counters_;
  std::unique_ptr<PrefixCache> prefix_cache_;  // cfg.prefix_cache on; entries share K/V pages
};

}  // namespace lockstep
