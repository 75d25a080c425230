// The lifecycle of `lockstep serve`: SIGTERM and SIGINT are taken synchronously (blocked in every
// thread, waited for by the main thread), SIGPIPE is ignored (a gone client is a failed write).
// On a signal the server drains: completions are refused with 503 and /health turns 503, running
// requests get up to --drain-s seconds, then whatever is left is cancelled (exports stay
// `.partial`), and the process exits 0.
#pragma once

#include <csignal>

namespace lockstep {

class EngineDriver;

class ShutdownSignals {
 public:
  // Blocks SIGTERM and SIGINT in the calling thread; threads started afterwards inherit it.
  ShutdownSignals();
  ~ShutdownSignals();  // restores the mask
  ShutdownSignals(const ShutdownSignals&) = delete;
  ShutdownSignals& operator=(const ShutdownSignals&) = delete;
  // Waits for SIGTERM or SIGINT; returns its number.
  int Wait();

 private:
  sigset_t set_{}, old_{};
};

// Waits until the driver has nothing in flight or `drain_s` passed; then cancels the rest and
// waits (at most 10 s more) for them to end. Returns the number of requests it cancelled.
int Drain(EngineDriver& driver, double drain_s);

}  // namespace lockstep
