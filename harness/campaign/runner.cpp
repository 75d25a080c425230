#include "lockstep/harness/runner.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <set>

#include "campaign/service_arm.h"
#include "lockstep/compare/export_reader.h"
#include "lockstep/compare/report.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/model_config.h"
#include "lockstep/engine/tokenizer.h"
#include "lockstep/engine/weights.h"
#include "lockstep/harness/builds.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/campaign_report.h"
#include "lockstep/harness/chat_prompt.h"
#include "lockstep/harness/gates.h"
#include "lockstep/harness/localize_run.h"
#include "lockstep/harness/model_init.h"
#include "lockstep/harness/process.h"
#include "lockstep/harness/prompt_text.h"
#include "lockstep/harness/run_record.h"
#include "lockstep/harness/units.h"
#include "lockstep/harness/verdict.h"
#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

namespace fs = std::filesystem;

// The model is fixed by the plan, while its folder differs between run folders (the ledgers of
// two runs stay comparable).
std::string EngineConfigHash(EngineConfig cfg) {
  cfg.model.clear();
  return Sha256Hex(cfg.ToJson());
}

namespace {

using ArmRepeat = std::pair<std::string, int>;

// Whether an arm's exit code means it ran: 0, or 1 (it ran and something it checks failed).
// Anything else (2 bad input, 3 runtime failure, a signal) is a failed arm (issue 35).
bool ArmRan(int exit_code) { return exit_code == 0 || exit_code == 1; }

// What the ledger says has happened (replayed on resume; kept current while running).
using RunState = RunRecord;

struct Runner {
  const RunOptions& opts;
  std::ostream& out;
  Campaign c;
  std::string dir, exe, model_dir, tokens_path;
  std::optional<Ledger> ledger;
  RunState st;
  bool progress = false;
  std::map<std::string, ArmBuild> builds;  // every build an arm uses (ArmBuildName)
  std::unique_ptr<ServiceHost> host;       // the servers of service arms (at the first one)
  // The plan's model as exports fingerprint it: SHA-256 over its checkpoint files.
  std::string model_sha256;
  bool pending = false;  // opts.source had not run an arm yet: stopped there, no verdict

  const ArmBuild& BuildOf(const ArmSpec& arm) const { return builds.at(ArmBuildName(arm)); }

  // The arm's build must still be the file that was probed (and recorded) when the campaign
  // started: a build replaced since would make the ledger's digests false.
  Status CheckBuild(const ArmBuild& b) const {
    auto sha = Sha256File(b.path);
    if (sha.ok() && *sha == b.sha256) return Status::Ok();
    return Status::InvalidArgument(
        "build '" + b.name + "' (" + b.path + ")",
        sha.ok() ? fmt::format("changed since the campaign started (SHA-256 {} now, {} recorded): "
                               "refusing to run arms on it; start a new run folder",
                               sha->substr(0, 12), b.sha256.substr(0, 12))
                 : "cannot be read any more: " + sha.status().message());
  }

  std::string ArmDir(const ArmSpec& spec, int repeat) const {
    return RunPaths(dir).RepeatDir(spec, repeat);
  }

  Status Append(const std::string& event, const std::string& arm, const nlohmann::json& data) {
    LOCKSTEP_ASSIGN_OR_RETURN(LedgerEntry e, ledger->Append(event, arm, data, /*sync=*/true));
    st.Apply(e);
    return Status::Ok();
  }

  Status ProvisionModel() {
    LOCKSTEP_ASSIGN_OR_RETURN(model_dir, ProvisionPlanModel(c, dir));
    return Status::Ok();
  }

  Status ModelFingerprint() {
    // Loaded as generate and serve load it, so its file list (and digest) is theirs.
    LOCKSTEP_ASSIGN_OR_RETURN(ModelWeightsPtr w, ModelWeights::Load(model_dir));
    LOCKSTEP_ASSIGN_OR_RETURN(model_sha256, Sha256Files(w->files));
    return Status::Ok();
  }

  // A remote server must serve the plan's model on the arms' build with their engine config
  // before any arm is sent to it (exit 2 otherwise, naming each field that differs). What was
  // checked is recorded once in the ledger (remote_checked) for the report.
  Status CheckRemote() {
    if (!st.service.is_object() || st.service.value("url", "").empty()) return Status::Ok();
    bool recorded = st.remote_checked;
    for (const ArmSpec& a : c.arms) {
      if (a.server == "process" || a.control) continue;
      LOCKSTEP_RETURN_IF_ERROR(EnsureHost());
      LOCKSTEP_ASSIGN_OR_RETURN(EngineConfig cfg, EffectiveConfig(c, a, model_dir));
      LOCKSTEP_ASSIGN_OR_RETURN(nlohmann::json checked,
                                host->CheckRemoteServes(a.name, model_sha256, BuildOf(a), cfg));
      if (!recorded) {
        LOCKSTEP_RETURN_IF_ERROR(Append("remote_checked", a.name, checked));
        recorded = true;
      }
    }
    return Status::Ok();
  }

  Status ProvisionRequest() {
    tokens_path = dir + "/request.tokens";
    return ProvisionPlanRequest(c, model_dir, tokens_path);
  }

