// The setup functions of the subcommands that live outside main.cpp (one file per group of
// commands): each adds its subcommand to `app` and the library call that runs it to `commands`.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep::cli {

// A subcommand and the library call that runs when it is the one given. The options it reads
// live in state its setup function allocated and `run` holds.
struct Command {
  CLI::App* app = nullptr;
  std::function<Status()> run;
  // Where `run` left the exit code for an OK status (null, or 0: exit 0), e.g. `merge`'s 4.
  std::shared_ptr<int> ok_exit = nullptr;
};

// `model init`, `tokenize`, `detokenize` (model_cli.cpp).
void AddModelInit(CLI::App& app, std::vector<Command>& commands);
void AddTokenize(CLI::App& app, std::vector<Command>& commands);
// `serve` (serve_cli.cpp).
void AddServe(CLI::App& app, std::vector<Command>& commands);
// `preflight` (preflight_cli.cpp).
void AddPreflight(CLI::App& app, std::vector<Command>& commands);
// `localize` (localize_cli.cpp).
void AddLocalize(CLI::App& app, std::vector<Command>& commands);
// `plan expand`, `run-unit`, `merge` (units_cli.cpp).
void AddUnits(CLI::App& app, std::vector<Command>& commands);

}  // namespace lockstep::cli
