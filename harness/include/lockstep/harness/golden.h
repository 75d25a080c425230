// Recorded references for CI without a second build: `lockstep golden record --plan P --out DIR`
// and `lockstep golden check DIR` (harness/README.md, "Recorded references").
//
// record runs each state arm of the plan that is not the positive control, once, as a fresh
// `lockstep generate` process with the arm's effective engine config (the runner's
// ArmGenerateArgv, runner.h), and stores in DIR:
//   DIR/manifest.json          lockstep.golden v1 (keys below), written last and atomically
//   DIR/plan.toml              the plan as read (its SHA-256 is in the manifest)
//   DIR/request.tokens         the request's token ids
//   DIR/arms/<arm>/export.h5   the arm's export (LZ4-compressed when the HDF5 plugin is
//                              installed, else uncompressed: the manifest's `compression` says
//                              which), with config.json, stdout.json, trace.jsonl, stderr.log
// The folder is built aside (DIR.recording) and renamed into place, so DIR holds a whole
// reference or none. A non-empty DIR is kInvalidArgument (exit 2) unless `force`.
//
// check re-runs the same arms with the current build (in `work_dir`, or a temporary folder removed
// afterwards) and compares each new export against the stored one with DiffExports (the stored
// export is A). Results:
//   OK                         every arm's output (ids, stop reason) is identical and its state is
//                              bitwise equal to the reference (every item's SHA-256), or within
//                              the thresholds (`thresholds`, `nrmse_max`, `kl_max`); a diff that
//                              compared nothing is never a pass;
//   GateFailed (exit 1)        something changed: the message names the first changed item
//                              (arm, window, checkpoint, stage, layer, item, NRMSE, KL);
//   kInvalidArgument (exit 2)  the reference does not fit: no or a damaged manifest, a plan.toml
//                              that is not the recorded one, another export schema, a stored
//                              export whose item digests or file SHA-256 differ from the
//                              manifest, another model or request than the recorded ones;
//   kRuntime (exit 3)          a generate process failed.
// Engine overrides (`engine_overrides`, "KEY=VALUE", VALUE as JSON or else a string; a string for
// a list key is a one-element list) apply on top of every arm's config: the plan is recorded, so
// this is how a check is given a change to see (e.g. `inject=perturb:...` as a positive control).
// Config keys that differ from the recorded ones are reported, not refused.
//
// manifest.json keys: schema ("lockstep.golden"), schema_version (1), campaign, plan_sha256,
// plan_dir (relative plan paths resolve here), recorded_utc, build {executable_sha256, version},
// export_schema, export_schema_version, compression ("lz4" | "none"), compression_note,
// model_sha256, request_sha256, arms [{name, export, export_file_sha256, run_id, config_sha256,
// engine_config, output_ids, stop_reason, n_checkpoints, items [{key, dtype, shape, sha256}]}]. The
// --json summaries (record and check) are in harness/README.md.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/compare/export_reader.h"
#include "lockstep/engine/status.h"

namespace lockstep {

// One exported state item's bytes as stored: "00000_commit/stage0/layer3/k" (int8 scales as a
// sibling "<key>_scale", f32 [rows, heads]), its dtype, shape and SHA-256 of the raw rows.
struct ItemDigest {
  std::string key, dtype;
  std::vector<std::int64_t> shape;
  std::string sha256;
};

// Every item of every checkpoint, in the reader's order. Errors: the reader's.
Result<std::vector<ItemDigest>> ExportItemDigests(const ExportReader& reader);
// "f32 [3,128] <sha256>" (the form tests/golden/exports.json pins).
std::string DigestText(const ItemDigest& d);

struct GoldenRecordOptions {
  std::string plan;      // PLAN.toml
  std::string out_dir;   // the reference folder
  bool force = false;    // replace a non-empty out_dir
  std::string json;      // summary path ("-" stdout; "" none)
  std::string exe;       // lockstep binary for the arms (default: this executable)
  std::string version;   // `lockstep --version` text of the recording build (the manifest's)
  bool compress = true;  // try --export-compress lz4 (falls back to none without the plugin)
};

Status RunGoldenRecord(const GoldenRecordOptions& opts, std::ostream& out);

struct GoldenCheckOptions {
  std::string dir;       // the reference folder
  std::string work_dir;  // where the new arms run (kept); "": a temporary folder, removed
  std::string model;     // model folder instead of the plan's (a checkpoint moved elsewhere)
  std::vector<std::string> engine_overrides;  // "KEY=VALUE" on top of every arm's config
  bool thresholds = false;                    // the plan's thresholds instead of bitwise
  std::optional<double> nrmse_max, kl_max;    // thresholds (either implies `thresholds`)
  std::string json;                           // summary path ("-" stdout; "" none)
  std::string exe;                            // lockstep binary (default: this executable)
  std::string version;                        // `lockstep --version` text (the summary's)
  double isolate_timeout_s = 30.0;            // each export's isolated parse
};

Status RunGoldenCheck(const GoldenCheckOptions& opts, std::ostream& out);

}  // namespace lockstep