  Status SendRepeat(const ArmSpec& arm, int repeat) {
    const std::string d = ArmDir(arm, repeat);
    std::error_code ec;
    fs::remove_all(d, ec);  // a re-sent arm starts from nothing
    fs::create_directories(d, ec);
    if (ec) return Status::IOError("arm folder '" + d + "'", ec.message());
    LOCKSTEP_ASSIGN_OR_RETURN(EngineConfig cfg, EffectiveConfig(c, arm, model_dir));
    LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(d + "/config.json", cfg.ToJson() + "\n"));
    const ArmBuild& build = BuildOf(arm);
    LOCKSTEP_RETURN_IF_ERROR(CheckBuild(build));
    if (arm.server != "process") return SendService(arm, repeat, d, cfg, build);
    ChildSpec cs;
    cs.argv = ArmGenerateArgv(c, arm, build.path, d, tokens_path);
    cs.stdout_path = d + "/stdout.json";
    cs.stderr_path = d + "/stderr.log";
    SentEntry sent{repeat, arm.mode, "", ArmConfigSha256(c, arm, cfg), build.name, build.sha256};
    LOCKSTEP_RETURN_IF_ERROR(Append(SentEntry::kEvent, arm.name, sent.Encode()));
    const std::string label = arm.repeat > 1 ? fmt::format("{} #{}", arm.name, repeat) : arm.name;
    std::function<void()> tick;
    if (progress) {
      tick = [&, label] {
        // Windows from the trace (one line each); before the first window, the child's last
        // "progress: prefill D/N" line from its log.
        std::ifstream f(d + "/trace.jsonl");
        const auto n =
            std::count(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>(), '\n');
        std::string state = fmt::format("{} windows", n);
        if (n == 0) {
          std::ifstream log(d + "/stderr.log");
          std::string line;
          state = "starting";
          while (std::getline(log, line))
            if (line.rfind("progress: ", 0) == 0) state = line.substr(10);
        }
        std::fprintf(stderr, "\r\033[K  %s: %s", label.c_str(), state.c_str());
        std::fflush(stderr);
      };
    }
    LOCKSTEP_ASSIGN_OR_RETURN(ChildResult cr, RunChild(cs, tick));
    if (progress) std::fprintf(stderr, "\r\033[K");
    const bool ok = ArmRan(cr.exit_code);
    RunEndEntry end;
    end.failed = !ok;
    end.repeat = repeat;
    end.exit_code = cr.exit_code;
    end.signal = cr.signal;
    end.seconds = cr.seconds;
    LOCKSTEP_RETURN_IF_ERROR(Append(end.event(), arm.name, end.Encode()));
    out << fmt::format("  {}: {} in {:.2f} s", label, ok ? "finished" : "FAILED", cr.seconds);
    if (ok && cr.exit_code != 0) out << fmt::format(" (exit {})", cr.exit_code);
    if (!ok)
      out << fmt::format(" (exit {}{}; see arms/{}/stderr.log)", cr.exit_code,
                         cr.signal ? fmt::format(", signal {}", cr.signal) : "", arm.name);
    out << "\n";
    return Status::Ok();
  }

  // One repeat from opts.source (lockstep merge): recorded as a child's would be, with its unit.
  Status TakeRepeat(const ArmSpec& arm, int repeat) {
    const std::string d = ArmDir(arm, repeat);
    LOCKSTEP_ASSIGN_OR_RETURN(EngineConfig cfg, EffectiveConfig(c, arm, model_dir));
    const ArmBuild& build = BuildOf(arm);
    const RunExpect expect{ArmConfigSha256(c, arm, cfg), build.sha256, build.name, model_sha256};
    LOCKSTEP_ASSIGN_OR_RETURN(RunTaken t, opts.source->Take(arm, repeat, d, expect));
    if (t.pending) {
      pending = true;
      return Status::Ok();
    }
    SentEntry sent{repeat, arm.mode, "", expect.engine_config_sha256, build.name, build.sha256};
    LOCKSTEP_RETURN_IF_ERROR(Append(SentEntry::kEvent, arm.name, sent.Encode()));
    RunEndEntry end;
    end.failed = t.failed;
    end.repeat = repeat;
    end.exit_code = t.exit_code;
    end.signal = t.signal;
    end.seconds = t.seconds;
    end.error = t.error;
    end.unit = t.unit;
    LOCKSTEP_RETURN_IF_ERROR(Append(end.event(), arm.name, end.Encode()));
    const std::string label = arm.repeat > 1 ? fmt::format("{} #{}", arm.name, repeat) : arm.name;
    out << fmt::format("  {}: {} (unit {}, attempt {}){}\n", label,
                       t.failed ? "FAILED" : "finished", IntOr(t.unit, "index", -1),
                       IntOr(t.unit, "attempt", 1), t.note.empty() ? "" : ": " + t.note);
    return Status::Ok();
  }

  // The service endpoint of this run: the ledger's (a resumed run keeps it), else the command
  // line's override of the plan's [service].
  ServiceOptions ServiceOpts() const {
    ServiceOptions so;
    if (st.service.is_object()) {
      so.url = st.service.value("url", "");
      const std::string env = st.service.value("api_key_env", "");
      if (const char* k = env.empty() ? nullptr : std::getenv(env.c_str())) so.api_key = k;
    }
    so.request_timeout_s = opts.service_timeout_s;
    return so;
  }

