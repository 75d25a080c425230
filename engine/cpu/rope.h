// Partial rotary position embedding, NeoX / rotate_half convention (MODEL.md 3.5 step 3).
// Dims [0, R) of each head rotate, [R, D) pass through. inv_freq, angles, cos and sin are
// computed in f32 exactly as HF does: inv_freq[i] = 1 / theta^(2i/R), phi = float(p) * inv_freq[i].
#pragma once

#include <vector>

namespace lockstep::cpu {

class Rope {
 public:
  Rope(int rotary_dim, double theta);
  // Rotates x f32 [n_heads, head_dim] in place for absolute position `pos`.
  void Apply(float* x, int n_heads, int head_dim, int pos) const;
  int rotary_dim() const { return rotary_dim_; }

 private:
  int rotary_dim_;
  std::vector<float> inv_freq_;  // f32 [R/2]
};

}  // namespace lockstep::cpu
