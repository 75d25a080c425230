#include "commands/llamacpp_generate.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <ostream>

#include "commands/output.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/step_record.h"
#include "lockstep/instrument/export_writer.h"
#include "lockstep/instrument/fingerprint.h"
#include "lockstep/llamacpp/llama_engine.h"

namespace lockstep {

namespace {

// Options of the lockstep engine that llama.cpp's generate does not take: refused by name rather
// than silently ignored.
Status RefuseLockstepOnly(const GenerateOptions& o) {
  const EngineConfig& c = o.config;
  const char* flag = c.spec != 0               ? "--spec"
                     : c.temperature != 0.0    ? "--temperature"
                     : c.quant_dot != "exact"  ? "--quant-dot (llama.cpp's own products are ggml's)"
                     : !c.inject.empty()       ? "--inject"
                     : !c.replay_path.empty()  ? "--replay-path"
                     : !o.save_slot.empty()    ? "--save-slot"
                     : !o.restore_slot.empty() ? "--restore-slot"
                     : !o.background.empty()   ? "--background (use --slots N)"
                     : !o.trace_json.empty()   ? "--trace-json"
                     : o.export_compress.size() > 0 && o.export_compress != "none"
                         ? "--export-compress"
                         : nullptr;
  if (flag == nullptr) return Status::Ok();
  return Status::InvalidArgument(flag,
                                 "is a lockstep-engine option; --engine llama.cpp decodes "
                                 "greedily without it");
}

// A one-row view of `data` (`elems` elements of `dtype`, `bytes` bytes) as item `kind` of stage 0.
StateView RowView(ItemKind kind, DType dtype, const void* data, std::size_t bytes,
                  std::int64_t elems) {
  StateView v;
  v.kind = kind;
  v.stage = 0;
  v.layer = -1;
  v.dtype = dtype;
  v.shape = {1, elems};
  v.rows = v.rows_capacity = 1;
  v.row_bytes = bytes;
  const auto* p = static_cast<const std::byte*>(data);
  v.row = [p](int) { return p; };
  return v;
}

std::string UtcNow() {
  const std::time_t tt = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char ts[32];
  std::strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&tt));
  return ts;
}

// The export of `opts` (null without --export); --op-digests / --op-dump need one.
Result<std::unique_ptr<H5Exporter>> MakeExporter(const GenerateOptions& opts) {
  LOCKSTEP_ASSIGN_OR_RETURN(OpWindows op_windows, OpWindows::Parse(opts.op_digests));
  std::vector<OpDump> dumps;
  for (const std::string& d : opts.op_dumps) {
    LOCKSTEP_ASSIGN_OR_RETURN(OpDump dump, OpDump::Parse(d));
    dumps.push_back(std::move(dump));
  }
  if (opts.export_path.empty() && (!op_windows.none() || !dumps.empty()))
    return Status::InvalidArgument("--op-digests / --op-dump", "needs --export FILE");
  if (opts.export_path.empty()) return std::unique_ptr<H5Exporter>();
  ExportOptions eo;
  eo.path = opts.export_path;
  eo.op_digests = op_windows;
  eo.op_dumps = std::move(dumps);
  LOCKSTEP_ASSIGN_OR_RETURN(eo.windows, WindowSelection::Parse(opts.export_windows));
  LOCKSTEP_ASSIGN_OR_RETURN(eo.points, ParseExportPoints(opts.export_points));
  return H5Exporter::Create(eo);
}

// The --trace-jsonl file opened for appends (-1 without one).
Result<int> OpenTrace(const std::string& path) {
  if (path.empty()) return -1;
  LOCKSTEP_RETURN_IF_ERROR(CheckOutputFolder(path, "--trace-jsonl"));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IOError("--trace-jsonl '" + path + "'", std::strerror(errno));
  return fd;
}

