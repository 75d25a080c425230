#include "lockstep/harness/generate_command.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>

#include "commands/llamacpp_generate.h"
#include "commands/output.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/generate.h"
#include "lockstep/engine/scheduler.h"
#include "lockstep/engine/slot_file.h"
#include "lockstep/engine/tokenizer.h"
#include "lockstep/engine/trace_ring.h"
#include "lockstep/engine/weights.h"
#include "lockstep/harness/chat_prompt.h"
#include "lockstep/harness/graft_spec.h"
#include "lockstep/harness/host_fingerprint.h"
#include "lockstep/harness/prompt_text.h"
#include "lockstep/instrument/chrome_trace.h"
#include "lockstep/instrument/export_writer.h"
#include "lockstep/instrument/fingerprint.h"
#include "lockstep/instrument/resource_sampler.h"

namespace lockstep {

Result<std::vector<std::int32_t>> LoadGeneratePrompt(const GenerateOptions& o, int n_vocab,
                                                     const Tokenizer& tok) {
  int given = (!o.prompt_text.empty()) + (!o.prompt_file.empty()) + (!o.prompt_tokens.empty()) +
              (!o.chat_file.empty());
  if (given != 1)
    return Status::InvalidArgument(
        "prompt", "give exactly one of --prompt, --prompt-file, --prompt-tokens or --chat");
  std::vector<std::int32_t> ids;
  if (!o.prompt_tokens.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(o.prompt_tokens, std::size_t{256} << 20));
    LOCKSTEP_ASSIGN_OR_RETURN(
        ids, ParseTokenList(text, n_vocab, "--prompt-tokens '" + o.prompt_tokens + "'"));
  } else {
    std::string text = o.prompt_text;
    if (!o.prompt_file.empty()) {
      LOCKSTEP_ASSIGN_OR_RETURN(text, ReadFile(o.prompt_file, std::size_t{256} << 20));
    }
    if (!o.chat_file.empty()) {
      LOCKSTEP_ASSIGN_OR_RETURN(text, RenderChatFile(o.config.model, o.chat_file));
    }
    LOCKSTEP_ASSIGN_OR_RETURN(ids, EncodePromptText(tok, text, n_vocab));
  }
  if (ids.empty())
    return Status::InvalidArgument("prompt", "is empty (at least one token is needed)");
  return ids;
}

namespace {

// --trace-jsonl: the file window records stream to, closed when the request ends.
struct TraceFile {
  int fd = -1;
  TraceFile() = default;
  TraceFile(const TraceFile&) = delete;
  TraceFile& operator=(const TraceFile&) = delete;
  ~TraceFile() { Close(); }
  void Close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

// ---- progress on stderr (GenerateOptions::progress) ----

// On a terminal, one line redrawn in place ("prefill 512/2048 tokens", "decode 37/64 tokens,
// 12 windows") at most every 100 ms and erased at the end. Forced on elsewhere (--progress, the
// campaign runner reads the log), "progress: prefill D/N" per chunk and "progress: decode N/M
// tokens" at most once a second: a log stays short however long the request.
class Progress {
 public:
  Progress(bool tty, int max_new) : tty_(tty), max_new_(max_new) {}
  void Prefill(int done, int total) {
    if (!tty_) {
      std::fprintf(stderr, "progress: prefill %d/%d\n", done, total);
      return;
    }
    Draw("prefill " + std::to_string(done) + "/" + std::to_string(total) + " tokens",
         done == total);
  }
  void Window(const WindowRecord& r) {
    tokens_ += static_cast<int>(r.emitted.size());
    ++windows_;
    const std::string state = "decode " + std::to_string(tokens_) + "/" + std::to_string(max_new_) +
                              " tokens, " + std::to_string(windows_) + " windows";
    if (tty_) {
      Draw(state, windows_ == 1);  // the first window at once: decoding has started
    } else if (Due(std::chrono::seconds(1))) {
      std::fprintf(stderr, "progress: %s\n", state.c_str());
    }
  }
  // Erases the terminal line (the summary line takes its place).
  void Done() {
    if (tty_ && drawn_) std::fprintf(stderr, "\r\033[K");
    drawn_ = false;
  }

