// The one clock every timing field in lockstep uses: CLOCK_MONOTONIC nanoseconds (window records,
// stage timings, trace events, resource samples), and the calling thread's CPU time beside it.
//
// Inline on purpose: each read is one clock_gettime through the vDSO (no system call), and
// TraceRing::Record's hot path must stay that one read (see the cost note in trace_ring.h).
// Thread safety: both functions may be called from any thread.
#pragma once

#include <time.h>

#include <cstdint>

namespace lockstep {

// CLOCK_MONOTONIC in ns: never jumps with the wall clock; comparable across the threads and the
// processes of one boot (the trace and the resource samples share it).
inline std::int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// CLOCK_THREAD_CPUTIME_ID in ns: CPU time the calling thread has used (StageTiming::cpu_ns).
inline std::int64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace lockstep
