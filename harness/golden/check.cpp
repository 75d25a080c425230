// `lockstep golden check`: re-runs a reference's arms with this build and compares (golden.h).
// Everything that makes the reference not fit (manifest, plan, schema, stored exports, model,
// request) is checked before an item is compared, so a changed item is never reported against a
// reference that could not have matched.
#include <fmt/format.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <ostream>

#include "commands/output.h"
#include "golden_internal.h"
#include "lockstep/compare/state_diff.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/run_record.h"
#include "lockstep/harness/runner.h"
#include "lockstep/instrument/export_writer.h"
#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

namespace fs = std::filesystem;

namespace {

Status DoesNotFit(const std::string& what, const std::string& why) {
  return Status::InvalidArgument(what, "the reference does not fit: " + why);
}

// "KEY=VALUE" overrides as one JSON object of engine keys (EffectiveConfig checks keys and types).
Result<nlohmann::json> ParseOverrides(const std::vector<std::string>& specs) {
  nlohmann::json o = nlohmann::json::object();
  for (const std::string& s : specs) {
    const auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
      return Status::InvalidArgument("--engine-override '" + s + "'", "expected KEY=VALUE");
    const std::string key = s.substr(0, eq), text = s.substr(eq + 1);
    nlohmann::json v = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (v.is_discarded()) v = text;
    for (const EngineOption& opt : EngineOptions())
      if (opt.key == key && v.is_string() &&
          std::holds_alternative<std::vector<std::string> EngineConfig::*>(opt.field)) {
        if (!o.contains(key)) o[key] = nlohmann::json::array();
        o[key].push_back(v);  // repeatable, as the flag is
        v = nullptr;
      }
    if (!v.is_null()) o[key] = v;
  }
  return o;
}

// The first item that is not bitwise equal (bitwise mode) or that failed (thresholds), or null.
const ItemResult* FirstChanged(const DiffResult& d, bool bitwise) {
  if (!bitwise) return d.first_failure >= 0 ? &d.items[d.first_failure] : nullptr;
  for (const ItemResult& it : d.items)
    if (it.verdict != Verdict::kPass || it.stats.n_diff > 0 || it.code_diff > 0) return &it;
  return nullptr;
}

nlohmann::json ItemJson(const ItemResult& it) {
  return {
      {"window", it.window},
      {"checkpoint", it.checkpoint},
      {"point", it.point},
      {"stage", it.stage},
      {"layer", it.layer},
      {"item", it.kind},
      {"path", it.rel},
      {"dtype", it.dtype},
      {"verdict", VerdictName(it.verdict)},
      {"reason", it.reason},
      {"nrmse", it.verdict == Verdict::kSkip ? nlohmann::json() : nlohmann::json(it.stats.nrmse)},
      {"max_abs",
       it.verdict == Verdict::kSkip ? nlohmann::json() : nlohmann::json(it.stats.max_abs)},
      {"kl", it.has_kl ? nlohmann::json(it.kl.kl_max) : nlohmann::json()}};
}

std::string ItemText(const ItemResult& it) {
  std::string s = fmt::format(
      "window {} ({}), stage {}, {}item {} ({})", it.window, it.checkpoint, it.stage,
      it.layer >= 0 ? fmt::format("layer {}, ", it.layer) : std::string(), it.kind, it.rel);
  if (it.verdict == Verdict::kSkip) return s + ": not compared: " + it.reason;
  s += fmt::format(": NRMSE {:.3g}, KL {}", it.stats.nrmse,
                   it.has_kl ? fmt::format("{:.3g}", it.kl.kl_max) : std::string("n/a"));
  if (!it.reason.empty())
    s += " (" + it.reason + ")";
  else if (it.stats.n_diff > 0 || it.code_diff > 0)
    s += fmt::format(" ({} values differ, max |diff| {:.3g})",
                     std::max(it.stats.n_diff, it.code_diff), it.stats.max_abs);
  return s;
}

struct Checker {
  Checker(const GoldenCheckOptions& o, std::ostream& os) : opts(o), out(os) {}
  const GoldenCheckOptions& opts;
  std::ostream& out;
  nlohmann::json manifest;
  Campaign c;
  std::string work, exe, model_dir;
  nlohmann::json overrides;
  bool bitwise = true;
  bool arm_failed = false;  // an arm's generate did not exit 0 (its files are kept)
  std::vector<std::unique_ptr<ExportReader>> refs;  // per manifest arm
  nlohmann::json arms = nlohmann::json::array();    // the summary's
  nlohmann::json first_changed;                     // {arm, ...} of the first change
  std::string first_text;
  std::string exe_sha256;