// The export's run attributes, counters and fingerprints (the config names the commit).
Status FinishExport(H5Exporter& exporter, const LlamaOptions& lo, const std::string& commit,
                    const std::string& arm, const std::vector<std::int32_t>& prompt,
                    const LlamaResult& res, const std::string& text) {
  ExportRunInfo meta;
  meta.arm = arm;
  meta.created_utc = UtcNow();
  meta.run_id = Sha256Hex(meta.created_utc + "/" + std::to_string(::getpid())).substr(0, 16);
  meta.config_json = lo.ToJson();
  meta.config_sha256 = Sha256Hex(meta.config_json);
  if (auto exe = Sha256SelfExe(); exe.ok()) meta.executable_sha256 = *exe;
  if (auto mh = Sha256Files({lo.model}); mh.ok()) meta.model_sha256 = *mh;
  meta.request_sha256 = Sha256Tokens(prompt);
  meta.max_new = lo.max_new;
  meta.request_tokens = prompt;
  meta.output_tokens = res.output;
  meta.stop_reason = res.stop_reason;
  meta.text_sha256 = Sha256Hex(text);
  // One stage; llama.cpp counts none of these (-1: not measured, never zero).
  ExportRunInfo::Counters c;
  c.expert_hits = c.expert_misses = c.expert_bytes_fetched = c.host_expert_tokens = -1;
  c.verify_calls = res.n_windows;
  meta.counters.push_back(c);
  meta.engine = "llama.cpp";
  meta.engine_commit = commit;
  return exporter.Finish(meta);
}