  Status EnsureHost() {
    if (host) return Status::Ok();
    LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(tokens_path, std::size_t{256} << 20));
    LOCKSTEP_ASSIGN_OR_RETURN(ModelConfig mc, ModelConfig::FromFile(model_dir + "/config.json"));
    LOCKSTEP_ASSIGN_OR_RETURN(auto ids, ParseTokenList(text, mc.n_vocab, "request.tokens"));
    host = std::make_unique<ServiceHost>(
        c, ServiceOpts(), std::move(ids), mc.n_vocab, dir, st.shared_started,
        [this](const std::string& event, const std::string& arm, nlohmann::json data) {
          return Append(event, arm, data);
        });
    return Status::Ok();
  }

  // The earlier shared arms that finished (what a replacement shared server gets again).
  Result<std::vector<SharedHistoryItem>> SharedHistory(const ArmSpec& upto) const {
    std::vector<SharedHistoryItem> items;
    for (const ArmSpec& a : c.arms) {
      if (&a == &upto) break;
      if (a.server != "shared" || !st.finished.count({a.name, 0})) continue;
      LOCKSTEP_ASSIGN_OR_RETURN(EngineConfig cfg, EffectiveConfig(c, a, model_dir));
      int n = 0;
      while (n < a.repeat && st.finished.count({a.name, n})) ++n;
      items.push_back(SharedHistoryItem{&a, cfg, n});
    }
    return items;
  }

  // One repeat of a service arm: its request on a server (service_arm.h), recorded like a
  // process arm's, with the `service` object.
  Status SendService(const ArmSpec& arm, int repeat, const std::string& d, const EngineConfig& cfg,
                     const ArmBuild& build) {
    LOCKSTEP_RETURN_IF_ERROR(EnsureHost());
    SentEntry sent{repeat, arm.mode, arm.server, EngineConfigHash(cfg), build.name, build.sha256};
    LOCKSTEP_RETURN_IF_ERROR(Append(SentEntry::kEvent, arm.name, sent.Encode()));
    const std::string label = arm.repeat > 1 ? fmt::format("{} #{}", arm.name, repeat) : arm.name;
    if (progress)
      std::fprintf(stderr, "\r\033[K  %s: on a %s server", label.c_str(), arm.server.c_str());
    LOCKSTEP_ASSIGN_OR_RETURN(auto history, SharedHistory(arm));
    LOCKSTEP_ASSIGN_OR_RETURN(ServiceArmRun run,
                              host->Run(arm, cfg, build.path, d, repeat, history));
    if (progress) std::fprintf(stderr, "\r\033[K");
    RunEndEntry end;
    end.failed = !run.ok;
    end.repeat = repeat;
    end.exit_code = run.ok ? 0 : 3;
    end.seconds = run.seconds;
    end.service = run.service;
    if (!run.ok) end.error = run.error;
    LOCKSTEP_RETURN_IF_ERROR(Append(end.event(), arm.name, end.Encode()));
    const nlohmann::json& svc = run.service;
    out << fmt::format(
        "  {}: {} in {:.2f} s ({} server{})", label, run.ok ? "finished" : "FAILED", run.seconds,
        StringOr(svc, "server", ""),
        svc["cold"].is_boolean()
            ? svc["cold"].get<bool>()
                  ? ", cold"
                  : fmt::format(", warm: {} tokens reused", IntOr(svc, "prompt_tokens_reused", 0))
            : "");
    if (svc.contains("load") && svc["load"].is_object())
      out << fmt::format("; under load: {} of {} background requests completed",
                         IntOr(svc["load"], "completed", 0), IntOr(svc["load"], "requests", 0));
    if (!run.ok) out << ": " << run.error;
    out << "\n";
    return Status::Ok();
  }

  // The arm's outcome from its files (missing or unreadable files make it a failed arm).
  ArmOutcome LoadOutcome(const ArmSpec& arm) {
    ArmOutcome o;
    o.name = arm.name;
    int failed_exit = 0;  // the first repeat's exit code that means it did not run
    for (int r = 0; r < arm.repeat; ++r) {
      const std::string d = ArmDir(arm, r);
      // An arm that exited other than 0 or 1 failed, whatever files it left (generate writes its
      // outputs before it exits 2 for an injection that never fired): it never counts as run.
      // Its files are still read (its injection records say what did not fire).
      if (auto it = st.exit_codes.find({arm.name, r});
          it != st.exit_codes.end() && !ArmRan(it->second) && failed_exit == 0)
        failed_exit = it->second;
      auto text = ReadFile(d + "/stdout.json", std::size_t{64} << 20);
      auto windows = ReadWindowRecords(d + "/trace.jsonl");
      bool ok = text.ok() && windows.ok();
      if (ok && r == 0) {
        try {
          auto j = nlohmann::json::parse(*text);
          o.output_ids = j.at("output_ids").get<std::vector<std::int32_t>>();
          o.stop_reason = j.at("stop_reason").get<std::string>();
          const auto& res = j.at("resources");
          o.guard_tripped = res.contains("guard");
          o.max_swap_used_bytes = res.value("max_swap_used_bytes", std::int64_t{-1});
          o.min_host_available_bytes = res.value("min_host_available_bytes", std::int64_t{-1});
          for (const auto& inj : j.value("injections", nlohmann::json::array()))
            o.injections.push_back(inj);
        } catch (const nlohmann::json::exception&) {
          ok = false;
        }
      }
      if (!ok) {
        o.ok = false;
        o.exit_code = failed_exit != 0 ? failed_exit : 3;
        return o;
      }
      if (r == 0) o.windows = *windows;
      o.repeats.push_back(std::move(*windows));
      if (r == 0 && arm.server != "process")
        if (auto svc = ReadFile(d + "/service.json", std::size_t{16} << 20); svc.ok())
          o.service = nlohmann::json::parse(*svc, nullptr, false);
    }
    o.ok = failed_exit == 0;
    o.exit_code = failed_exit;
    return o;
  }

  Status Compare(const ArmSpec& arm, const ArmSpec& base_spec) {
    ArmOutcome base = LoadOutcome(base_spec);
    ArmOutcome cur = LoadOutcome(arm);
    AlignResult al = AlignWindows(base.windows, cur.windows);
    std::unique_ptr<ExportReader> ra, rb;
    std::optional<DiffResult> diff;
    std::string diff_error;
    if (arm.mode == "state" && base_spec.mode == "state" && base.ok && cur.ok) {
      ReaderLimits limits;  // isolated: a crash parsing an arm's export fails this comparison only
      limits.isolate_timeout_s = opts.isolate_timeout_s;
      auto a = ExportReader::Open(ArmDir(base_spec, 0) + "/export.h5", limits);
      auto b = ExportReader::Open(ArmDir(arm, 0) + "/export.h5", limits);
      if (a.ok() && b.ok()) {
        ra = std::move(a).value();
        rb = std::move(b).value();
        DiffOptions dopt;
        dopt.thresholds = c.thresholds;
        dopt.max_skipped = arm.max_skipped.value_or(c.gates.max_skipped);
        auto d = DiffExports(*ra, *rb, dopt);
        if (d.ok())
          diff = std::move(d).value();
        else
          diff_error = d.status().message();
      } else {
        diff_error = (a.ok() ? b.status() : a.status()).message();
      }
    }
    ComparisonResult cr = EvaluateComparison(c, arm, base, cur, diff ? &*diff : nullptr, al);
    nlohmann::json fingerprints = nlohmann::json::object();
    if (ra && rb) {
      const std::string bad = FingerprintMismatches(base_spec, ra->meta(), arm, rb->meta());
      if (!bad.empty())
        cr.gates.push_back(GateOutcome{"fingerprints", false, bad}), cr.passed = false;
      fingerprints = {{"plan_model_sha256", model_sha256},
                      {"a", MetaFingerprints(ra->meta())},
                      {"b", MetaFingerprints(rb->meta())},
                      {"mismatch", bad.empty() ? nlohmann::json() : nlohmann::json(bad)}};
    }
    if (opts.source) {
      std::string violation;
      cr.hosts = opts.source->PairHosts(base_spec, arm, &violation);
      if (!violation.empty())
        cr.gates.push_back(GateOutcome{"placement", false, violation}), cr.passed = false;
    }
    if (const std::string refused = RefusedExports(base, cur); !refused.empty())
      cr.gates.push_back(GateOutcome{"export digest", false, refused}), cr.passed = false;
    else if (!diff_error.empty())
      cr.gates.push_back(GateOutcome{"exports readable", false, diff_error}), cr.passed = false;
    ReportInput in;
    in.title = fmt::format("{}: {} vs {}{}", c.name, arm.name, base_spec.name,
                           arm.mode == "timing" ? " (repeat 0 of each arm)" : "");
    if (ra) in.a = SummarizeArm(ra->meta(), base_spec.name);
    if (rb) in.b = SummarizeArm(rb->meta(), arm.name);
    in.a.arm = base_spec.name;
    in.b.arm = arm.name;
    in.a.windows = static_cast<std::int64_t>(base.windows.size());
    in.b.windows = static_cast<std::int64_t>(cur.windows.size());
    in.diff = diff ? &*diff : nullptr;
    in.align = &al;
    in.windows_a = &base.windows;
    in.windows_b = &cur.windows;
    std::error_code ec;
    fs::create_directories(dir + "/compare", ec);
    nlohmann::json rec;
    rec["comparison"] = ToJson(cr);
    rec["builds"] = {{"a", {{"arm", base_spec.name}, {"build", ArmBuildName(base_spec)}}},
                     {"b", {{"arm", arm.name}, {"build", ArmBuildName(arm)}}}};
    for (const char* side : {"a", "b"}) {
      nlohmann::json& s = rec["builds"][side];
      const ArmBuild& b = BuildOf(side[0] == 'a' ? base_spec : arm);
      s["sha256"] = b.sha256, s["version"] = b.version, s["commit"] = b.commit;
    }
    rec["report"] = nlohmann::json::parse(RenderJson(in));
    if (!fingerprints.empty()) rec["fingerprints"] = fingerprints;
    const std::string stem = RunPaths(dir).Compare(arm.name, "");
    LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(stem + ".json", rec.dump(2) + "\n"));
    LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(stem + ".md", RenderMarkdown(in)));
    LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(stem + ".html", RenderHtml(in)));
    if (diff)  // the campaign report embeds the heat map of a failing pair
      LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(stem + ".nrmse.svg", SvgNrmseHeatmap(*diff)));
    LOCKSTEP_RETURN_IF_ERROR(Append("compared", arm.name, ToJson(cr)));
    if (c.localize && !cr.passed && !arm.control && ra && rb) {
      // Plan key localize: where the failing pair's difference is born (localize_run.h).
      auto where = LocalizeCampaignPair(dir, base_spec.name, arm.name, BuildOf(base_spec).path,
                                        BuildOf(arm).path);
      out << fmt::format("  localize: {}\n",
                         where.ok() ? *where : "failed: " + where.status().ToString());
    }
    std::string failed;
    for (const auto& g : cr.gates)
      if (!g.passed) failed += (failed.empty() ? "" : ", ") + g.name;
    // Name the gates that failed as gates ("caught (positive control: state within thresholds)"
    // read as if the state had stayed within the thresholds).
    const std::string by = failed.empty() ? "" : "failed gates: " + failed;
    if (arm.control && !cr.control_applied)
      out << fmt::format(
          "  {} vs {}: NOT APPLIED (positive control: its injection did not fire; "
          "the gates were not tested)\n",
          arm.name, base_spec.name);
    else if (arm.control && !cr.passed && cr.caught_by.empty())
      out << fmt::format(
          "  {} vs {}: NOT CAUGHT ON ANYTHING (positive control; {}, none on a compared "
          "quantity)\n",
          arm.name, base_spec.name, by);
    else if (arm.control)
      out << fmt::format("  {} vs {}: {} (positive control{})\n", arm.name, base_spec.name,
                         cr.passed ? "NOT CAUGHT" : "caught", by.empty() ? "" : "; " + by);
    else
      out << fmt::format("  {} vs {}: {}{}\n", arm.name, base_spec.name,
                         cr.passed ? "pass" : "FAIL", by.empty() ? "" : " (" + by + ")");
    return Status::Ok();
  }

  static nlohmann::json MetaFingerprints(const ExportMeta& m) {
    return {{"model_sha256", m.model_sha256},
            {"executable_sha256", m.executable_sha256},
            {"config_sha256", m.config_sha256}};
  }

  // What the exports say they ran against, checked against what the plan names: its model and
  // each arm's build. "" when both match; otherwise each mismatch, named.
  std::string FingerprintMismatches(const ArmSpec& a, const ExportMeta& ma, const ArmSpec& b,
                                    const ExportMeta& mb) const {
    std::string bad;
    const std::pair<const ArmSpec*, const ExportMeta*> sides[] = {{&a, &ma}, {&b, &mb}};
    for (const auto& side : sides) {
      const std::string& arm = side.first->name;
      auto add = [&bad, &arm](const std::string& what, const std::string& got,
                              const std::string& want) {
        bad += fmt::format("{}{}'s export: {} {} (the plan's: {})", bad.empty() ? "" : "; ", arm,
                           what, got.empty() ? "unknown" : got.substr(0, 12), want);
      };
      const ExportMeta& m = *side.second;
      if (m.model_sha256 != model_sha256)
        add("model SHA-256", m.model_sha256, model_sha256.substr(0, 12));
      const ArmBuild& build = BuildOf(*side.first);
      if (m.executable_sha256 != build.sha256)
        add("executable SHA-256", m.executable_sha256,
            build.sha256.substr(0, 12) + ", build " + build.name);
    }
    return bad;
  }

  // Service arms whose export failed its digest check (downloaded from a remote server): "export
  // digest mismatch (A2: ...)"; "" when both sides' exports were accepted.
  static std::string RefusedExports(const ArmOutcome& a, const ArmOutcome& b) {
    std::string out;
    for (const ArmOutcome* o : {&a, &b}) {
      if (!o->service.is_object() || !o->service.contains("export")) continue;
      const nlohmann::json& e = o->service["export"];
      if (!e.is_object() || !e.contains("verified") || e["verified"] != false) continue;
      out += fmt::format("{}{} ({}: the server said {}, received {})", out.empty() ? "" : "; ",
                         StringOr(e, "reason", "export digest mismatch"), o->name,
                         e.contains("sha256") ? e["sha256"].dump() : "null",
                         StringOr(e, "received_sha256", "?"));
    }
    return out;
  }

  const ArmSpec* FindArm(const std::string& name) const {
    for (const auto& a : c.arms)
      if (a.name == name) return &a;
    return nullptr;
  }

  // Whether `arm` is to be sent: the stop rules and its requirements, decided once, before its
  // first send (a not_sent entry otherwise). An arm with a send on record goes on.
  Result<bool> DecideSend(const ArmSpec& arm) {
    if (st.not_sent.count(arm.name)) return false;
    for (int r = 0; r < arm.repeat; ++r)
      if (st.sent.count({arm.name, r})) return true;
    std::vector<ComparisonResult> so_far;
    for (const auto& a : c.arms)
      if (auto it = st.compared.find(a.name); it != st.compared.end()) so_far.push_back(it->second);
    if (!st.stopped) {
      if (auto stop = EvaluateStopRules(c, so_far)) {
        const StoppedEntry entry{stop->rule->name, stop->rule->message, arm.name, stop->fired_by};
        LOCKSTEP_RETURN_IF_ERROR(Append(StoppedEntry::kEvent, "", entry.Encode()));
        out << fmt::format("  stop rule '{}' fired ({}): {}\n", stop->rule->name,
                           fmt::join(stop->fired_by, ", "), stop->rule->message);
      }
    }
    if (st.stopped) {
      LOCKSTEP_RETURN_IF_ERROR(
          Append(NotSentEntry::kEvent, arm.name,
                 NotSentEntry{"the campaign stopped (stop rule fired)"}.Encode()));
      out << fmt::format("  {}: not sent (campaign stopped)\n", arm.name);
      return false;
    }
    std::string missing;
    for (const auto& req : arm.require) {
      auto it = st.decisions.find(req);
      if (it == st.decisions.end() || !it->second)
        missing += (missing.empty() ? "" : ", ") + req +
                   (it == st.decisions.end() ? " (not decided)" : " (failed)");
    }
    if (!missing.empty()) {
      LOCKSTEP_RETURN_IF_ERROR(
          Append(NotSentEntry::kEvent, arm.name, NotSentEntry{"requires " + missing}.Encode()));
      out << fmt::format("  {}: not sent (requires {})\n", arm.name, missing);
      return false;
    }
    return true;
  }

  // The arms in send groups (units.h SendGroups: one arm each, or consecutive timing arms
  // interleaved by the plan's order): each arm decided, the group's repeats sent in
  // GroupSendOrder, then its arms compared and their decisions recorded, in plan order.
  Status RunArms() {
    for (const std::vector<std::size_t>& group : SendGroups(c)) {
      std::set<std::size_t> go;
      for (std::size_t ai : group) {
        LOCKSTEP_ASSIGN_OR_RETURN(bool send, DecideSend(c.arms[ai]));
        if (send) go.insert(ai);
      }
      for (const auto& [ai, r] : GroupSendOrder(c, group)) {
        const ArmSpec& arm = c.arms[ai];
        if (!go.count(ai) || st.finished.count({arm.name, r})) continue;
        LOCKSTEP_RETURN_IF_ERROR(opts.source ? TakeRepeat(arm, r) : SendRepeat(arm, r));
        if (pending) return Status::Ok();
      }
      for (std::size_t ai : go) {
        const ArmSpec& arm = c.arms[ai];
        if (!arm.baseline.empty() && !st.compared.count(arm.name)) {
          const ArmSpec* base = FindArm(arm.baseline);
          if (!base)
            return Status::InvalidArgument("arm '" + arm.name + "'",
                                           "baseline '" + arm.baseline + "' is not an arm");
          LOCKSTEP_RETURN_IF_ERROR(Compare(arm, *base));
        }
        if (!arm.decision.empty() && !st.decisions.count(arm.decision) &&
            st.compared.count(arm.name))
          LOCKSTEP_RETURN_IF_ERROR(
              Append(DecisionEntry::kEvent, arm.name,
                     DecisionEntry{arm.decision, st.compared[arm.name].passed}.Encode()));
      }
    }
    return Status::Ok();
  }

  // A resumed run keeps the builds its ledger recorded (checked again before each send).
  Status ResumeBuilds() {
    if (!opts.builds.empty())
      return Status::InvalidArgument("--build",
                                     "a resumed run uses the builds its ledger "
                                     "recorded; --build applies to a new run only");
    if (!st.builds.is_object()) {  // a ledger from before named builds: every arm ran this one
      LOCKSTEP_ASSIGN_OR_RETURN(builds, ResolveBuilds(c, {}, exe));
      return Status::Ok();
    }
    for (auto it = st.builds.begin(); it != st.builds.end(); ++it)
      builds[it.key()] = BuildFromJson(it.key(), it.value());
    for (const ArmSpec& a : c.arms)
      if (!builds.count(ArmBuildName(a)))
        return Status::Corruption("ledger", "arm '" + a.name + "' runs on build '" +
                                                ArmBuildName(a) + "', which the ledger lacks");
    return Status::Ok();
  }

  // The verdict, by the one rule of lockstep/harness/verdict.h.
  Status Finish() {
    if (st.done) return Status::Ok();
    const CampaignDecision d = DecideCampaignVerdict(c, st.compared, st.stopped);
    return Append(DoneEntry::kEvent, "",
                  DoneEntry{CampaignOutcomeName(d.outcome), d.reason}.Encode());
  }
};

