// Help and usage errors of the `lockstep` executable: option groups listed in HelpGroupOrder()
// (engine_flags.h) whatever order the flags were added in, and the nearest name for a misspelled
// command or flag ("did you mean --prompt?").
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep {

// CLI11's formatter with the option groups sorted: "Options" (--help, --version) first, then the
// groups of HelpGroupOrder() in that order, then any other group in the order it was first used.
class GroupedFormatter : public CLI::Formatter {
 public:
  std::string make_help(const CLI::App* app, std::string name,
                        CLI::AppFormatMode mode) const override;
};

// Optimal string alignment distance (insertions, deletions, substitutions, adjacent swaps).
std::size_t EditDistance(std::string_view a, std::string_view b);

// The candidate nearest to `word` when it is near enough to be a typo of it (distance 1 for
// words up to 4 characters, 2 up to 8, else 3; ties: the first candidate); "" otherwise.
std::string NearestName(std::string_view word, const std::vector<std::string>& candidates);

// The usage error for a command line CLI11 refused with `e`: "unknown option --promt; did you
// mean --prompt?" when an argument that starts with "--" is no option of the subcommand given
// (`parsed`: the deepest subcommand CLI11 recognised, or the app) and one is near; else e.what().
std::string UsageMessage(const CLI::App& parsed, const CLI::ParseError& e, int argc, char** argv);

// The deepest subcommand of `app` that was given on the command line (`app` itself if none).
const CLI::App& GivenCommand(const CLI::App& app);

}  // namespace lockstep
