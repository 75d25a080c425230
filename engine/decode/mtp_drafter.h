// MtpDrafter: keeps the MTP head's draft K/V in step with the main model and drafts by chaining.
//
// Draft K/V row q holds the MTP layer's K/V for input (h_q, t_{q+1}): the main model's
// final-normed hidden at q and the token that followed. Rows are "pending" until both are known
// (after prefill chunks and after each window's commit); Extend() runs the MTP over all pending
// rows in one batched forward (batch-invariant kernels: the rows' bits do not depend on how many
// are extended together) and commits them. The draft K/V at a window's commit therefore precedes
// the next MTP write, as in the seed issue. Extension is lazy: it happens when a window wants an
// MTP draft (or when 256 rows are pending), so windows that draft from the suffix index or not at
// all cost no MTP work.
//
// Chaining: the last extended row's logits give draft 1; step s >= 2 runs the MTP at position
// p+s-2 on (m_{s-1}, d_{s-1}) where m is the MTP's own post-norm output, writing speculative
// draft K/V rows that the next Extend() overwrites. Drafts are argmax (point-mass proposals).
//
// Borrowed: the engine outlives the drafter. Not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "lockstep/engine/conversation.h"
#include "lockstep/engine/engine.h"

namespace lockstep {

class MtpDrafter {
 public:
  explicit MtpDrafter(Engine& engine);

  // Queues rows p..p+T-1 with final-normed hidden f32 [T, H] and their next tokens [T].
  void Queue(int p, int T, const float* normed, const std::int32_t* next_tokens);
  int pending() const { return static_cast<int>(pending_tokens_.size()); }
  // Runs the MTP over every pending row (mode kPrefill during prefill: GEMM kernels).
  void Extend(ForwardMode mode = ForwardMode::kVerify);

  // Drafts for the window at position p (all rows < p must be queued). The first
  // `forced.size()` drafts are taken from `forced` (suffix prefix of a merged draft, or a
  // replayed draft) and fed to the chain; then up to `n_own` argmax drafts follow.
  // Returns the draft tokens (forced ones included).
  std::vector<std::int32_t> Draft(int p, std::span<const std::int32_t> forced, int n_own);

  // The queue and the last extended row (conversations, prefix cache); LoadState takes them back
  // (the engine's MTP draft K/V must hold the rows the state says are extended).
  MtpDrafterState SaveState() const;
  void LoadState(const MtpDrafterState& s);

 private:
  Engine& e_;
  int h_, v_;
  int next_row_ = 0;                          // first row not yet queued
  std::vector<float> pending_h_;              // f32 [n, H]
  std::vector<std::int32_t> pending_tokens_;  // [n]
  int pending_p_ = 0;                         // position of the first pending row
  std::vector<float> m_, logits_;             // last extended row: m f32 [H], logits f32 [V]
  std::vector<float> bm_;                     // batch output m f32 [n, H]
};

}  // namespace lockstep
