// `lockstep golden record`: runs the plan's reference arms once each and stores their exports and
// the manifest (golden.h). The folder is built aside and renamed so that a killed record leaves
// either the old reference or the new one, never half of one.
#include <fmt/format.h>

#include <filesystem>
#include <ostream>

#include "commands/output.h"
#include "golden_internal.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/runner.h"
#include "lockstep/instrument/export_writer.h"
#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

namespace fs = std::filesystem;

namespace {

// Last non-empty line of a child's stderr (for the one-line error of a failed arm).
std::string LastLine(const std::string& path) {
  auto text = ReadFile(path, std::size_t{16} << 20);
  if (!text.ok()) return "";
  std::string last, line;
  for (char ch : *text) {
    if (ch != '\n') {
      line += ch;
    } else if (!line.empty()) {
      last = line;
      line.clear();
    }
  }
  return line.empty() ? last : line;
}

struct Recorder {
  Recorder(const GoldenRecordOptions& o, std::ostream& os) : opts(o), out(os) {}
  const GoldenRecordOptions& opts;
  std::ostream& out;
  Campaign c;
  std::string tmp, exe, model_dir;
  bool lz4 = true;
  std::string compression_note;
  nlohmann::json arms = nlohmann::json::array();
  std::string model_sha256, request_sha256;

  // Runs one arm, with LZ4 while the plugin is there: the first arm refused for the plugin
  // turns compression off for the rest (and the manifest says why).
  Status RunOne(const ArmSpec& arm, const EngineConfig& cfg, const std::string& d) {
    for (;;) {
      std::vector<std::string> extra;
      if (lz4) extra = {"--export-compress", "lz4"};
      LOCKSTEP_ASSIGN_OR_RETURN(
          ChildResult cr, golden::RunArm(c, arm, cfg, exe, d, tmp + "/request.tokens", extra));
      if (cr.exit_code == 0) return Status::Ok();
      std::string why = LastLine(d + "/stderr.log");
      if (why.rfind("lockstep: error: ", 0) == 0) why.erase(0, 17);
      if (lz4 && cr.exit_code == 2 && why.find("plugin") != std::string::npos) {
        lz4 = false;
        compression_note = "LZ4 unavailable, stored uncompressed: " + why;
        out << "  " << compression_note << "\n";
        continue;
      }
      return Status::Runtime(
          "arm " + arm.name,
          fmt::format("generate failed (exit {}{}): {}", cr.exit_code,
                      cr.signal ? fmt::format(", signal {}", cr.signal) : "", why));
    }
  }

  Status RecordArm(const ArmSpec& arm) {
    const std::string rel = "arms/" + arm.name;
    const std::string d = tmp + "/" + rel;
    LOCKSTEP_ASSIGN_OR_RETURN(EngineConfig cfg, EffectiveConfig(c, arm, model_dir));
    LOCKSTEP_RETURN_IF_ERROR(RunOne(arm, cfg, d));
    LOCKSTEP_ASSIGN_OR_RETURN(golden::ArmOutput o, golden::ReadArmOutput(d));
    LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<ExportReader> r,
                              ExportReader::Open(d + "/export.h5"));
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<ItemDigest> digests, ExportItemDigests(*r));
    if (digests.empty())
      return Status::InvalidArgument(
          "arm " + arm.name,
          "exported no state item (the plan's [export] windows select none): a reference "
          "that holds nothing cannot check anything");
    LOCKSTEP_ASSIGN_OR_RETURN(std::string file_sha, Sha256File(d + "/export.h5"));
    const ExportMeta& m = r->meta();
    if (!model_sha256.empty() &&
        (m.model_sha256 != model_sha256 || m.request_sha256 != request_sha256))
      return Status::Runtime("arm " + arm.name,
                             "its model or request differs from the first arm's");
    model_sha256 = m.model_sha256;
    request_sha256 = m.request_sha256;
    nlohmann::json cfg_json = nlohmann::json::parse(cfg.ToJson());
    cfg_json.erase("model");  // the folder differs between machines; the model is model_sha256
    arms.push_back({{"name", arm.name},
                    {"export", rel + "/export.h5"},
                    {"export_file_sha256", file_sha},
                    {"run_id", m.run_id},
                    {"config_sha256", m.config_sha256},
                    {"engine_config", cfg_json},
                    {"output_ids", o.output_ids},
                    {"stop_reason", o.stop_reason},
                    {"n_checkpoints", m.checkpoints.size()},
                    {"items", golden::DigestsToJson(digests)}});
    out << fmt::format("  {}: {} items at {} checkpoints, {} output tokens ({})\n", arm.name,
                       digests.size(), m.checkpoints.size(), o.output_ids.size(), o.stop_reason);
    return Status::Ok();
  }

  nlohmann::json Manifest(const std::string& exe_sha) const {
    return {{"schema", golden::kSchema},
            {"schema_version", golden::kSchemaVersion},
            {"campaign", c.name},
            {"plan_sha256", c.plan_sha256},
            {"plan_dir", c.plan_dir},
            {"recorded_utc", golden::UtcNow()},
            {"build", {{"executable_sha256", exe_sha}, {"version", opts.version}}},
            {"export_schema", "lockstep.export"},
            {"export_schema_version", kExportSchemaVersion},
            {"compression", lz4 ? "lz4" : "none"},
            {"compression_note", compression_note},
            {"model_sha256", model_sha256},
            {"request_sha256", request_sha256},
            {"arms", arms}};
  }
};

