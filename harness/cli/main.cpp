// lockstep: the command-line entry point. Builds the CLI11 app (one setup function per command
// below), calls one library function for the subcommand given and maps its Status to the exit
// code (0 ok, 1 gate failed, 2 usage or bad input, 3 runtime failure). Engine options are not
// listed here: EngineFlags registers them from the option table (engine_flags.h).
//
// Every flag names its help group (engine_flags.h: kGroup*; help.h lists the groups in order),
// so a new flag is one line wherever it is added. Documents (--json / --md / --html / --junit)
// go through WriteOutput (output.h): "-" is stdout, and the command's human summary then goes
// to stderr.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <utility>
#include <vector>

#include "campaign_summary.h"
#include "commands.h"
#include "commands/output.h"
#include "commands/terminal.h"
#include "engine_flags.h"
#include "help.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/campaign_report.h"
#include "lockstep/harness/compare_commands.h"
#include "lockstep/harness/generate_command.h"
#include "lockstep/harness/golden.h"
#include "lockstep/harness/model_init.h"
#include "lockstep/harness/runner.h"
#include "lockstep/harness/units_executor.h"
#include "lockstep/instrument/export_writer.h"
#include "version.h"

namespace {

using lockstep::IsStdout, lockstep::Status, lockstep::TakesStdout, lockstep::WriteOutput;
using lockstep::kGroupCampaign, lockstep::kGroupCompare, lockstep::kGroupDiagnostics,
    lockstep::kGroupExport, lockstep::kGroupModel, lockstep::kGroupPipeline,
    lockstep::kGroupReports, lockstep::kGroupRequest, lockstep::kGroupServer,
    lockstep::kGroupService;

using lockstep::cli::AddModelInit, lockstep::cli::AddTokenize, lockstep::cli::AddServe,
    lockstep::cli::AddPreflight, lockstep::cli::AddLocalize, lockstep::cli::AddUnits;
using lockstep::cli::Command;

// "lockstep: <what>:" for a message on stderr, <what> in red when a person reads stderr.
std::string Prefix(const char* what) {
  return "lockstep: " +
         lockstep::Paint(what, lockstep::Tint::kRed, lockstep::ColorEnabled(stderr)) + ":";
}

// Prints a non-OK status and returns its exit code (0 for OK).
int Fail(const Status& s) {
  if (!s.ok()) std::fprintf(stderr, "%s %s\n", Prefix("error").c_str(), s.message().c_str());
  return s.exit_code();
}

using Documents = std::vector<std::pair<std::string, std::string>>;  // (flag, path)

// Where a command's human summary goes: stderr when one of its documents goes to stdout (so
// stdout carries that document alone), else stdout. Two documents on stdout: kInvalidArgument.
lockstep::Result<std::ostream*> SummaryStream(const Documents& docs) {
  Status s;
  if (!TakesStdout(docs, &s)) return &std::cout;
  if (!s.ok()) return s;
  return &std::cerr;
}

// Colour for the verdict lines of a summary written to `out` (SummaryStream's choice).
bool ColorEnabledFor(const std::ostream* out) {
  return lockstep::ColorEnabled(out == &std::cerr ? stderr : stdout);
}

Documents ReportDocuments(const lockstep::ReportOutputs& r) {
  return {{"--json", r.json}, {"--md", r.md}, {"--html", r.html}, {"--junit", r.junit}};
}

// ---- generate ----
// `generate --engine llama.cpp` (issue 38): --model FILE.gguf, --threads, --max-new and --slots
// apply too.
void AddLlamaFlags(CLI::App& gen_app, lockstep::GenerateOptions& g) {
  CLI::App* gen = &gen_app;
  gen->add_option("--engine", g.engine,
                  "lockstep | llama.cpp (scripts/install-llamacpp.sh; greedy decoding)")
      ->capture_default_str()
      ->group(kGroupModel);
  gen->add_option("--llama-batch", g.llama.batch, "llama.cpp n_batch")
      ->capture_default_str()
      ->group(kGroupModel);
  gen->add_option("--llama-ubatch", g.llama.ubatch, "llama.cpp n_ubatch")
      ->capture_default_str()
      ->group(kGroupModel);
  gen->add_option("--llama-kv-type", g.llama.kv_type, "llama.cpp K/V type: f32 | f16 | bf16 | q8_0")
      ->capture_default_str()
      ->group(kGroupModel);
  gen->add_option("--llama-flash-attn", g.llama.flash_attn,
                  "llama.cpp flash attention: off | on | auto")
      ->capture_default_str()
      ->group(kGroupModel);
  gen->add_option("--llama-kv-unified", g.llama.kv_unified,
                  "llama.cpp: one K/V buffer for all sequences (true, llama-server's default) or "
                  "one per sequence (false)")
      ->capture_default_str()
      ->group(kGroupModel);
  gen->add_option("--llama-background-prompt", g.llama.background_prompt,
                  "llama.cpp --slots: prompt tokens of each background sequence")
      ->capture_default_str()
      ->group(kGroupModel);
}

void AddGenerate(CLI::App& app, std::vector<Command>& commands) {
  auto* gen = app.add_subcommand("generate", "Run one request on the engine and print the output");
  struct State {
    lockstep::GenerateOptions opts;
    lockstep::EngineFlags flags;
    CLI::Option* json = nullptr;
    bool progress = false, no_progress = false;
  };
  auto st = std::make_shared<State>();
  lockstep::GenerateOptions& g = st->opts;
  gen->add_option("--prompt", g.prompt_text,
                  "Prompt text (the model's tokenizer.json, else byte-level tokens)")
      ->group(kGroupRequest);
  gen->add_option("--prompt-file", g.prompt_file, "File whose bytes are the prompt")
      ->group(kGroupRequest);
  gen->add_option("--prompt-tokens", g.prompt_tokens,
                  "File of token ids (whitespace or comma separated)")
      ->group(kGroupRequest);
  gen->add_option("--chat", g.chat_file,
                  "JSON file of chat messages ({\"messages\": [...]} or the array), rendered "
                  "with the model's chat template")
      ->type_name("FILE")
      ->group(kGroupRequest);
  st->json = gen->add_option("--json", g.json_path,
                             "Print one JSON object (ids, text, stop reason, timings) instead of "
                             "the text; with PATH, write it there and print the text")
                 ->expected(0, 1)
                 ->type_name("[PATH|-]")
                 ->group(kGroupRequest);
  st->flags.Register(*gen);  // the engine options, each in its row's group
  AddLlamaFlags(*gen, g);
  gen->add_option("--save-slot", g.save_slot,
                  "Save the conversation after the request (lockstep.slot v1)")
      ->type_name("FILE")
      ->group(kGroupService);
  gen->add_option("--restore-slot", g.restore_slot,
                  "Continue the conversation saved in FILE with --prompt as its next turn")
      ->type_name("FILE")
      ->group(kGroupService);
  gen->add_option("--export", g.export_path, "Write state exports (lockstep.export v1 HDF5)")
      ->group(kGroupExport);
  gen->add_option("--export-windows", g.export_windows,
                  "Windows that export state: all | none | LIST")
      ->capture_default_str()
      ->group(kGroupExport);
  gen->add_option("--export-points", g.export_points, "Checkpoints: pre_verify,post_verify,commit")
      ->capture_default_str()
      ->group(kGroupExport);
  gen->add_option("--export-compress", g.export_compress,
                  "none | lz4 (chunked, through the LZ4 HDF5 filter plugin)")
      ->default_str("none")
      ->group(kGroupExport);
  gen->add_option("--op-digests", g.op_digests,
                  "Windows whose named ops are digested per row into the export: none | all | "
                  "LIST (indices, ranges, prefill)")
      ->capture_default_str()
      ->group(kGroupExport);
  gen->add_option("--op-dump", g.op_dumps,
                  "Also store the full rows of these ops: OPS@WINDOWS (repeatable)")
      ->type_name("OPS@WINDOWS")
      ->group(kGroupExport);
  gen->add_option("--graft", g.grafts,
                  "Take a state item's value from another run's export at one checkpoint: "
                  "FROM.h5:ITEM@WINDOW:CHECKPOINT (repeatable; ITEM as diff names it)")
      ->type_name("FROM.h5:ITEM@W:POINT")
      ->group(kGroupExport);
  gen->add_option("--arm", g.arm, "Arm name recorded in the export")->group(kGroupExport);
  gen->add_option("--trace-jsonl", g.trace_jsonl,
                  "Stream window records as JSON lines (one write per window)")
      ->group(kGroupExport);
  gen->add_option("--trace-json", g.trace_json,
                  "Write a Chrome trace-event JSON of the windows (Perfetto)")
      ->group(kGroupExport);
  gen->add_option("--sample-ms", g.sample_ms, "Resource sampler interval in ms")
      ->capture_default_str()
      ->group(kGroupDiagnostics);
  gen->add_option("--guard-min-free-mib", g.guard_min_free_mib,
                  "End the request cleanly when free memory falls below N MiB")
      ->default_str("off")
      ->group(kGroupDiagnostics);
  gen->add_option("--background", g.background,
                  "Random-token background requests sharing the engine's steps (not exported): "
                  "n=N,prompt=A:B,max_new=A:B,arrive=A:B,seed=S; needs --slots 2 or more")
      ->group(lockstep::kGroupService);
  gen->add_flag("--print-config", g.print_config,
                "Print the effective config as canonical JSON and exit")
      ->group(kGroupDiagnostics);
  gen->add_flag("--progress", st->progress,
                "Prefill / decode progress and a summary line on stderr even when it is not a "
                "terminal (default: on a terminal only)")
      ->group(kGroupDiagnostics);
  gen->add_flag("--no-progress", st->no_progress, "No progress or summary line on stderr")
      ->group(kGroupDiagnostics);
  gen->footer(
      "Examples:\n"
      "  lockstep generate --model m --prompt 'Hello there' --max-new 16\n"
      "  lockstep generate --model m --prompt-file p.txt --spec 4 --export A.h5 "
      "--trace-jsonl A.jsonl\n"
      "  lockstep generate --model m --prompt hi --json - | jq .timings\n"
      "  lockstep generate --print-config --kv int8 > config.json\n"
      "  lockstep generate --model m --prompt hi --save-slot c.slot && "
      "lockstep generate --model m --restore-slot c.slot --prompt ' more'");
  commands.push_back({gen, [st]() -> Status {
                        LOCKSTEP_ASSIGN_OR_RETURN(st->opts.config, st->flags.Build());
                        st->opts.json = st->json->count() > 0;
                        if (st->opts.json_path.empty()) st->opts.json_path = "-";
                        if (st->progress && st->no_progress)
                          return Status::InvalidArgument("--progress",
                                                         "give --progress or --no-progress");
                        st->opts.progress = st->progress ? 1 : st->no_progress ? 0 : -1;
                        return lockstep::RunGenerateCommand(st->opts, std::cout);
                      }});
}

// ---- diff / align / summarize (the comparator: reads files, never runs the engine) ----
void AddReportOutputs(CLI::App* sc, lockstep::ReportOutputs& r) {
  sc->add_option("--json", r.json, "Write the JSON report (keys: compare/REPORTS.md)")
      ->type_name("PATH|-")
      ->group(kGroupReports);
  sc->add_option("--md", r.md, "Write the Markdown summary (allowlisted fields only)")
      ->type_name("PATH|-")
      ->group(kGroupReports);
  sc->add_option("--html", r.html, "Write the self-contained HTML report")
      ->type_name("PATH|-")
      ->group(kGroupReports);
  sc->add_option("--junit", r.junit, "Write JUnit XML (one test case per item and gate)")
      ->type_name("PATH|-")
      ->group(kGroupReports);
}

// Isolation of the HDF5 parser (export_reader.h "Isolation"): on unless --no-isolate.
void AddIsolateOptions(CLI::App* sc, bool& isolate, double& timeout_s) {
  sc->add_flag("--isolate,!--no-isolate", isolate,
               "Parse HDF5 metadata in a child process (default; --no-isolate: trusted files)")
      ->group(kGroupDiagnostics);
  sc->add_option("--isolate-timeout", timeout_s, "Seconds the isolated parser may take per file")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->group(kGroupDiagnostics);
}

// The options diff and summarize share; `mem_limit` is parsed when the command runs.
void AddDiffOptions(CLI::App* sc, lockstep::DiffCommandOptions& d, std::string& mem_limit) {
  sc->add_option("A", d.a, "Reference export (.h5)")->required();
  sc->add_option("B", d.b, "Export to compare (.h5)")->required();
  sc->add_option("--nrmse-max", d.diff.thresholds.nrmse_max, "NRMSE threshold for every item kind")
      ->capture_default_str()
      ->each([&d](const std::string&) { d.nrmse_max_given = true; })
      ->group(kGroupCompare);
  sc->add_option("--kl-max", d.diff.thresholds.kl_max, "Logits KL threshold")
      ->capture_default_str()
      ->each([&d](const std::string&) { d.kl_max_given = true; })
      ->group(kGroupCompare);
  sc->add_option("--nrmse-kind", d.kind_overrides,
                 "Per-kind NRMSE threshold KIND=VALUE (repeatable)")
      ->default_str("none")
      ->group(kGroupCompare);
  sc->add_option("--points", d.diff.points, "Checkpoints to compare")
      ->capture_default_str()
      ->group(kGroupCompare);
  sc->add_option("--windows", d.diff.windows, "Windows to compare: all | LIST like 0-2,5")
      ->capture_default_str()
      ->group(kGroupCompare);
  sc->add_option("--mem-limit", mem_limit, "Memory for read buffers")
      ->capture_default_str()
      ->group(kGroupDiagnostics);
  sc->add_option("--threads", d.diff.threads, "Items compared in parallel (0 = hardware threads)")
      ->capture_default_str()
      ->group(kGroupDiagnostics);
  sc->add_flag("--no-index", d.no_index,
               "Ignore /index/items and open every dataset (files edited by other tools)")
      ->group(kGroupDiagnostics);
  sc->add_option("--max-skipped", d.diff.max_skipped,
                 "Skipped items allowed before the diff fails (-1 = any)")
      ->capture_default_str()
      ->group(kGroupCompare);
  sc->add_flag("--allow-self", d.diff.allow_self,
               "Allow A and B to be the same file or the same run")
      ->group(kGroupCompare);
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
  diff->add_flag("--quiet", st->opts.quiet, "Print the verdict line only")->group(kGroupReports);
  diff->footer(
      "Examples:\n"
      "  lockstep diff A.h5 B.h5\n"
      "  lockstep diff A.h5 B.h5 --windows 0-2 --nrmse-kind ssm_state=1e-3 --html diff.html\n"
      "  lockstep diff A.h5 B.h5 --quiet --json - | jq .state.passed");
  commands.push_back({diff, [st]() -> Status {
                        LOCKSTEP_ASSIGN_OR_RETURN(
                            st->opts.diff.mem_limit_bytes,
                            lockstep::ParseByteSize(st->mem_limit, "--mem-limit"));
                        LOCKSTEP_ASSIGN_OR_RETURN(std::ostream * out,
                                                  SummaryStream(ReportDocuments(st->opts.reports)));
                        st->opts.color = ColorEnabledFor(out);
                        return lockstep::RunDiff(st->opts, *out);
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
  summarize->add_option("--fields", st->opts.fields, "Path fields to align on")
      ->capture_default_str()
      ->group(kGroupCompare);
  summarize->footer(
      "Examples:\n"
      "  lockstep summarize A.h5 B.h5 --md report.md --html report.html\n"
      "  lockstep summarize A.h5 B.h5 --json - > report.json");
  commands.push_back(
      {summarize, [st]() -> Status {
         LOCKSTEP_ASSIGN_OR_RETURN(st->opts.diff.diff.mem_limit_bytes,
                                   lockstep::ParseByteSize(st->mem_limit, "--mem-limit"));
         LOCKSTEP_ASSIGN_OR_RETURN(std::ostream * out,
                                   SummaryStream(ReportDocuments(st->opts.diff.reports)));
         st->opts.diff.color = ColorEnabledFor(out);
         return lockstep::RunSummarize(st->opts, *out);
       }});
}

void AddAlign(CLI::App& app, std::vector<Command>& commands) {
  auto st = std::make_shared<lockstep::AlignCommandOptions>();
  auto* align = app.add_subcommand(
      "align", "Align the verify windows of two traces to the first path divergence");
  align->add_option("A", st->a, "Export (.h5) or trace (JSON lines)")->required();
  align->add_option("B", st->b, "Export (.h5) or trace (JSON lines)")->required();
  align->add_option("--fields", st->fields, "Path fields to align on")
      ->capture_default_str()
      ->group(kGroupCompare);
  align
      ->add_flag("--fail-on-divergence", st->fail_on_divergence,
                 "Exit 1 when the paths diverge, are not comparable or cannot differ")
      ->group(kGroupCompare);
  AddIsolateOptions(align, st->isolate, st->isolate_timeout_s);
  align->add_flag("--no-index", st->no_index, "Ignore /index/items (files edited by other tools)")
      ->group(kGroupDiagnostics);
  align
      ->add_flag("--allow-self", st->allow_self,
                 "Allow A and B to be the same file or the same run")
      ->group(kGroupCompare);
  AddReportOutputs(align, st->reports);
  align->footer(
      "Examples:\n"
      "  lockstep align A.jsonl B.jsonl\n"
      "  lockstep align A.h5 B.h5 --fields p,T --fail-on-divergence --md align.md");
  commands.push_back({align, [st]() -> Status {
                        LOCKSTEP_ASSIGN_OR_RETURN(std::ostream * out,
                                                  SummaryStream(ReportDocuments(st->reports)));
                        st->color = ColorEnabledFor(out);
                        return lockstep::RunAlign(*st, *out);
                      }});
}

// ---- campaigns ----

// The documents of a campaign run folder: the summary (--json, from its ledger) and the JUnit
// file for "-" (the runner writes it in the folder; it is copied to stdout from there).
Status WriteCampaignDocuments(const std::string& dir, const std::string& json,
                              const std::string& junit) {
  if (IsStdout(junit)) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string xml, lockstep::ReadFile(dir + "/junit.xml"));
    LOCKSTEP_RETURN_IF_ERROR(WriteOutput("-", xml));
  }
  if (json.empty()) return Status::Ok();
  const lockstep::ReportPaths paths{dir + "/report.md", dir + "/report.html",
                                    junit.empty() ? dir + "/junit.xml" : junit};
  LOCKSTEP_ASSIGN_OR_RETURN(nlohmann::json j, lockstep::CampaignSummaryJson(dir, paths));
  return WriteOutput(json, j.dump(2) + "\n");
}

// RunCampaign with its documents: the progress text on stderr when a document takes stdout;
// the summary written when the campaign ran to a verdict (exit 0 or 1), never for a run that
// was refused (that folder's ledger may be another run's).
Status RunWithDocuments(lockstep::RunOptions r, const std::string& json,
                        const lockstep::ExecutorOptions& eo = {}) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::ostream * out,
                            SummaryStream({{"--json", json}, {"--junit", r.junit}}));
  const std::string junit = r.junit;
  if (IsStdout(junit)) r.junit.clear();  // the run folder's junit.xml, copied to stdout after
  // Units (units_executor.h): a new run with --executor units|slurm, or a resumed units folder.
  const bool units = r.resume ? lockstep::IsUnitsRunFolder(r.out_dir) : eo.executor != "local";
  const Status s = units ? lockstep::RunUnitsCampaign(r, eo, *out) : lockstep::RunCampaign(r, *out);
  if (s.exit_code() > 1) return s;
  LOCKSTEP_RETURN_IF_ERROR(WriteCampaignDocuments(r.out_dir, json, junit));
  return s;
}