 private:
  bool Due(std::chrono::milliseconds every) {
    const auto now = std::chrono::steady_clock::now();
    if (last_ && now - *last_ < every) return false;
    last_ = now;
    return true;
  }
  void Draw(const std::string& state, bool force) {
    if (!Due(std::chrono::milliseconds(100)) && !force) return;
    std::fprintf(stderr, "\r\033[K%s", state.c_str());
    std::fflush(stderr);
    drawn_ = true;
  }
  bool tty_;
  int max_new_;
  int tokens_ = 0, windows_ = 0;
  bool drawn_ = false;
  std::optional<std::chrono::steady_clock::time_point> last_;
};

// Progress of `opts` on this stderr: null when off.
std::unique_ptr<Progress> MakeProgress(const GenerateOptions& opts, const EngineConfig& cfg) {
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  if (opts.progress == 0 || (opts.progress < 0 && !tty)) return nullptr;
  return std::make_unique<Progress>(tty, cfg.max_new);
}

// ---- phase: the request's sinks (trace lines, export, progress, resource sampler) ----

Status OpenTraceJsonl(const GenerateOptions& opts, TraceFile& trace, GenerateHooks& hooks) {
  if (opts.trace_jsonl.empty()) return Status::Ok();
  trace.fd =
      ::open(opts.trace_jsonl.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (trace.fd < 0)
    return Status::IOError("--trace-jsonl '" + opts.trace_jsonl + "'", std::strerror(errno));
  // One write() per record: a killed run keeps every finished window's line whole.
  hooks.on_record = [&trace, &opts](const WindowRecord& r) {
    std::string line = r.ToJsonLine() + "\n";
    if (::write(trace.fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
      return Status::IOError("--trace-jsonl '" + opts.trace_jsonl + "'", std::strerror(errno));
    return Status::Ok();
  };
  return Status::Ok();
}

// The exporter for --export (null without it), set as the request's observer.
Result<std::unique_ptr<H5Exporter>> OpenExport(const GenerateOptions& opts, GenerateHooks& hooks) {
  LOCKSTEP_ASSIGN_OR_RETURN(OpWindows op_windows, OpWindows::Parse(opts.op_digests));
  std::vector<OpDump> dumps;
  for (const std::string& d : opts.op_dumps) {
    LOCKSTEP_ASSIGN_OR_RETURN(OpDump dump, OpDump::Parse(d));
    dumps.push_back(std::move(dump));
  }
  if (opts.export_path.empty()) {
    if (!op_windows.none() || !dumps.empty())
      return Status::InvalidArgument("--op-digests / --op-dump", "needs --export FILE");
    return std::unique_ptr<H5Exporter>();
  }
  ExportOptions eo;
  eo.op_digests = op_windows;
  eo.op_dumps = std::move(dumps);
  eo.path = opts.export_path;
  LOCKSTEP_ASSIGN_OR_RETURN(eo.windows, WindowSelection::Parse(opts.export_windows));
  LOCKSTEP_ASSIGN_OR_RETURN(eo.points, ParseExportPoints(opts.export_points));
  eo.compress = opts.export_compress == "none" ? "" : opts.export_compress;
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<H5Exporter> exporter, H5Exporter::Create(eo));
  hooks.observer = exporter.get();
  TraceRing::Global().Clear();
  TraceRing::Global().Enable();  // layer / stage events for /trace/events
  return exporter;
}

// ---- phase: the request, alone or among --background requests ----

// SplitMix64: the background requests' lengths, arrivals and tokens, from --background's seed.
struct SplitMix {
  std::uint64_t x;
  std::uint64_t Next() {
    std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int In(int lo, int hi) {
    return lo + static_cast<int>(Next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
};

// The request (ticket 1, slot 0, arriving at step 0) and --background's requests through one
// scheduler; the request's slot stays open for the export's counters. Background requests share
// the request's options but max_new, and have no hooks, injections or replay.
Result<GenerateResult> GenerateAmong(Engine& engine, const std::vector<std::int32_t>& prompt,
                                     const GenerateHooks* hooks, const BackgroundSpec& bg) {
  if (engine.max_slots() < 2)
    return Status::InvalidArgument("--background", "needs --slots 2 or more");
  SchedulerOptions so;
  so.leave_slots_open = true;
  Scheduler sched(engine, so);
  RequestSpec target;
  target.id = "request";
  target.prompt = prompt;
  target.options = RequestOptions::FromConfig(engine.config());
  target.borrowed_hooks = hooks;
  target.keep = true;
  LOCKSTEP_ASSIGN_OR_RETURN(Ticket t, sched.Submit(std::move(target)));
  SplitMix rng{bg.seed};
  const int V = engine.weights().config.n_vocab;
  for (int i = 0; i < bg.n; ++i) {
    RequestSpec r;
    r.id = "background" + std::to_string(i);
    r.prompt.resize(static_cast<std::size_t>(rng.In(bg.prompt_min, bg.prompt_max)));
    r.options = RequestOptions::FromConfig(engine.config());
    r.options.max_new = rng.In(bg.max_new_min, bg.max_new_max);
    r.options.inject.clear();
    r.options.replay_path.clear();
    r.arrive_step = rng.In(bg.arrive_min, bg.arrive_max);
    for (auto& tok : r.prompt)
      tok = static_cast<std::int32_t>(rng.Next() % static_cast<std::uint64_t>(V));
    LOCKSTEP_RETURN_IF_ERROR(sched.Submit(std::move(r)).status());
  }
  LOCKSTEP_RETURN_IF_ERROR(sched.RunUntilIdle());
  for (RequestResult& r : sched.TakeFinished()) {
    if (r.ticket != t) continue;
    LOCKSTEP_RETURN_IF_ERROR(r.status);
    engine.UseSlot(r.slot);  // the export reads the request's slot
    return std::move(r.result);
  }
  return Status::Runtime("generate", "the request did not finish");
}

// ---- phase: the export's run metadata and its finish ----

// Weight bytes held in memory per stage (issue 26): matrices in their file type, mapped or owned.
nlohmann::json WeightsJson(Engine& engine, const ModelWeights& w) {
  nlohmann::json stages = nlohmann::json::array();
  for (int is = 0; is < engine.n_stages(); ++is) {
    const int lb = engine.stage(is).layer_begin(), le = engine.stage(is).layer_end();
    stages.push_back(
        {{"stage", is}, {"layers", {lb, le}}, {"resident_bytes", w.ResidentBytes(lb, le)}});
  }
  return {{"format", w.format},
          {"resident_bytes", w.ResidentBytes(0, w.config.n_layers)},
          {"owned_bytes", w.arena_bytes()},
          {"active_bytes_per_token", w.ActiveBytesPerToken()},
          {"stages", stages}};
}

// Everything the export records about the run besides the state items. Stops the trace ring.
ExportRunInfo BuildRunInfo(const GenerateOptions& opts, Engine& engine, const ModelWeights& weights,
                           const std::vector<std::int32_t>& prompt, const GenerateResult& res,
                           const ResourceSampler& sampler, const Tokenizer& tok) {
  ExportRunInfo meta;
  meta.arm = opts.arm;
  const auto now = std::chrono::system_clock::now();
  const std::time_t tt = std::chrono::system_clock::to_time_t(now);
  char ts[32];
  std::strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&tt));
  meta.created_utc = ts;
  meta.run_id = Sha256Hex(std::string(ts) + "/" + std::to_string(::getpid()) + "/" +
                          std::to_string(now.time_since_epoch().count()))
                    .substr(0, 16);
  meta.config_json = engine.config().ToJson();
  meta.config_sha256 = Sha256Hex(meta.config_json);
  meta.weights_json = WeightsJson(engine, weights).dump();
  if (auto exe = Sha256SelfExe(); exe.ok()) meta.executable_sha256 = *exe;
  if (auto mh = Sha256Files(weights.files); mh.ok()) meta.model_sha256 = *mh;
  meta.request_sha256 = Sha256Tokens(prompt);
  meta.host_json = ProbeHost(engine.config().threads).ToJson().dump();
  meta.seed = engine.config().seed;
  meta.max_new = engine.config().max_new;
  meta.request_tokens = prompt;
  meta.output_tokens = res.output;
  meta.stop_reason = res.stop_reason;
  meta.text_sha256 = Sha256Hex(tok.Decode(res.output));
  meta.injections = engine.InjectionReport();
  AppendStageInfo(engine, res.n_windows, &meta.residency, &meta.counters);
  TraceRing::Global().Disable();
  meta.events = TraceRing::Global().Snapshot();
  meta.events_dropped = TraceRing::Global().dropped();
  meta.samples = sampler.Samples();
  meta.sample_intervals = sampler.Intervals();
  meta.nvml_unavailable = sampler.nvml_unavailable_reason();
  if (auto trip = sampler.guard_trip())
    meta.guard = "tripped: " + trip->source + " free " + std::to_string(trip->free_bytes) +
                 " bytes at t_ns " + std::to_string(trip->t_ns);
  return meta;
}

Status FinishExport(H5Exporter& exporter, const ExportRunInfo& meta, const std::string& path) {
  LOCKSTEP_RETURN_IF_ERROR(exporter.Finish(meta));
  // The seed's "93 / 94 / 93": items per checkpoint, for the first exported window.
  std::string names, counts;
  for (CheckpointPoint pt : AllCheckpointPoints()) {
    auto it = exporter.item_counts().find(pt);
    names += (names.empty() ? "" : " / ") + std::string(CheckpointPointName(pt));
    counts +=
        (counts.empty() ? "" : " / ") + (it == exporter.item_counts().end() || it->second.empty()
                                             ? std::string("-")
                                             : std::to_string(it->second.front()));
  }
  std::fprintf(stderr, "export: wrote %s; items per checkpoint (%s): %s\n", path.c_str(),
               names.c_str(), counts.c_str());
  return Status::Ok();
}

// ---- phase: the --json object (schema lockstep.generate v1) ----

// Speculation summary: tokens per window, drafts and acceptance per source.
nlohmann::json SpeculationJson(const GenerateResult& res) {
  std::map<std::string, std::pair<long, long>> by_source;  // drafted, accepted
  long max_T = 0;
  for (const auto& w : res.windows) {
    auto& e = by_source[DraftSourceName(w.source)];
    e.first += w.T - 1;
    e.second += w.accepted;
    max_T = std::max<long>(max_T, w.T);
  }
  nlohmann::json sj;
  sj["tokens_per_window"] =
      res.n_windows ? static_cast<double>(res.output.size()) / res.n_windows : 0.0;
  sj["max_T"] = max_T;
  for (const auto& [k, v] : by_source)
    sj["sources"][k] = {{"drafted", v.first}, {"accepted", v.second}};
  return sj;
}

nlohmann::json ExpertCacheJson(Engine& engine) {
  nlohmann::json experts = nlohmann::json::array();
  for (int is = 0; is < engine.n_stages(); ++is) {
    const auto& ec = engine.stage(is).experts();
    experts.push_back({{"stage", is},
                       {"layers", {engine.stage(is).layer_begin(), engine.stage(is).layer_end()}},
                       {"resident_per_layer", ec.n_resident()},
                       {"hits", ec.counters().hits},
                       {"misses", ec.counters().misses},
                       {"bytes_fetched", ec.counters().bytes_fetched}});
  }
  return experts;
}

nlohmann::json ResourcesJson(const ResourceSampler& sampler) {
  const Extremes ex = sampler.Summary();
  const IntervalStats iv = sampler.Intervals();
  nlohmann::json r;  // -1 = unknown
  r["samples"] = ex.n_samples;
  r["min_host_available_bytes"] = ex.min_host_available_bytes;
  r["max_swap_used_bytes"] = ex.max_swap_used_bytes;
  r["max_rss_bytes"] = ex.max_rss_bytes;
  r["interval_ms"] = {
      {"min", iv.min_ns < 0 ? -1.0 : static_cast<double>(iv.min_ns) * 1e-6},
      {"median", iv.median_ns < 0 ? -1.0 : static_cast<double>(iv.median_ns) * 1e-6},
      {"max", iv.max_ns < 0 ? -1.0 : static_cast<double>(iv.max_ns) * 1e-6}};
  r["nvml"] = sampler.nvml_unavailable_reason().empty()
                  ? std::string("read")
                  : "unknown: " + sampler.nvml_unavailable_reason();
  nlohmann::json devs = nlohmann::json::array();
  for (const auto& d : ex.devices)
    devs.push_back({{"device", d.index},
                    {"min_free_bytes", d.min_free_bytes},
                    {"max_temperature_c", d.max_temperature_c},
                    {"min_sm_clock_mhz", d.min_sm_clock_mhz},
                    {"max_sm_clock_mhz", d.max_sm_clock_mhz}});
  r["devices"] = devs;
  if (auto trip = sampler.guard_trip())
    r["guard"] = {{"tripped", true}, {"source", trip->source}, {"free_bytes", trip->free_bytes}};
  return r;
}

// Wall times of the request and its rates (prefill covers n-1 of the n prompt tokens).
struct Rates {
  double prefill_ms, decode_ms, prefill_per_s, decode_per_s;
};
Rates RatesOf(const std::vector<std::int32_t>& prompt, const GenerateResult& res) {
  const double pre_s = static_cast<double>(res.prefill_ns) * 1e-9,
               dec_s = static_cast<double>(res.decode_ns) * 1e-9;
  const double n_pre = static_cast<double>(prompt.size() - 1),
               n_dec = static_cast<double>(res.output.size());
  return {pre_s * 1e3, dec_s * 1e3, pre_s > 0 ? n_pre / pre_s : 0.0,
          dec_s > 0 ? n_dec / dec_s : 0.0};
}

// The line a person at the terminal reads when the request ends (stderr).
void PrintSummary(const std::vector<std::int32_t>& prompt, const GenerateResult& res) {
  const Rates t = RatesOf(prompt, res);
  std::fprintf(stderr,
               "generate: %zu tokens in %d windows, stop %s; prompt %zu tokens, prefill %.1f ms "
               "(%.0f tok/s), decode %.1f ms (%.1f tok/s)\n",
               res.output.size(), res.n_windows, res.stop_reason.c_str(), prompt.size(),
               t.prefill_ms, t.prefill_per_s, t.decode_ms, t.decode_per_s);
}

nlohmann::json GenerateJson(const std::vector<std::int32_t>& prompt, const GenerateResult& res,
                            Engine& engine, const ModelWeights& weights,
                            const ResourceSampler& sampler, const Tokenizer& tok,
                            const nlohmann::json& slot_file) {
  nlohmann::json j;
  j["schema"] = "lockstep.generate";
  j["schema_version"] = 1;
  j["prompt_tokens"] = prompt.size();
  j["output_tokens"] = res.output.size();
  j["output_ids"] = res.output;
  j["text"] = tok.Decode(res.output);
  auto tok_json = TokenizerJson(tok);
  j["tokenizer"] = tok_json.ok() ? *tok_json : nlohmann::json();
  j["stop_reason"] = res.stop_reason;
  j["windows"] = res.n_windows;
  j["speculation"] = SpeculationJson(res);
  j["config"] = nlohmann::json::parse(engine.config().ToJson());
  j["config_sha256"] = Sha256Hex(engine.config().ToJson());
  j["request_sha256"] = Sha256Tokens(prompt);
  const Rates t = RatesOf(prompt, res);
  j["timings"] = {{"prefill_ms", t.prefill_ms},
                  {"decode_ms", t.decode_ms},
                  {"prefill_tokens_per_s", t.prefill_per_s},
                  {"decode_tokens_per_s", t.decode_per_s},
                  {"clock", "CLOCK_MONOTONIC wall time around the engine calls"}};
  j["expert_cache"] = ExpertCacheJson(engine);
  j["weights"] = WeightsJson(engine, weights);
  j["resources"] = ResourcesJson(sampler);
  j["injections"] = nlohmann::json::array();  // one record per --inject (SCHEMA.md /injections)
  for (const auto& r : engine.InjectionReport())
    j["injections"].push_back(nlohmann::json::parse(r));
  if (!slot_file.is_null()) j["slot_file"] = slot_file;
  return j;
}

// ---- phase: the request as a conversation turn (--save-slot / --restore-slot) ----

// What the summary JSON says about the slot files ("slot_file"; null without either flag).
struct SlotFileInfo {
  nlohmann::json json;
};

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The kept conversation the turn starts from: restored from --restore-slot and continued with
// `prompt`, or `prompt` as a new one. Returns its ticket.
Result<Ticket> StartTurn(const GenerateOptions& opts, Engine& engine, Scheduler& sched,
                         std::span<const std::int32_t> prompt, const GenerateHooks* hooks,
                         SlotFileInfo& info) {
  const RequestOptions ro = RequestOptions::FromConfig(engine.config());
  const bool keep = !opts.save_slot.empty();
  if (opts.restore_slot.empty()) {
    RequestSpec spec;
    spec.prompt.assign(prompt.begin(), prompt.end());
    spec.options = ro;
    spec.borrowed_hooks = hooks;
    spec.keep = keep;
    return sched.Submit(std::move(spec));
  }
  const auto t0 = std::chrono::steady_clock::now();
  LOCKSTEP_ASSIGN_OR_RETURN(ConversationState st, LoadConversation(opts.restore_slot, engine));
  LOCKSTEP_ASSIGN_OR_RETURN(Ticket kept, sched.ImportConversation(st));
  info.json["restored"] = opts.restore_slot;
  info.json["restore_ms"] = MsSince(t0);
  info.json["restored_tokens"] = st.tokens.size();
  return sched.Continue(kept, std::vector<std::int32_t>(prompt.begin(), prompt.end()), ro, hooks,
                        keep);
}

// Runs the turn on a one-slot scheduler and, with --save-slot, saves the conversation after it.
Result<GenerateResult> RunConversationTurn(const GenerateOptions& opts, Engine& engine,
                                           std::span<const std::int32_t> prompt,
                                           const GenerateHooks* hooks, SlotFileInfo& info) {
  SchedulerOptions so;
  so.slots = 1;
  so.leave_slots_open = true;  // the engine keeps the request's state for the outputs
  Scheduler sched(engine, so);
  LOCKSTEP_ASSIGN_OR_RETURN(Ticket t, StartTurn(opts, engine, sched, prompt, hooks, info));
  LOCKSTEP_RETURN_IF_ERROR(sched.RunUntilIdle());
  std::vector<RequestResult> done = sched.TakeFinished();
  auto it = std::find_if(done.begin(), done.end(), [t](const auto& r) { return r.ticket == t; });
  if (it == done.end()) return Status::Runtime("generate", "the request did not finish");
  LOCKSTEP_RETURN_IF_ERROR(it->status);
  if (!opts.save_slot.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    LOCKSTEP_ASSIGN_OR_RETURN(ConversationState st, sched.ExportConversation(t));
    LOCKSTEP_RETURN_IF_ERROR(SaveConversation(opts.save_slot, engine, st));
    info.json["saved"] = opts.save_slot;
    info.json["save_ms"] = MsSince(t0);
    info.json["saved_tokens"] = st.tokens.size();
  }
  return std::move(it->result);
}

// ---- phase: outputs of a finished request (export, Chrome trace, text or JSON) ----

Status WriteOutputs(const GenerateOptions& opts, Engine& engine, const ModelWeights& weights,
                    const std::vector<std::int32_t>& prompt, const GenerateResult& res,
                    H5Exporter* exporter, const ResourceSampler& sampler, const Tokenizer& tok,
                    const nlohmann::json& slot_file, std::ostream& out) {
  Status export_status;
  if (exporter)
    export_status =
        FinishExport(*exporter, BuildRunInfo(opts, engine, weights, prompt, res, sampler, tok),
                     opts.export_path);
  if (export_status.ok() && !opts.trace_json.empty()) {
    ChromeTraceOptions co;
    co.arm = opts.arm;
    co.injections = engine.InjectionReport();
    export_status = WriteChromeTrace(opts.trace_json, res.windows, engine.n_stages(), co);
  }
  const std::string text = EscapeText(tok.Decode(res.output)) + "\n";
  if (!export_status.ok()) {
    // The request finished: its output is printed before the export failure is reported.
    out << text;
    out.flush();
    return export_status;
  }
  if (!opts.json) {
    out << text;
    return Status::Ok();
  }
  const std::string json = GenerateJson(prompt, res, engine, weights, sampler, tok, slot_file)
                               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                           "\n";
  if (opts.json_path.empty() || IsStdout(opts.json_path)) {
    out << json;
    return Status::Ok();
  }
  out << text;  // the object went to its file: the text is what stdout shows
  out.flush();
  return WriteOutput(opts.json_path, json);
}

}  // namespace

Status RunGenerateCommand(const GenerateOptions& opts, std::ostream& out) {
  if (opts.engine == "llama.cpp") return RunLlamaGenerate(opts, out);
  if (opts.engine != "lockstep")
    return Status::InvalidArgument("--engine '" + opts.engine + "'",
                                   "expected lockstep or llama.cpp");
  // ---- config, model, prompt, engine ----
  EngineConfig cfg = opts.config;
  LOCKSTEP_RETURN_IF_ERROR(cfg.Validate());
  if (cfg.threads == 0) cfg.threads = ThreadPool::HardwareThreads();
  if (opts.print_config) {
    out << cfg.ToJson() << "\n";
    return Status::Ok();
  }
  if (cfg.model.empty())
    return Status::InvalidArgument("--model", "is required (a folder with config.json)");
  LOCKSTEP_ASSIGN_OR_RETURN(ModelWeightsPtr weights, ModelWeights::Load(cfg.model));
  LOCKSTEP_ASSIGN_OR_RETURN(TokenizerPtr tok, LoadModelTokenizer(cfg.model));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<std::int32_t> prompt,
                            LoadGeneratePrompt(opts, weights->config.n_vocab, *tok));
  LOCKSTEP_ASSIGN_OR_RETURN(EnginePtr engine, Engine::Create(cfg, *weights));
  std::optional<BackgroundSpec> background;
  if (!opts.background.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(background, ParseBackgroundSpec(opts.background));
    if (!opts.save_slot.empty() || !opts.restore_slot.empty())
      return Status::InvalidArgument("--background",
                                     "cannot be combined with --save-slot / --restore-slot");
  }

  if (!opts.grafts.empty()) {
    if (background || !opts.save_slot.empty() || !opts.restore_slot.empty())
      return Status::InvalidArgument("--graft",
                                     "cannot be combined with --background, --save-slot or "
                                     "--restore-slot (a graft acts on the one request)");
    LOCKSTEP_ASSIGN_OR_RETURN(std::string model_sha, Sha256Files(weights->files));
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Graft> grafts,
                              LoadGrafts(opts.grafts, engine->config().ToJson(), model_sha));
    LOCKSTEP_RETURN_IF_ERROR(engine->SetGrafts(std::move(grafts)));
  }

  // ---- sinks, then the request (a missing output folder is bad input, before the run) ----
  for (const auto& [path, what] :
       {std::pair{opts.trace_jsonl, "--trace-jsonl"}, std::pair{opts.trace_json, "--trace-json"},
        std::pair{opts.save_slot, "--save-slot"}})
    if (!path.empty()) LOCKSTEP_RETURN_IF_ERROR(CheckOutputFolder(path, what));
  GenerateHooks hooks;
  TraceFile trace;
  LOCKSTEP_RETURN_IF_ERROR(OpenTraceJsonl(opts, trace, hooks));
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<H5Exporter> exporter, OpenExport(opts, hooks));
  std::unique_ptr<Progress> progress = MakeProgress(opts, cfg);
  if (progress) {
    hooks.on_prefill = [&progress](int done, int total) { progress->Prefill(done, total); };
    hooks.on_record = [&progress, trace_line = hooks.on_record](const WindowRecord& r) {
      progress->Window(r);
      return trace_line ? trace_line(r) : Status::Ok();
    };
  }
  SamplerOptions so;
  so.interval_ms = opts.sample_ms;
  so.guard_min_free_mib = opts.guard_min_free_mib;
  ResourceSampler sampler(so);
  LOCKSTEP_RETURN_IF_ERROR(sampler.Start());
  hooks.stop_check = [&sampler] {
    return sampler.guard_tripped() ? std::string("resource_guard") : std::string();
  };
  SlotFileInfo slot_info;
  const bool turn = !opts.save_slot.empty() || !opts.restore_slot.empty();
  auto generated = background ? GenerateAmong(*engine, prompt, &hooks, *background)
                   : turn     ? RunConversationTurn(opts, *engine, prompt, &hooks, slot_info)
                              : Generate(*engine, prompt, &hooks);
  sampler.Stop();
  trace.Close();
  if (progress) progress->Done();
  if (!generated.ok() && exporter) {
    // The export is not finished; what it holds stays in FILE.partial (SCHEMA.md), never FILE.
    std::fprintf(
        stderr,
        "export: not written (the request failed); %s.partial keeps what was exported before\n",
        opts.export_path.c_str());
  }
  LOCKSTEP_ASSIGN_OR_RETURN(GenerateResult res, std::move(generated));