// The --json object of a llama.cpp run.
std::string RunJson(const LlamaOptions& lo, const std::string& commit,
                    const std::vector<std::int32_t>& prompt, const LlamaResult& res,
                    const std::string& text) {
  nlohmann::json j;
  j["schema"] = "lockstep.generate";
  j["schema_version"] = 1;
  j["engine"] = "llama.cpp";
  j["llama_cpp_commit"] = commit;
  j["prompt_tokens"] = prompt.size();
  j["output_tokens"] = res.output.size();
  j["output_ids"] = res.output;
  j["text"] = text;
  j["stop_reason"] = res.stop_reason;
  j["windows"] = res.n_windows;
  j["config"] = nlohmann::json::parse(lo.ToJson());
  j["config_sha256"] = Sha256Hex(lo.ToJson());
  j["request_sha256"] = Sha256Tokens(prompt);
  j["resources"] = nlohmann::json::object();  // not sampled on llama.cpp (no guard, no swap figure)
  const double pre_s = static_cast<double>(res.prefill_ns) * 1e-9,
               dec_s = static_cast<double>(res.decode_ns) * 1e-9;
  j["timings"] = {
      {"prefill_ms", pre_s * 1e3},
      {"decode_ms", dec_s * 1e3},
      {"decode_tokens_per_s", dec_s > 0 ? static_cast<double>(res.output.size()) / dec_s : 0.0},
      {"clock", "CLOCK_MONOTONIC wall time around the llama_decode calls"}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

// The export's hooks: op records, the logits (post-verify) and the sequence state (commit).
void AttachExportHooks(H5Exporter* ex, LlamaHooks& hooks) {
  hooks.wants_ops = [ex](int window) { return ex->WantsOps(window); };
  hooks.on_op = [ex](const OpRecord& rec) { ex->OnOp(rec); };
  hooks.on_logits = [ex](int w, int pos, std::span<const float> lg) {
    if (!ex->WantsCheckpoint(w, CheckpointPoint::kPostVerify)) return;
    CheckpointInfo info{w, CheckpointPoint::kPostVerify, pos, 1, pos, 1, pos};
    ex->OnCheckpointBegin(info);
    ex->OnState(info, RowView(ItemKind::kLogits, DType::kF32, lg.data(), lg.size_bytes(),
                              static_cast<std::int64_t>(lg.size())));
    ex->OnCheckpointEnd(info);
  };
  // The commit checkpoint: the request's sequence as llama.cpp serialises it, one u8 row.
  hooks.on_state = [ex](int w, int pos, std::span<const std::uint8_t> st) {
    if (!ex->WantsCheckpoint(w, CheckpointPoint::kCommit)) return;
    CheckpointInfo info{w, CheckpointPoint::kCommit, pos, 1, pos + 1, 0, pos + 1};
    ex->OnCheckpointBegin(info);
    ex->OnState(info, RowView(ItemKind::kSeqState, DType::kU8, st.data(), st.size_bytes(),
                              static_cast<std::int64_t>(st.size())));
    ex->OnCheckpointEnd(info);
  };
}

}  // namespace

Status RunLlamaGenerate(const GenerateOptions& opts, std::ostream& out) {
  LOCKSTEP_RETURN_IF_ERROR(RefuseLockstepOnly(opts));
  LlamaOptions lo = opts.llama;
  lo.model = opts.config.model;
  lo.threads = opts.config.threads;
  lo.max_new = opts.config.max_new;
  lo.slots = opts.config.slots;
  LOCKSTEP_RETURN_IF_ERROR(lo.Validate());
  if (opts.print_config) {
    out << lo.ToJson() << "\n";
    return Status::Ok();
  }
  LOCKSTEP_ASSIGN_OR_RETURN(LlamaEnginePtr engine, LlamaEngine::Open(lo));
  LOCKSTEP_ASSIGN_OR_RETURN(TokenizerPtr tok, LoadModelTokenizer(lo.model));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<std::int32_t> prompt,
                            LoadGeneratePrompt(opts, engine->n_vocab(), *tok));

  // ---- sinks: the export and the window lines ----
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<H5Exporter> exporter, MakeExporter(opts));
  LOCKSTEP_ASSIGN_OR_RETURN(const int trace_fd, OpenTrace(opts.trace_jsonl));
  struct Fd {
    int fd;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  } trace_close{trace_fd};

  // ---- the request ----
  LlamaHooks hooks;
  Status trace_status;
  int step_rows = 0, step_seqs = 0;
  std::int64_t steps = 0;
  // Every llama_decode is a step; the export's /trace/steps holds those the request had rows in
  // (its prefill chunks and windows), so localize can say who shared a window's step.
  hooks.on_step = [&](int window, int rows, int seqs, std::int64_t begin_ns, std::int64_t end_ns) {
    step_rows = rows, step_seqs = seqs;
    if (exporter && window >= -1) {
      StepRecord s;
      s.step = steps;
      s.begin_ns = begin_ns;
      s.end_ns = end_ns;
      s.rows = rows;
      s.seqs = seqs;
      s.verify_rows = window >= 0 ? seqs : 0;
      s.prefill_rows = window >= 0 ? 0 : rows;
      s.live = lo.slots;
      for (int q = 0; q < seqs; ++q) s.slots.push_back(q);
      exporter->OnStep(s);
    }
    ++steps;
  };
  if (exporter) AttachExportHooks(exporter.get(), hooks);
  std::vector<WindowRecord> windows;
  auto on_logits = hooks.on_logits;
  hooks.on_logits = [&](int w, int pos, std::span<const float> lg) {
    if (on_logits) on_logits(w, pos, lg);
    WindowRecord r;
    r.idx = w;
    r.p = pos;
    r.T = 1;
    r.step = steps - 1;
    r.step_rows = step_rows;
    r.step_seqs = step_seqs;
    windows.push_back(std::move(r));
  };
  LOCKSTEP_ASSIGN_OR_RETURN(LlamaResult res, engine->Generate(prompt, hooks));
  for (std::size_t i = 0; i < windows.size() && i < res.output.size(); ++i) {
    windows[i].emitted = {res.output[i]};
    if (exporter) exporter->OnWindow(windows[i]);
    if (trace_fd >= 0) {
      const std::string line = windows[i].ToJsonLine() + "\n";
      if (::write(trace_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
        trace_status =
            Status::IOError("--trace-jsonl '" + opts.trace_jsonl + "'", std::strerror(errno));
    }
  }

  // ---- outputs ----
  const std::string text = tok->Decode(res.output);
  if (exporter) {
    Status st = FinishExport(*exporter, lo, engine->commit(), opts.arm, prompt, res, text);
    if (!st.ok()) {
      out << EscapeText(text) << "\n";
      return st;
    }
    std::fprintf(stderr, "export: wrote %s (llama.cpp %s)\n", opts.export_path.c_str(),
                 engine->commit().c_str());
  }
  LOCKSTEP_RETURN_IF_ERROR(trace_status);
  if (!opts.json) {
    out << EscapeText(text) << "\n";
    return Status::Ok();
  }
  const std::string json = RunJson(lo, engine->commit(), prompt, res, text);
  if (opts.json_path.empty() || IsStdout(opts.json_path)) {
    out << json;
    return Status::Ok();
  }
  out << EscapeText(text) << "\n";
  out.flush();
  return WriteOutput(opts.json_path, json);
}

}  // namespace lockstep
