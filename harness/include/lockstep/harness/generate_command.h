// `lockstep generate`: one request in one process. This is the process each campaign arm runs
// (the runner execs `lockstep generate ... --config FILE` once per arm and repeat), and the
// command a user runs by hand. One library call taking a plain options struct, writing its
// normal output to `out` and returning a Status that main() maps to the exit code (0 ok,
// 2 bad input, 3 runtime failure).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>

#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/status.h"
#include "lockstep/llamacpp/llama_engine.h"

namespace lockstep {

struct GenerateOptions {
  EngineConfig config;
  // --engine lockstep | llama.cpp (issue 38): llama.cpp takes config's model, threads, max_new and
  // slots, and its own knobs from `llama` (batch, ubatch, K/V type, flash attention).
  std::string engine = "lockstep";
  LlamaOptions llama;
  std::string prompt_text;      // --prompt (text: the model's tokenizer.json, else byte level)
  std::string prompt_file;      // --prompt-file (text, likewise)
  std::string prompt_tokens;    // --prompt-tokens (file of ids)
  std::string chat_file;        // --chat FILE.json: messages rendered by the model's chat
                                // template (chat_prompt.h), then encoded as text
  bool json = false;            // one JSON object (lockstep.generate v1) instead of the text
  std::string json_path = "-";  // --json PATH: the object goes there (WriteOutput) and the text to
                                // `out`; "-": the object goes to `out`
  bool print_config = false;    // print the effective config as canonical JSON and stop
  std::string trace_jsonl;      // stream window records here (one write() per window)
  std::string export_path;      // --export FILE: lockstep.export v1 HDF5 (written as FILE.partial)
  std::string export_windows = "0-2";  // --export-windows all|none|LIST
  std::string export_points = "pre_verify,post_verify,commit";
  std::string export_compress;  // --export-compress none|lz4 ("" = none)
  // Op digests (issue 37, instrument op_export.h): --op-digests none|all|LIST (with `prefill`)
  // and --op-dump OPS@WINDOWS (repeatable); both need --export.
  std::string op_digests = "none";
  std::vector<std::string> op_dumps;
  // State transplant (issue 37, graft_spec.h): --graft FROM.h5:ITEM@WINDOW:CHECKPOINT
  // (repeatable). Not part of the config (config_sha256 is unchanged); recorded in /injections.
  std::vector<std::string> grafts;
  // Progress on stderr: -1 when stderr is a terminal (a line redrawn in place, then a summary
  // line), 1 always (--progress; not a terminal: "progress: prefill D/N" and throttled
  // "progress: decode N/M tokens" lines, which the campaign runner reads), 0 never.
  int progress = -1;
  std::string arm;                       // --arm NAME recorded in the export
  std::string trace_json;                // --trace-json FILE: Chrome trace-event JSON (Perfetto)
  int sample_ms = 100;                   // resource sampler interval
  std::int64_t guard_min_free_mib = -1;  // end the request when free memory falls below (-1 off)
  // --background SPEC: seeded random-token requests sharing the engine with this one
  // (n=N,prompt=A:B,max_new=A:B,arrive=A:B,seed=S; see ParseBackgroundSpec). Never exported.
  std::string background;
  // Conversations (lockstep.slot v1, lockstep/engine/slot_file.h): --restore-slot FILE continues
  // the saved conversation with the prompt as its next turn; --save-slot FILE saves the
  // conversation after this request (atomically). A damaged, truncated or foreign file is
  // refused (exit 2, the message names the part) before the engine is touched.
  std::string save_slot;
  std::string restore_slot;
};

// --background's spec: `n` requests, each with a prompt of [prompt_min, prompt_max] random
// tokens, max_new in [max_new_min, max_new_max], arriving at a step in [arrive_min,
// arrive_max], all drawn from `seed`. Keys may come in any order; a range is A:B or one value.
struct BackgroundSpec {
  int n = 1;
  int prompt_min = 50, prompt_max = 2000;
  int max_new_min = 8, max_new_max = 32;
  int arrive_min = 0, arrive_max = 40;
  std::uint64_t seed = 1;
};
// kInvalidArgument naming --background for an unknown key, a bad number or an empty range.
Result<BackgroundSpec> ParseBackgroundSpec(std::string_view text);

// `lockstep generate ...`: validates the config (or prints it, with print_config, and stops),
// loads the model and the prompt, builds the engine, runs one request and prints the text (or,
// with json, one lockstep.generate object). The text is printed through EscapeText (the exact
// bytes are in the JSON's text and output_ids). With export_path it writes the state export, with
// trace_jsonl / trace_json the window records. The request's output is printed even when an
// export then fails (that Status is returned after). A failed request leaves FILE.partial, never
// FILE. kInvalidArgument for bad options or inputs, kIOError / kRuntime from files and the engine.
Status RunGenerateCommand(const GenerateOptions& opts, std::ostream& out);

// `text` safe to print on a terminal: newline and tab kept, valid UTF-8 of printable characters
// kept, every other byte (C0 controls such as backspace and ESC, DEL, the C1 controls U+0080 ..
// U+009F, bytes that are not valid UTF-8) written as \xNN. Pure.
std::string EscapeText(std::string_view text);

}  // namespace lockstep
