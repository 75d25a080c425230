// lockstep: the command-line entry point. Builds the CLI11 app (one setup function per command
// below), calls one library function for the subcommand given and maps its Status to the exit
// code (0 ok, 1 gate failed, 2 usage or bad input, 3 runtime failure). Engine options are not
// listed here: EngineFlags registers them from the option table (engine_flags.h).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <vector>

#include "engine_flags.h"
#include "lockstep/harness/campaign_report.h"
#include "lockstep/harness/compare_commands.h"
#include "lockstep/harness/generate_command.h"
#include "lockstep/harness/model_command.h"
#include "lockstep/harness/runner.h"

namespace {

using lockstep::Status;

// A subcommand and the library call that runs when it is the one given. The options it reads
// live in state its setup function allocated and `run` holds.
struct Command {
  CLI::App* app = nullptr;
  std::function<Status()> run;
};

// Prints a non-OK status and returns its exit code (0 for OK).
int Fail(const Status& s) {
  if (!s.ok()) std::fprintf(stderr, "lockstep: error: %s\n", s.message().c_str());
  return s.exit_code();
}

// ---- model init ----
void AddModelInit(CLI::App& app, std::vector<Command>& commands) {
  auto* model = app.add_subcommand("model", "Model files");
  model->require_subcommand(1);
  auto* init =
      model->add_subcommand("init", "Write a seeded synthetic Qwen3-Next model (HF layout)");
  struct State {
    lockstep::SyntheticOptions syn;
    std::string out_dir, dtype;
    bool no_mtp = false;
  };
  auto st = std::make_shared<State>();
  init->add_option("--preset", st->syn.preset, "tiny | small | seed48 | wide")->required();
  init->add_option("--seed", st->syn.seed, "Weight seed (same seed, byte-identical files)");
  init->add_option("--out", st->out_dir, "Output folder")->required();
  init->add_option("--dtype", st->dtype,
                   "Matrix storage dtype: f32 | bf16 | f16 (default: f32 tiny, bf16 others)");
  init->add_flag("--no-mtp", st->no_mtp, "Omit the mtp.* tensors");
  init->add_flag("--induction", st->syn.induction,
                 "Wire induction heads: the model continues repeated text");
  // The preset cut in depth and breadth, its widths kept (e.g. `wide` in 4 layers on a small GPU).
  init->add_option("--layers", st->syn.n_layers,
                   "Layers instead of the preset's (full attention every 4th)")
      ->check(CLI::Range(1, 1 << 24));
  init->add_option("--experts", st->syn.n_experts,
                   "Routed experts per MoE layer instead of the preset's")
      ->check(CLI::Range(1, 1 << 24));
  init->add_option("--experts-used", st->syn.n_experts_used,
                   "Experts per token instead of the preset's")
      ->check(CLI::Range(1, 1 << 24));
  init->add_option("--vocab", st->syn.n_vocab, "Vocabulary size instead of the preset's")
      ->check(CLI::Range(1, 1 << 24));
  commands.push_back({init, [st]() -> Status {
                        if (!st->dtype.empty()) {
                          LOCKSTEP_ASSIGN_OR_RETURN(st->syn.dtype,
                                                    lockstep::ParseModelDtype(st->dtype));
                        }
                        st->syn.with_mtp = !st->no_mtp;
                        return lockstep::RunModelInit(st->syn, st->out_dir, std::cout);
                      }});
}

// ---- generate ----
void AddGenerate(CLI::App& app, std::vector<Command>& commands) {
  auto* gen = app.add_subcommand("generate", "Run one request on the engine and print the output");
  struct State {
    lockstep::GenerateOptions opts;
    lockstep::EngineFlags flags;
  };
  auto st = std::make_shared<State>();
  lockstep::GenerateOptions& g = st->opts;
  st->flags.Register(*gen);
  gen->add_option("--prompt", g.prompt_text, "Prompt text (byte-level tokens)");
  gen->add_option("--prompt-file", g.prompt_file, "File whose bytes are the prompt");
  gen->add_option("--prompt-tokens", g.prompt_tokens,
                  "File of token ids (whitespace or comma separated)");
  gen->add_flag("--json", g.json, "Print one JSON object (tokens, stop reason, timings)");
  gen->add_option("--trace-jsonl", g.trace_jsonl,
                  "Stream window records as JSON lines (one write per window)");
  gen->add_option("--export", g.export_path, "Write state exports (lockstep.export v1 HDF5)");
  gen->add_option("--export-windows", g.export_windows,
                  "Windows that export state: all | none | LIST (default 0-2)");
  gen->add_option("--export-points", g.export_points,
                  "Checkpoints: pre_verify,post_verify,commit (default all)");
  gen->add_option("--export-compress", g.export_compress,
                  "none | lz4 (chunked, through the LZ4 HDF5 filter plugin; default none)");
  gen->add_option("--arm", g.arm, "Arm name recorded in the export");
  gen->add_option("--trace-json", g.trace_json,
                  "Write a Chrome trace-event JSON of the windows (Perfetto)");
  gen->add_option("--sample-ms", g.sample_ms, "Resource sampler interval in ms (default 100)");
  gen->add_option("--guard-min-free-mib", g.guard_min_free_mib,
                  "End the request cleanly when free memory falls below N MiB");
  gen->add_flag("--print-config", g.print_config,
                "Print the effective config as canonical JSON and exit");
  gen->add_flag("--progress", g.progress,
                "Print 'progress: prefill D/N' lines on stderr (campaign runners read them)");
  commands.push_back({gen, [st]() -> Status {
                        LOCKSTEP_ASSIGN_OR_RETURN(st->opts.config, st->flags.Build());
                        return lockstep::RunGenerateCommand(st->opts, std::cout);
                      }});
}

// ---- diff / align / summarize (the comparator: reads files, never runs the engine) ----
void AddReportOutputs(CLI::App* sc, lockstep::ReportOutputs& r) {
  sc->add_option("--json", r.json, "Write the JSON report (keys: compare/REPORTS.md)");
  sc->add_option("--md", r.md, "Write the Markdown summary (allowlisted fields only)");
  sc->add_option("--html", r.html, "Write the self-contained HTML report");
  sc->add_option("--junit", r.junit, "Write JUnit XML (one test case per item and gate)");
}

// Isolation of the HDF5 parser (export_reader.h "Isolation"): on unless --no-isolate.
void AddIsolateOptions(CLI::App* sc, bool& isolate, double& timeout_s) {
  sc->add_flag("--isolate,!--no-isolate", isolate,
               "Parse HDF5 metadata in a child process (default; --no-isolate: trusted files)");
  sc->add_option("--isolate-timeout", timeout_s,
                 "Seconds the isolated parser may take per file (default 30)")
      ->check(CLI::PositiveNumber);
}

// The options diff and summarize share; `mem_limit` is parsed when the command runs.
void AddDiffOptions(CLI::App* sc, lockstep::DiffCommandOptions& d, std::string& mem_limit) {
  sc->add_option("A", d.a, "Reference export (.h5)")->required();
  sc->add_option("B", d.b, "Export to compare (.h5)")->required();
  sc->add_option("--nrmse-max", d.diff.thresholds.nrmse_max,
                 "NRMSE threshold for every item kind (default 2e-4)");
  sc->add_option("--kl-max", d.diff.thresholds.kl_max, "Logits KL threshold (default 1e-5)");
  sc->add_option("--nrmse-kind", d.kind_overrides,
                 "Per-kind NRMSE threshold KIND=VALUE (repeatable)");
  sc->add_option("--points", d.diff.points,
                 "Checkpoints to compare (default pre_verify,post_verify,commit)");
  sc->add_option("--windows", d.diff.windows,
                 "Windows to compare: all | LIST like 0-2,5 (default all)");
  sc->add_option("--mem-limit", mem_limit, "Memory for read buffers (default 1G)");
  sc->add_option("--threads", d.diff.threads, "Items compared in parallel (0 = hardware threads)");
  sc->add_flag("--no-index", d.no_index,
               "Ignore /index/items and open every dataset (files edited by other tools)");
  AddIsolateOptions(sc, d.isolate, d.isolate_timeout_s);
  AddReportOutputs(sc, d.reports);
}

void AddDiff(CLI::App& app, std::vector<Command>& commands) {
  struct State {
    lockstep::DiffCommandOptions opts;
    std::string mem_limit = "1G";
  };
  auto st = std::make_shared<State>();
  auto* diff = app.add_subcommand(
      "diff", "Compare the state of two exports (NRMSE, KL, exact) item by item");
  AddDiffOptions(diff, st->opts, st->mem_limit);
  diff->add_flag("--quiet", st->opts.quiet, "Print the verdict line only");
  commands.push_back({diff, [st]() -> Status {
                        LOCKSTEP_ASSIGN_OR_RETURN(
                            st->opts.diff.mem_limit_bytes,
                            lockstep::ParseByteSize(st->mem_limit, "--mem-limit"));
                        return lockstep::RunDiff(st->opts, std::cout);
                      }});
}

void AddSummarize(CLI::App& app, std::vector<Command>& commands) {
  struct State {
    lockstep::SummarizeCommandOptions opts;
    std::string mem_limit = "1G";
  };
  auto st = std::make_shared<State>();
  auto* summarize =
      app.add_subcommand("summarize", "Diff + alignment of two exports with every report");
  AddDiffOptions(summarize, st->opts.diff, st->mem_limit);
  summarize->add_option("--fields", st->opts.fields,
                        "Path fields to align on (default p,T,T_mtp,merged,from_sfx,chain_n)");
  commands.push_back({summarize, [st]() -> Status {
                        LOCKSTEP_ASSIGN_OR_RETURN(
                            st->opts.diff.diff.mem_limit_bytes,
                            lockstep::ParseByteSize(st->mem_limit, "--mem-limit"));
                        return lockstep::RunSummarize(st->opts, std::cout);
                      }});
}

void AddAlign(CLI::App& app, std::vector<Command>& commands) {
  auto st = std::make_shared<lockstep::AlignCommandOptions>();
  auto* align = app.add_subcommand(
      "align", "Align the verify windows of two traces to the first path divergence");
  align->add_option("A", st->a, "Export (.h5) or trace (JSON lines)")->required();
  align->add_option("B", st->b, "Export (.h5) or trace (JSON lines)")->required();
  align->add_option("--fields", st->fields,
                    "Path fields to align on (default p,T,T_mtp,merged,from_sfx,chain_n)");
  AddIsolateOptions(align, st->isolate, st->isolate_timeout_s);
  align->add_flag("--fail-on-divergence", st->fail_on_divergence, "Exit 1 when the paths diverge");
  align->add_flag("--no-index", st->no_index, "Ignore /index/items (files edited by other tools)");
  AddReportOutputs(align, st->reports);
  commands.push_back({align, [st] { return lockstep::RunAlign(*st, std::cout); }});
}

// ---- campaigns ----
void AddRun(CLI::App& app, std::vector<Command>& commands) {
  struct State {
    lockstep::RunOptions opts;
    std::string resume_dir;
    bool no_progress = false, gate_flag = false;
  };
  auto st = std::make_shared<State>();
  auto* run = app.add_subcommand(
      "run", "Run a predeclared campaign (fresh process per arm, crash-safe ledger)");
  run->add_option("PLAN", st->opts.plan, "Campaign file (TOML, campaigns/README.md)");
  run->add_option("--out", st->opts.out_dir, "Run folder (new, or empty)");
  run->add_option("--resume", st->resume_dir, "Continue the campaign in this run folder");
  run->add_flag("--gate", st->gate_flag,
                "CI gate (accepted for scripts; every run already exits 0/1 and writes JUnit XML)");
  run->add_option("--junit", st->opts.junit, "JUnit XML path (default <run folder>/junit.xml)");
  run->add_flag("--no-progress", st->no_progress, "No progress lines on stderr");
  run->add_option("--isolate-timeout", st->opts.isolate_timeout_s,
                  "Seconds each export's isolated HDF5 parse may take (default 30)")
      ->check(CLI::PositiveNumber);
  commands.push_back(
      {run, [st]() -> Status {
         lockstep::RunOptions& r = st->opts;
         if (!st->resume_dir.empty()) {
           if (!r.out_dir.empty() && r.out_dir != st->resume_dir)
             return Status::InvalidArgument("--resume", "give the run folder once (--resume DIR)");
           r.out_dir = st->resume_dir;
           r.resume = true;
         } else if (r.plan.empty() || r.out_dir.empty()) {
           return Status::InvalidArgument(
               "run", "usage: lockstep run PLAN.toml --out DIR | lockstep run --resume DIR");
         }
         if (st->no_progress) r.progress = 0;
         return lockstep::RunCampaign(r, std::cout);
       }});
}

void AddGate(CLI::App& app, std::vector<Command>& commands) {
  struct State {
    lockstep::RunOptions opts;
    bool no_progress = false;
  };
  auto st = std::make_shared<State>();
  auto* gate = app.add_subcommand(
      "gate", "CI gate: run a campaign, write JUnit XML, exit 0 (pass) or 1 (fail)");
  gate->add_option("PLAN", st->opts.plan, "Campaign file (TOML)")->required();
  gate->add_option("--out", st->opts.out_dir, "Run folder (default out/gate/<plan>-<time>)");
  gate->add_option("--junit", st->opts.junit, "JUnit XML path (default <run folder>/junit.xml)");
  gate->add_flag("--no-progress", st->no_progress, "No progress lines on stderr");
  gate->add_option("--isolate-timeout", st->opts.isolate_timeout_s,
                   "Seconds each export's isolated HDF5 parse may take (default 30)")
      ->check(CLI::PositiveNumber);
  commands.push_back({gate, [st] {
                        lockstep::RunOptions& r = st->opts;
                        if (r.out_dir.empty()) {
                          const std::string stem = std::filesystem::path(r.plan).stem().string();
                          r.out_dir = "out/gate/" + stem + "-" +
                                      std::to_string(std::time(nullptr)) + "-" +
                                      std::to_string(::getpid());
                        }
                        if (st->no_progress) r.progress = 0;
                        return lockstep::RunCampaign(r, std::cout);
                      }});
}

void AddReport(CLI::App& app, std::vector<Command>& commands) {
  auto st = std::make_shared<lockstep::ReportOptions>();
  auto* report =
      app.add_subcommand("report", "Render a campaign run folder as Markdown / HTML / JUnit");
  report->add_option("DIR", st->dir, "Run folder")->required();
  report->add_option("--md", st->md, "Markdown path (default DIR/report.md)");
  report->add_option("--html", st->html, "HTML path (default DIR/report.html)");
  report->add_option("--junit", st->junit, "JUnit path (default DIR/junit.xml)");
  commands.push_back({report, [st] { return lockstep::RunCampaignReport(*st, std::cout); }});
}

// A first argument that is neither a flag nor a command: exit 2 naming the commands, before
// CLI11 would report it as an extra positional.
bool RejectUnknownCommand(CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  std::string names;
  for (const auto* sc : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sc->get_name() == argv[1]) return false;
    names += (names.empty() ? "" : ", ") + sc->get_name();
  }
  std::fprintf(stderr, "lockstep: usage error: unknown command '%s' (commands: %s)\n", argv[1],
               names.c_str());
  return true;
}

int Main(int argc, char** argv) {
  CLI::App app{
      "lockstep: deterministic A/A diagnostics and state diffing for a hybrid MoE inference "
      "engine"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "lockstep 0.1.0");
  std::vector<Command> commands;
  for (auto add :
       {AddModelInit, AddGenerate, AddDiff, AddSummarize, AddAlign, AddRun, AddGate, AddReport})
    add(app, commands);
  if (RejectUnknownCommand(app, argc, argv)) return 2;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "lockstep: usage error: %s\n", e.what());
    std::fprintf(stderr, "run 'lockstep --help' (or 'lockstep <command> --help') for usage\n");
    return 2;
  }
  for (const Command& c : commands)
    if (c.app->parsed()) return Fail(c.run());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep: internal error: %s\n", e.what());
    return 3;
  }
}
