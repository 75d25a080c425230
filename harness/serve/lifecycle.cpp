#include "serve/lifecycle.h"

#include <pthread.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "serve/engine_driver.h"

namespace lockstep {

ShutdownSignals::ShutdownSignals() {
  sigemptyset(&set_);
  sigaddset(&set_, SIGTERM);
  sigaddset(&set_, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set_, &old_);
  std::signal(SIGPIPE, SIG_IGN);
}

ShutdownSignals::~ShutdownSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

int ShutdownSignals::Wait() {
  for (;;) {
    int sig = 0;
    if (sigwait(&set_, &sig) == 0) return sig;
  }
}

int Drain(EngineDriver& driver, double drain_s) {
  using Clock = std::chrono::steady_clock;
  const auto poll = std::chrono::milliseconds(20);
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(drain_s));
  while (driver.in_flight() > 0 && Clock::now() < until) std::this_thread::sleep_for(poll);
  const int left = driver.in_flight();
  if (left == 0) return 0;
  driver.CancelAll();
  const auto hard = Clock::now() + std::chrono::seconds(10);
  while (driver.in_flight() > 0 && Clock::now() < hard) std::this_thread::sleep_for(poll);
  return left;
}

}  // namespace lockstep
