// The `preflight` subcommand's flags (harness/include/lockstep/harness/preflight.h).
#include <unistd.h>

#include <iostream>
#include <memory>
#include <sstream>

#include "commands.h"
#include "commands/output.h"
#include "commands/terminal.h"
#include "engine_flags.h"
#include "lockstep/harness/preflight.h"

namespace lockstep::cli {

void AddPreflight(CLI::App& app, std::vector<Command>& commands) {
  auto* pf = app.add_subcommand(
      "preflight",
      "Is this engine config deterministic? Lists the knobs that make results timing- or "
      "batch-dependent and probes each property on the model");
  struct State {
    PreflightOptions opts;
    EngineFlags flags;
    std::string probes;
  };
  auto st = std::make_shared<State>();
  PreflightOptions& o = st->opts;
  pf->add_option("--prompt", o.prompt_text, "Prompt text (the model's tokenizer)")
      ->default_str("built-in: 32 tokens and a 48-token block 3 times")
      ->group(kGroupRequest);
  pf->add_option("--prompt-tokens", o.prompt_tokens,
                 "File of token ids (whitespace or comma separated)")
      ->group(kGroupRequest);
  pf->add_option("--probe-tokens", o.probe_tokens,
                 "Tokens each probe request generates, 4 .. 256 (ignore_eos on for the probes)")
      ->default_str("--max-new within 4 .. 24")
      ->group(kGroupRequest);
  st->flags.Register(*pf);  // the engine options: the config under test
  pf->add_option("--probes", st->probes,
                 "Probes to run: fresh_repeat, index_timing, load, cold_warm, verify_single, "
                 "threads (comma separated)")
      ->default_str("all")
      ->group(kGroupCompare);
  pf->add_flag("--skip-probes", o.skip_probes, "The static part only (no run)")
      ->group(kGroupCompare);
  pf->add_option("--json", o.json, "Write the lockstep.preflight v1 object")
      ->type_name("PATH|-")
      ->group(kGroupReports);
  pf->add_option("--work", o.work_dir, "Keep the probes' exports in this folder")
      ->default_str("a temporary folder, removed")
      ->group(kGroupExport);
  pf->footer(
      "Examples:\n"
      "  lockstep preflight --model m\n"
      "  lockstep preflight --model m --spec 4 --draft-policy latency --suffix-index async\n"
      "  lockstep preflight --config arm.json --slots 4 --batch-invariant off --json - | jq "
      ".verdict\n"
      "  lockstep preflight --model m --skip-probes --batch-invariant off --slots 16");
  commands.push_back({pf, [st]() -> Status {
                        LOCKSTEP_ASSIGN_OR_RETURN(st->opts.config, st->flags.Build());
                        std::stringstream ids(st->probes);
                        for (std::string id; std::getline(ids, id, ',');)
                          if (!id.empty()) st->opts.probes.push_back(id);
                        std::ostream* out = &std::cout;
                        if (IsStdout(st->opts.json)) out = &std::cerr;
                        st->opts.color = ColorEnabled(out == &std::cerr ? stderr : stdout);
                        st->opts.progress = ::isatty(2) == 1;
                        return RunPreflightCommand(st->opts, *out);
                      }});
}

}  // namespace lockstep::cli