void AddRun(CLI::App& app, std::vector<Command>& commands) {
  struct State {
    lockstep::RunOptions opts;
    std::string resume_dir, json, check_plan;
    bool no_progress = false, gate_flag = false;
    lockstep::ExecutorOptions exec;
  };
  auto st = std::make_shared<State>();
  auto* run = app.add_subcommand(
      "run", "Run a predeclared campaign (fresh process per arm, crash-safe ledger)");
  run->add_option("PLAN", st->opts.plan, "Campaign file (TOML, campaigns/README.md)");
  run->add_option("--out", st->opts.out_dir, "Run folder (new, or empty)")->group(kGroupCampaign);
  run->add_option("--resume", st->resume_dir, "Continue the campaign in this run folder")
      ->group(kGroupCampaign);
  run->add_option("--check-plan", st->check_plan,
                  "Say whether PLAN can pass on what it checks (its pairs and the gates that apply "
                  "to each), without running anything: exit 0, or 2 with the reason")
      ->type_name("PLAN")
      ->group(kGroupCampaign);
  run->add_option("--build", st->opts.builds, "Run the plan's build NAME from PATH (repeatable)")
      ->type_name("NAME=PATH")
      ->group(kGroupCampaign);
  run->add_option("--service-url", st->opts.service_url,
                  "Run the service arms on this lockstep serve (over the plan's [service] url)")
      ->type_name("http://HOST:PORT")
      ->group(kGroupCampaign);
  run->add_option("--service-key-env", st->opts.service_key_env,
                  "Environment variable holding that server's API key")
      ->type_name("NAME")
      ->group(kGroupCampaign);
  run->add_flag("--gate", st->gate_flag,
                "CI gate (accepted for scripts; every run already exits 0/1 and writes JUnit XML)")
      ->group(kGroupCampaign);
  run->add_option("--junit", st->opts.junit, "JUnit XML path")
      ->type_name("PATH|-")
      ->default_str("<run folder>/junit.xml")
      ->group(kGroupReports);
  run->add_option("--json", st->json, "Write the JSON summary (keys: harness/README.md)")
      ->type_name("PATH|-")
      ->group(kGroupReports);
  run->add_option("--executor", st->exec.executor,
                  "local: arms as children of this process; units: each (arm, repeat) a "
                  "`run-unit` child, merged per wave; slurm: one sbatch --array per wave")
      ->check(CLI::IsMember({"local", "units", "slurm"}))
      ->default_str("local")
      ->group(kGroupCampaign);
  run->add_option("--slurm-arg", st->exec.slurm_args,
                  "An sbatch argument for every wave (repeatable: --slurm-arg=--partition=gpu)")
      ->group(kGroupCampaign);
  run->add_flag("--no-progress", st->no_progress, "No progress lines on stderr")
      ->group(kGroupDiagnostics);
  run->footer(
      "Examples:\n"
      "  lockstep run campaigns/aa-smoke.toml --out out/smoke\n"
      "  lockstep run --resume out/smoke\n"
      "  lockstep run --check-plan campaigns/aa-demo.toml\n"
      "  lockstep run campaigns/aa-demo.toml --out out/demo --json - | jq .verdict");
  run->add_option("--isolate-timeout", st->opts.isolate_timeout_s,
                  "Seconds each export's isolated HDF5 parse may take")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->group(kGroupDiagnostics);
  commands.push_back(
      {run, [st]() -> Status {
         lockstep::RunOptions& r = st->opts;
         if (!st->check_plan.empty()) {
           if (!r.plan.empty() || !r.out_dir.empty() || !st->resume_dir.empty())
             return Status::InvalidArgument("--check-plan",
                                            "checks one plan and runs nothing: give no PLAN, "
                                            "--out or --resume with it");
           return lockstep::CheckCampaignPlan(st->check_plan, std::cout);
         }
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
         if (r.resume && st->exec.executor != "local")
           return Status::InvalidArgument("--executor",
                                          "a resumed run uses the executor it recorded");
         if (!st->exec.slurm_args.empty() && st->exec.executor != "slurm" && !r.resume)
           return Status::InvalidArgument("--slurm-arg", "applies to --executor slurm");
         return RunWithDocuments(r, st->json, st->exec);
       }});
}