  Status LoadReference() {
    LOCKSTEP_ASSIGN_OR_RETURN(manifest, golden::ReadManifest(opts.dir));
    const std::string plan = opts.dir + "/plan.toml";
    auto text = ReadFile(plan, std::size_t{16} << 20);
    if (!text.ok()) return DoesNotFit("'" + opts.dir + "'", text.status().message());
    if (Sha256Hex(*text) != manifest["plan_sha256"])
      return DoesNotFit("'" + plan + "'", "not the plan the manifest recorded (SHA-256 differs)");
    LOCKSTEP_ASSIGN_OR_RETURN(c,
                              ParseCampaign(*text, plan, manifest["plan_dir"].get<std::string>()));
    if (manifest["export_schema"] != "lockstep.export" ||
        manifest["export_schema_version"] != kExportSchemaVersion)
      return DoesNotFit(
          "'" + opts.dir + "'",
          fmt::format("recorded with export schema {} v{}; this build writes "
                      "lockstep.export v{} (re-record the reference)",
                      manifest["export_schema"].get<std::string>(),
                      manifest["export_schema_version"].get<std::int64_t>(), kExportSchemaVersion));
    ReaderLimits limits;
    limits.isolate_timeout_s = opts.isolate_timeout_s;
    for (const auto& a : manifest["arms"]) {
      const std::string path = opts.dir + "/" + a["export"].get<std::string>();
      const std::string what = "stored export '" + path + "'";
      auto sha = Sha256File(path);
      if (!sha.ok()) return DoesNotFit(what, sha.status().message());
      if (*sha != a["export_file_sha256"])
        return DoesNotFit(what, "its file SHA-256 is not the manifest's (the file changed)");
      auto r = ExportReader::Open(path, limits);
      if (!r.ok()) return DoesNotFit(what, r.status().message());
      LOCKSTEP_ASSIGN_OR_RETURN(std::vector<ItemDigest> d, ExportItemDigests(**r));
      if (golden::DigestsToJson(d) != a["items"])
        return DoesNotFit(what, "its item digests do not match the manifest");
      refs.push_back(std::move(r).value());
    }
    return Status::Ok();
  }

