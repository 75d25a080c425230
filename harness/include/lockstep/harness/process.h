// Child processes for campaign arms: fork + execv with stdout/stderr redirected to files, waited
// for with a periodic callback (progress). Every arm is a fresh process, so no state (caches,
// thread pools, allocator layout, first-call effects) leaks from one arm into the next.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep {

struct ChildSpec {
  std::vector<std::string> argv;  // argv[0] is the executable path
  std::string stdout_path;        // truncated and written by the child
  std::string stderr_path;
};

struct ChildResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;      // the signal that ended it (0: exited)
  double seconds = 0.0;
};

// Runs the child to completion; `tick` (if set) is called about every 200 ms while it runs.
Result<ChildResult> RunChild(const ChildSpec& spec, const std::function<void()>& tick = nullptr);

// Absolute path of the running executable (/proc/self/exe).
Result<std::string> SelfExecutable();

}  // namespace lockstep