void AddGate(CLI::App& app, std::vector<Command>& commands) {
  struct State {
    lockstep::RunOptions opts;
    std::string json;
    bool no_progress = false;
  };
  auto st = std::make_shared<State>();
  auto* gate = app.add_subcommand(
      "gate", "CI gate: run a campaign, write JUnit XML, exit 0 (pass) or 1 (fail)");
  gate->add_option("PLAN", st->opts.plan, "Campaign file (TOML)")->required();
  gate->add_option("--out", st->opts.out_dir, "Run folder")
      ->default_str("out/gate/<plan>-<time>-<pid>")
      ->group(kGroupCampaign);
  gate->add_option("--build", st->opts.builds, "Run the plan's build NAME from PATH (repeatable)")
      ->type_name("NAME=PATH")
      ->group(kGroupCampaign);
  gate->add_option("--service-url", st->opts.service_url,
                   "Run the service arms on this lockstep serve (over the plan's [service] url)")
      ->type_name("http://HOST:PORT")
      ->group(kGroupCampaign);
  gate->add_option("--service-key-env", st->opts.service_key_env,
                   "Environment variable holding that server's API key")
      ->type_name("NAME")
      ->group(kGroupCampaign);
  gate->add_option("--junit", st->opts.junit, "JUnit XML path")
      ->type_name("PATH|-")
      ->default_str("<run folder>/junit.xml")
      ->group(kGroupReports);
  gate->add_option("--json", st->json, "Write the JSON summary (keys: harness/README.md)")
      ->type_name("PATH|-")
      ->group(kGroupReports);
  gate->add_flag("--no-progress", st->no_progress, "No progress lines on stderr")
      ->group(kGroupDiagnostics);
  gate->footer(
      "Examples:\n"
      "  lockstep gate campaigns/aa-smoke.toml --junit out/junit.xml\n"
      "  lockstep gate campaigns/aa-smoke.toml --junit - > junit.xml\n"
      "  lockstep gate campaigns/gate-change.toml --build baseline=main/lockstep "
      "--build candidate=pr/lockstep");
  gate->add_option("--isolate-timeout", st->opts.isolate_timeout_s,
                   "Seconds each export's isolated HDF5 parse may take")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->group(kGroupDiagnostics);
  commands.push_back({gate, [st] {
                        lockstep::RunOptions& r = st->opts;
                        if (r.out_dir.empty()) {
                          const std::string stem = std::filesystem::path(r.plan).stem().string();
                          r.out_dir = "out/gate/" + stem + "-" +
                                      std::to_string(std::time(nullptr)) + "-" +
                                      std::to_string(::getpid());
                        }
                        if (st->no_progress) r.progress = 0;
                        return RunWithDocuments(r, st->json);
                      }});
}

