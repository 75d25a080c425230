// Where the CLI's documents go. Every --json / --md / --html / --junit of every command is
// written through WriteOutput, so "-" means stdout everywhere and a path is written atomically.
// A command with a document on stdout prints its human summary on stderr instead (main.cpp), so
// stdout carries the document alone.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep {

// True for the path that means stdout.
inline bool IsStdout(std::string_view path) { return path == "-"; }

// `content` to `path`: "-" writes it to stdout (fd 1, flushed); any other path is written with
// WriteFileAtomic (temp file + rename). An empty path writes nothing. Errors name the path
// ("stdout" for "-"): kInvalidArgument when the path's folder does not exist (a typo in the
// command line, exit 2), kIOError for a failed write (exit 3).
Status WriteOutput(const std::string& path, std::string_view content);

// (flag, path) pairs of one command: true when one of them is "-". kInvalidArgument through
// `status` when more than one is (two documents cannot share stdout); the message names both.
bool TakesStdout(const std::vector<std::pair<std::string, std::string>>& outputs, Status* status);

}  // namespace lockstep
