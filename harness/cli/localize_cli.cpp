// The `localize` subcommand (issue 37): where two exports' difference is born, from their op
// records (compare/include/lockstep/compare/localize.h). Exit 0 no difference (records
// compared), 1 a difference (born / carried / path), 2 nothing comparable or bad input.
#include <iostream>
#include <memory>

#include "commands.h"
#include "engine_flags.h"
#include "lockstep/compare/export_reader.h"
#include "lockstep/compare/localize.h"
#include "output.h"

namespace lockstep::cli {

namespace {

struct LocalizeOptions {
  std::string a, b;
  std::string json, md, html;
  bool no_isolate = false;
};

Status RunLocalize(const LocalizeOptions& o) {
  ReaderLimits limits;
  limits.isolate = !o.no_isolate;
  LOCKSTEP_ASSIGN_OR_RETURN(auto ra, ExportReader::Open(o.a, limits));
  LOCKSTEP_ASSIGN_OR_RETURN(auto rb, ExportReader::Open(o.b, limits));
  const LocalizeResult r = Localize(ra->meta(), rb->meta());
  int on_stdout = 0;
  for (const std::string* p : {&o.json, &o.md, &o.html}) on_stdout += IsStdout(*p) ? 1 : 0;
  if (on_stdout > 1)
    return Status::InvalidArgument("localize", "only one of --json, --md, --html may be '-'");
  if (!o.json.empty()) LOCKSTEP_RETURN_IF_ERROR(WriteOutput(o.json, LocalizeJson(r, o.a, o.b)));
  if (!o.md.empty()) LOCKSTEP_RETURN_IF_ERROR(WriteOutput(o.md, LocalizeMarkdown(r, o.a, o.b)));
  if (!o.html.empty()) LOCKSTEP_RETURN_IF_ERROR(WriteOutput(o.html, LocalizeHtml(r, o.a, o.b)));
  std::ostream& out = on_stdout > 0 ? std::cerr : std::cout;
  out << "localize: " << LocalizeVerdictLine(r) << "\n";
  switch (LocalizeExitCode(r)) {
    case 0:
      return Status::Ok();
    case 1:
      return Status::GateFailed("localize", "the runs differ (" + r.kind + ")");
    default:
      return Status::InvalidArgument("localize", r.why.empty() ? "nothing comparable" : r.why);
  }
}

}  // namespace

void AddLocalize(CLI::App& app, std::vector<Command>& commands) {
  auto* lc = app.add_subcommand(
      "localize",
      "Where two runs' difference is born: the first op whose output differs with equal inputs, "
      "or the state item it was carried in (exports written with --op-digests)");
  auto st = std::make_shared<LocalizeOptions>();
  lc->add_option("A", st->a, "First export (lockstep.export v1 with /ops)")->required();
  lc->add_option("B", st->b, "Second export")->required();
  lc->add_option("--json", st->json, "Write the lockstep.localize v1 object")
      ->type_name("PATH|-")
      ->group(kGroupReports);
  lc->add_option("--md", st->md, "Write the Markdown report")
      ->type_name("PATH|-")
      ->group(kGroupReports);
  lc->add_option("--html", st->html, "Write the HTML report")
      ->type_name("PATH|-")
      ->group(kGroupReports);
  lc->add_flag("--no-isolate", st->no_isolate,
               "Parse the files in this process (trusted files only; see `diff --help`)")
      ->group(kGroupCompare);
  lc->footer(
      "Examples:\n"
      "  lockstep generate --model m --prompt hi --export A.h5 --op-digests all\n"
      "  lockstep localize A.h5 B.h5 --md -\n"
      "Exit: 0 no difference, 1 a difference (born / carried / path), 2 nothing comparable.");
  commands.push_back({lc, [st]() -> Status { return RunLocalize(*st); }});
}

}  // namespace lockstep::cli