// `report`: RunCampaignReport's three files, each through WriteOutput, and the summary.
Status RenderReport(const lockstep::ReportOptions& o, const std::string& json) {
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::ostream * out,
      SummaryStream({{"--md", o.md}, {"--html", o.html}, {"--junit", o.junit}, {"--json", json}}));
  LOCKSTEP_ASSIGN_OR_RETURN(lockstep::CampaignDocuments d, lockstep::RenderCampaign(o.dir));
  const lockstep::ReportPaths p{o.md.empty() ? o.dir + "/report.md" : o.md,
                                o.html.empty() ? o.dir + "/report.html" : o.html,
                                o.junit.empty() ? o.dir + "/junit.xml" : o.junit};
  LOCKSTEP_RETURN_IF_ERROR(WriteOutput(p.md, d.markdown));
  LOCKSTEP_RETURN_IF_ERROR(WriteOutput(p.html, d.html));
  LOCKSTEP_RETURN_IF_ERROR(WriteOutput(p.junit, d.junit));
  *out << "report: " << p.md << " (" << p.html << ", " << p.junit << ")\n";
  if (json.empty()) return Status::Ok();
  LOCKSTEP_ASSIGN_OR_RETURN(nlohmann::json j, lockstep::CampaignSummaryJson(o.dir, p));
  return WriteOutput(json, j.dump(2) + "\n");
}

