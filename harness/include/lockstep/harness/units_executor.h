// `lockstep run PLAN --executor units|slurm` (issue 41): the campaign driven through its units
// (units.h) by this process: expand, then per wave run the units, merge, next wave, until merge
// gives the verdict. Killing the driver loses nothing: `lockstep run --resume DIR` merges what
// finished, waits for what a scheduler still runs, and sends only the units without verified
// outputs.
//
//   units   each unit a fresh `lockstep run-unit` child of this process, one after another
//   slurm   one `sbatch --array=<indices>` per wave (plus --slurm-arg ARG...), polled with
//           `sacct` (State and ExitCode; `scontrol show job` where sacct has no records: a
//           cluster without accounting storage); a task that is not COMPLETED with ExitCode 0:0
//           (CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, FAILED, ...) gets a
//           scheduler record (units.h SchedulerRecordPath) and merges as a failed unit, whatever
//           files it left.
//
// DIR/executor.json records the executor and the Slurm arguments (a resumed run uses them);
// DIR/slurm.json the submissions ({"submissions": [{"wave", "name", "job", "indices"}]}), each
// written before its sbatch (job null) and after it (the job id).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "lockstep/engine/status.h"
#include "lockstep/harness/runner.h"

namespace lockstep {

struct ExecutorOptions {
  std::string executor = "local";  // local (RunCampaign) | units | slurm
  std::vector<std::string> slurm_args;
  double poll_s = 2.0;  // seconds between squeue / sacct polls
};

// A test hook, named as one: LOCKSTEP_TEST_HOOK_KILL_DRIVER_AFTER=N makes the driver SIGKILL
// itself at its N-th step (a step: a merge, or a unit or wave sent), to prove --resume.
inline constexpr const char* kKillDriverEnv = "LOCKSTEP_TEST_HOOK_KILL_DRIVER_AFTER";

// Runs or resumes (ro.resume) the campaign in ro.out_dir through its units. Status as
// RunCampaign's; kInvalidArgument for a plan units cannot run (service arms), kRuntime when a
// scheduler command fails or units stay unrun.
Status RunUnitsCampaign(const RunOptions& ro, const ExecutorOptions& eo, std::ostream& out);

// Whether a run folder was made by `plan expand` / an executor other than local (its
// units.json exists): `lockstep run --resume` then resumes it with RunUnitsCampaign.
bool IsUnitsRunFolder(const std::string& dir);

// One array task's state as Slurm reports it.
struct SlurmTaskState {
  int index = -1;         // the array index (our unit index)
  std::string state;      // COMPLETED, FAILED, CANCELLED, TIMEOUT, ... (first word)
  std::string exit_code;  // "E:S" (exit code : signal)
};
// Parses `sacct -n -P -X -o JobID,State,ExitCode` lines ("123_4|COMPLETED|0:0") of job `job`.
std::vector<SlurmTaskState> ParseSacct(const std::string& text, const std::string& job);
// Parses `scontrol -o show job` lines (ArrayTaskId=N, or a range for pending tasks).
std::vector<SlurmTaskState> ParseScontrol(const std::string& text);
// Whether a state is final (the task will not run again by itself).
bool SlurmStateFinal(const std::string& state);
// A final state that counts as success: COMPLETED with exit code 0:0. Anything else is a failure,
// whatever the unit's own exit code said (vLLM's "false green": sacct's 0:0 on a CANCELLED job).
bool SlurmTaskSucceeded(const SlurmTaskState& t);

}  // namespace lockstep
