// The setup functions of the subcommands that live outside main.cpp (one file per group of
// commands): each adds its subcommand to `app` and the library call that runs it to `commands`.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep::cli {

// A subcommand and the library call that runs when it is the one given. The options it reads
// live in state its setup function allocated and `run` holds.
struct Command {
  CLI::App* app = nullptr;
  std::function<Status()> run;
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

}  // namespace lockstep::cli