void AddReport(CLI::App& app, std::vector<Command>& commands) {
  struct State {
    lockstep::ReportOptions opts;
    std::string json;
  };
  auto st = std::make_shared<State>();
  auto* report =
      app.add_subcommand("report", "Render a campaign run folder as Markdown / HTML / JUnit");
  report->add_option("DIR", st->opts.dir, "Run folder")->required();
  report->add_option("--md", st->opts.md, "Markdown path")
      ->type_name("PATH|-")
      ->default_str("DIR/report.md")
      ->group(kGroupReports);
  report->add_option("--html", st->opts.html, "HTML path")
      ->type_name("PATH|-")
      ->default_str("DIR/report.html")
      ->group(kGroupReports);
  report->add_option("--junit", st->opts.junit, "JUnit path")
      ->type_name("PATH|-")
      ->default_str("DIR/junit.xml")
      ->group(kGroupReports);
  report->add_option("--json", st->json, "Write the JSON summary (keys: harness/README.md)")
      ->type_name("PATH|-")
      ->group(kGroupReports);
  report->footer(
      "Examples:\n"
      "  lockstep report out/demo/aa-demo\n"
      "  lockstep report out/demo/aa-demo --md - | less");
  commands.push_back({report, [st] { return RenderReport(st->opts, st->json); }});
}

