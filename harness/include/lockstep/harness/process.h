// Every child process lockstep starts, in one place:
//   RunChild     fork + execv of a command (a campaign arm: `lockstep generate --config ...`),
//                stdout/stderr to files, waited for with a periodic callback (progress).
//   RunIsolated  fork without exec: a function run in a copy of this process, its Status and its
//                text sent back over a pipe (`diff` / `align` / `summarize --isolate`), so a
//                crash in a library (HDF5 on a malformed file) cannot take the caller down.
// Every arm is a fresh process, so no state (caches, thread pools, allocator layout, first-call
// effects) leaks from one arm into the next.
//
// Neither has a timeout: a child that never exits blocks its caller (the runner's progress tick
// still runs). Neither changes the caller's signal dispositions. Call them from one thread at a
// time: a child forked by a concurrent call inherits this call's descriptors (RunIsolated's pipe
// is not close-on-exec), which can hold the pipe open until that other child exits.
#pragma once

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
};

struct ChildResult {
  int exit_code = -1;    // -1 when killed by a signal
  int signal = 0;        // the signal that ended it (0: exited)
  double seconds = 0.0;  // wall time from fork to reap (steady clock)
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

// Absolute path of the running executable (/proc/self/exe); kRuntime when it cannot be read.
Result<std::string> SelfExecutable();

// ---- RunIsolated: a function in a forked copy of this process ----

// Runs `fn` in a forked child and returns its Status as seen from the parent, after copying what
// `fn` wrote to its stream onto `out` (nothing is copied unless the child delivered its result).
// The child: a copy of this process with only the calling thread (so `fn` must not need other
// threads, or locks they may hold; it may start its own), stdio flushed before the fork; what it
// changes in memory is lost, the files it writes are its own writes (use atomic writes). It ends
// with _exit (no atexit handlers, no static destructors).
// Results: `fn`'s Status (code and message) when the child finished; kInvalidArgument naming
// `what` and the signal when the child was killed by one (a crash while reading a malformed file
// is a bad input: exit 2), an exception escaping `fn` included (std::terminate: SIGABRT);
// kRuntime when the pipe or fork fails, the child exits without a result (it called exit() or
// its write to the pipe failed) or the result is garbled.
Status RunIsolated(const std::string& what, const std::function<Status(std::ostream&)>& fn,
                   std::ostream& out);

}  // namespace lockstep
