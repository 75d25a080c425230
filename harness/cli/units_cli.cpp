// `plan expand`, `run-unit` and `merge` (harness/include/lockstep/harness/units.h).
#include <iostream>
#include <memory>

#include "commands.h"
#include "commands/output.h"
#include "lockstep/harness/units.h"

namespace lockstep::cli {

void AddUnits(CLI::App& app, std::vector<Command>& commands) {
  auto* plan = app.add_subcommand("plan", "Campaign plans cut into units for a scheduler");
  plan->require_subcommand(1);
  struct ExpandState {
    ExpandOptions opts;
    int wave = -1;
    bool count = false;
  };
  auto xs = std::make_shared<ExpandState>();
  auto* expand = plan->add_subcommand(
      "expand", "Write the run folder and DIR/units.json (one unit per arm and repeat, by wave)");
  expand->add_option("PLAN", xs->opts.plan, "Campaign file (TOML)")->required();
  expand->add_option("--out", xs->opts.out_dir, "Run folder (new, or empty)")
      ->group(kGroupCampaign);
  expand->add_option("--build", xs->opts.builds, "Run the plan's build NAME from PATH")
      ->type_name("NAME=PATH")
      ->group(kGroupCampaign);
  expand->add_option("--wave", xs->wave, "With --count: the wave")->group(kGroupCampaign);
  expand
      ->add_flag("--count", xs->count,
                 "Print the number of units in --wave N and write nothing (sbatch --array)")
      ->group(kGroupCampaign);
  expand->footer(
      "Examples:\n"
      "  lockstep plan expand campaigns/aa-demo.toml --out out/demo\n"
      "  n=$(lockstep plan expand campaigns/aa-demo.toml --wave 0 --count)");
  commands.push_back({expand, [xs]() -> Status {
                        if (xs->count) {
                          if (xs->wave < 0 || !xs->opts.out_dir.empty())
                            return Status::InvalidArgument(
                                "--count", "give --wave N, and no --out (it writes nothing)");
                          LOCKSTEP_ASSIGN_OR_RETURN(int n, WaveUnitCount(xs->opts.plan, xs->wave));
                          std::cout << n << "\n";
                          return Status::Ok();
                        }
                        if (xs->opts.out_dir.empty())
                          return Status::InvalidArgument("plan expand", "--out DIR is required");
                        return ExpandPlan(xs->opts, std::cout);
                      }});

  auto ru = std::make_shared<RunUnitOptions>();
  auto* run_unit = app.add_subcommand(
      "run-unit", "Run one unit of an expanded campaign as a fresh process (DIR/units/N/)");
  run_unit->add_option("DIR", ru->dir, "Run folder (lockstep plan expand)")->required();
  run_unit->add_option("--index", ru->index, "The unit's index")->group(kGroupCampaign);
  run_unit
      ->add_option("--index-env", ru->index_env,
                   "The variable that holds the index (SLURM_ARRAY_TASK_ID, "
                   "JOB_COMPLETION_INDEX, ...)")
      ->group(kGroupCampaign);
  run_unit->add_option("--wave", ru->wave, "The index counts within this wave (0, 1, ...)")
      ->group(kGroupCampaign);
  run_unit->footer(
      "Exit 0 when the unit ran (or had already finished with verified outputs), 3 when it "
      "failed;\nonly `lockstep merge` judges the campaign.\n"
      "Examples:\n"
      "  lockstep run-unit out/demo --index 3\n"
      "  lockstep run-unit out/demo --index-env SLURM_ARRAY_TASK_ID");
  commands.push_back({run_unit, [ru]() -> Status {
                        if ((ru->index >= 0) == !ru->index_env.empty())
                          return Status::InvalidArgument("run-unit",
                                                         "give one of --index N, --index-env VAR");
                        return RunUnit(*ru, std::cout);
                      }});

  auto dir = std::make_shared<std::string>();
  auto pending_exit = std::make_shared<int>(0);
  auto* merge = app.add_subcommand(
      "merge", "Verify the units' outputs, append them to the ledger, judge or name the next wave");
  merge->add_option("DIR", *dir, "Run folder (lockstep plan expand)")->required();
  merge->footer(
      "Exit 0 pass, 1 fail, 4 when units must run first (it prints the wave and the indices),\n"
      "2 bad input, 3 runtime failure.\n"
      "Example:\n"
      "  lockstep merge out/demo");
  commands.push_back({merge,
                      [dir, pending_exit]() -> Status {
                        MergeResult r;
                        LOCKSTEP_RETURN_IF_ERROR(MergeUnits(*dir, std::cout, &r));
                        *pending_exit = r.pending ? kMergePending : 0;
                        return Status::Ok();
                      },
                      pending_exit});
}

}  // namespace lockstep::cli
