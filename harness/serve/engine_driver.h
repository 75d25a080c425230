// EngineDriver: the one thread that owns the Engine and its Scheduler (neither is thread-safe).
// HTTP handler threads hand it completions and cancellations through a command queue; it loops
// Scheduler::Step() while any request lives and sleeps on a condition variable otherwise (no
// busy loop). Each request's hooks feed its ServeJob channel: every window's emitted tokens go
// through the job's TextStream (stop strings, UTF-8) as a text delta; the end sets the result.
//
// Kept conversations (a request with lockstep.keep): the finished request's slot holds its state
// until a request continues it (id_slot), POST /slots/{id}?action=erase releases it, the driver
// releases it (KeepPolicy below) or the server stops; save writes it to a slot file, restore
// reads one into a free slot as a kept conversation (slot_actions.cpp). Held state never starves
// admission: before each step, every new request waiting beyond the free slots takes the least
// recently used kept conversation's slot ("evicted"; LRU by the time it was kept, restored or last
// continued), and one is evicted when a step ran nothing while requests wait (their memory
// reservations do not fit beside the kept ones'). A conversation not continued for
// KeepPolicy::idle_s is released ("idle"), keeping more than KeepPolicy::max releases the LRU one
// ("cap"). Every release is POST /slots/{id}?action=erase's (ReleaseKept: the scheduler's Release,
// so the prefix cache keeps what it stored); a continuation of a released slot is refused with 409
// naming the reason, and the client resends the whole conversation without id_slot. A
// continuation's prompt is the whole conversation so far (every token the slot holds, as /slots
// lists their count) followed by the new tokens: the slot's state is reused as llama-server reuses
// a slot's cache, and the new tokens continue it bitwise as if the conversation had never left its
// slot.
//
// Thread safety: Submit, Cancel, Gauges, Slots, the slot actions and Shutdown may be called from
// any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "lockstep/engine/engine.h"
#include "lockstep/engine/prefix_cache.h"
#include "lockstep/engine/scheduler.h"
#include "lockstep/engine/tokenizer.h"
#include "serve/api_error.h"
#include "serve/metrics.h"
#include "serve/serve_job.h"

namespace lockstep {

// When the driver releases kept conversations by itself (`lockstep serve --keep-max /
// --keep-idle`).
struct KeepPolicy {
  int max = -1;       // kept conversations at most (keeping one more releases the LRU); -1 = any
  double idle_s = 0;  // seconds without a continuation before a release; 0 = never
};

class EngineDriver {
 public:
  // Borrowed: `engine`, `metrics` and `tokenizer` (the text of the tokens) outlive the driver.
  // Starts the thread.
  EngineDriver(Engine& engine, ServeMetrics& metrics, const Tokenizer& tokenizer,
               KeepPolicy keep = {});
  ~EngineDriver();  // Shutdown(), then joins
  EngineDriver(const EngineDriver&) = delete;
  EngineDriver& operator=(const EngineDriver&) = delete;

  // Queues `job` (its options, prompt and exporter set). The job's channel then says whether the
  // scheduler took it (accepted) or refused it (error: 400 bad request, 429 queue full).
  void Submit(ServeJobPtr job);
  // Ends `job` wherever it is (waiting or running); its slot is free before the next step.
  void Cancel(ServeJobPtr job);
  // Cancels every request still in flight (the drain limit passed).
  void CancelAll();
  // Stops the thread after cancelling what is left; Submit afterwards refuses with 503.
  void Shutdown();

  int in_flight() const;  // requests submitted and not yet ended
  ServeGauges Gauges() const;
  nlohmann::json Slots() const;  // GET /slots

  // POST /slots/{id}?action=... on the driver thread between two steps (slot_actions.cpp): the
  // answer's JSON (llama-server's fields) or the refusal. `path` is the file under --slot-dir,
  // `name` its file name (what the answer shows); a restore gets the file's `bytes`, read on the
  // HTTP thread (slot_actions.cpp: ReadSlotFile), so no file read blocks the engine.
  using SlotAnswer = std::variant<nlohmann::json, ApiError>;
  SlotAnswer SaveSlot(int slot, const std::string& path, const std::string& name);
  SlotAnswer RestoreSlot(int slot, std::string bytes, const std::string& name);
  SlotAnswer EraseSlot(int slot);
  // POST /slots/{id}?action=preempt: the request running in the slot is preempted (Scheduler::
  // Preempt); its client sees nothing but a pause. {"id_slot", "preempted" (its request id),
  // "n_tokens" (its tokens so far)}; 409 when the slot runs no request or it cannot be preempted.
  SlotAnswer PreemptSlot(int slot);

