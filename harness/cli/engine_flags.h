// EngineFlags: every engine option as a `lockstep generate` flag, from the one option table
// (EngineOptions() in lockstep/engine/engine_config.h): flag name, doc and default come from
// the table, so an option added there is a flag here with no edit. Plus `--config FILE`, a base
// config (canonical JSON, as --print-config prints it) that the given flags override.
//
// Each flag is listed in its row's help group (EngineOptionGroup, named below) with its default
// (the formatted field, or the row's default_text): the grouping lives in the table, so it cannot
// drift from the options.
//
// Not thread-safe; one instance per CLI11 app, used on the thread that parses.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/status.h"

namespace lockstep {

// The help groups of every command, in the order help lists them (help.h sorts by this list;
// a group not in it comes after the listed ones). A new flag names one of these.
inline constexpr const char* kGroupRequest = "Request";
inline constexpr const char* kGroupModel = "Model";
inline constexpr const char* kGroupPipeline = "Pipeline";
inline constexpr const char* kGroupService = "Service";
inline constexpr const char* kGroupServer = "HTTP server";
inline constexpr const char* kGroupSpeculative = "Speculative decoding";
inline constexpr const char* kGroupCompare = "Comparison";
inline constexpr const char* kGroupCampaign = "Campaign";
inline constexpr const char* kGroupExport = "Export and trace";
inline constexpr const char* kGroupReports = "Reports";
inline constexpr const char* kGroupCuda = "CUDA";
inline constexpr const char* kGroupDiagnostics = "Diagnostics";
const std::vector<std::string_view>& HelpGroupOrder();

// The help group of an engine option row.
std::string_view EngineGroupName(EngineOptionGroup g);

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