Status CheckedPlanText(const RunOptions& opts, const RunState& st, std::string* text) {
  const std::string copy = opts.out_dir + "/plan.toml";
  LOCKSTEP_ASSIGN_OR_RETURN(*text,
                            ReadFile(opts.plan.empty() ? copy : opts.plan, std::size_t{16} << 20));
  const std::string sha = Sha256Hex(*text);
  if (sha != st.plan_sha256)
    return Status::InvalidArgument("--resume",
                                   fmt::format("the plan changed since the campaign started "
                                               "(SHA-256 {} now, {} recorded): refusing to "
                                               "resume; start a new run folder",
                                               sha.substr(0, 12), st.plan_sha256.substr(0, 12)));
  return Status::Ok();
}

}  // namespace

Status CreateRunFolder(const RunOptions& opts, const std::string& exe, Campaign* c,
                       std::map<std::string, ArmBuild>* builds_out) {
  if (opts.out_dir.empty()) return Status::InvalidArgument("--out", "a run folder is required");
  if (opts.plan.empty()) return Status::InvalidArgument("run", "a campaign file is required");
  LOCKSTEP_ASSIGN_OR_RETURN(*c, LoadCampaign(opts.plan));
  LOCKSTEP_RETURN_IF_ERROR(CheckPlanCanPass(*c, opts.plan));
  LOCKSTEP_ASSIGN_OR_RETURN(const nlohmann::json service,
                            PlannedService(opts.service_url, opts.service_key_env, c->service));
  // Every build is checked before the run folder exists: a refused build runs nothing.
  LOCKSTEP_ASSIGN_OR_RETURN(*builds_out, ResolveBuilds(*c, opts.builds, exe));
  const auto& builds = *builds_out;
  std::error_code ec;
  if (fs::exists(opts.out_dir) && !fs::is_empty(opts.out_dir, ec))
    return Status::InvalidArgument(
        "--out '" + opts.out_dir + "'",
        "exists and is not empty (continue it with --resume, or choose a new folder)");
  // The folder appears complete (plan + ledger with its first entry) or not at all.
  const std::string tmp = opts.out_dir + ".creating";
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return Status::IOError("run folder '" + tmp + "'", ec.message());
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(tmp + "/plan.toml", c->plan_text));
  {
    LOCKSTEP_ASSIGN_OR_RETURN(Ledger l, Ledger::Create(RunPaths(tmp).Ledger()));
    std::vector<std::string> arms;
    nlohmann::json arm_builds = nlohmann::json::object(), bj = nlohmann::json::object();
    for (const auto& a : c->arms) arms.push_back(a.name), arm_builds[a.name] = ArmBuildName(a);
    for (const auto& [name, b] : builds) bj[name] = BuildJson(b);
    PlannedEntry planned{c->name, c->plan_sha256, c->plan_dir, arms, bj, arm_builds, service};
    planned.order = c->order;
    planned.order_seed = c->order_seed;
    LOCKSTEP_RETURN_IF_ERROR(l.Append(PlannedEntry::kEvent, "", planned.Encode(), true).status());
  }
  fs::remove(opts.out_dir, ec);  // an empty folder may be replaced
  fs::rename(tmp, opts.out_dir, ec);
  if (ec) return Status::IOError("run folder '" + opts.out_dir + "'", ec.message());
  return Status::Ok();
}

