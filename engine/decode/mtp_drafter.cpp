#include "decode/mtp_drafter.h"

#include <algorithm>

#include "lockstep/engine/sampler.h"
#include "util/check.h"

namespace lockstep {

MtpDrafter::MtpDrafter(Engine& engine)
    : e_(engine), h_(engine.weights().config.n_embd), v_(engine.weights().config.n_vocab) {
  m_.assign(static_cast<std::size_t>(h_), 0.0f);
  logits_.assign(static_cast<std::size_t>(v_), 0.0f);
}

void MtpDrafter::Queue(int p, int T, const float* normed, const std::int32_t* next_tokens) {
  LOCKSTEP_CHECK_EQ(p, next_row_);
  if (pending_tokens_.empty()) pending_p_ = p;
  pending_h_.insert(pending_h_.end(), normed,
                    normed + static_cast<std::size_t>(T) * static_cast<std::size_t>(h_));
  pending_tokens_.insert(pending_tokens_.end(), next_tokens, next_tokens + T);
  next_row_ = p + T;
}

void MtpDrafter::Extend(ForwardMode mode) {
  const int n = pending();
  if (n == 0) return;
  LOCKSTEP_CHECK_EQ(pending_p_, e_.mtp_position());
  bm_.resize(static_cast<std::size_t>(n) * static_cast<std::size_t>(h_));
  e_.MtpForward(pending_h_.data(), pending_tokens_.data(), pending_p_, n, mode, bm_.data(),
                logits_.data(), 1);
  e_.MtpCommit(pending_p_ + n);
  std::copy_n(bm_.end() - h_, h_, m_.begin());
  pending_h_.clear();
  pending_tokens_.clear();
}

std::vector<std::int32_t> MtpDrafter::Draft(int p, std::span<const std::int32_t> forced,
                                            int n_own) {
  LOCKSTEP_CHECK_EQ(next_row_, p);
  Extend();
  LOCKSTEP_CHECK_EQ(e_.mtp_position(), p);
  std::vector<std::int32_t> out;
  const int total = static_cast<int>(forced.size()) + n_own;
  if (total == 0) return out;
  std::vector<float> m = m_, logits = logits_, m_next(static_cast<std::size_t>(h_)),
                     l_next(static_cast<std::size_t>(v_));
  for (int s = 0; s < total; ++s) {
    const std::int32_t d = s < static_cast<int>(forced.size())
                               ? forced[static_cast<std::size_t>(s)]
                               : static_cast<std::int32_t>(Argmax(logits.data(), v_));
    out.push_back(d);
    if (s + 1 == total) break;
    // Chain step at position p + s on (m, d): speculative draft K/V row, overwritten by the
    // next Extend().
    e_.MtpForward(m.data(), &d, p + s, 1, ForwardMode::kVerify, m_next.data(), l_next.data(), 1);
    m.swap(m_next);
    logits.swap(l_next);
  }
  return out;
}

MtpDrafterState MtpDrafter::SaveState() const {
  MtpDrafterState s;
  s.next_row = next_row_;
  s.pending_p = pending_p_;
  s.pending_h = pending_h_;
  s.pending_tokens = pending_tokens_;
  s.last_m = m_;
  s.last_logits = logits_;
  return s;
}

void MtpDrafter::LoadState(const MtpDrafterState& s) {
  LOCKSTEP_CHECK_EQ(s.last_m.size(), m_.size());
  LOCKSTEP_CHECK_EQ(s.last_logits.size(), logits_.size());
  next_row_ = s.next_row;
  pending_p_ = s.pending_p;
  pending_h_ = s.pending_h;
  pending_tokens_ = s.pending_tokens;
  m_ = s.last_m;
  logits_ = s.last_logits;
}

}  // namespace lockstep