  Status Prepare() {
    LOCKSTEP_ASSIGN_OR_RETURN(overrides, ParseOverrides(opts.engine_overrides));
    bitwise = !opts.thresholds && !opts.nrmse_max && !opts.kl_max;
    if (opts.nrmse_max)
      c.thresholds.nrmse_max = *opts.nrmse_max, c.thresholds.nrmse_by_kind.clear();
    if (opts.kl_max) c.thresholds.kl_max = *opts.kl_max;
    exe = opts.exe;
    if (exe.empty()) {
      LOCKSTEP_ASSIGN_OR_RETURN(exe, SelfExecutable());
    }
    LOCKSTEP_ASSIGN_OR_RETURN(exe_sha256, Sha256File(exe));
    std::error_code ec;
    if (opts.work_dir.empty()) {
      std::string tmpl = (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
      tmpl += "/lockstep-golden-XXXXXX";
      if (!::mkdtemp(tmpl.data())) return Status::IOError("temporary folder", std::strerror(errno));
      work = tmpl;
    } else {
      work = opts.work_dir;
      fs::create_directories(work, ec);
      if (ec) return Status::IOError("--work '" + work + "'", ec.message());
    }
    if (!opts.model.empty()) {
      model_dir = fs::absolute(opts.model).string();
    } else {
      LOCKSTEP_ASSIGN_OR_RETURN(model_dir, ProvisionPlanModel(c, work));
    }
    return ProvisionPlanRequest(c, model_dir, work + "/request.tokens");
  }

  const ArmSpec* FindArm(const std::string& name) const {
    for (const ArmSpec& a : c.arms)
      if (a.name == name) return &a;
    return nullptr;
  }

  // Runs arm `i` of the manifest and compares it; `changed` is set when it differs.
  Status CheckArm(std::size_t i, bool* changed) {
    const nlohmann::json& rec = manifest["arms"][i];
    const std::string name = rec["name"];
    const ArmSpec* spec = FindArm(name);
    if (!spec) return DoesNotFit("arm " + name, "the recorded plan has no such arm");
    ArmSpec arm = *spec;
    for (const auto& [k, v] : overrides.items()) arm.engine[k] = v;
    LOCKSTEP_ASSIGN_OR_RETURN(EngineConfig cfg, EffectiveConfig(c, arm, model_dir));
    const std::string d = RunPaths(work).ArmDir(name);
    LOCKSTEP_ASSIGN_OR_RETURN(ChildResult cr,
                              golden::RunArm(c, arm, cfg, exe, d, work + "/request.tokens", {}));
    if (cr.exit_code != 0) {
      // The child's own last words lead: "see stderr.log" alone is no answer.
      std::string last;
      if (auto log = ReadFile(d + "/stderr.log", std::size_t{1} << 20); log.ok()) {
        std::string t = *log;
        while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
        last = t.substr(t.rfind('\n') == std::string::npos ? 0 : t.rfind('\n') + 1);
      }
      arm_failed = true;
      // The child's exit 2 (bad input: an override, an injection that never fired) stays 2.
      return (cr.exit_code == 2 ? Status::InvalidArgument : Status::Runtime)(
          "arm " + name,
          fmt::format("generate failed (exit {}{}){}; see {}", cr.exit_code,
                      cr.signal ? fmt::format(", signal {}", cr.signal) : std::string(),
                      last.empty() ? std::string() : ": " + last, d + "/stderr.log"));
    }
    LOCKSTEP_ASSIGN_OR_RETURN(golden::ArmOutput o, golden::ReadArmOutput(d));
    ReaderLimits limits;
    limits.isolate_timeout_s = opts.isolate_timeout_s;
    LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<ExportReader> now,
                              ExportReader::Open(d + "/export.h5", limits));
    const ExportReader& ref = *refs[i];
    if (now->meta().model_sha256 != manifest["model_sha256"] ||
        now->meta().request_sha256 != manifest["request_sha256"]) {
      std::string why;
      for (const std::string& s : IdentityDifferences(ref.meta(), now->meta()))
        why += (why.empty() ? "" : "; ") + s;
      return DoesNotFit("arm " + name, why.empty() ? "model or request fingerprint differs" : why);
    }
    DiffOptions dopt;
    dopt.thresholds = c.thresholds;
    dopt.max_skipped = bitwise ? -1 : arm.max_skipped.value_or(c.gates.max_skipped);
    LOCKSTEP_ASSIGN_OR_RETURN(DiffResult diff, DiffExports(ref, *now, dopt));
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<ItemDigest> digests, ExportItemDigests(*now));
    const bool same_bits = golden::DigestsToJson(digests) == rec["items"];
    const bool output_changed =
        o.output_ids != rec["output_ids"].get<std::vector<std::int32_t>>() ||
        o.stop_reason != rec["stop_reason"];
    const ItemResult* first = FirstChanged(diff, bitwise);
    std::string why;  // why it changed, when no item says it
    if (!diff.vacuous.empty())
      why = diff.vacuous;
    else if (output_changed)
      why = "the output changed (token ids or stop reason)";
    else if (bitwise && !same_bits)
      why = "an item's bytes or the set of items changed";
    else if (!bitwise && !diff.Passed())
      why = "the state diff did not pass";
    *changed = first != nullptr || !why.empty();
    nlohmann::json a = {
        {"name", name},
        {"verdict", *changed ? "changed" : "pass"},
        {"bitwise_equal", same_bits && !output_changed},
        {"output_changed", output_changed},
        {"items_compared", diff.compared},
        {"items_failed", diff.failed},
        {"items_skipped", diff.skipped},
        {"vacuous", diff.vacuous.empty() ? nlohmann::json() : nlohmann::json(diff.vacuous)},
        {"config_differences", diff.config_differences},
        {"first_changed", first ? ItemJson(*first) : nlohmann::json()},
        {"reason", why}};
    arms.push_back(a);
    const std::string text = first ? "first changed item: " + ItemText(*first) : why;
    if (*changed && first_changed.is_null()) {
      first_changed = first ? ItemJson(*first) : nlohmann::json::object();
      first_changed["arm"] = name;
      first_text = name + ": " + text;
    }
    out << fmt::format("  {}: {}", name,
                       !*changed
                           ? (bitwise ? fmt::format("bitwise equal ({} items)", diff.compared)
                                      : fmt::format("within thresholds ({} items)", diff.compared))
                           : "CHANGED: " + text);
    if (*changed && first && output_changed) out << "; the output changed too";
    out << "\n";
    for (const std::string& cd : diff.config_differences)
      out << "    config differs from the recorded one: " << cd << "\n";
    return Status::Ok();
  }

