// `lockstep localize` (localize_run.h): the inputs (two exports or a run folder), the re-runs and
// the reports. The graft bisection is in localize_graft.cpp.
#include "lockstep/harness/localize_run.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands/output.h"
#include "localize/localize_rerun.h"
#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/thread_pool.h"
#include "lockstep/harness/llama_arm.h"
#include "lockstep/harness/preflight.h"
#include "lockstep/harness/process.h"
#include "lockstep/harness/run_record.h"

namespace lockstep {

namespace {

bool IsDir(const std::string& p) {
  std::error_code ec;
  return std::filesystem::is_directory(p, ec);
}

// A run folder's comparison: its two exports and names. `which` "BASELINE:ARM" or "" (the first
// failing comparison that is not the positive control, in the order they were compared).
Status ResolveRunFolder(std::string dir, std::string which, LocalizeRun* run,
                        LocalizeRunOptions* o) {
  LOCKSTEP_ASSIGN_OR_RETURN(RunRead rr, ReadRun(dir));
  const RunRecord& rec = rr.record;
  const ComparisonResult* pick = nullptr;
  std::string listed;
  for (const std::string& arm : rec.compared_order) {
    const ComparisonResult& c = rec.compared.at(arm);
    listed +=
        (listed.empty() ? "" : ", ") + c.baseline + ":" + c.arm + (c.passed ? "" : " (failed)");
    if (pick != nullptr) continue;
    if (which.empty() ? !c.passed && !c.control : which == c.baseline + ":" + c.arm) pick = &c;
  }
  if (pick == nullptr)
    return Status::InvalidArgument(
        "localize " + dir,
        (which.empty() ? std::string("no comparison failed") : "no comparison " + which) +
            " in this run folder (compared: " + (listed.empty() ? "none" : listed) + ")");
  run->baseline = pick->baseline;
  run->arm = pick->arm;
  run->pair = pick->baseline + " vs " + pick->arm;
  const RunPaths paths(dir);
  for (const auto& [arm, out] : {std::pair{pick->baseline, &o->a}, std::pair{pick->arm, &o->b}}) {
    std::string e = paths.ArmDir(arm) + "/" + std::string(arm_file::kExport);
    if (!std::filesystem::exists(e))
      e = paths.ArmDir(arm) + "/r0/" + std::string(arm_file::kExport);
    if (!std::filesystem::exists(e))
      return Status::InvalidArgument("localize " + dir,
                                     "arm " + arm + " has no export (a timing arm, or it failed)");
    *out = e;
  }
  if (o->model.empty() && IsDir(paths.Model())) o->model = paths.Model();
  if (o->model.empty() && std::filesystem::exists(paths.Model() + ".gguf"))
    o->model = paths.Model() + ".gguf";  // [model] format = "gguf"
  if (o->work.empty()) o->work = dir + "/localize/work-" + pick->baseline + "-" + pick->arm;
  return Status::Ok();
}

std::string WorkDir(const LocalizeRunOptions& o) {
  if (!o.work.empty()) return o.work;
  const std::string parent = std::filesystem::path(o.a).parent_path().string();
  return parent.empty() ? "localize-rerun" : parent + "/localize-rerun";
}

Status MakeDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("localize --work '" + dir + "'", ec.message());
  return Status::Ok();
}

std::string Joined(const std::vector<std::string>& v, const char* none) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? std::string(none) : s;
}

