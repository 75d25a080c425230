// lockstep: the command-line entry point. Builds the CLI11 app, parses flags into option
// structs, calls one library function per subcommand and maps its Status to the exit code
// (0 ok, 1 gate failed, 2 usage or bad input, 3 runtime failure).
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/generate_command.h"
#include "lockstep/harness/compare_commands.h"
#include "lockstep/harness/model_command.h"
#include "lockstep/harness/runner.h"

namespace {

// Prints a non-OK status and returns its exit code (0 for OK).
int Fail(const lockstep::Status& s) {
  if (!s.ok()) std::fprintf(stderr, "lockstep: error: %s\n", s.message().c_str());
  return s.exit_code();
}

// Engine options shared by every command that runs the engine. Values land in `raw` first so a
// `--config FILE` base can be overridden by exactly the flags given on the command line.
struct EngineFlags {
  std::string config_file, model, backend, split, kv, expert_cache, deterministic, cuda_graphs, devices;
  int cuda_attn_split = 0;
  int threads = 0, stages = 0, prefill = 0, kv_page = 0, max_new = 0, top_k = 0;
  std::uint64_t seed = 0;
  double pcie_frac = 0, temperature = 0, top_p = 0;
  bool ignore_eos = false;
  int spec = 0, spec_max_suffix = 0;
  std::string mtp, suffix_index, draft_policy, replay_path;
  std::vector<std::string> inject;
  std::vector<std::pair<CLI::Option*, std::function<lockstep::Status(lockstep::EngineConfig&)>>> apply;