 private:
  struct Command {
    enum Kind { kSubmit, kCancel, kCancelAll, kCall } kind;
    ServeJobPtr job;
    std::function<void()> fn;  // kCall
  };
  // A conversation held in its slot (driver thread).
  using Clock = std::chrono::steady_clock;
  struct Kept {
    Ticket ticket = 0;
    std::vector<std::int32_t> tokens;  // every token so far; the last is not in K/V yet
    std::string id;                    // the request that produced it
    Clock::time_point since;           // kept, restored or last continued (LRU, idle)
  };
  // What a kept conversation held by /slots shows (published under mu_).
  struct KeptView {
    std::string id;
    std::size_t n_tokens = 0;
    Clock::time_point since;
  };
  // Why a slot's last kept conversation was released: evicted | idle | cap | erased.
  struct ReleasedKept {
    std::string reason;
    std::string id;
  };
  // Runs `fn` on the driver thread and waits for it; false (not run) once the driver stopped.
  bool Call(std::function<void()> fn);
  SlotAnswer SaveSlotNow(int slot, const std::string& path, const std::string& name);
  SlotAnswer RestoreSlotNow(int slot, const std::string& bytes, const std::string& name);
  SlotAnswer EraseSlotNow(int slot);
  SlotAnswer PreemptSlotNow(int slot);
  // A request with id_slot: continues that slot's kept conversation; false when refused (the
  // job has its error).
  bool ContinueKept(const ServeJobPtr& job);
  // The one release of a kept conversation (erase, eviction, idle, cap): the scheduler frees
  // the slot, `reason` is counted and remembered for the slot's next continuation.
  Status ReleaseKept(int slot, const std::string& reason);
  // A kept conversation was just installed: releases the LRU ones beyond KeepPolicy::max.
  void CapKept();
  // Before each step: idle conversations released, then one per new request that waits beyond
  // the free slots (LRU first), or one when the last step ran nothing (`stalled`) while requests
  // wait with slots free (their memory reservations do not fit beside the kept ones).
  void ReclaimKept(bool stalled);
  int LruKept() const;  // the slot of the least recently used kept conversation (kept_ not empty)
  // The 409 of a continuation of `slot`, which holds no kept conversation.
  ApiError NotKept(int slot) const;
  Clock::duration IdleLimit() const;  // KeepPolicy::idle_s (> 0)
  // The loop's sleep: until a command, a request or the next idle release is due.
  void WaitForWork(std::unique_lock<std::mutex>& lk);
  void Accept(const ServeJobPtr& job, Ticket t);
  void Refuse(const ServeJobPtr& job, ApiError e);
  void Loop();
  void Run(const Command& c);
  void SubmitNow(const ServeJobPtr& job);
  void InstallHooks(ServeJob& job);
  void OnWindow(ServeJob& job, const WindowRecord& rec);
  void Deliver(RequestResult res);
  void FailLost();
  void Publish();

  Engine& engine_;
  ServeMetrics& metrics_;
  const Tokenizer& tokenizer_;
  Scheduler scheduler_;
  const int n_slots_;
  const KeepPolicy keep_;
  std::map<Ticket, ServeJobPtr> jobs_;    // driver thread only: live and waiting requests
  std::map<int, Kept> kept_;              // driver thread only: by slot
  std::map<int, ReleasedKept> released_;  // driver thread only: by slot, until it keeps again

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> commands_;                   // GUARDED_BY(mu_)
  bool stop_ = false;                              // GUARDED_BY(mu_)
  int in_flight_ = 0;                              // GUARDED_BY(mu_)
  SchedulerCounters counters_;                     // GUARDED_BY(mu_): published after each step
  PrefixCacheCounters prefix_;                     // GUARDED_BY(mu_): likewise
  std::vector<std::pair<std::string, int>> live_;  // GUARDED_BY(mu_): (request id, slot)
  std::map<int, KeptView> kept_pub_;               // GUARDED_BY(mu_)
  std::map<int, std::string> released_pub_;        // GUARDED_BY(mu_): reasons
  std::thread thread_;
};

}  // namespace lockstep
