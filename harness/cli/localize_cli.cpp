// The `localize` subcommand (issue 37): flags into LocalizeRunOptions, one library call
// (lockstep/harness/localize_run.h), the reports written, the verdict mapped to the exit code:
// 0 no difference (records compared), 1 a difference (born / carried / path) or did not
// reproduce, 2 nothing comparable or bad input.
#include <iostream>
#include <memory>

#include "commands.h"
#include "commands/output.h"
#include "engine_flags.h"
#include "lockstep/harness/localize_run.h"

namespace lockstep::cli {

namespace {

struct LocalizeFlags {
  LocalizeRunOptions run;
  std::string json, md, html;
};

Status RunLocalize(const LocalizeFlags& f) {
  int on_stdout = 0;
  for (const std::string* p : {&f.json, &f.md, &f.html}) on_stdout += IsStdout(*p) ? 1 : 0;
  if (on_stdout > 1)
    return Status::InvalidArgument("localize", "only one of --json, --md, --html may be '-'");
  LOCKSTEP_ASSIGN_OR_RETURN(LocalizeRun run, RunLocalization(f.run));
  if (!f.json.empty()) LOCKSTEP_RETURN_IF_ERROR(WriteOutput(f.json, LocalizeRunJson(run)));
  if (!f.md.empty()) LOCKSTEP_RETURN_IF_ERROR(WriteOutput(f.md, LocalizeRunMarkdown(run)));
  if (!f.html.empty()) LOCKSTEP_RETURN_IF_ERROR(WriteOutput(f.html, LocalizeRunHtml(run)));
  std::ostream& out = on_stdout > 0 ? std::cerr : std::cout;
  out << "localize: " << LocalizeRunSummary(run) << "\n";
  return LocalizeRunStatus(run);
}

}  // namespace

void AddLocalize(CLI::App& app, std::vector<Command>& commands) {
  auto* lc = app.add_subcommand(
      "localize",
      "Where two runs' difference is born: the first op whose output differs with equal inputs, "
      "or the state item it was carried in (exports written with --op-digests, or a campaign run "
      "folder)");
  auto st = std::make_shared<LocalizeFlags>();
  lc->add_option("A", st->run.a, "First export, or a campaign run folder (lockstep run --out DIR)")
      ->required();
  lc->add_option("B", st->run.b, "Second export (none with a run folder)");
  lc->add_option("--comparison", st->run.comparison,
                 "Run folder: the comparison BASELINE:ARM (default: the first failing one)")
      ->type_name("A1:A2")
      ->group(kGroupCompare);
  lc->add_option("--json", st->json, "Write the lockstep.localize v1 object")
      ->type_name("PATH|-")
      ->group(kGroupReports);
  lc->add_option("--md", st->md, "Write the Markdown report")
      ->type_name("PATH|-")
      ->group(kGroupReports);
  lc->add_option("--html", st->html, "Write the HTML report")
      ->type_name("PATH|-")
      ->group(kGroupReports);
  lc->add_flag("--rerun", st->run.rerun,
               "Exports without op digests: re-run both requests (fresh processes, their recorded "
               "configs and prompts) with --op-digests all, then localise")
      ->group(kGroupCompare);
  lc->add_flag("--graft", st->run.graft,
               "A path divergence: re-run B with A's state grafted at the commit before the first "
               "divergent window; say whether the state is the cause and bisect to the item")
      ->group(kGroupCompare);
  lc->add_option("--work", st->run.work, "Folder for the re-runs' files")
      ->default_str("A's folder/localize-rerun; a run folder's localize/work-A1-A2")
      ->group(kGroupExport);
  lc->add_option("--model", st->run.model, "The model at hand for re-runs (checked by fingerprint)")
      ->default_str("the path the configs record; a run folder's model/")
      ->group(kGroupCompare);
  lc->add_flag("--no-isolate", st->run.no_isolate,
               "Parse the files in this process (trusted files only; see `diff --help`)")
      ->group(kGroupCompare);
  lc->footer(
      "Examples:\n"
      "  lockstep generate --model m --prompt hi --export A.h5 --op-digests all\n"
      "  lockstep localize A.h5 B.h5 --md -\n"
      "  lockstep localize out/aa-smoke --rerun            # a campaign's failing A/A\n"
      "  lockstep localize A.h5 B.h5 --graft --json -       # is the path divergence in the "
      "state?\n"
      "Exit: 0 no difference, 1 a difference (born / carried / path) or did not reproduce, 2 "
      "nothing comparable.");
  commands.push_back({lc, [st]() -> Status { return RunLocalize(*st); }});
}

}  // namespace lockstep::cli