  void Add(CLI::App* app) {
    app->add_option("--config", config_file, "Base engine config (JSON, as printed by --print-config)");
    auto opt = [&](CLI::Option* o, std::function<lockstep::Status(lockstep::EngineConfig&)> f) { apply.emplace_back(o, f); };
    using lockstep::EngineConfig;
    using lockstep::Status;
    opt(app->add_option("--model", model, "Checkpoint folder (config.json + *.safetensors)"),
        [this](EngineConfig& c) { c.model = model; return Status::Ok(); });
    opt(app->add_option("--backend", backend, "cpu | cuda"), [this](EngineConfig& c) { c.backend = backend; return Status::Ok(); });
    opt(app->add_option("--deterministic", deterministic, "cuda: on (default; bitwise reproducible) | off (faster paths)"),
        [this](EngineConfig& c) {
          if (deterministic != "on" && deterministic != "off")
            return Status::InvalidArgument("--deterministic", "expected on or off, got '" + deterministic + "'");
          c.deterministic = deterministic == "on";
          return Status::Ok();
        });
    opt(app->add_option("--cuda-graphs", cuda_graphs,
                        "cuda: on (default; verify/decode steps replay a captured CUDA graph) | off (every kernel "
                        "launched from the host)"),
        [this](EngineConfig& c) {
          if (cuda_graphs != "on" && cuda_graphs != "off")
            return Status::InvalidArgument("--cuda-graphs", "expected on or off, got '" + cuda_graphs + "'");
          c.cuda_graphs = cuda_graphs == "on";
          return Status::Ok();
        });
    opt(app->add_option("--cuda-attn-split", cuda_attn_split,
                        "cuda: attention rows with a longer context run in blocks of this many positions and a "
                        "combine (default 512; 0: one block per row). Changes the long rows' bits"),
        [this](EngineConfig& c) { c.cuda_attn_split = cuda_attn_split; return Status::Ok(); });
    opt(app->add_option("--devices", devices, "cuda: GPUs for the stages, e.g. 0,1,2,3 (default 0)"),
        [this](EngineConfig& c) {
          auto r = lockstep::ParseIntList(devices, "--devices");
          if (!r.ok()) return r.status();
          c.devices = *r;
          return Status::Ok();
        });
    opt(app->add_option("--threads", threads, "Worker threads (0 = one per hardware thread)"),
        [this](EngineConfig& c) { c.threads = threads; return Status::Ok(); });
    opt(app->add_option("--stages", stages, "Pipeline stages (default 4)"), [this](EngineConfig& c) { c.stages = stages; return Status::Ok(); });
    opt(app->add_option("--split", split, "Layer boundaries between stages, e.g. 12,24,36"), [this](EngineConfig& c) {
      auto r = lockstep::ParseIntList(split, "--split");
      if (!r.ok()) return r.status();
      c.split = *r;
      return Status::Ok();
    });
    opt(app->add_option("--prefill", prefill, "Prefill chunk size in tokens (default 512)"),
        [this](EngineConfig& c) { c.prefill_chunk = prefill; return Status::Ok(); });
    opt(app->add_option("--kv", kv, "K/V cache dtype: f32 | bf16 | int8"), [this](EngineConfig& c) {
      auto r = lockstep::ParseKvDtype(kv);
      if (!r.ok()) return r.status();
      c.kv_dtype = *r;
      return Status::Ok();
    });
    opt(app->add_option("--kv-page", kv_page, "Rows per K/V page (default 64)"),
        [this](EngineConfig& c) { c.kv_page_rows = kv_page; return Status::Ok(); });
    opt(app->add_option("--expert-cache", expert_cache, "Resident experts per MoE layer: auto | N"), [this](EngineConfig& c) {
      if (expert_cache == "auto") {
        c.expert_cache = -1;
        return Status::Ok();
      }
      auto r = lockstep::ParseIntList(expert_cache, "--expert-cache");
      if (!r.ok() || r->size() != 1 || (*r)[0] < 0)
        return Status::InvalidArgument("--expert-cache", "expected auto or a non-negative count, got '" + expert_cache + "'");
      c.expert_cache = (*r)[0];
      return Status::Ok();
    });
    opt(app->add_option("--pcie-frac", pcie_frac, "Fraction of experts served from host memory"),
        [this](EngineConfig& c) { c.pcie_frac = pcie_frac; return Status::Ok(); });
    opt(app->add_option("--max-new", max_new, "Maximum output tokens (default 64)"),
        [this](EngineConfig& c) { c.max_new = max_new; return Status::Ok(); });
    opt(app->add_option("--seed", seed, "Sampling seed (counter RNG key)"), [this](EngineConfig& c) { c.seed = seed; return Status::Ok(); });
    opt(app->add_option("--temperature", temperature, "Sampling temperature (0 = greedy)"),
        [this](EngineConfig& c) { c.temperature = temperature; return Status::Ok(); });
    opt(app->add_option("--top-k", top_k, "Top-k cut (0 = off)"), [this](EngineConfig& c) { c.top_k = top_k; return Status::Ok(); });
    opt(app->add_option("--top-p", top_p, "Top-p cut (1 = off)"), [this](EngineConfig& c) { c.top_p = top_p; return Status::Ok(); });
    opt(app->add_flag("--ignore-eos", ignore_eos, "Keep generating past EOS"),
        [this](EngineConfig& c) { c.ignore_eos = ignore_eos; return Status::Ok(); });
    opt(app->add_option("--spec", spec, "Draft budget K (0 = plain decoding, T = 1)"),
        [this](EngineConfig& c) { c.spec = spec; return Status::Ok(); });
    opt(app->add_option("--mtp", mtp, "MTP drafter: on | off"), [this](EngineConfig& c) {
      if (mtp != "on" && mtp != "off") return Status::InvalidArgument("--mtp", "expected on or off, got '" + mtp + "'");
      c.mtp = mtp == "on";
      return Status::Ok();
    });
    opt(app->add_option("--spec-max-suffix", spec_max_suffix, "Longest suffix draft (default 8)"),
        [this](EngineConfig& c) { c.spec_max_suffix = spec_max_suffix; return Status::Ok(); });
    opt(app->add_option("--suffix-index", suffix_index, "sync | async (async: timing-dependent drafts)"),
        [this](EngineConfig& c) { c.suffix_index = suffix_index; return Status::Ok(); });
    opt(app->add_option("--draft-policy", draft_policy, "static | adaptive | latency"),
        [this](EngineConfig& c) { c.draft_policy = draft_policy; return Status::Ok(); });
    opt(app->add_option("--replay-path", replay_path, "Replay the drafts of recorded window records (JSON lines)"),
        [this](EngineConfig& c) { c.replay_path = replay_path; return Status::Ok(); });
    opt(app->add_option("--inject", inject, "Fault injection, e.g. delay:stage=2:window=5:ms=200 (repeatable)"),
        [this](EngineConfig& c) { c.inject = inject; return Status::Ok(); });
  }