Status RunCampaign(const RunOptions& opts, std::ostream& out) {
  if (opts.out_dir.empty()) return Status::InvalidArgument("--out", "a run folder is required");
  Runner run{opts,         out, {},    opts.out_dir, opts.exe, {}, {},
             std::nullopt, {},  false, {},           nullptr,  {}};
  run.progress = opts.progress < 0 ? ::isatty(STDERR_FILENO) != 0 : opts.progress > 0;
  if (run.exe.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(run.exe, SelfExecutable());
  }
  if (opts.source && !opts.resume)
    return Status::InvalidArgument("run", "runs from units continue a run folder (resume)");
  if (!opts.resume) {
    LOCKSTEP_RETURN_IF_ERROR(CreateRunFolder(opts, run.exe, &run.c, &run.builds));
    LedgerLoad loaded;
    LOCKSTEP_ASSIGN_OR_RETURN(Ledger l, OpenRunLedger(opts.out_dir, &loaded));
    run.ledger.emplace(std::move(l));
    for (const auto& e : loaded.entries) run.st.Apply(e);
    out << fmt::format("campaign {} (plan SHA-256 {}), run folder {}\n", run.c.name,
                       run.c.plan_sha256.substr(0, 12), opts.out_dir);
  } else {
    const std::string lp = RunPaths(opts.out_dir).Ledger();
    if (!fs::exists(lp))
      return Status::InvalidArgument("--resume '" + opts.out_dir + "'",
                                     "not a run folder (no ledger.jsonl)");
    LedgerLoad loaded;
    LOCKSTEP_ASSIGN_OR_RETURN(Ledger l, OpenRunLedger(opts.out_dir, &loaded));
    run.ledger.emplace(std::move(l));
    if (loaded.entries.empty() || loaded.entries.front().event != "planned")
      return Status::Corruption("ledger '" + lp + "'", "does not start with the planned entry");
    for (const auto& e : loaded.entries) run.st.Apply(e);
    std::string text;
    LOCKSTEP_RETURN_IF_ERROR(CheckedPlanText(opts, run.st, &text));
    LOCKSTEP_ASSIGN_OR_RETURN(run.c,
                              ParseCampaign(text, opts.out_dir + "/plan.toml", run.st.plan_dir));
    LOCKSTEP_RETURN_IF_ERROR(run.ResumeBuilds());
    if (!opts.service_url.empty() || !opts.service_key_env.empty())
      return Status::InvalidArgument("--service-url",
                                     "a resumed run uses the server its ledger recorded; "
                                     "--service-url / --service-key-env apply to a new run only");
    if (const std::string env =
            run.st.service.is_object() ? run.st.service.value("api_key_env", "") : std::string();
        !env.empty() && std::getenv(env.c_str()) == nullptr)
      return Status::InvalidArgument(
          "--resume", "the run's remote server needs its key in $" + env + ", which is not set");
    std::vector<std::string> rerun;
    if (run.st.done) {
      out << fmt::format("campaign {} in {} is complete: rendering its report again\n", run.c.name,
                         opts.out_dir);
    }
    for (const auto& s : run.st.sent)
      if (!run.st.finished.count(s))
        rerun.push_back(s.second ? fmt::format("{}#{}", s.first, s.second) : s.first);
    if (!run.st.done) {
      LOCKSTEP_RETURN_IF_ERROR(run.Append("resumed", "",
                                          {{"torn", loaded.torn},
                                           {"torn_bytes", loaded.torn_bytes},
                                           {"torn_saved_as", loaded.torn_saved_as},
                                           {"rerun", rerun}}));
      out << fmt::format("campaign {} resumed in {}\n", run.c.name, opts.out_dir);
    }
    if (loaded.torn)
      out << fmt::format("  the ledger's last line was torn ({} bytes): set aside as {}\n",
                         loaded.torn_bytes, loaded.torn_saved_as);
    for (const auto& r : rerun)
      out << fmt::format("  {}: was sent but did not finish: sending it again\n", r);
  }
  if (!run.st.done) {
    LOCKSTEP_RETURN_IF_ERROR(run.ProvisionModel());
    LOCKSTEP_RETURN_IF_ERROR(run.ProvisionRequest());
    LOCKSTEP_RETURN_IF_ERROR(run.ModelFingerprint());
    LOCKSTEP_RETURN_IF_ERROR(run.CheckRemote());
    LOCKSTEP_RETURN_IF_ERROR(run.RunArms());
    if (run.pending) return Status::Ok();  // opts.source: more units must run (no verdict yet)
    if (run.host) LOCKSTEP_RETURN_IF_ERROR(run.host->StopAll());  // the shared server
    LOCKSTEP_RETURN_IF_ERROR(run.Finish());
  }
  ReportOptions ro;
  ro.dir = opts.out_dir;
  ro.junit = opts.junit;
  LOCKSTEP_RETURN_IF_ERROR(RunCampaignReport(ro, out));
  const std::string& v = run.st.verdict;
  if (const auto relaxed = RelaxedThresholds(run.c.thresholds); !relaxed.empty())
    out << fmt::format("thresholds relaxed by the plan: {}\n", fmt::join(relaxed, "; "));
  const std::string& why = run.st.verdict_reason;
  out << fmt::format("verdict: {}{}\n", VerdictWords(v), why.empty() ? "" : ": " + why);
  if (v != "pass") return Status::GateFailed("campaign " + run.c.name, "verdict " + v);
  return Status::Ok();
}

