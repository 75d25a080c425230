// Named builds (builds.h): the probe that refuses a build before anything runs, and its record.
#include "lockstep/harness/builds.h"

#include <fmt/format.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <sstream>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/process.h"
#include "lockstep/instrument/export_writer.h"
#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

namespace fs = std::filesystem;

std::string ThisExportSchema() {
  return "lockstep.export v" + std::to_string(kExportSchemaVersion);
}

namespace {

// `--version` of `path` into `out` (its stdout); the probe's files live in a private temporary
// folder, removed afterwards.
Status RunVersion(const std::string& path, double timeout_s, std::string* out, std::string* why) {
  std::string tmpl = (fs::temp_directory_path() / "lockstep-probe-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr)
    return Status::IOError("probe folder '" + tmpl + "'", "mkdtemp failed");
  ChildSpec cs;
  cs.argv = {path, "--version"};
  cs.stdout_path = tmpl + "/stdout";
  cs.stderr_path = tmpl + "/stderr";
  cs.timeout_s = timeout_s;
  auto r = RunChild(cs);
  auto text = ReadFile(cs.stdout_path, std::size_t{1} << 20);
  std::error_code ec;
  fs::remove_all(tmpl, ec);
  LOCKSTEP_RETURN_IF_ERROR(r.status());
  if (r->timed_out)
    *why = fmt::format("'--version' did not answer within {:g} s (killed)", timeout_s);
  else if (r->signal != 0)
    *why = fmt::format("'--version' was killed by signal {}", r->signal);
  else if (r->exit_code != 0)
    *why = fmt::format("'--version' exited {}", r->exit_code);
  else if (text.ok())
    *out = *text;
  else
    *why = "'--version' output unreadable: " + text.status().message();
  return Status::Ok();
}

}  // namespace

Result<ArmBuild> ProbeBuild(const std::string& name, const std::string& path, double timeout_s) {
  const std::string what = "build '" + name + "' (" + path + ")";
  auto refuse = [&](const std::string& why) { return Status::InvalidArgument(what, why); };
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!fs::exists(st)) return refuse("does not exist");
  if (fs::is_directory(st)) return refuse("is a folder, not an executable");
  if (!fs::is_regular_file(st)) return refuse("is not a regular file");
  if (::access(path.c_str(), X_OK) != 0) return refuse("is not executable (no execute permission)");
  std::string text, why;
  LOCKSTEP_RETURN_IF_ERROR(RunVersion(path, timeout_s, &text, &why));
  if (!why.empty()) return refuse(why + ": not a lockstep build this one can run");
  ArmBuild b;
  b.name = name;
  b.path = path;
  std::istringstream lines(text);
  std::string line;
  bool first = true;
  while (std::getline(lines, line)) {
    if (first) b.version = line, first = false;
    auto field = [&line](const char* key, std::string& out) {
      if (line.rfind(key, 0) == 0) out = line.substr(std::char_traits<char>::length(key));
    };
    field("commit: ", b.commit);
    field("build type: ", b.build_type);
    field("export schema: ", b.export_schema);
  }
  if (b.version.rfind("lockstep ", 0) != 0)
    return refuse("'--version' printed '" + b.version.substr(0, 80) +
                  "', not 'lockstep VERSION': not a lockstep build");
  if (b.export_schema.empty())
    return refuse(
        "'--version' prints no 'export schema:' line, so its exports cannot be known "
        "to match this build's " +
        ThisExportSchema());
  if (b.export_schema != ThisExportSchema())
    return refuse("export schema '" + b.export_schema + "' differs from this build's '" +
                  ThisExportSchema() + "': its exports cannot be compared");
  LOCKSTEP_ASSIGN_OR_RETURN(b.sha256, Sha256File(path));
  return b;
}

Result<std::map<std::string, ArmBuild>> ResolveBuilds(const Campaign& c,
                                                      const std::vector<std::string>& overrides,
                                                      const std::string& self_exe) {
  std::map<std::string, std::string> paths = c.builds;
  std::set<std::string> given;
  for (const std::string& o : overrides) {
    const auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == o.size())
      return Status::InvalidArgument("--build '" + o + "'", "expected NAME=PATH");
    const std::string name = o.substr(0, eq);
    if (!c.builds.count(name)) {
      std::string names;
      for (const auto& [n, p] : c.builds) names += (names.empty() ? "" : ", ") + n;
      return Status::InvalidArgument("--build '" + o + "'",
                                     "the plan declares no build '" + name + "' ([builds]: " +
                                         (names.empty() ? std::string("none") : names) + ")");
    }
    if (!given.insert(name).second)
      return Status::InvalidArgument("--build '" + o + "'", "build '" + name + "' given twice");
    std::error_code ec;
    paths[name] = fs::absolute(o.substr(eq + 1), ec).lexically_normal().string();
  }
  paths[kSelfBuild] = self_exe;
  std::set<std::string> used;
  for (const ArmSpec& a : c.arms) used.insert(ArmBuildName(a));
  std::map<std::string, ArmBuild> out;
  for (const std::string& name : used) {
    LOCKSTEP_ASSIGN_OR_RETURN(out[name], ProbeBuild(name, paths.at(name)));
  }
  return out;
}

nlohmann::json BuildJson(const ArmBuild& b) {
  return {{"path", b.path},     {"sha256", b.sha256},         {"version", b.version},
          {"commit", b.commit}, {"build_type", b.build_type}, {"export_schema", b.export_schema}};
}

ArmBuild BuildFromJson(const std::string& name, const nlohmann::json& j) {
  ArmBuild b;
  b.name = name;
  if (!j.is_object()) return b;
  b.path = j.value("path", "");
  b.sha256 = j.value("sha256", "");
  b.version = j.value("version", "");
  b.commit = j.value("commit", "");
  b.build_type = j.value("build_type", "");
  b.export_schema = j.value("export_schema", "");
  return b;
}

}  // namespace lockstep
