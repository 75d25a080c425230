// The run folder of a campaign (runner.h "Run folder"), named once: every path the runner, the
// resume, the campaign report, the summary and the golden check read or write is built here, as
// LevelDB's db/filename.h names every file of a database folder. Pure string work: nothing here
// touches the disk.
//
//   DIR/plan.toml  DIR/ledger.jsonl  DIR/model/  DIR/request.tokens  DIR/shared/
//   DIR/arms/<arm>/                 (ArmDir)     DIR/arms/<arm>/r<k>/ (RepeatDir, timing arms)
//     config.json stdout.json stderr.log trace.jsonl export.h5 service.json   (arm_file::k*)
//   DIR/compare/<arm>.json|.md|.html|.nrmse.svg                               (Compare)
//   DIR/localize/<baseline>-<arm>.json|.md  (plan key localize)               (Localize)
//   DIR/report.md  DIR/report.html  DIR/junit.xml
//
// RunRecord (below) is the ledger of such a folder replayed once into types: the runner and its
// resume, the campaign report and the summary JSON read it instead of each replaying the JSON.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lockstep/harness/gates.h"
#include "lockstep/harness/ledger.h"

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

  // DIR/localize/<baseline>-<arm><ext>: a failing comparison localised (plan key localize).
  std::string Localize(std::string_view baseline, std::string_view arm,
                       std::string_view ext) const {
    return dir_ + "/localize/" + std::string(baseline) + "-" + std::string(arm) + std::string(ext);
  }

  std::string ReportMd() const { return dir_ + "/report.md"; }
  std::string ReportHtml() const { return dir_ + "/report.html"; }
  std::string Junit() const { return dir_ + "/junit.xml"; }

 private:
  std::string dir_;
};

// ---- ledger entries as types: the runner writes them with Encode(), RunRecord reads them with
// Decode() (missing keys read as their defaults, as in ledgers of older builds) ----

struct PlannedEntry {  // "planned": the first entry of every ledger
  static constexpr const char* kEvent = "planned";
  std::string campaign, plan_sha256, plan_dir;
  std::vector<std::string> arms;  // in plan order
  nlohmann::json builds = nlohmann::json::object(), arm_builds = nlohmann::json::object();
  nlohmann::json service;  // the remote server ({url, api_key_env}); null: none (not written)
  // The plan's `order` for timing arms (units.h GroupSendOrder) and its seed: written only when
  // not "plan" (the ledgers of plans without it are unchanged).
  std::string order = "plan";
  std::uint64_t order_seed = 0;
  nlohmann::json Encode() const;
  static PlannedEntry Decode(const nlohmann::json& d);
};

struct SentEntry {  // "sent": one repeat of an arm handed to its process or server
  static constexpr const char* kEvent = "sent";
  int repeat = 0;
  std::string mode;    // state | timing
  std::string server;  // fresh | shared for a service arm; "" for a process arm (not written)
  std::string engine_config_sha256, build, executable_sha256;
  nlohmann::json Encode() const;
  static SentEntry Decode(const nlohmann::json& d);
};

struct RunEndEntry {  // "finished" (it exited 0 or 1) or "failed" (anything else)
  bool failed = false;
  int repeat = 0, exit_code = 0, signal = 0;
  double seconds = 0;
  nlohmann::json service;  // a service arm's record (null: a process arm, not written)
  std::string error;       // why a service arm failed ("": not written)
  // A unit's run merged from its fragment (units.h): {"index", "attempt", "host" (the
  // HostFingerprint), "host_sha256", "retry_differs" (null: no earlier attempt), "scheduler"
  // (a scheduler's failure record, null none)}. Null: a child of the runner (not written).
  nlohmann::json unit;
  const char* event() const { return failed ? "failed" : "finished"; }
  nlohmann::json Encode() const;
  static RunEndEntry Decode(const LedgerEntry& e);
};

struct NotSentEntry {  // "not_sent"
  static constexpr const char* kEvent = "not_sent";
  std::string reason;
  nlohmann::json Encode() const;
  static NotSentEntry Decode(const nlohmann::json& d);
};

struct StoppedEntry {  // "stopped": the stop rule that fired, before which arm
  static constexpr const char* kEvent = "stopped";
  std::string rule, message, before_arm;
  std::vector<std::string> fired_by;
  nlohmann::json Encode() const;
  static StoppedEntry Decode(const nlohmann::json& d);
};

struct DecisionEntry {  // "decision": a comparison's verdict under its plan name
  static constexpr const char* kEvent = "decision";
  std::string name;
  bool value = false;
  nlohmann::json Encode() const;
  static DecisionEntry Decode(const nlohmann::json& d);
};

struct DoneEntry {  // "done": the campaign's verdict (CampaignOutcomeName) and its reason
  static constexpr const char* kEvent = "done";
  std::string verdict, reason;
  nlohmann::json Encode() const;
  static DoneEntry Decode(const nlohmann::json& d);
};

// ---- the ledger, replayed once ----

// What a run folder's ledger says (harness/campaign/runner.cpp writes it; campaigns/README.md
// lists the events). Apply() takes the entries in ledger order; an event this build does not
// know is ignored, a compared entry whose record does not decode is left out of `compared`.
// Thread-compatible (a value).
struct RunRecord {
  using ArmRepeat = std::pair<std::string, int>;  // (arm, repeat)

  // planned: the campaign, its plan, the arms in plan order, the builds (null: a ledger from
  // before named builds), the remote server ({url, api_key_env}; null none).
  std::string campaign, plan_sha256, plan_dir;
  std::vector<std::string> arm_order;
  nlohmann::json builds, arm_builds, service;

  std::set<ArmRepeat> sent;
  std::set<ArmRepeat> finished;  // a finished or failed entry (the repeat is no longer in flight)
  std::set<ArmRepeat> ran;       // a finished entry (it exited 0 or 1)
  std::set<ArmRepeat> failed;    // a failed entry
  std::map<ArmRepeat, int> exit_codes;        // of the finished / failed entries
  std::map<ArmRepeat, nlohmann::json> units;  // the merged entries' `unit` objects
  std::string order = "plan";                 // the planned entry's
  std::uint64_t order_seed = 0;
  std::map<std::string, nlohmann::json> first_service;  // repeat 0's last finished `service`
  std::map<std::string, ComparisonResult> compared;     // by arm
  std::vector<std::string> compared_order;              // arms, in the order they were compared
  std::map<std::string, bool> decisions;
  bool stopped = false;
  nlohmann::json stopped_data;                         // the stopped entry's data (null none)
  std::set<std::string> not_sent;                      // arms
  std::map<std::string, std::string> not_sent_reason;  // by arm
  bool done = false;
  std::string verdict, verdict_reason;  // the done entry's
  bool shared_started = false;  // some runner process of this folder started the shared server
  bool remote_checked = false;  // a remote server's fingerprints were checked (remote_checked)
  nlohmann::json remote;        // what was checked (null none)

  void Apply(const LedgerEntry& e);
  static RunRecord Replay(const std::vector<LedgerEntry>& entries);
};

// A run folder's ledger read without changing it (Ledger::Read: a torn tail is reported, not
// moved) and replayed: what the campaign report and the summary read. Errors: Ledger::Read's.
struct RunRead {
  LedgerLoad ledger;
  RunRecord record;
};
Result<RunRead> ReadRun(const std::string& dir);
// The run folder's ledger opened for appending (Ledger::Open: a torn tail set aside first), its
// entries in `loaded`: what the runner and its resume append to.
Result<Ledger> OpenRunLedger(const std::string& dir, LedgerLoad* loaded);

}  // namespace lockstep