// The command names at the top level (and under `model`), for usage errors.
std::vector<std::string> CommandNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const auto* sc : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(sc->get_name());
  return names;
}

// A first argument that is neither a flag nor a command (or a `model` / `golden` argument that is
// no command of theirs): exit 2 naming the nearest command, before CLI11 would report an extra
// positional.
bool RejectUnknownCommand(CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  const CLI::App* level = &app;
  std::string word = argv[1], prefix;
  if (word == "model" || word == "golden") {
    if (argc < 3 || argv[2][0] == '-') return false;
    level = app.get_subcommand(word);
    prefix = word + " ";
    word = argv[2];
  }
  const std::vector<std::string> names = CommandNames(*level);
  std::string list;
  for (const std::string& n : names) {
    if (n == word) return false;
    list += (list.empty() ? "" : ", ") + n;
  }
  const std::string near = lockstep::NearestName(word, names);
  std::fprintf(stderr, "%s unknown command '%s%s'%s (commands: %s)\n",
               Prefix("usage error").c_str(), prefix.c_str(), word.c_str(),
               near.empty() ? "" : ("; did you mean " + prefix + near + "?").c_str(), list.c_str());
  return true;
}

std::string VersionText() {
  const lockstep::BuildInfo& b = lockstep::GetBuildInfo();
  return std::string("lockstep ") + b.version + "\ncommit: " + b.commit +
         "\nbuild type: " + b.build_type + "\ncuda backend: " + (b.cuda ? "on" : "off") +
         "\nexport schema: lockstep.export v" + std::to_string(lockstep::kExportSchemaVersion) +
         "\nllama.cpp: " +
         (lockstep::LlamaCppBuilt() ? std::string(lockstep::LlamaCppBuiltCommit())
                                    : std::string("not built (scripts/install-llamacpp.sh)"));
}

