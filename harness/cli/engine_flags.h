// EngineFlags: every engine option as a `lockstep generate` flag, from the one option table
// (EngineOptions() in lockstep/engine/engine_config.h): flag name, doc and default come from
// the table, so an option added there is a flag here with no edit. Plus `--config FILE`, a base
// config (canonical JSON, as --print-config prints it) that the given flags override.
//
// Not thread-safe; one instance per CLI11 app, used on the thread that parses.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <deque>
#include <string>
#include <variant>
#include <vector>

#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/status.h"

namespace lockstep {

class EngineFlags {
 public:
  // Adds --config and one flag per engine option to `app`. The flags bind storage inside `*this`,
  // so `*this` must outlive app.parse() and Build().
  void Register(CLI::App& app);

  // After app.parse(): the --config base (defaults when absent) with each flag that was given
  // applied in table order. Errors are kInvalidArgument naming the flag or the config file
  // (unreadable file: kIOError); Validate() is left to the command.
  Result<EngineConfig> Build() const;

 private:
  // One registered option: what CLI11 wrote (`text` for a table `parse`, else `value` in the
  // field's own type) and whether it was given.
  struct Slot {
    const EngineOption* option = nullptr;
    CLI::Option* cli = nullptr;
    std::string text;
    std::variant<int, std::uint64_t, double, bool, std::string, std::vector<int>,
                 std::vector<std::string>, DType>
        value;
  };
  Status Apply(const Slot& s, EngineConfig& c) const;

  std::string config_file_;
  std::deque<Slot> slots_;  // a deque: CLI11 keeps pointers into each Slot
};

}  // namespace lockstep
