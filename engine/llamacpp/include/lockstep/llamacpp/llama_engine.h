// LlamaEngine: llama.cpp as a second engine under the harness (issue 38). One model and one
// context of the prebuilt libraries (llama_lib.h, loaded at run time), greedy decoding of one
// request, optionally beside `slots - 1` background sequences in the same llama_batch per step
// (as llama-server batches its slots), with what an export needs handed out per step.
//
// The request's windows follow the lockstep engine's plain decoding, so the two engines' exports
// line up step by step: the prompt's first n-1 tokens are the prefill (window -1, chunks of
// min(batch, ubatch) tokens, one llama_decode each), and window w runs one token (the prompt's
// last, then each output) at position n-1+w and emits output[w].
//
// Background sequences (slots > 1): each gets `background_prompt` tokens drawn from
// `background_seed` (SplitMix64), prefilled before the request alone, then one greedy token per
// window beside the request's, in one batch: the request first (batch row 0, sequence 0), the
// background sequences after it in sequence order.
//
// Op digests: llama.cpp's graph evaluation callback (cb_eval) is installed when the hooks ask for
// ops; it asks for every named graph tensor that is not a leaf (`attn_norm-3`, `ffn_moe_logits-3`;
// the suffix is the layer) of f32/f16/bf16/i32 type and reports one OpRecord per row of the
// request (a tensor's row: the elements of one token, for the outermost dimension that counts the
// ubatch's tokens; a one-token ubatch's tensor is one row; a tensor without a token dimension in a
// one-sequence ubatch is one record, in a multi-sequence ubatch none). OpDef inputs: the named
// non-leaf tensors a tensor reads, through unnamed and view tensors (" (reshaped)" etc. stripped).
// Records carry stage 0, index -1; digests are over the row's raw element bytes.
//
// Threading: one thread uses an engine at a time; hooks are called on that thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/op_table.h"
#include "lockstep/engine/status.h"
#include "lockstep/llamacpp/llamacpp_build.h"

namespace lockstep {

struct LlamaOptions {
  std::string model;               // a .gguf file
  int threads = 0;                 // n_threads and n_threads_batch; 0 = one per hardware core
  int batch = 512;                 // n_batch
  int ubatch = 512;                // n_ubatch
  std::string kv_type = "f16";     // type_k and type_v: f32 | f16 | bf16 | q8_0
  std::string flash_attn = "off";  // off | on | auto
  // One K/V buffer for every sequence (llama-server's default with several slots: a sequence's
  // attention then spans other sequences' cells, masked) or one stream per sequence.
  bool kv_unified = true;
  int max_new = 64;            // output tokens at most (greedy; stops early at end-of-generation)
  int slots = 1;               // sequences per step: the request and slots-1 background ones
  int background_prompt = 16;  // prompt tokens of each background sequence
  std::uint64_t background_seed = 1;
  // kInvalidArgument naming the option for a value outside its range or set.
  Status Validate() const;
  // Canonical JSON of every option and the llama.cpp commit (the export's config fingerprint).
  std::string ToJson() const;
  // The options ToJson wrote (an export's /config, for `localize --rerun`); the commit and
  // "sampling" are not options and are not read. kInvalidArgument naming `label` for text that
  // is not such an object.
  static Result<LlamaOptions> FromJson(std::string_view text, const std::string& label);
};

// What Generate hands out while it runs (all optional).
struct LlamaHooks {
  // Asked per llama_decode with its window (-1: prefill): record this call's ops?
  std::function<bool(int window)> wants_ops;
  std::function<void(const OpRecord&)> on_op;  // rec.data valid during the call only
  // Window w's logits of the request's row (n_vocab floats), at `position`.
  std::function<void(int window, int position, std::span<const float> logits)> on_logits;
  // Window w's sequence state after its decode (llama_state_seq_get_data of sequence 0).
  std::function<void(int window, int position, std::span<const std::uint8_t> state)> on_state;
  // Per llama_decode: window (-2: a background sequence's prefill), rows of the batch, sequences
  // in it, CLOCK_MONOTONIC ns around the call.
  std::function<void(int window, int rows, int seqs, std::int64_t begin_ns, std::int64_t end_ns)>
      on_step;
};

struct LlamaResult {
  std::vector<std::int32_t> output;
  std::string stop_reason;  // "max_new" | "eos"
  int n_windows = 0;
  std::int64_t prefill_ns = 0, decode_ns = 0;
};

class LlamaEngine {
 public:
  // Loads the libraries (LlamaLib::Get), the model and one context. kInvalidArgument naming
  // scripts/install-llamacpp.sh when the component is absent (not built, or no libraries);
  // kInvalidArgument when llama.cpp refuses the file; kRuntime for a failed context.
  static Result<std::unique_ptr<LlamaEngine>> Open(const LlamaOptions& opts);
  ~LlamaEngine();
  LlamaEngine(const LlamaEngine&) = delete;
  LlamaEngine& operator=(const LlamaEngine&) = delete;

  int n_vocab() const;
  const LlamaOptions& options() const;
  // The llama.cpp commit of the loaded libraries.
  const std::string& commit() const;

  // Runs the request (at least one token). kInvalidArgument for an empty prompt or an id outside
  // the vocabulary; kRuntime when llama_decode fails.
  Result<LlamaResult> Generate(std::span<const std::int32_t> prompt, const LlamaHooks& hooks);

 private:
  struct Impl;
  explicit LlamaEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};
using LlamaEnginePtr = std::unique_ptr<LlamaEngine>;

}  // namespace lockstep
