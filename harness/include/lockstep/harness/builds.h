// Named builds: the executables a campaign's arms run on (`[builds]` in the plan, `--build
// NAME=PATH` on the command line; campaigns/README.md). A change gate runs arms on main's build
// and on the pull request's build and compares them on the same requests.
//
// Every build an arm uses is probed before anything runs: it must exist, be an executable file,
// answer `PATH --version` within the probe's deadline with a `lockstep ...` first line, and print
// the `export schema:` line of this build (its exports must be readable by this comparator).
// Anything else is kInvalidArgument (exit 2) naming the build, its path and the reason. The probe
// records the file's SHA-256 and the version lines; the runner writes them into the ledger's
// `planned` entry and checks the SHA-256 again before each send (a build replaced mid-campaign,
// or before a resume, is refused).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/engine/status.h"
#include "lockstep/harness/campaign.h"

namespace lockstep {

// The name under which arms without `build` run: the running executable (or RunOptions::exe).
inline constexpr const char* kSelfBuild = "self";

struct ArmBuild {
  std::string name;           // a [builds] name, or kSelfBuild
  std::string path;           // absolute
  std::string sha256;         // of the file, lower-case hex
  std::string version;        // first line of --version ("lockstep 0.1.0")
  std::string commit;         // "commit: ..." ("" when not printed)
  std::string build_type;     // "build type: ..."
  std::string export_schema;  // "export schema: ..." ("lockstep.export v1")
};

// "lockstep.export vN" for this build.
std::string ThisExportSchema();

// Probes one executable (see the header comment); `timeout_s` bounds `--version`.
Result<ArmBuild> ProbeBuild(const std::string& name, const std::string& path,
                            double timeout_s = 10.0);

// The builds the campaign's arms use, probed: the plan's [builds] paths with `overrides`
// ("NAME=PATH", relative paths against the working folder; NAME must be declared in [builds],
// once) applied, and kSelfBuild = `self_exe` when an arm has no build.
Result<std::map<std::string, ArmBuild>> ResolveBuilds(const Campaign& c,
                                                      const std::vector<std::string>& overrides,
                                                      const std::string& self_exe);

// The build's ledger / report record (name not included: it is the key) and back.
nlohmann::json BuildJson(const ArmBuild& b);
ArmBuild BuildFromJson(const std::string& name, const nlohmann::json& j);

// The build an arm runs on.
inline const std::string& ArmBuildName(const ArmSpec& a) {
  static const std::string self = kSelfBuild;
  return a.build.empty() ? self : a.build;
}

}  // namespace lockstep