  nlohmann::json Summary(const std::string& verdict, const std::string& reason) const {
    nlohmann::json recorded =
        manifest.is_object() && manifest.contains("build") ? manifest["build"] : nlohmann::json();
    return {{"command", "golden check"},
            {"reference", opts.dir},
            {"verdict", verdict},
            {"reason", reason},
            {"mode", bitwise ? "bitwise" : "thresholds"},
            {"recorded_by", recorded},
            {"checked_by", {{"executable_sha256", exe_sha256}, {"version", opts.version}}},
            {"first_changed", first_changed},
            {"arms", arms}};
  }
};

Status CheckReference(Checker& ck) {
  LOCKSTEP_RETURN_IF_ERROR(ck.LoadReference());
  LOCKSTEP_RETURN_IF_ERROR(ck.Prepare());
  const std::string by = ck.manifest["build"].value("version", "");
  ck.out << fmt::format("golden check {} ({} arms, {}; recorded by {} {})\n", ck.opts.dir,
                        ck.manifest["arms"].size(), ck.bitwise ? "bitwise" : "within thresholds",
                        ck.manifest["build"].value("executable_sha256", "").substr(0, 12),
                        by.substr(0, by.find('\n')));
  bool any = false;
  for (std::size_t i = 0; i < ck.manifest["arms"].size(); ++i) {
    bool changed = false;
    LOCKSTEP_RETURN_IF_ERROR(ck.CheckArm(i, &changed));
    any = any || changed;
  }
  if (any) return Status::GateFailed("golden check " + ck.opts.dir, "changed: " + ck.first_text);
  return Status::Ok();
}

}  // namespace

Status RunGoldenCheck(const GoldenCheckOptions& opts, std::ostream& out) {
  if (opts.dir.empty())
    return Status::InvalidArgument("golden check", "a reference folder is required");
  Checker ck(opts, out);
  const Status s = CheckReference(ck);
  // A check that could not finish keeps the files its error points at (a temporary folder is
  // otherwise removed); one that reached a verdict needs none of them.
  const bool error = ck.arm_failed || s.exit_code() > 2;
  if (!ck.work.empty() && opts.work_dir.empty()) {
    std::error_code ec;
    if (error)
      out << "the check's files are kept in " << ck.work << "\n";
    else
      fs::remove_all(ck.work, ec);
  }
  out << "verdict: "
      << (s.ok()               ? "PASS"
          : s.exit_code() == 1 ? "FAIL (changed)"
          : error              ? "FAIL (error: " + s.message() + ")"
                               : "FAIL (the reference does not fit)")
      << "\n";
  if (!opts.json.empty()) {
    const std::string verdict = s.ok()               ? "pass"
                                : s.exit_code() == 1 ? "changed"
                                : error              ? "error"
                                                     : "does_not_fit";
    LOCKSTEP_RETURN_IF_ERROR(
        WriteOutput(opts.json, ck.Summary(verdict, s.ok() ? "" : s.message()).dump(2) + "\n"));
  }
  return s;
}

}  // namespace lockstep