  lockstep::Result<lockstep::EngineConfig> Build() const {
    lockstep::EngineConfig c;
    if (!config_file.empty()) {
      auto text = lockstep::ReadFile(config_file, std::size_t{16} << 20);
      if (!text.ok()) return text.status();
      auto parsed = lockstep::EngineConfig::FromJson(*text, config_file);
      if (!parsed.ok()) return parsed.status();
      c = *parsed;
    }
    for (const auto& [o, f] : apply)
      if (o->count() > 0) {
        auto s = f(c);
        if (!s.ok()) return s;
      }
    return c;
  }
};

}  // namespace

int main(int argc, char** argv) {
  try {
    CLI::App app{"lockstep: deterministic A/A diagnostics and state diffing for a hybrid MoE inference engine"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "lockstep 0.1.0");

    // ---- model init ----
    auto* model = app.add_subcommand("model", "Model files");
    model->require_subcommand(1);
    auto* init = model->add_subcommand("init", "Write a seeded synthetic Qwen3-Next model (HF layout)");
    lockstep::SyntheticOptions syn;
    std::string out_dir, dtype;
    bool no_mtp = false;
    init->add_option("--preset", syn.preset, "tiny | small | seed48 | wide")->required();
    init->add_option("--seed", syn.seed, "Weight seed (same seed, byte-identical files)");
    init->add_option("--out", out_dir, "Output folder")->required();
    init->add_option("--dtype", dtype, "Matrix storage dtype: f32 | bf16 | f16 (default: f32 tiny, bf16 others)");
    init->add_flag("--no-mtp", no_mtp, "Omit the mtp.* tensors");
    init->add_flag("--induction", syn.induction, "Wire induction heads: the model continues repeated text");
    // The preset cut in depth and breadth, its widths kept (e.g. `wide` in 4 layers on a small GPU).
    init->add_option("--layers", syn.n_layers, "Layers instead of the preset's (full attention every 4th)")
        ->check(CLI::Range(1, 1 << 24));
    init->add_option("--experts", syn.n_experts, "Routed experts per MoE layer instead of the preset's")
        ->check(CLI::Range(1, 1 << 24));
    init->add_option("--experts-used", syn.n_experts_used, "Experts per token instead of the preset's")
        ->check(CLI::Range(1, 1 << 24));
    init->add_option("--vocab", syn.n_vocab, "Vocabulary size instead of the preset's")->check(CLI::Range(1, 1 << 24));

    // ---- generate ----
    auto* gen = app.add_subcommand("generate", "Run one request on the engine and print the output");
    lockstep::GenerateOptions gopts;
    EngineFlags flags;
    flags.Add(gen);
    gen->add_option("--prompt", gopts.prompt_text, "Prompt text (byte-level tokens)");
    gen->add_option("--prompt-file", gopts.prompt_file, "File whose bytes are the prompt");
    gen->add_option("--prompt-tokens", gopts.prompt_tokens, "File of token ids (whitespace or comma separated)");
    gen->add_flag("--json", gopts.json, "Print one JSON object (tokens, stop reason, timings)");
    gen->add_option("--trace-jsonl", gopts.trace_jsonl, "Stream window records as JSON lines (one write per window)");
    gen->add_option("--export", gopts.export_path, "Write state exports (lockstep.export v1 HDF5)");
    gen->add_option("--export-windows", gopts.export_windows, "Windows that export state: all | none | LIST (default 0-2)");
    gen->add_option("--export-points", gopts.export_points, "Checkpoints: pre_verify,post_verify,commit (default all)");
    gen->add_option("--export-compress", gopts.export_compress,
                    "none | lz4 (chunked, through the LZ4 HDF5 filter plugin; default none)");
    gen->add_option("--arm", gopts.arm, "Arm name recorded in the export");
    gen->add_option("--trace-json", gopts.trace_json, "Write a Chrome trace-event JSON of the windows (Perfetto)");
    gen->add_option("--sample-ms", gopts.sample_ms, "Resource sampler interval in ms (default 100)");
    gen->add_option("--guard-min-free-mib", gopts.guard_min_free_mib,
                    "End the request cleanly when free memory falls below N MiB");
    gen->add_flag("--print-config", gopts.print_config, "Print the effective config as canonical JSON and exit");
    gen->add_flag("--progress", gopts.progress, "Print 'progress: prefill D/N' lines on stderr (campaign runners read them)");

    // ---- diff / align / summarize (the comparator: reads files, never runs the engine) ----
    auto add_reports = [](CLI::App* sc, lockstep::ReportOutputs& r) {
      sc->add_option("--json", r.json, "Write the JSON report (keys: compare/REPORTS.md)");
      sc->add_option("--md", r.md, "Write the Markdown summary (allowlisted fields only)");
      sc->add_option("--html", r.html, "Write the self-contained HTML report");
      sc->add_option("--junit", r.junit, "Write JUnit XML (one test case per item and gate)");
    };
    lockstep::SummarizeCommandOptions sopts;
    lockstep::DiffCommandOptions& dopts = sopts.diff;
    std::string mem_limit = "1G";
    auto add_diff = [&](CLI::App* sc) {
      sc->add_option("A", dopts.a, "Reference export (.h5)")->required();
      sc->add_option("B", dopts.b, "Export to compare (.h5)")->required();
      sc->add_option("--nrmse-max", dopts.diff.thresholds.nrmse_max, "NRMSE threshold for every item kind (default 2e-4)");
      sc->add_option("--kl-max", dopts.diff.thresholds.kl_max, "Logits KL threshold (default 1e-5)");
      sc->add_option("--nrmse-kind", dopts.kind_overrides, "Per-kind NRMSE threshold KIND=VALUE (repeatable)");
      sc->add_option("--points", dopts.diff.points, "Checkpoints to compare (default pre_verify,post_verify,commit)");
      sc->add_option("--windows", dopts.diff.windows, "Windows to compare: all | LIST like 0-2,5 (default all)");
      sc->add_option("--mem-limit", mem_limit, "Memory for read buffers (default 1G)");
      sc->add_option("--threads", dopts.diff.threads, "Items compared in parallel (0 = hardware threads)");
      sc->add_flag("--no-index", dopts.no_index, "Ignore /index/items and open every dataset (files edited by other tools)");
      add_reports(sc, dopts.reports);
    };
    auto* diff = app.add_subcommand("diff", "Compare the state of two exports (NRMSE, KL, exact) item by item");
    add_diff(diff);
    diff->add_flag("--isolate,!--no-isolate", dopts.isolate, "Parse in a child process (a crash there is exit 2)");
    diff->add_flag("--quiet", dopts.quiet, "Print the verdict line only");
    auto* summarize = app.add_subcommand("summarize", "Diff + alignment of two exports with every report");
    add_diff(summarize);
    summarize->add_option("--fields", sopts.fields, "Path fields to align on (default p,T,T_mtp,merged,from_sfx,chain_n)");
    bool no_isolate = false;
    summarize->add_flag("--no-isolate", no_isolate, "Parse in this process (default: a child process)");
    auto* align = app.add_subcommand("align", "Align the verify windows of two traces to the first path divergence");
    lockstep::AlignCommandOptions aopts;
    align->add_option("A", aopts.a, "Export (.h5) or trace (JSON lines)")->required();
    align->add_option("B", aopts.b, "Export (.h5) or trace (JSON lines)")->required();
    align->add_option("--fields", aopts.fields, "Path fields to align on (default p,T,T_mtp,merged,from_sfx,chain_n)");
    align->add_flag("--isolate", aopts.isolate, "Parse in a child process (a crash there is exit 2)");
    align->add_flag("--fail-on-divergence", aopts.fail_on_divergence, "Exit 1 when the paths diverge");
    align->add_flag("--no-index", aopts.no_index, "Ignore /index/items (files edited by other tools)");
    add_reports(align, aopts.reports);

    // ---- campaigns ----
    lockstep::RunOptions ropts;
    std::string resume_dir;
    bool no_progress = false, gate_flag = false;
    auto* run = app.add_subcommand("run", "Run a predeclared campaign (fresh process per arm, crash-safe ledger)");
    run->add_option("PLAN", ropts.plan, "Campaign file (TOML, campaigns/README.md)");
    run->add_option("--out", ropts.out_dir, "Run folder (new, or empty)");
    run->add_option("--resume", resume_dir, "Continue the campaign in this run folder");
    run->add_flag("--gate", gate_flag, "CI gate (accepted for scripts; every run already exits 0/1 and writes JUnit XML)");
    run->add_option("--junit", ropts.junit, "JUnit XML path (default <run folder>/junit.xml)");
    run->add_flag("--no-progress", no_progress, "No progress lines on stderr");
    auto* gate = app.add_subcommand("gate", "CI gate: run a campaign, write JUnit XML, exit 0 (pass) or 1 (fail)");
    std::string gate_plan, gate_out, gate_junit;
    gate->add_option("PLAN", gate_plan, "Campaign file (TOML)")->required();
    gate->add_option("--out", gate_out, "Run folder (default out/gate/<plan>-<time>)");
    gate->add_option("--junit", gate_junit, "JUnit XML path (default <run folder>/junit.xml)");
    gate->add_flag("--no-progress", no_progress, "No progress lines on stderr");
    lockstep::ReportOptions rep_opts;
    auto* report = app.add_subcommand("report", "Render a campaign run folder as Markdown / HTML / JUnit");
    report->add_option("DIR", rep_opts.dir, "Run folder")->required();
    report->add_option("--md", rep_opts.md, "Markdown path (default DIR/report.md)");
    report->add_option("--html", rep_opts.html, "HTML path (default DIR/report.html)");
    report->add_option("--junit", rep_opts.junit, "JUnit path (default DIR/junit.xml)");

    auto known = app.get_subcommands([](CLI::App*) { return true; });
    bool is_known = argc < 2 || argv[1][0] == '-';
    std::string names;
    for (const auto* sc : known) {
      names += (names.empty() ? "" : ", ") + sc->get_name();
      is_known = is_known || sc->get_name() == argv[1];
    }
    if (!is_known) {
      std::fprintf(stderr, "lockstep: usage error: unknown command '%s' (commands: %s)\n", argv[1], names.c_str());
      return 2;
    }
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
      std::fprintf(stderr, "lockstep: usage error: %s\n", e.what());
      std::fprintf(stderr, "run 'lockstep --help' (or 'lockstep <command> --help') for usage\n");
      return 2;
    }

    if (init->parsed()) {
      if (!dtype.empty()) {
        auto d = lockstep::ParseModelDtype(dtype);
        if (!d.ok()) return Fail(d.status());
        syn.dtype = *d;
      }
      syn.with_mtp = !no_mtp;
      return Fail(lockstep::RunModelInit(syn, out_dir, std::cout));
    }
    if (gen->parsed()) {
      auto cfg = flags.Build();
      if (!cfg.ok()) return Fail(cfg.status());
      gopts.config = *cfg;
      return Fail(lockstep::RunGenerateCommand(gopts, std::cout));
    }
    if (diff->parsed() || summarize->parsed()) {
      auto mem = lockstep::ParseByteSize(mem_limit, "--mem-limit");
      if (!mem.ok()) return Fail(mem.status());
      dopts.diff.mem_limit_bytes = *mem;
      if (diff->parsed()) return Fail(lockstep::RunDiff(dopts, std::cout));
      dopts.isolate = !no_isolate;
      return Fail(lockstep::RunSummarize(sopts, std::cout));
    }
    if (align->parsed()) return Fail(lockstep::RunAlign(aopts, std::cout));
    if (run->parsed()) {
      if (!resume_dir.empty()) {
        if (!ropts.out_dir.empty() && ropts.out_dir != resume_dir)
          return Fail(lockstep::Status::InvalidArgument("--resume", "give the run folder once (--resume DIR)"));
        ropts.out_dir = resume_dir;
        ropts.resume = true;
      } else if (ropts.plan.empty() || ropts.out_dir.empty()) {
        return Fail(lockstep::Status::InvalidArgument("run", "usage: lockstep run PLAN.toml --out DIR | lockstep run --resume DIR"));
      }
      if (no_progress) ropts.progress = 0;
      (void)gate_flag;
      return Fail(lockstep::RunCampaign(ropts, std::cout));
    }
    if (gate->parsed()) {
      ropts.plan = gate_plan;
      ropts.junit = gate_junit;
      ropts.out_dir = gate_out;
      if (ropts.out_dir.empty()) {
        const std::string stem = std::filesystem::path(gate_plan).stem().string();
        ropts.out_dir = "out/gate/" + stem + "-" + std::to_string(std::time(nullptr)) + "-" + std::to_string(::getpid());
      }
      if (no_progress) ropts.progress = 0;
      return Fail(lockstep::RunCampaign(ropts, std::cout));
    }
    if (report->parsed()) return Fail(lockstep::RunCampaignReport(rep_opts, std::cout));
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep: internal error: %s\n", e.what());
    return 3;
  }
}
