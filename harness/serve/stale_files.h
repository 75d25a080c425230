// The leftovers of earlier server processes in --export-dir and --slot-dir: exports that never
// finished (`<id>.h5.partial`: a request cancelled or the server killed mid-export; hundreds of
// MB each) and atomic-write temp files (`<name>.tmp.<pid>`: a slot save killed before its
// rename). Nothing else reads them, and nothing removed them, so a server that is restarted now
// and then filled its disk. RemoveStaleFiles runs once at start.
#pragma once

#include <cstdint>
#include <ctime>
#include <string>

namespace lockstep {

struct StaleSweep {
  std::uint64_t files = 0, bytes = 0;
};

// Removes the regular files of `dir` (not its subfolders, never following a symlink) named
// `*.partial` or `*.tmp.<digits>` whose last change is older than `before` (the server's start
// less a margin: a file another live process is writing is recent, and is left alone).
StaleSweep RemoveStaleFiles(const std::string& dir, std::time_t before);

}  // namespace lockstep
