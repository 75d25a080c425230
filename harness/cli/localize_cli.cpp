// The `localize` subcommand (issue 37): where two exports' difference is born, from their op
// records (compare/include/lockstep/compare/localize.h). Exit 0 no difference (records
// compared), 1 a difference (born / carried / path), 2 nothing comparable or bad input.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "commands/output.h"
#include "engine_flags.h"
#include "lockstep/compare/export_reader.h"
#include "lockstep/compare/localize.h"
#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/thread_pool.h"
#include "lockstep/harness/preflight.h"
#include "lockstep/harness/process.h"

namespace lockstep::cli {

namespace {

struct LocalizeOptions {
  std::string a, b;
  std::string json, md, html;
  bool no_isolate = false;
  bool rerun = false;  // exports without op digests: re-run both requests with them
  std::string work;    // --work: the re-runs' folder (default: next to A)
  std::string model;   // --model: the model at hand (default: the path the config records)
};

// What a re-run found, for the reports.
struct RerunInfo {
  bool ran = false;
  std::string a, b;                // the re-runs' exports
  bool originals_differ = false;   // outputs or window paths of the given exports differ
  std::vector<std::string> knobs;  // timing- or batch-dependent knobs active in the configs
};

// Re-runs the request `m` records as a fresh `lockstep generate` with its recorded config and
// op digests for every window, into work/<side>.rerun.h5; refuses when the re-run's fingerprints
// (model, request, executable) are not the original's.
Result<std::string> Rerun(const ExportMeta& m, const std::string& side, const LocalizeOptions& o,
                          const std::string& work) {
  nlohmann::json cfg = nlohmann::json::parse(m.config_json, nullptr, false);
  if (!cfg.is_object())
    return Status::InvalidArgument("localize --rerun", side + ": the export's /config is not JSON");
  if (!o.model.empty()) cfg["model"] = o.model;
  const std::string base = work + "/" + side;
  LOCKSTEP_RETURN_IF_ERROR(WriteOutput(base + ".config.json", cfg.dump() + "\n"));
  std::string ids;
  for (std::int32_t t : m.request_tokens) ids += std::to_string(t) + " ";
  LOCKSTEP_RETURN_IF_ERROR(WriteOutput(base + ".tokens", ids + "\n"));
  LOCKSTEP_ASSIGN_OR_RETURN(std::string self, SelfExecutable());
  ChildSpec spec;
  spec.argv = {self,
               "generate",
               "--config",
               base + ".config.json",
               "--prompt-tokens",
               base + ".tokens",
               "--export",
               base + ".rerun.h5",
               "--export-windows",
               "none",
               "--op-digests",
               "all",
               "--no-progress"};
  spec.stdout_path = base + ".rerun.out";
  spec.stderr_path = base + ".rerun.err";
  spec.timeout_s = 3600;
  LOCKSTEP_ASSIGN_OR_RETURN(ChildResult cr, RunChild(spec));
  if (cr.exit_code != 0)
    return Status::Runtime("localize --rerun", side + ": the re-run exited " +
                                                   std::to_string(cr.exit_code) + " (see " +
                                                   spec.stderr_path + ")");
  ReaderLimits lim;
  lim.isolate = false;  // this process's own child wrote it
  LOCKSTEP_ASSIGN_OR_RETURN(auto r, ExportReader::Open(base + ".rerun.h5", lim));
  const ExportMeta& n = r->meta();
  auto refuse = [&](const std::string& what) {
    return Status::InvalidArgument("localize --rerun", side + ": the " + what +
                                                           " at hand is not the one the export "
                                                           "records (fingerprint " +
                                                           what +
                                                           "_sha256 differs): refusing to "
                                                           "call a re-run of another " +
                                                           what + " a reproduction");
  };
  if (n.model_sha256 != m.model_sha256) return refuse("model");
  if (n.request_sha256 != m.request_sha256) return refuse("request");
  if (!m.executable_sha256.empty() && n.executable_sha256 != m.executable_sha256)
    return refuse("executable");
  return base + ".rerun.h5";
}

// The knobs of a recorded config that make results timing- or batch-dependent (preflight's
// static part), active ones only: "draft_policy=latency".
std::vector<std::string> TimingKnobs(const ExportMeta& m) {
  std::vector<std::string> out;
  auto cfg = EngineConfig::FromJson(m.config_json, "/config");
  if (!cfg.ok()) return out;
  for (const KnobFinding& k : StaticKnobs(*cfg, ThreadPool::HardwareThreads()))
    if (k.active && k.breaks) out.push_back(k.knob + "=" + k.value);
  return out;
}

Status RunLocalize(const LocalizeOptions& o) {
  ReaderLimits limits;
  limits.isolate = !o.no_isolate;
  LOCKSTEP_ASSIGN_OR_RETURN(auto ra, ExportReader::Open(o.a, limits));
  LOCKSTEP_ASSIGN_OR_RETURN(auto rb, ExportReader::Open(o.b, limits));
  LocalizeResult r = Localize(ra->meta(), rb->meta());
  RerunInfo rerun;
  if (o.rerun && r.verdict == LocalizeVerdict::kNothing) {
    const ExportMeta &ma = ra->meta(), &mb = rb->meta();
    std::string work = o.work;
    if (work.empty()) work = std::filesystem::path(o.a).parent_path().string() + "/localize-rerun";
    if (o.work.empty() && std::filesystem::path(o.a).parent_path().empty()) work = "localize-rerun";
    std::error_code ec;
    std::filesystem::create_directories(work, ec);
    if (ec) return Status::IOError("localize --work '" + work + "'", ec.message());
    LOCKSTEP_ASSIGN_OR_RETURN(rerun.a, Rerun(ma, "a", o, work));
    LOCKSTEP_ASSIGN_OR_RETURN(rerun.b, Rerun(mb, "b", o, work));
    rerun.ran = true;
    rerun.originals_differ =
        ma.output_tokens != mb.output_tokens || ma.windows.size() != mb.windows.size();
    for (std::size_t i = 0; !rerun.originals_differ && i < ma.windows.size(); ++i)
      rerun.originals_differ = !ma.windows[i].SamePath(mb.windows[i]);
    for (const ExportMeta* m : {&ma, &mb})
      for (const std::string& k : TimingKnobs(*m))
        if (std::find(rerun.knobs.begin(), rerun.knobs.end(), k) == rerun.knobs.end())
          rerun.knobs.push_back(k);
    ReaderLimits own = limits;
    own.isolate = false;
    LOCKSTEP_ASSIGN_OR_RETURN(auto xa, ExportReader::Open(rerun.a, own));
    LOCKSTEP_ASSIGN_OR_RETURN(auto xb, ExportReader::Open(rerun.b, own));
    r = Localize(xa->meta(), xb->meta());
    std::string knobs;
    for (const std::string& k : rerun.knobs) knobs += (knobs.empty() ? "" : ", ") + k;
    if (knobs.empty()) knobs = "none active";
    if (r.verdict == LocalizeVerdict::kNoDifference) {
      r.kind = "did not reproduce";
      r.why =
          "timing-dependent: did not reproduce (the re-runs are bitwise equal in every op; "
          "the given exports " +
          std::string(rerun.originals_differ ? "differ" : "do not differ in outputs or path") +
          "); timing-dependent knobs: " + knobs;
    } else if (r.verdict == LocalizeVerdict::kPath) {
      r.why += "; timing-dependent knobs: " + knobs;
    }
  }
  int on_stdout = 0;
  for (const std::string* p : {&o.json, &o.md, &o.html}) on_stdout += IsStdout(*p) ? 1 : 0;
  if (on_stdout > 1)
    return Status::InvalidArgument("localize", "only one of --json, --md, --html may be '-'");
  if (!o.json.empty()) {
    nlohmann::json j = nlohmann::json::parse(LocalizeJson(r, o.a, o.b));
    if (rerun.ran)
      j["rerun"] = {{"a", rerun.a},
                    {"b", rerun.b},
                    {"reproduced", r.verdict != LocalizeVerdict::kNoDifference},
                    {"originals_differ", rerun.originals_differ},
                    {"timing_knobs", rerun.knobs}};
    LOCKSTEP_RETURN_IF_ERROR(WriteOutput(o.json, j.dump(2) + "\n"));
  }
  if (!o.md.empty()) LOCKSTEP_RETURN_IF_ERROR(WriteOutput(o.md, LocalizeMarkdown(r, o.a, o.b)));
  if (!o.html.empty()) LOCKSTEP_RETURN_IF_ERROR(WriteOutput(o.html, LocalizeHtml(r, o.a, o.b)));
  std::ostream& out = on_stdout > 0 ? std::cerr : std::cout;
  out << "localize: " << LocalizeVerdictLine(r) << "\n";
  if (rerun.ran)
    out << "localize: re-ran both requests (" << rerun.a << ", " << rerun.b << "): " << r.why
        << "\n";
  if (rerun.ran && r.verdict == LocalizeVerdict::kNoDifference)
    return Status::GateFailed("localize", "did not reproduce");
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
  lc->add_flag("--rerun", st->rerun,
               "Exports without op digests: re-run both requests (fresh processes, their recorded "
               "configs and prompts) with --op-digests all, then localise")
      ->group(kGroupCompare);
  lc->add_option("--work", st->work, "Folder for the re-runs' files")
      ->default_str("A's folder/localize-rerun")
      ->group(kGroupExport);
  lc->add_option("--model", st->model, "The model at hand for --rerun (checked by fingerprint)")
      ->default_str("the path the configs record")
      ->group(kGroupCompare);
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
