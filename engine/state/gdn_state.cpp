#include "lockstep/engine/gdn_state.h"

#include <algorithm>
#include <limits>

#include "lockstep/engine/poison.h"
#include "util/check.h"

namespace lockstep {

namespace {
// What fresh memory holds: zero, or NaN under LOCKSTEP_POISON_FRESH.
float FreshValue() { return PoisonFresh() ? std::numeric_limits<float>::quiet_NaN() : 0.0f; }
}  // namespace

GdnState::GdnState(int conv_dim, int conv_kernel, int n_v_heads, int k_head_dim, int v_head_dim)
    : conv_dim_(conv_dim),
      conv_rows_(conv_kernel - 1),
      conv_(static_cast<std::size_t>(conv_kernel - 1) * static_cast<std::size_t>(conv_dim),
            FreshValue()),
      ssm_(static_cast<std::size_t>(n_v_heads) * static_cast<std::size_t>(k_head_dim) *
               static_cast<std::size_t>(v_head_dim),
           FreshValue()) {
  Reset();
}

void GdnState::Reset() {
  std::fill(conv_.begin(), conv_.end(), 0.0f);
  std::fill(ssm_.begin(), ssm_.end(), 0.0f);
  position_ = 0;
  n_steps_ = 0;
}

void GdnState::Restore(const float* conv, const float* ssm, int position) {
  LOCKSTEP_CHECK_GE(position, 0);
  std::copy_n(conv, conv_.size(), conv_.data());
  std::copy_n(ssm, ssm_.size(), ssm_.data());
  position_ = position;
  n_steps_ = 0;
}

void GdnState::SwapScratch(GdnState& other) {
  LOCKSTEP_CHECK(other.conv_.size() == conv_.size() && other.ssm_.size() == ssm_.size())
      << "scratch of another shape";
  scratch_conv_.swap(other.scratch_conv_);
  scratch_ssm_.swap(other.scratch_ssm_);
  n_steps_ = other.n_steps_ = 0;
}

void GdnState::BeginSteps(int T) {
  std::size_t t = static_cast<std::size_t>(T);
  const float fresh = FreshValue();
  if (scratch_conv_.size() < t * conv_.size()) scratch_conv_.resize(t * conv_.size(), fresh);
  if (scratch_ssm_.size() < t * ssm_.size()) scratch_ssm_.resize(t * ssm_.size(), fresh);
  n_steps_ = T;
}

void GdnState::CommitSteps(int n) {
  LOCKSTEP_CHECK(n >= 1 && n <= n_steps_) << "commit " << n << " of " << n_steps_ << " steps";
  std::copy_n(step_conv(n - 1), conv_.size(), conv_.data());
  std::copy_n(step_ssm(n - 1), ssm_.size(), ssm_.data());
  position_ += n;
  n_steps_ = 0;
}

}  // namespace lockstep
