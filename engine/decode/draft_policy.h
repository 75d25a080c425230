// Draft policies: per window, choose between a suffix draft, an MTP draft and a merged draft
// (suffix prefix continued by the MTP head), and the draft length.
//
//   static    fixed rule: a suffix match of >= kMinSuffixMatch tokens is used (merged with MTP up
//             to K tokens when shorter than K); otherwise MTP drafts K tokens. Deterministic.
//   adaptive  per-source per-token acceptance rates (exponentially weighted counts, prior 1/2)
//             set the draft lengths: token i is drafted while rate^i >= a threshold, so a drafter
//             that keeps missing drafts nothing (with a 1-token probe every 16 windows). Suffix
//             drafts keep one rate per class of match length ([3, 8), [8, 32), >= 32 tokens;
//             a class uses the best of its rate and the shorter classes'; the >= 32 class starts
//             at 8/9): long matches (repeated blocks, loops) draft up to --spec-max-suffix from
//             their first window, even after short natural-text matches kept missing.
//             Uses acceptance history only: deterministic.
//   latency   adaptive, plus a back-off driven by measured verify latency: a verify slower than
//             max(3 x its running mean, mean + 50 ms) (a stall) pauses drafting for the next 4
//             windows (T = 1), the way serving engines stop speculating under pressure.
//             Timing-dependent on purpose, like production engines.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "decode/suffix_index.h"
#include "lockstep/engine/status.h"
#include "lockstep/engine/window.h"

namespace lockstep {

struct DraftPlan {
  DraftSource source = DraftSource::kNone;
  int n_sfx = 0;  // suffix tokens (from the front of the proposal)
  int n_mtp = 0;  // MTP tokens (after the suffix tokens for merged)
};

class DraftPolicy {
 public:
  static constexpr int kMinSuffixMatch = 3;

  virtual ~DraftPolicy() = default;
  // `sfx`: the suffix proposal (maybe empty); `mtp`: the MTP drafter is available; `k`: --spec;
  // `max_suffix`: --spec-max-suffix.
  virtual DraftPlan Plan(const SuffixProposal& sfx, bool mtp, int k, int max_suffix) = 0;
  // Feedback after the window's commit.
  virtual void Observe(const WindowRecord& rec) = 0;
  virtual const char* name() const = 0;
  // What Observe learned, as bytes (empty for static; doubles as bit patterns), and back: a
  // conversation saved to a slot file continues with the policy where it was. LoadState refuses
  // bytes that are not a state of this policy (kCorruption).
  virtual std::string SaveState() const { return {}; }
  virtual Status LoadState(std::string_view bytes) {
    return bytes.empty() ? Status::Ok() : Status::Corruption("draft policy state", name());
  }

  // "static" | "adaptive" | "latency"; nullptr for an unknown name.
  static std::unique_ptr<DraftPolicy> Create(const std::string& name);
};

}  // namespace lockstep
