// The child processes lockstep starts for commands:
//   RunChild     fork + execv of a command (a campaign arm: `lockstep generate --config ...`),
//                stdout/stderr to files, waited for with a periodic callback (progress).
// (The HDF5 parser's isolation is the export reader's own: compare/isolated_open.cpp.)
// Every arm is a fresh process, so no state (caches, thread pools, allocator layout, first-call
// effects) leaks from one arm into the next.
//
// Without ChildSpec::timeout_s a child that never exits blocks its caller (the runner's progress
// tick still runs). It does not change the caller's signal dispositions.
#pragma once

#include <sys/types.h>

#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep {

// ---- RunChild: a command in a fresh process ----

struct ChildSpec {
  std::vector<std::string> argv;  // argv[0] is the executable path (no PATH search)
  std::string stdout_path;        // truncated and written by the child
  std::string stderr_path;
  double timeout_s = 0.0;  // > 0: SIGKILL at this wall time (ChildResult::timed_out)
};

struct ChildResult {
  int exit_code = -1;      // -1 when killed by a signal
  int signal = 0;          // the signal that ended it (0: exited)
  double seconds = 0.0;    // wall time from fork to reap (steady clock)
  bool timed_out = false;  // killed at ChildSpec::timeout_s
};

// Runs the command to completion; `tick` (if set) is called about every 200 ms on the calling
// thread while it runs (it must not block for long: the child is reaped between ticks).
// The child: its stdout and stderr are the two files (opened here, so a bad path is an error
// before anything runs), its other descriptors are this process's minus the O_CLOEXEC ones, and
// it gets SIGKILL when the calling process dies (PR_SET_PDEATHSIG; an orphan would keep writing
// into a folder the resumed runner reuses).
// Results: the child's outcome, whatever it is — a crash is `signal` != 0 (exit_code -1), a
// failed exec is exit code 127 with a line in the stderr file, 126 if the parent was already
// gone. A Status error only when nothing ran or the wait failed: kInvalidArgument (empty argv),
// kIOError (an output file cannot be created), kRuntime (fork or waitpid failed).
Result<ChildResult> RunChild(const ChildSpec& spec, const std::function<void()>& tick = nullptr);

// Starts the command as RunChild does (the same files, descriptors and PR_SET_PDEATHSIG) and
// returns its pid without waiting (ChildSpec::timeout_s is not applied): the caller reaps it
// (a `lockstep serve` the runner keeps while arms run). Errors as RunChild's before the wait.
Result<pid_t> SpawnChild(const ChildSpec& spec);

// Absolute path of the running executable (/proc/self/exe); kRuntime when it cannot be read.
Result<std::string> SelfExecutable();

}  // namespace lockstep