  // ---- outputs, then the summary line (after the export's own line) ----
  Status written = WriteOutputs(opts, *engine, *weights, prompt, res, exporter.get(), sampler, *tok,
                                slot_info.json, out);
  if (progress) {
    out.flush();
    PrintSummary(prompt, res);
  }
  LOCKSTEP_RETURN_IF_ERROR(written);
  // Whether every injection fired (its record is in the outputs either way).
  LOCKSTEP_RETURN_IF_ERROR(CheckInjectionsFired(engine->injections(), engine->injection_records(),
                                                res.n_windows, res.stop_reason));
  return CheckGraftsFired(engine->grafts(), engine->graft_records(), res.n_windows,
                          res.stop_reason);
}

Result<BackgroundSpec> ParseBackgroundSpec(std::string_view text) {
  BackgroundSpec b;
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("--background '" + std::string(text) + "'", why);
  };
  auto number = [](std::string_view v, std::int64_t& out) {
    if (v.empty() || v.size() > 12) return false;
    out = 0;
    for (char c : v) {
      if (c < '0' || c > '9') return false;
      out = out * 10 + (c - '0');
    }
    return true;
  };
  std::size_t pos = 0;
  while (pos <= text.size() && !text.empty()) {
    const std::size_t end = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, end - pos);
    pos = end + 1;
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) return bad("'" + std::string(item) + "' is not KEY=VALUE");
    const std::string_view key = item.substr(0, eq), val = item.substr(eq + 1);
    const std::size_t colon = val.find(':');
    std::int64_t lo = 0, hi = 0;
    if (!number(val.substr(0, colon), lo) ||
        !number(colon == std::string_view::npos ? val.substr(0, colon) : val.substr(colon + 1),
                hi) ||
        hi < lo || hi > 1000000)
      return bad("'" + std::string(item) + "': expected N or A:B with 0 <= A <= B <= 1000000");
    const int a = static_cast<int>(lo), z = static_cast<int>(hi);
    if (key == "n" && lo == hi && lo >= 1 && lo <= 4096) {
      b.n = a;
    } else if (key == "prompt" && lo >= 1) {
      b.prompt_min = a, b.prompt_max = z;
    } else if (key == "max_new" && lo >= 1) {
      b.max_new_min = a, b.max_new_max = z;
    } else if (key == "arrive") {
      b.arrive_min = a, b.arrive_max = z;
    } else if (key == "seed" && lo == hi) {
      b.seed = static_cast<std::uint64_t>(lo);
    } else {
      return bad("'" + std::string(item) +
                 "': keys are n (1..4096), prompt, max_new (>= 1), arrive (ranges A:B) and seed");
    }
  }
  if (text.empty()) return bad("empty");
  return b;
}

std::string EscapeText(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  auto hex = [&out](unsigned char b) {
    static const char* const kDigits = "0123456789abcdef";
    out += "\\x";
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  };
  std::size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      if ((b < 0x20 && b != '\n' && b != '\t') || b == 0x7f)
        hex(b);
      else
        out += static_cast<char>(b);
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length from the lead byte, continuation bytes checked, overlong
    // forms, surrogates and values past U+10FFFF refused; C1 controls (U+0080..U+009F) escaped.
    const std::size_t n = b >= 0xf5 ? 0 : b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 0;
    std::uint32_t cp = n == 4 ? b & 0x07u : n == 3 ? b & 0x0fu : b & 0x1fu;
    bool valid = n != 0 && i + n <= text.size();
    for (std::size_t k = 1; valid && k < n; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      valid = (c & 0xc0) == 0x80;
      cp = (cp << 6) | (c & 0x3fu);
    }
    static constexpr std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    valid = valid && cp >= kMin[n] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff) &&
            !(cp >= 0x80 && cp <= 0x9f);
    if (!valid) {
      hex(b);
      ++i;
      continue;
    }
    out.append(text.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace lockstep
