// The run folder of a campaign (runner.h "Run folder"), named once: every path the runner, the
// resume, the campaign report, the summary and the golden check read or write is built here, as
// LevelDB's db/filename.h names every file of a database folder. Pure string work: nothing here
// touches the disk.
//
//   DIR/plan.toml  DIR/ledger.jsonl  DIR/model/  DIR/request.tokens  DIR/shared/
//   DIR/arms/<arm>/                 (ArmDir)     DIR/arms/<arm>/r<k>/ (RepeatDir, timing arms)
//     config.json stdout.json stderr.log trace.jsonl export.h5 service.json   (arm_file::k*)
//   DIR/compare/<arm>.json|.md|.html|.nrmse.svg                               (Compare)
//   DIR/report.md  DIR/report.html  DIR/junit.xml
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace lockstep {

struct ArmSpec;

// The names of the files inside an arm's (or a repeat's) folder.
namespace arm_file {
inline constexpr std::string_view kConfig = "config.json";
inline constexpr std::string_view kStdout = "stdout.json";
inline constexpr std::string_view kStderr = "stderr.log";
inline constexpr std::string_view kTrace = "trace.jsonl";
inline constexpr std::string_view kExport = "export.h5";
inline constexpr std::string_view kService = "service.json";
}  // namespace arm_file

class RunPaths {
 public:
  explicit RunPaths(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }

  std::string Plan() const { return dir_ + "/plan.toml"; }
  std::string Ledger() const { return dir_ + "/ledger.jsonl"; }
  std::string Model() const { return dir_ + "/model"; }
  std::string RequestTokens() const { return dir_ + "/request.tokens"; }
  std::string Shared() const { return dir_ + "/shared"; }

  // DIR/arms/<arm>: the arm's folder (a timing arm's repeats are below it).
  std::string ArmDir(std::string_view arm) const;
  // Where one run of `arm` writes: its folder, or r<repeat>/ inside it for a timing arm.
  std::string RepeatDir(const ArmSpec& arm, int repeat) const;
  // DIR/arms/<arm>/<file>: a file of the arm's folder itself (service.json).
  std::string ArmFile(std::string_view arm, std::string_view file) const;
  // A file of `arm`'s first run (repeat 0; the arm's folder for a state arm): what reports read.
  std::string FirstRunFile(const ArmSpec& arm, std::string_view file) const;

  // DIR/compare/<arm><ext>: the comparison of `arm` with its baseline (ext ".json", ".md", ...).
  std::string Compare(std::string_view arm, std::string_view ext) const;

  std::string ReportMd() const { return dir_ + "/report.md"; }
  std::string ReportHtml() const { return dir_ + "/report.html"; }
  std::string Junit() const { return dir_ + "/junit.xml"; }

 private:
  std::string dir_;
};

}  // namespace lockstep