Status CheckCampaignPlan(const std::string& plan, std::ostream& out) {
  LOCKSTEP_ASSIGN_OR_RETURN(Campaign c, LoadCampaign(plan));
  LOCKSTEP_RETURN_IF_ERROR(CheckPlanCanPass(c, plan));
  out << fmt::format("plan {} (campaign {}) can pass on what it checks:\n", plan, c.name);
  for (const std::string& line : PlanCheckLines(c)) out << "  " << line << "\n";
  return Status::Ok();
}

std::vector<std::string> LedgerDigest(const std::vector<LedgerEntry>& entries) {
  // A send counts only if the same (arm, repeat) finished after it with no other send between.
  std::set<std::size_t> keep_sends;
  std::map<ArmRepeat, std::size_t> last_send;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    const ArmRepeat key{e.arm, e.data.value("repeat", 0)};
    if (e.event == "sent") last_send[key] = i;
    if ((e.event == "finished" || e.event == "failed") && last_send.count(key))
      keep_sends.insert(last_send[key]);
  }
  std::vector<std::string> out;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    if (e.event == "resumed" || (e.event == "sent" && !keep_sends.count(i))) continue;
    // Servers come and go with runner processes (a killed runner's server is started again).
    if (e.event == "server_started" || e.event == "server_stopped" || e.event == "server_failed" ||
        e.event == "reprimed")
      continue;
    nlohmann::json d = e.data;
    // A unit's attempt and host say where it ran, not what it decided (units.h).
    if (e.event == "finished" || e.event == "failed") d.erase("seconds"), d.erase("unit");
    if (d.contains("service") && d["service"].is_object()) {
      nlohmann::json& s = d["service"];
      if (e.event == "compared") {  // the comparison's two sides (gates.h)
        for (const char* side : {"a", "b"})
          if (s.contains(side) && s[side].is_object()) s[side] = ServiceDigest(s[side]);
      } else {
        s = ServiceDigest(s);
      }
    }
    out.push_back(e.event + " " + e.arm + " " + d.dump());
  }
  return out;
}

}  // namespace lockstep
