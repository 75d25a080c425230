// What golden record and golden check share: the manifest's form and checks, running one arm,
// reading an arm's stdout JSON. Private to harness/golden/.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/status.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/golden.h"
#include "lockstep/harness/process.h"

namespace lockstep::golden {

inline constexpr const char* kSchema = "lockstep.golden";
inline constexpr int kSchemaVersion = 1;

// The arms a reference holds: state arms that are not the positive control, in plan order.
std::vector<const ArmSpec*> ReferenceArms(const Campaign& c);

nlohmann::json DigestsToJson(const std::vector<ItemDigest>& digests);

// DIR/manifest.json, read and checked key by key (types included). A missing file or any
// malformed key is kInvalidArgument naming it: the reference does not fit.
Result<nlohmann::json> ReadManifest(const std::string& dir);

// One arm as a fresh `lockstep generate`: `cfg` written to arm_dir/config.json, the runner's
// argv plus `extra` (e.g. --export-compress lz4). The child's outcome (exit code, signal).
Result<ChildResult> RunArm(const Campaign& c, const ArmSpec& arm, const EngineConfig& cfg,
                           const std::string& exe, const std::string& arm_dir,
                           const std::string& tokens_path, const std::vector<std::string>& extra);

struct ArmOutput {
  std::vector<std::int32_t> output_ids;
  std::string stop_reason;
};
// output_ids and stop_reason of arm_dir/stdout.json (kRuntime when unreadable: the arm failed).
Result<ArmOutput> ReadArmOutput(const std::string& arm_dir);

// "2026-12-01T12:00:00Z"
std::string UtcNow();

}  // namespace lockstep::golden
