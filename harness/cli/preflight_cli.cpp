// The `preflight` subcommand's flags (harness/include/lockstep/harness/preflight.h).
#include <unistd.h>

#include <charconv>
#include <iostream>
#include <memory>
#include <sstream>

#include "commands.h"
#include "commands/output.h"
#include "commands/terminal.h"
#include "engine_flags.h"
#include "lockstep/harness/preflight.h"

namespace lockstep::cli {

namespace {

// "0,1,3" as integers; "" as none. A bad entry is bad input naming the flag.
Result<std::vector<int>> IntList(const std::string& text, const std::string& flag) {
  std::vector<int> v;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty()) continue;
    int n = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
    if (ec != std::errc() || end != item.data() + item.size())
      return Status::InvalidArgument(flag, "'" + item + "' is not an integer");
    v.push_back(n);
  }
  return v;
}

}  // namespace

void AddPreflight(CLI::App& app, std::vector<Command>& commands) {
  auto* pf = app.add_subcommand(
      "preflight",
      "Is this engine config deterministic? Lists the knobs that make results timing- or "
      "batch-dependent and probes each property on the model");
  struct State {
    PreflightOptions opts;
    EngineFlags flags;
    std::string probes;
    std::string sweep, sweep_rows, age;
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
                 "threads, engine_age (comma separated)")
      ->default_str("all")
      ->group(kGroupCompare);
  pf->add_flag("--skip-probes", o.skip_probes, "The static part only (no run)")
      ->group(kGroupCompare);
  pf->add_option("--sweep", st->sweep,
                 "The sweep instead of the probes: the probe beside k co-resident background "
                 "requests for each k (default 0 1 2 3 7 8 15 16 31 32 63 64 and the maximum, "
                 "clipped to --slots - 1), and prefill chunks straddling the CPU kernels' tile "
                 "boundaries")
      ->expected(0, 1)
      ->type_name("[K-LIST]")
      ->group(kGroupCompare);
  pf->add_option("--sweep-rows", st->sweep_rows,
                 "The sweep's rows points: prefill chunk sizes (comma separated) or none")
      ->type_name("LIST|none")
      ->default_str("each tile boundary - 1, itself, + 1")
      ->group(kGroupCompare);
  pf->add_option("--age", st->age,
                 "The engine_age probe's request positions k (request k on an engine that "
                 "served k - 1 others; comma separated)")
      ->type_name("K-LIST")
      ->default_str("2,5")
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
      "  lockstep preflight --model m --skip-probes --batch-invariant off --slots 16\n"
      "  lockstep preflight --model m --slots 64 --spec 4 --prefix-cache on --sweep "
      "0,1,3,7,15,31,63");
  commands.push_back({pf, [st, pf]() -> Status {
                        LOCKSTEP_ASSIGN_OR_RETURN(st->opts.config, st->flags.Build());
                        std::stringstream ids(st->probes);
                        for (std::string id; std::getline(ids, id, ',');)
                          if (!id.empty()) st->opts.probes.push_back(id);
                        PreflightOptions& po = st->opts;
                        po.sweep = pf->count("--sweep") > 0;
                        LOCKSTEP_ASSIGN_OR_RETURN(po.sweep_k, IntList(st->sweep, "--sweep"));
                        if (st->sweep_rows == "none") {
                          po.sweep_rows = std::vector<int>{};
                        } else if (!st->sweep_rows.empty()) {
                          LOCKSTEP_ASSIGN_OR_RETURN(po.sweep_rows,
                                                    IntList(st->sweep_rows, "--sweep-rows"));
                        }
                        if (!st->age.empty()) {
                          LOCKSTEP_ASSIGN_OR_RETURN(po.age_k, IntList(st->age, "--age"));
                        }
                        std::ostream* out = &std::cout;
                        if (IsStdout(st->opts.json)) out = &std::cerr;
                        st->opts.color = ColorEnabled(out == &std::cerr ? stderr : stdout);
                        st->opts.progress = ::isatty(2) == 1;
                        return RunPreflightCommand(st->opts, *out);
                      }});
}

}  // namespace lockstep::cli
