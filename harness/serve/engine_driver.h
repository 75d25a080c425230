// EngineDriver: the one thread that owns the Engine and its Scheduler (neither is thread-safe).
// HTTP handler threads hand it completions and cancellations through a command queue; it loops
// Scheduler::Step() while any request lives and sleeps on a condition variable otherwise (no
// busy loop). Each request's hooks feed its ServeJob channel: every window's emitted tokens go
// through the job's TextStream (stop strings, UTF-8) as a text delta; the end sets the result.
//
// Kept conversations (a request with lockstep.keep): the finished request's slot holds its state
// until a request continues it (id_slot), POST /slots/{id}?action=erase releases it, or the
// server stops; save writes it to a slot file, restore reads one into a free slot as a kept
// conversation (slot_actions.cpp). A continuation's prompt is the whole conversation so far
// (every token the slot holds, as /slots lists their count) followed by the new tokens: the
// slot's state is reused as llama-server reuses a slot's cache, and the new tokens continue it
// bitwise as if the conversation had never left its slot.
//
// Thread safety: Submit, Cancel, Gauges, Slots, the slot actions and Shutdown may be called from
// any thread.
#pragma once

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

class EngineDriver {
 public:
  // Borrowed: `engine`, `metrics` and `tokenizer` (the text of the tokens) outlive the driver.
  // Starts the thread.
  EngineDriver(Engine& engine, ServeMetrics& metrics, const Tokenizer& tokenizer);
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
  // `name` its file name (what the answer shows).
  using SlotAnswer = std::variant<nlohmann::json, ApiError>;
  SlotAnswer SaveSlot(int slot, const std::string& path, const std::string& name);
  SlotAnswer RestoreSlot(int slot, const std::string& path, const std::string& name);
  SlotAnswer EraseSlot(int slot);

 private:
  struct Command {
    enum Kind { kSubmit, kCancel, kCancelAll, kCall } kind;
    ServeJobPtr job;
    std::function<void()> fn;  // kCall
  };
  // A conversation held in its slot (driver thread).
  struct Kept {
    Ticket ticket = 0;
    std::vector<std::int32_t> tokens;  // every token so far; the last is not in K/V yet
    std::string id;                    // the request that produced it
  };
  // Runs `fn` on the driver thread and waits for it; false (not run) once the driver stopped.
  bool Call(std::function<void()> fn);
  SlotAnswer SaveSlotNow(int slot, const std::string& path, const std::string& name);
  SlotAnswer RestoreSlotNow(int slot, const std::string& path, const std::string& name);
  SlotAnswer EraseSlotNow(int slot);
  // A request with id_slot: continues that slot's kept conversation; false when refused (the
  // job has its error).
  bool ContinueKept(const ServeJobPtr& job);
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
  std::map<Ticket, ServeJobPtr> jobs_;  // driver thread only: live and waiting requests
  std::map<int, Kept> kept_;            // driver thread only: by slot

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> commands_;                   // GUARDED_BY(mu_)
  bool stop_ = false;                              // GUARDED_BY(mu_)
  int in_flight_ = 0;                              // GUARDED_BY(mu_)
  SchedulerCounters counters_;                     // GUARDED_BY(mu_): published after each step
  PrefixCacheCounters prefix_;                     // GUARDED_BY(mu_): likewise
  std::vector<std::pair<std::string, int>> live_;  // GUARDED_BY(mu_): (request id, slot)
  std::map<int, std::pair<std::string, std::size_t>> kept_pub_;  // GUARDED_BY(mu_): id, tokens
  std::thread thread_;
};

}  // namespace lockstep
