// EngineDriver: the one thread that owns the Engine and its Scheduler (neither is thread-safe).
// HTTP handler threads hand it completions and cancellations through a command queue; it loops
// Scheduler::Step() while any request lives and sleeps on a condition variable otherwise (no
// busy loop). Each request's hooks feed its ServeJob channel: every window's emitted tokens go
// through the job's TextStream (stop strings, UTF-8) as a text delta; the end sets the result.
//
// Thread safety: Submit, Cancel, Gauges, Slots and Shutdown may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "lockstep/engine/engine.h"
#include "lockstep/engine/scheduler.h"
#include "serve/metrics.h"
#include "serve/serve_job.h"

namespace lockstep {

class EngineDriver {
 public:
  // Borrowed: `engine` and `metrics` outlive the driver. Starts the thread.
  EngineDriver(Engine& engine, ServeMetrics& metrics);
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

 private:
  struct Command {
    enum Kind { kSubmit, kCancel, kCancelAll } kind;
    ServeJobPtr job;
  };
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
  Scheduler scheduler_;
  const int n_slots_;
  std::map<Ticket, ServeJobPtr> jobs_;  // driver thread only: live and waiting requests

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> commands_;                   // GUARDED_BY(mu_)
  bool stop_ = false;                              // GUARDED_BY(mu_)
  int in_flight_ = 0;                              // GUARDED_BY(mu_)
  SchedulerCounters counters_;                     // GUARDED_BY(mu_): published after each step
  std::vector<std::pair<std::string, int>> live_;  // GUARDED_BY(mu_): (request id, slot)
  std::thread thread_;
};

}  // namespace lockstep
