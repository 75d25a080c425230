// Recurrent state of one Gated DeltaNet layer for one sequence: the committed checkpoint plus
// per-step scratch for a verify window (MODEL.md section 4; DESIGN.md "committed checkpoint at
// p, per-step states in scratch, commit advances").
//
//   checkpoint  conv  f32 [K-1, conv_dim]   last K-1 pre-conv inputs, oldest first (zeros at start)
//               ssm   f32 [Hv, Dk, Dv]      S per value head (HF/FLA layout)
//               position()                 tokens folded into the checkpoint
//   scratch     step t (t < n_steps()): the same two tensors after input t of the window
//
// A verify of T tokens reads the checkpoint for step 0 and step t-1 for step t, writes step t
// (each step whole); CommitSteps(n) makes step n-1 the checkpoint (a buffer exchange, no copy)
// and advances position() by n. Rejected
// steps never touch the checkpoint. Prefill (chunked form) updates the checkpoint in place and
// calls Advance(n).
//
// A fresh state's checkpoint is zeroed explicitly (Reset: zero is the model's initial state);
// scratch steps are never valid before their write (NaN with LOCKSTEP_POISON_FRESH=1, poison.h).
//
// Thread safety: none; owned by one stage session.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace lockstep {

// Storage on 64-byte boundaries: the recurrent step writes the state a window leaves behind
// with streaming (non-temporal) 64-byte stores, which need them (cpu/gdn.cpp). Not Eigen's
// aligned_allocator: its alignment follows the build's vector width, and this public header
// stays free of Eigen.
template <class T>
struct Align64 {
  using value_type = T;
  Align64() = default;
  template <class U>
  Align64(const Align64<U>&) {}  // NOLINT(google-explicit-constructor): allocator rebinding
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, std::size_t) { ::operator delete (p, std::align_val_t{64}); }
  template <class U>
  bool operator==(const Align64<U>&) const {
    return true;
  }
};

class GdnState {
 public:
  GdnState(int conv_dim, int conv_kernel, int n_v_heads, int k_head_dim, int v_head_dim);

  float* conv() { return conv_.data(); }
  const float* conv() const { return conv_.data(); }
  float* ssm() { return ssm_.data(); }
  const float* ssm() const { return ssm_.data(); }
  int position() const { return position_; }

  std::size_t conv_size() const { return conv_.size(); }  // floats
  std::size_t ssm_size() const { return ssm_.size(); }    // floats
  int conv_rows() const { return conv_rows_; }            // K-1
  int conv_dim() const { return conv_dim_; }

  // Prepares scratch for a window of T steps (grows, never shrinks).
  void BeginSteps(int T);
  int n_steps() const { return n_steps_; }
  float* step_conv(int t) { return step_conv_[static_cast<std::size_t>(t)].data(); }
  float* step_ssm(int t) { return step_ssm_[static_cast<std::size_t>(t)].data(); }
  const float* step_conv(int t) const { return step_conv_[static_cast<std::size_t>(t)].data(); }
  const float* step_ssm(int t) const { return step_ssm_[static_cast<std::size_t>(t)].data(); }

  // Keeps the first n steps (1 <= n <= n_steps()): checkpoint := step n-1 (the two buffers are
  // exchanged: conv() / ssm() point elsewhere afterwards), position += n.
  void CommitSteps(int n);
  void DiscardSteps() { n_steps_ = 0; }
  // Prefill updated the checkpoint in place with n tokens.
  void Advance(int n) { position_ += n; }
  // The initial state: checkpoint zero (conv and ssm), position 0, no steps.
  void Reset();
  // The checkpoint after `position` tokens: conv f32 [K-1, conv_dim] and ssm f32 [Hv, Dk, Dv]
  // (conv_size() / ssm_size() floats); no steps.
  void Restore(const float* conv, const float* ssm, int position);
  // Exchanges the scratch buffers (not their steps' validity) with `other` of the same shape: a
  // restored slot keeps the window scratch its request reserved.
  void SwapScratch(GdnState& other);

 private:
  int conv_dim_, conv_rows_;
  std::vector<float> conv_;                                   // f32 [K-1, conv_dim]
  std::vector<float, Align64<float>> ssm_;                    // f32 [Hv, Dk, Dv]
  std::vector<std::vector<float>> step_conv_;                 // T_max x f32 [K-1, conv_dim]
  std::vector<std::vector<float, Align64<float>>> step_ssm_;  // T_max x f32 [Hv, Dk, Dv]
  int n_steps_ = 0;
  int position_ = 0;
};

}  // namespace lockstep