// tmp replaces out_dir: the old reference is moved aside first and removed after.
Status Publish(const std::string& tmp, const std::string& out_dir) {
  std::error_code ec;
  const std::string old = out_dir + ".replaced";
  fs::remove_all(old, ec);
  if (fs::exists(out_dir)) fs::rename(out_dir, old, ec);
  if (ec) return Status::IOError("reference folder '" + out_dir + "'", ec.message());
  fs::rename(tmp, out_dir, ec);
  if (ec) return Status::IOError("reference folder '" + out_dir + "'", ec.message());
  fs::remove_all(old, ec);
  return Status::Ok();
}

}  // namespace

Status RunGoldenRecord(const GoldenRecordOptions& opts, std::ostream& out) {
  if (opts.plan.empty()) return Status::InvalidArgument("--plan", "a campaign file is required");
  if (opts.out_dir.empty()) return Status::InvalidArgument("--out", "a folder is required");
  std::error_code ec;
  if (fs::exists(opts.out_dir) &&
      (!fs::is_directory(opts.out_dir) || !fs::is_empty(opts.out_dir, ec)) && !opts.force)
    return Status::InvalidArgument("--out '" + opts.out_dir + "'",
                                   "exists and is not empty (re-record it with --force)");
  Recorder rec(opts, out);
  rec.tmp = opts.out_dir + ".recording";
  rec.exe = opts.exe;
  rec.lz4 = opts.compress;
  LOCKSTEP_ASSIGN_OR_RETURN(rec.c, LoadCampaign(opts.plan));
  const std::vector<const ArmSpec*> arms = golden::ReferenceArms(rec.c);
  if (arms.empty())
    return Status::InvalidArgument("--plan '" + opts.plan + "'",
                                   "has no state arm to record (only timing arms or the control)");
  if (rec.exe.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(rec.exe, SelfExecutable());
  }
  LOCKSTEP_ASSIGN_OR_RETURN(std::string exe_sha, Sha256File(rec.exe));
  fs::remove_all(rec.tmp, ec);
  fs::create_directories(rec.tmp, ec);
  if (ec) return Status::IOError("folder '" + rec.tmp + "'", ec.message());
  out << fmt::format("golden record {} (plan SHA-256 {}) into {}\n", rec.c.name,
                     rec.c.plan_sha256.substr(0, 12), opts.out_dir);
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(rec.tmp + "/plan.toml", rec.c.plan_text));
  LOCKSTEP_ASSIGN_OR_RETURN(rec.model_dir, ProvisionPlanModel(rec.c, rec.tmp + "/work"));
  LOCKSTEP_RETURN_IF_ERROR(ProvisionPlanRequest(rec.c, rec.model_dir, rec.tmp + "/request.tokens"));
  for (const ArmSpec* a : arms) LOCKSTEP_RETURN_IF_ERROR(rec.RecordArm(*a));
  fs::remove_all(rec.tmp + "/work", ec);  // a synthetic model is made again from the plan
  const nlohmann::json manifest = rec.Manifest(exe_sha);
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(rec.tmp + "/manifest.json", manifest.dump(1) + "\n"));
  LOCKSTEP_RETURN_IF_ERROR(Publish(rec.tmp, opts.out_dir));
  out << fmt::format("recorded {} arms ({} exports) in {}: check with lockstep golden check {}\n",
                     arms.size(), rec.lz4 ? "LZ4" : "uncompressed", opts.out_dir, opts.out_dir);
  if (opts.json.empty()) return Status::Ok();
  nlohmann::json summary = {{"command", "golden record"},
                            {"reference", opts.out_dir},
                            {"campaign", rec.c.name},
                            {"compression", manifest["compression"]},
                            {"build", manifest["build"]},
                            {"model_sha256", rec.model_sha256},
                            {"request_sha256", rec.request_sha256},
                            {"arms", nlohmann::json::array()}};
  for (const auto& a : rec.arms)
    summary["arms"].push_back({{"name", a["name"]},
                               {"items", a["items"].size()},
                               {"output_ids", a["output_ids"]},
                               {"stop_reason", a["stop_reason"]}});
  return WriteOutput(opts.json, summary.dump(2) + "\n");
}

}  // namespace lockstep
