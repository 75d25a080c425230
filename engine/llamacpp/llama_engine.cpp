#include "lockstep/llamacpp/llama_engine.h"

#include <chrono>
#include <thread>

#include "graph_ops.h"
#include "llama_lib.h"
#include "lockstep/engine/clock.h"
#include "lockstep/engine/gguf.h"
#include "lockstep/engine/sampler.h"
#include "lockstep/engine/splitmix.h"

namespace lockstep {

namespace {

ggml_type KvType(const std::string& s) {
  if (s == "f32") return GGML_TYPE_F32;
  if (s == "bf16") return GGML_TYPE_BF16;
  if (s == "q8_0") return GGML_TYPE_Q8_0;
  return GGML_TYPE_F16;
}

llama_flash_attn_type FlashAttn(const std::string& s) {
  if (s == "on") return LLAMA_FLASH_ATTN_TYPE_ENABLED;
  if (s == "auto") return LLAMA_FLASH_ATTN_TYPE_AUTO;
  return LLAMA_FLASH_ATTN_TYPE_DISABLED;
}

// The next value of a SplitMix64 stream whose state is x.
std::uint64_t NextSplitMix(std::uint64_t& x) {
  const std::uint64_t z = SplitMix64(x);
  x += kSplitMix64Gamma;
  return z;
}

// A llama_batch with RAII.
struct Batch {
  const LlamaLib* lib;
  llama_batch b;
  Batch(const LlamaLib* l, int n, int n_seq) : lib(l), b(l->llama_batch_init(n, 0, n_seq)) {}
  ~Batch() { lib->llama_batch_free(b); }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  void Clear() { b.n_tokens = 0; }
  void Add(llama_token tok, llama_pos pos, llama_seq_id seq, bool logits) {
    const int i = b.n_tokens++;
    b.token[i] = tok;
    b.pos[i] = pos;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = seq;
    b.logits[i] = logits ? 1 : 0;
  }
};

}  // namespace

struct LlamaEngine::Impl {
  const LlamaLib* lib = nullptr;
  LlamaOptions opts;
  llama_model* model = nullptr;
  llama_context* ctx = nullptr;
  const llama_vocab* vocab = nullptr;
  int n_vocab = 0;
  std::unique_ptr<GraphOps> ops;
  ~Impl() {
    if (ctx) lib->llama_free(ctx);
    if (model) lib->llama_model_free(model);
  }
  Status Decode(Batch& batch, int window, const std::vector<int>& row_pos, int n_seqs,
                const LlamaHooks& hooks);
};

Status LlamaEngine::Impl::Decode(Batch& batch, int window, const std::vector<int>& row_pos,
                                 int n_seqs, const LlamaHooks& hooks) {
  const bool want = hooks.on_op && hooks.wants_ops && hooks.wants_ops(window);
  ops->BeginCall(window, row_pos, n_seqs, want ? &hooks.on_op : nullptr);
  const std::int64_t begin_ns = MonotonicNs();
  const int rc = lib->llama_decode(ctx, batch.b);
  const std::int64_t end_ns = MonotonicNs();
  ops->EndCall();
  if (rc != 0)
    return Status::Runtime(
        "llama_decode", "returned " + std::to_string(rc) + " at window " + std::to_string(window));
  if (hooks.on_step) hooks.on_step(window, batch.b.n_tokens, n_seqs, begin_ns, end_ns);
  return Status::Ok();
}

LlamaEngine::LlamaEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LlamaEngine::~LlamaEngine() = default;
int LlamaEngine::n_vocab() const { return impl_->n_vocab; }
const LlamaOptions& LlamaEngine::options() const { return impl_->opts; }
const std::string& LlamaEngine::commit() const { return impl_->lib->commit; }

Result<std::unique_ptr<LlamaEngine>> LlamaEngine::Open(const LlamaOptions& opts) {
  LOCKSTEP_RETURN_IF_ERROR(opts.Validate());
  LOCKSTEP_ASSIGN_OR_RETURN(const LlamaLib* lib, LlamaLib::Get());
  // The vocabulary size from the file (llama.cpp has none for tokenizer.ggml.model "none").
  LOCKSTEP_ASSIGN_OR_RETURN(GgufFilePtr gguf, GgufFile::Open(opts.model));
  const std::optional<std::string> arch = gguf->String("general.architecture");
  const std::optional<std::int64_t> nv =
      arch ? gguf->Int(*arch + ".vocab_size") : std::optional<std::int64_t>();
  auto impl = std::make_unique<Impl>();
  impl->lib = lib;
  impl->opts = opts;
  if (impl->opts.threads <= 0)
    impl->opts.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  llama_model_params mp = lib->llama_model_default_params();
  mp.n_gpu_layers = 0;
  impl->model = lib->llama_model_load_from_file(opts.model.c_str(), mp);
  if (impl->model == nullptr)
    return Status::InvalidArgument("--model '" + opts.model + "'",
                                   "llama.cpp cannot load it (LOCKSTEP_LLAMACPP_LOG=1 shows why)");
  impl->vocab = lib->llama_model_get_vocab(impl->model);
  impl->n_vocab = lib->llama_vocab_n_tokens(impl->vocab);
  if (impl->n_vocab <= 0 && nv) impl->n_vocab = static_cast<int>(*nv);
  if (impl->n_vocab <= 0)
    return Status::InvalidArgument("--model '" + opts.model + "'", "no vocabulary size");
  impl->ops = std::make_unique<GraphOps>(*lib);
  llama_context_params cp = lib->llama_context_default_params();
  const int per_seq = 4096;
  cp.n_ctx = static_cast<std::uint32_t>(per_seq * opts.slots);
  cp.n_batch = static_cast<std::uint32_t>(opts.batch);
  cp.n_ubatch = static_cast<std::uint32_t>(opts.ubatch);
  cp.n_seq_max = static_cast<std::uint32_t>(opts.slots);
  cp.n_threads = cp.n_threads_batch = impl->opts.threads;
  cp.type_k = cp.type_v = KvType(opts.kv_type);
  cp.flash_attn_type = FlashAttn(opts.flash_attn);
  cp.kv_unified = opts.kv_unified;
  cp.no_perf = true;
  cp.cb_eval = &GraphOps::Callback;
  cp.cb_eval_user_data = impl->ops.get();
  impl->ctx = lib->llama_init_from_model(impl->model, cp);
  if (impl->ctx == nullptr)
    return Status::Runtime("llama.cpp", "llama_init_from_model failed for '" + opts.model +
                                            "' (LOCKSTEP_LLAMACPP_LOG=1 shows why)");
  return std::unique_ptr<LlamaEngine>(new LlamaEngine(std::move(impl)));
}

Result<LlamaResult> LlamaEngine::Generate(std::span<const std::int32_t> prompt,
                                          const LlamaHooks& hooks) {
  Impl& m = *impl_;
  const LlamaOptions& o = m.opts;
  if (prompt.empty()) return Status::InvalidArgument("prompt", "is empty");
  for (std::int32_t id : prompt)
    if (id < 0 || id >= m.n_vocab)
      return Status::InvalidArgument("prompt", "token id " + std::to_string(id) +
                                                   " is outside the vocabulary (size " +
                                                   std::to_string(m.n_vocab) + ")");
  const int n = static_cast<int>(prompt.size());
  if (n + o.max_new > 4096 || o.background_prompt + o.max_new > 4096)
    return Status::InvalidArgument("prompt",
                                   "prompt + max_new exceeds 4096 positions per sequence");
  const int chunk = std::min(o.batch, o.ubatch);
  Batch batch(m.lib, std::max(chunk, o.slots), 1);
  LlamaResult res;

  // Background sequences: prompts from the seed, prefilled alone before the request.
  struct Bg {
    std::vector<llama_token> prompt;
    llama_token next = 0;
    int pos = 0;
  };
  std::vector<Bg> bg(static_cast<std::size_t>(o.slots - 1));
  std::uint64_t rng = o.background_seed;
  for (std::size_t s = 0; s < bg.size(); ++s) {
    for (int i = 0; i < o.background_prompt; ++i)
      bg[s].prompt.push_back(
          static_cast<llama_token>(NextSplitMix(rng) % static_cast<std::uint64_t>(m.n_vocab)));
    for (int b0 = 0; b0 < o.background_prompt; b0 += chunk) {
      batch.Clear();
      const int e = std::min(o.background_prompt, b0 + chunk);
      for (int i = b0; i < e; ++i)
        batch.Add(bg[s].prompt[static_cast<std::size_t>(i)], i, static_cast<int>(s + 1),
                  i == o.background_prompt - 1);
      LOCKSTEP_RETURN_IF_ERROR(
          m.Decode(batch, -2, std::vector<int>(static_cast<std::size_t>(e - b0), -1), 1, {}));
    }
    const float* lg = m.lib->llama_get_logits_ith(m.ctx, batch.b.n_tokens - 1);
    bg[s].next = Argmax(lg, m.n_vocab);
    bg[s].pos = o.background_prompt;
  }

  // The request's prefill: the first n-1 prompt tokens (window -1).
  const std::int64_t t0 = MonotonicNs();
  for (int b0 = 0; b0 < n - 1; b0 += chunk) {
    batch.Clear();
    std::vector<int> row_pos;
    for (int i = b0; i < std::min(n - 1, b0 + chunk); ++i) {
      batch.Add(prompt[static_cast<std::size_t>(i)], i, 0, false);
      row_pos.push_back(i);
    }
    LOCKSTEP_RETURN_IF_ERROR(m.Decode(batch, -1, row_pos, 1, hooks));
  }
  const std::int64_t t1 = MonotonicNs();
  res.prefill_ns = t1 - t0;

  // Windows: the request's token in row 0, each background sequence's next token after it.
  std::vector<std::uint8_t> state;
  llama_token tok = prompt[static_cast<std::size_t>(n - 1)];
  res.stop_reason = "max_new";
  for (int w = 0; w < o.max_new; ++w) {
    const int pos = n - 1 + w;
    batch.Clear();
    batch.Add(tok, pos, 0, true);
    std::vector<int> row_pos{pos};
    for (std::size_t s = 0; s < bg.size(); ++s) {
      batch.Add(bg[s].next, bg[s].pos, static_cast<int>(s + 1), true);
      row_pos.push_back(-1);
    }
    LOCKSTEP_RETURN_IF_ERROR(m.Decode(batch, w, row_pos, 1 + static_cast<int>(bg.size()), hooks));
    const float* lg = m.lib->llama_get_logits_ith(m.ctx, 0);
    if (lg == nullptr) return Status::Runtime("llama.cpp", "no logits for the request's row");
    if (hooks.on_logits)
      hooks.on_logits(w, pos, std::span<const float>(lg, static_cast<std::size_t>(m.n_vocab)));
    tok = Argmax(lg, m.n_vocab);
    for (std::size_t s = 0; s < bg.size(); ++s) {
      bg[s].next = Argmax(m.lib->llama_get_logits_ith(m.ctx, static_cast<int>(s + 1)), m.n_vocab);
      ++bg[s].pos;
    }
    if (hooks.on_state) {
      state.resize(m.lib->llama_state_seq_get_size(m.ctx, 0));
      const std::size_t got = m.lib->llama_state_seq_get_data(m.ctx, state.data(), state.size(), 0);
      state.resize(got);
      hooks.on_state(w, pos, state);
    }
    res.output.push_back(tok);
    ++res.n_windows;
    if (m.lib->llama_vocab_is_eog(m.vocab, tok)) {
      res.stop_reason = "eos";
      break;
    }
  }
  res.decode_ns = MonotonicNs() - t1;
  return res;
}

}  // namespace lockstep