// --rerun: both requests again with op digests, then Localize over the re-runs.
Status LocalizeByRerun(const ExportMeta& ma, const ExportMeta& mb, const LocalizeRunOptions& o,
                       const std::string& work, LocalizeRun* run) {
  LocalizeRerun& rr = run->rerun;
  LOCKSTEP_ASSIGN_OR_RETURN(rr.a,
                            RerunRequest(ma, RerunSpec{"a", true, "none", "", {}, false}, o, work));
  LOCKSTEP_ASSIGN_OR_RETURN(rr.b,
                            RerunRequest(mb, RerunSpec{"b", true, "none", "", {}, true}, o, work));
  rr.ran = true;
  rr.originals_differ = RunsDiffer(ma, mb);
  rr.knobs = TimingKnobs(ma, mb);
  LOCKSTEP_ASSIGN_OR_RETURN(auto xa, OpenOwn(rr.a));
  LOCKSTEP_ASSIGN_OR_RETURN(auto xb, OpenOwn(rr.b));
  LocalizeResult& r = run->result;
  r = Localize(xa->meta(), xb->meta());
  const std::string knobs = Joined(rr.knobs, "none active");
  if (r.verdict == LocalizeVerdict::kNoDifference) {
    r.kind = "did not reproduce";
    r.why =
        "timing-dependent: did not reproduce (the re-runs are bitwise equal in every op; the "
        "given exports " +
        std::string(rr.originals_differ ? "differ" : "do not differ in outputs or path") +
        "); timing-dependent knobs: " + knobs;
  } else if (r.verdict == LocalizeVerdict::kPath) {
    r.why += "; timing-dependent knobs: " + knobs;
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<ExportReader>> OpenOwn(const std::string& path) {
  ReaderLimits lim;
  lim.isolate = false;  // this process's own child wrote it
  return ExportReader::Open(path, lim);
}

Result<std::string> RerunRequest(const ExportMeta& m, const RerunSpec& rs,
                                 const LocalizeRunOptions& o, const std::string& work) {
  const std::string what = "localize re-run '" + rs.stem + "'";
  nlohmann::json cfg = nlohmann::json::parse(m.config_json, nullptr, false);
  if (!cfg.is_object()) return Status::InvalidArgument(what, "the export's /config is not JSON");
  if (!o.model.empty()) cfg["model"] = o.model;
  const std::string base = work + "/" + rs.stem;
  LOCKSTEP_RETURN_IF_ERROR(WriteOutput(base + ".config.json", cfg.dump() + "\n"));
  std::string ids;
  for (std::int32_t t : m.request_tokens) ids += std::to_string(t) + " ";
  LOCKSTEP_RETURN_IF_ERROR(WriteOutput(base + ".tokens", ids + "\n"));
  std::string exe = rs.side_b && !o.exe_b.empty() ? o.exe_b : o.exe;
  if (exe.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(exe, SelfExecutable());
  }
  ChildSpec spec;
  spec.argv = {exe, "generate"};
  if (cfg.value("engine", "") == "llama.cpp") {  // a llama.cpp export: its options as flags
    LOCKSTEP_ASSIGN_OR_RETURN(LlamaOptions lo, LlamaOptions::FromJson(cfg.dump(), what));
    for (std::string& f : LlamaGenerateFlags(lo)) spec.argv.push_back(std::move(f));
  } else {
    spec.argv.insert(spec.argv.end(), {"--config", base + ".config.json"});
  }
  spec.argv.insert(spec.argv.end(),
                   {"--prompt-tokens", base + ".tokens", "--export", base + ".rerun.h5",
                    "--export-windows", rs.export_windows, "--no-progress"});
  if (!rs.export_points.empty())
    spec.argv.insert(spec.argv.end(), {"--export-points", rs.export_points});
  if (rs.digests) spec.argv.insert(spec.argv.end(), {"--op-digests", "all"});
  for (const std::string& g : rs.grafts) spec.argv.insert(spec.argv.end(), {"--graft", g});
  spec.stdout_path = base + ".rerun.out";
  spec.stderr_path = base + ".rerun.err";
  spec.timeout_s = 3600;
  LOCKSTEP_ASSIGN_OR_RETURN(ChildResult cr, RunChild(spec));
  if (cr.exit_code != 0)
    return Status::Runtime(
        what, "exited " + std::to_string(cr.exit_code) + " (see " + spec.stderr_path + ")");
  LOCKSTEP_ASSIGN_OR_RETURN(auto r, OpenOwn(base + ".rerun.h5"));
  const ExportMeta& n = r->meta();
  auto refuse = [&](const std::string& fp) {
    return Status::InvalidArgument(what, "the " + fp +
                                             " at hand is not the one the export records "
                                             "(fingerprint " +
                                             fp +
                                             "_sha256 differs): refusing to call a re-run of "
                                             "another " +
                                             fp + " a reproduction");
  };
  if (n.model_sha256 != m.model_sha256) return refuse("model");
  if (n.request_sha256 != m.request_sha256) return refuse("request");
  if (!m.executable_sha256.empty() && n.executable_sha256 != m.executable_sha256)
    return refuse("executable");
  return base + ".rerun.h5";
}

std::vector<std::string> TimingKnobs(const ExportMeta& a, const ExportMeta& b) {
  std::vector<std::string> out;
  for (const ExportMeta* m : {&a, &b}) {
    auto cfg = EngineConfig::FromJson(m->config_json, "/config");
    if (!cfg.ok()) continue;
    for (const KnobFinding& k : StaticKnobs(*cfg, ThreadPool::HardwareThreads())) {
      const std::string s = k.knob + "=" + k.value;
      if (k.active && k.breaks && std::find(out.begin(), out.end(), s) == out.end())
        out.push_back(s);
    }
  }
  return out;
}

int FirstPathDivergence(const ExportMeta& a, const ExportMeta& b) {
  const std::size_t n = std::min(a.windows.size(), b.windows.size());
  for (std::size_t i = 0; i < n; ++i)
    if (!a.windows[i].SamePath(b.windows[i])) return static_cast<int>(i);
  return a.windows.size() == b.windows.size() ? -1 : static_cast<int>(n);
}

int FirstDeparture(const ExportMeta& a, const ExportMeta& b) {
  const int path = FirstPathDivergence(a, b);
  const std::size_t n = path < 0 ? a.windows.size() : static_cast<std::size_t>(path);
  std::size_t off = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t k = static_cast<std::size_t>(std::max(0, a.windows[i].accepted) + 1);
    for (std::size_t t = off; t < off + k; ++t) {
      const bool in_a = t < a.output_tokens.size(), in_b = t < b.output_tokens.size();
      if (in_a != in_b || (in_a && a.output_tokens[t] != b.output_tokens[t]))
        return static_cast<int>(i);
    }
    off += k;
  }
  return path;
}

bool RunsDiffer(const ExportMeta& a, const ExportMeta& b) {
  return a.output_tokens != b.output_tokens || FirstPathDivergence(a, b) >= 0;
}

Result<LocalizeRun> RunLocalization(const LocalizeRunOptions& given) {
  LocalizeRunOptions o = given;
  LocalizeRun run;
  if (o.b.empty()) {
    if (!IsDir(o.a))
      return Status::InvalidArgument("localize", "give two exports, or a campaign run folder");
    LOCKSTEP_RETURN_IF_ERROR(ResolveRunFolder(o.a, o.comparison, &run, &o));
  } else if (!o.comparison.empty()) {
    return Status::InvalidArgument("localize --comparison", "takes a run folder, not two exports");
  }
  run.a = o.a;
  run.b = o.b;
  ReaderLimits limits;
  limits.isolate = !o.no_isolate;
  LOCKSTEP_ASSIGN_OR_RETURN(auto ra, ExportReader::Open(o.a, limits));
  LOCKSTEP_ASSIGN_OR_RETURN(auto rb, ExportReader::Open(o.b, limits));
  const std::string work = WorkDir(o);
  if (o.graft) {
    LOCKSTEP_RETURN_IF_ERROR(MakeDir(work));
    LOCKSTEP_RETURN_IF_ERROR(LocalizeByGraft(ra->meta(), rb->meta(), o, work, &run));
    return run;
  }
  run.result = Localize(ra->meta(), rb->meta());
  if (o.rerun && run.result.verdict == LocalizeVerdict::kNothing) {
    LOCKSTEP_RETURN_IF_ERROR(MakeDir(work));
    LOCKSTEP_RETURN_IF_ERROR(LocalizeByRerun(ra->meta(), rb->meta(), o, work, &run));
  }
  return run;
}

Status LocalizeRunStatus(const LocalizeRun& run) {
  const LocalizeResult& r = run.result;
  if (run.graft.ran) {
    if (!run.graft.reproduced) return Status::GateFailed("localize", "did not reproduce");
    return Status::GateFailed("localize", "the paths differ (" + run.graft.finding + ")");
  }
  if (run.rerun.ran && r.verdict == LocalizeVerdict::kNoDifference)
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

std::string LocalizeRunSummary(const LocalizeRun& run) {
  std::string s = (run.pair.empty() ? "" : run.pair + ": ");
  if (run.graft.ran) return s + "graft: " + run.graft.finding;
  s += LocalizeVerdictLine(run.result);
  if (run.rerun.ran)
    s += "\nre-ran both requests (" + run.rerun.a + ", " + run.rerun.b + "): " + run.result.why;
  return s;
}

std::string LocalizeRunJson(const LocalizeRun& run) {
  nlohmann::json j = nlohmann::json::parse(LocalizeJson(run.result, run.a, run.b));
  if (!run.pair.empty()) {
    j["pair"] = run.pair;
    j["baseline"] = run.baseline;
    j["arm"] = run.arm;
  }
  j["sentence"] = LocalizeVerdictSentence(run);
  const LocalizeRerun& rr = run.rerun;
  if (rr.ran)
    j["rerun"] = {
        {"a", rr.a},
        {"b", rr.b},
        {"reproduced", run.graft.ran ? run.graft.reproduced
                                     : run.result.verdict != LocalizeVerdict::kNoDifference},
        {"originals_differ", rr.originals_differ},
        {"timing_knobs", rr.knobs}};
  const LocalizeGraft& g = run.graft;
  if (g.ran) {
    nlohmann::json trials = nlohmann::json::array();
    for (const GraftTrial& t : g.trials)
      trials.push_back(
          {{"items", t.items},
           {"agrees", t.agrees},
           {"first_divergence", t.first_divergence < 0 ? nlohmann::json(nullptr)
                                                       : nlohmann::json(t.first_divergence)}});
    j["graft"] = {{"divergence", g.divergence},
                  {"graft_window", g.graft_window},
                  {"point", "commit"},
                  {"reproduced", g.reproduced},
                  {"items", g.items},
                  {"differing", g.differing},
                  {"trials", std::move(trials)},
                  {"state_is_cause", g.state_is_cause},
                  {"culprit", g.culprit},
                  {"finding", g.finding}};
  }
  return j.dump(2) + "\n";
}

std::string LocalizeRunMarkdown(const LocalizeRun& run) {
  std::string md = LocalizeMarkdown(run.result, run.a, run.b);
  if (!run.pair.empty()) md = "Campaign comparison: **" + run.pair + "**\n\n" + md;
  if (run.rerun.ran)
    md += "\n## Re-runs\n\n- A: `" + run.rerun.a + "`\n- B: `" + run.rerun.b +
          "`\n- timing-dependent knobs: " + Joined(run.rerun.knobs, "none active") + "\n";
  const LocalizeGraft& g = run.graft;
  if (g.ran) {
    md += "\n## State transplant\n\n" + g.finding + "\n\n";
    md += "First divergent window " + std::to_string(g.divergence) + "; grafted at window " +
          std::to_string(g.graft_window) + " commit; " + std::to_string(g.items) +
          " state items, " + std::to_string(g.differing.size()) + " differing.\n\n";
    md += "| items grafted into B | B's path then | first divergence |\n|---|---|---|\n";
    for (const GraftTrial& t : g.trials)
      md += "| " +
            (t.items.size() > 4 ? std::to_string(t.items.size()) + " items"
                                : Joined(t.items, "none")) +
            " | " + (t.agrees ? "agrees" : "differs") + " | " +
            (t.first_divergence < 0 ? std::string("none") : std::to_string(t.first_divergence)) +
            " |\n";
  }
  return md;
}

std::string LocalizeRunHtml(const LocalizeRun& run) {
  return LocalizeHtml(run.result, run.a, run.b);
}

std::string LocalizeVerdictSentence(const LocalizeRun& run) {
  const LocalizeResult& r = run.result;
  const std::string who = run.pair.empty() ? std::string("A and B") : run.pair;
  const LocalizeGraft& g = run.graft;
  if (g.ran) return who + " " + g.finding;
  if (r.verdict == LocalizeVerdict::kNoDifference)
    return who + (run.rerun.ran
                      ? ": the re-runs did not reproduce the difference (timing-dependent)"
                      : ": no difference in " + std::to_string(r.compared) + " op records");
  if (r.verdict == LocalizeVerdict::kNothing) return who + ": nothing comparable (" + r.why + ")";
  const OpSite& f = r.first;
  const std::string from = who + " differ from window " + std::to_string(f.window) + "; ";
  if (r.verdict == LocalizeVerdict::kCarried)
    return from + "carried in " + r.item + ", born in no op";
  if (r.verdict == LocalizeVerdict::kPath) return from + "the path differs, no op born";
  std::string s = from + "born at stage " + std::to_string(f.stage) + ", ";
  if (f.layer >= 0) s += "layer " + std::to_string(f.layer) + ", ";
  s += "`" + f.op + "`, row " + std::to_string(f.row);
  s += r.kind == "same inputs, different output" ? " (inputs equal)" : " (" + r.kind + ")";
  return s;
}

nlohmann::json LocalizeSummaryJson(const LocalizeRun& run) {
  const LocalizeResult& r = run.result;
  nlohmann::json j = {{"pair", run.pair},
                      {"verdict", LocalizeVerdictName(r.verdict)},
                      {"kind", r.kind},
                      {"sentence", LocalizeVerdictSentence(run)}};
  if (r.verdict == LocalizeVerdict::kBorn || r.verdict == LocalizeVerdict::kCarried ||
      r.verdict == LocalizeVerdict::kPath) {
    j["window"] = r.first.window;
    j["stage"] = r.first.stage;
    j["layer"] = r.first.layer;
    j["op"] = r.first.op;
    j["row"] = r.first.row;
  }
  if (!r.item.empty()) j["item"] = r.item;
  if (run.graft.ran) j["state_is_cause"] = run.graft.state_is_cause;
  return j;
}

nlohmann::json AllowlistedLocalizeSummary(const nlohmann::json& summary) {
  static const char* const kKeys[] = {"pair",           "verdict", "kind",    "window",
                                      "stage",          "layer",   "op",      "row",
                                      "state_is_cause", "item",    "sentence"};
  nlohmann::json out = nlohmann::json::object();
  if (!summary.is_object()) return out;
  for (const char* k : kKeys)
    if (summary.contains(k)) out[k] = summary[k];
  return out;
}

Result<std::string> LocalizeCampaignPair(const std::string& dir, const std::string& baseline,
                                         const std::string& arm, const std::string& exe_a,
                                         const std::string& exe_b) {
  LocalizeRunOptions o;
  o.a = dir;
  o.comparison = baseline + ":" + arm;
  o.rerun = true;
  o.exe = exe_a;
  o.exe_b = exe_b;
  const RunPaths paths(dir);
  LOCKSTEP_RETURN_IF_ERROR(MakeDir(dir + "/localize"));
  Result<LocalizeRun> run = RunLocalization(o);
  if (!run.ok()) {
    const nlohmann::json err = {{"pair", baseline + " vs " + arm},
                                {"error", run.status().ToString()}};
    LOCKSTEP_RETURN_IF_ERROR(WriteOutput(paths.Localize(baseline, arm, ".json"), err.dump(2)));
    return run.status();
  }
  nlohmann::json j = nlohmann::json::parse(LocalizeRunJson(*run));
  j["summary"] = AllowlistedLocalizeSummary(LocalizeSummaryJson(*run));
  LOCKSTEP_RETURN_IF_ERROR(WriteOutput(paths.Localize(baseline, arm, ".json"), j.dump(2) + "\n"));
  LOCKSTEP_RETURN_IF_ERROR(
      WriteOutput(paths.Localize(baseline, arm, ".md"), LocalizeRunMarkdown(*run)));
  return LocalizeVerdictSentence(*run);
}

}  // namespace lockstep