// ---- golden references ----

// `golden record` and `golden check` (harness/include/lockstep/harness/golden.h).
void AddGolden(CLI::App& app, std::vector<Command>& commands) {
  auto* golden = app.add_subcommand(
      "golden", "Recorded references for CI: record a plan's exports, check a build against them");
  golden->require_subcommand(1);
  golden->footer(
      "Examples:\n"
      "  lockstep golden record --plan campaigns/aa-smoke.toml --out ref/smoke\n"
      "  lockstep golden check ref/smoke");
  struct Record {
    lockstep::GoldenRecordOptions opts;
    bool no_compress = false;
  };
  auto rs = std::make_shared<Record>();
  auto* rec = golden->add_subcommand(
      "record", "Run a plan's state arms once each and store their exports and a manifest");
  rec->add_option("--plan", rs->opts.plan, "Campaign file (TOML)")
      ->required()
      ->group(kGroupCampaign);
  rec->add_option("--out", rs->opts.out_dir, "Reference folder (new or empty)")
      ->required()
      ->group(kGroupCampaign);
  rec->add_flag("--force", rs->opts.force, "Replace the reference in a non-empty --out")
      ->group(kGroupCampaign);
  rec->add_flag("--no-compress", rs->no_compress,
                "Store exports uncompressed (default: LZ4 when the HDF5 plugin is installed)")
      ->group(kGroupExport);
  rec->add_option("--json", rs->opts.json, "Write the JSON summary (keys: harness/README.md)")
      ->type_name("PATH|-")
      ->group(kGroupReports);
  rec->footer(
      "Examples:\n"
      "  lockstep golden record --plan campaigns/aa-smoke.toml --out ref/smoke\n"
      "  lockstep golden record --plan campaigns/aa-smoke.toml --out ref/smoke --force");
  commands.push_back(
      {rec, [rs]() -> Status {
         rs->opts.version = VersionText();
         rs->opts.compress = !rs->no_compress;
         LOCKSTEP_ASSIGN_OR_RETURN(std::ostream * out, SummaryStream({{"--json", rs->opts.json}}));
         return lockstep::RunGoldenRecord(rs->opts, *out);
       }});
  auto cs = std::make_shared<lockstep::GoldenCheckOptions>();
  auto* chk = golden->add_subcommand(
      "check", "Re-run a reference's requests with this build; exit 1 naming the first change");
  chk->add_option("DIR", cs->dir, "Reference folder (golden record --out)")->required();
  chk->add_option("--work", cs->work_dir, "Keep the new arms' files in this folder")
      ->default_str("a temporary folder, removed")
      ->group(kGroupCampaign);
  chk->add_option("--model", cs->model, "Model folder instead of the plan's")->group(kGroupModel);
  chk->add_option("--engine-override", cs->engine_overrides,
                  "KEY=VALUE on top of every arm's config (repeatable), e.g. inject=perturb:...")
      ->type_name("KEY=VALUE")
      ->group(kGroupCampaign);
  chk->add_flag("--thresholds", cs->thresholds,
                "Pass within the plan's [thresholds] instead of bitwise")
      ->group(kGroupCompare);
  chk->add_option("--nrmse-max", cs->nrmse_max, "NRMSE threshold (implies --thresholds)")
      ->group(kGroupCompare);
  chk->add_option("--kl-max", cs->kl_max, "Logits KL threshold (implies --thresholds)")
      ->group(kGroupCompare);
  chk->add_option("--json", cs->json, "Write the JSON summary (keys: harness/README.md)")
      ->type_name("PATH|-")
      ->group(kGroupReports);
  chk->add_option("--isolate-timeout", cs->isolate_timeout_s,
                  "Seconds each export's isolated HDF5 parse may take")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->group(kGroupDiagnostics);
  chk->footer(
      "Examples:\n"
      "  lockstep golden check ref/smoke\n"
      "  lockstep golden check ref/smoke --nrmse-max 1e-4 --json out/golden.json\n"
      "  lockstep golden check ref/smoke --engine-override inject=perturb:layer=3:item=k:eps=1e-2");
  commands.push_back(
      {chk, [cs]() -> Status {
         LOCKSTEP_ASSIGN_OR_RETURN(std::ostream * out, SummaryStream({{"--json", cs->json}}));
         return lockstep::RunGoldenCheck(*cs, *out);
       }});
}

