// The one clock (clock.h): MonotonicNs is CLOCK_MONOTONIC and ThreadCpuNs the calling thread's CPU
// time, in nanoseconds, so every timing field (window records, stage timings, trace events,
// resource samples) lines up with the others and with an outside CLOCK_MONOTONIC reader.
#include "lockstep/engine/clock.h"

#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <cstdint>
#include <thread>

namespace lockstep {
namespace {

std::int64_t Read(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

TEST(Clock, MonotonicNsIsClockMonotonicInNanoseconds) {
  for (int i = 0; i < 100; ++i) {
    const std::int64_t before = Read(CLOCK_MONOTONIC);
    const std::int64_t t = MonotonicNs();
    const std::int64_t after = Read(CLOCK_MONOTONIC);
    EXPECT_LE(before, t);
    EXPECT_LE(t, after);
  }
}

TEST(Clock, MonotonicNsCountsSleep) {
  const std::int64_t t0 = MonotonicNs();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::int64_t dt = MonotonicNs() - t0;
  EXPECT_GE(dt, 20'000'000);
  EXPECT_LT(dt, 20'000'000'000);  // nanoseconds, not a finer unit
}

TEST(Clock, ThreadCpuNsIsThisThreadsCpuTime) {
  const std::int64_t before = Read(CLOCK_THREAD_CPUTIME_ID);
  const std::int64_t t = ThreadCpuNs();
  const std::int64_t after = Read(CLOCK_THREAD_CPUTIME_ID);
  EXPECT_LE(before, t);
  EXPECT_LE(t, after);
  // Sleeping costs (almost) no CPU time: a wall clock would count the whole 50 ms.
  const std::int64_t c0 = ThreadCpuNs();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_LT(ThreadCpuNs() - c0, 25'000'000);
}

}  // namespace
}  // namespace lockstep