int Main(int argc, char** argv) {
  CLI::App app{
      "lockstep: deterministic A/A diagnostics and state diffing for a hybrid MoE inference "
      "engine",
      "lockstep"};
  app.formatter(std::make_shared<lockstep::GroupedFormatter>());  // subcommands inherit it
  app.require_subcommand(1);
  app.set_version_flag("--version", VersionText());
  app.footer(
      "Examples:\n"
      "  lockstep model init --preset tiny --seed 7 --out m\n"
      "  lockstep generate --model m --prompt 'Hello there' --export A.h5 --trace-jsonl A.jsonl\n"
      "  lockstep diff A.h5 B.h5\n"
      "  lockstep run campaigns/aa-smoke.toml --out out/smoke\n"
      "Run 'lockstep <command> --help' for a command's options; harness/README.md has them all.");
  std::vector<Command> commands;
  for (auto add : {AddModelInit, AddTokenize, AddGenerate, AddDiff, AddSummarize, AddAlign, AddRun,
                   AddGate, AddReport, AddGolden, AddServe, AddPreflight, AddLocalize, AddUnits})
    add(app, commands);
  if (RejectUnknownCommand(app, argc, argv)) return 2;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    const CLI::App& given = lockstep::GivenCommand(app);
    std::string path;  // "model init " for `lockstep model init`
    for (const CLI::App* a = &given; a->get_parent() != nullptr; a = a->get_parent())
      path = a->get_name() + " " + path;
    std::fprintf(stderr, "%s %s\n", Prefix("usage error").c_str(),
                 lockstep::UsageMessage(given, e, argc, argv).c_str());
    std::fprintf(stderr, "run 'lockstep %s--help' for usage\n", path.c_str());
    return 2;
  }
  for (const Command& c : commands) {
    if (!c.app->parsed()) continue;
    const Status s = c.run();
    return s.ok() && c.ok_exit ? *c.ok_exit : Fail(s);
  }
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
