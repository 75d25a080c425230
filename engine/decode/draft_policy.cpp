#include "decode/draft_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>

namespace lockstep {

namespace {

class StaticPolicy final : public DraftPolicy {
 public:
  DraftPlan Plan(const SuffixProposal& sfx, bool mtp, int k, int max_suffix) override {
    DraftPlan plan;
    const int n_sfx = std::min(static_cast<int>(sfx.tokens.size()), max_suffix);
    if (sfx.match_len >= kMinSuffixMatch && n_sfx > 0) {
      plan.n_sfx = n_sfx;
      if (mtp && n_sfx < k) {
        plan.source = DraftSource::kMerged;
        plan.n_mtp = k - n_sfx;
      } else {
        plan.source = DraftSource::kSuffix;
      }
    } else if (mtp && k > 0) {
      plan.source = DraftSource::kMtp;
      plan.n_mtp = k;
    }
    return plan;
  }
  void Observe(const WindowRecord&) override {}
  const char* name() const override { return "static"; }
};

// Per-token acceptance of one draft source, as exponentially weighted success / trial counts.
struct Rate {
  Rate() = default;
  Rate(double s, double t) : success(s), trials(t) {}
  double success = 1.0, trials = 2.0;  // prior: 1/2
  double value() const { return success / trials; }
  void Add(int accepted, int drafted) {
    constexpr double kDecay = 0.9;  // ~10 windows of memory
    success = success * kDecay + accepted;
    trials = trials * kDecay + accepted + (accepted < drafted ? 1 : 0);
  }
};

template <typename T>
void Put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename T>
bool Take(std::string_view& s, T& v) {
  if (s.size() < sizeof v) return false;
  std::memcpy(&v, s.data(), sizeof v);
  s.remove_prefix(sizeof v);
  return true;
}

// Longest length n <= cap whose last token is still likely: rate^n >= threshold.
int Length(double rate, double threshold, int cap) {
  int n = 0;
  double pr = 1.0;
  while (n < cap && pr * rate >= threshold) {
    pr *= rate;
    ++n;
  }
  return n;
}

class AdaptivePolicy : public DraftPolicy {
 public:
  // A drafted MTP token costs an MTP step plus a verify row; a suffix token only the verify
  // row. The thresholds are the acceptance probability a token must have to pay for itself on
  // the CPU backend (measured on `small`: one MTP step ~13% of a decode step, one extra verify
  // row 10-30% depending on how many new experts it routes to).
  static constexpr double kMtpThreshold = 0.4;
  static constexpr double kSfxThreshold = 0.25;
  static constexpr int kProbeEvery = 16;

  // Suffix acceptance is tracked per class of match length: short contexts (a few tokens, as
  // natural text repeats them) are often followed differently than before, long ones (a repeated
  // block, a loop) rarely. With one shared rate the misses of the first kind kept the second
  // kind's drafts short or off (e.g. a loop that starts after a stretch of prose). A longer match
  // is taken to be at least as reliable as a shorter one (a class's rate is the best of its own
  // and the shorter classes'), and a match of >= 32 tokens starts at 8/9 instead of 1/2: as if
  // eight of nine such tokens had been accepted, so the first window drafts the full budget
  // (up to 11 tokens), as suffix decoding drafts in proportion to the match length. Misses
  // shorten it like any other rate (one miss at the first token: 7.2 / 9.1, five tokens). Going
  // straight to the longest window also pays the first-window costs of a new window size (the
  // stages' scratch grows to the largest T seen) once instead of once per step of a ramp.
  static constexpr int kMatchClassBounds[] = {8, 32};  // classes [3, 8), [8, 32), [32, inf)
  static constexpr int kMatchClasses = static_cast<int>(std::size(kMatchClassBounds)) + 1;
  static int MatchClass(int match_len) {
    int c = 0;
    for (int b : kMatchClassBounds) c += match_len >= b;
    return c;
  }
  double SfxRate(int cls) const {
    double r = 0;
    for (int c = 0; c <= cls; ++c) r = std::max(r, sfx_[c].value());
    return r;
  }

  DraftPlan Plan(const SuffixProposal& sfx, bool mtp, int k, int max_suffix) override {
    ++windows_;
    k = Budget(k);
    max_suffix = Budget(max_suffix);
    DraftPlan plan;
    int n_mtp = mtp ? Length(mtp_.value(), kMtpThreshold, k) : 0;
    if (mtp && n_mtp == 0 && k > 0 && windows_ % kProbeEvery == 0) n_mtp = 1;  // keep measuring
    const int avail = std::min(static_cast<int>(sfx.tokens.size()), max_suffix);
    sfx_class_ = MatchClass(sfx.match_len);
    const double sfx_rate = SfxRate(sfx_class_);
    int n_sfx = sfx.match_len >= kMinSuffixMatch ? Length(sfx_rate, kSfxThreshold, avail) : 0;
    if (sfx.match_len >= kMinSuffixMatch && avail > 0 && n_sfx == 0 && windows_ % kProbeEvery == 0)
      n_sfx = 1;
    auto expected = [](double r, int n) {
      double e = 0, pr = 1;
      for (int i = 0; i < n; ++i) e += (pr *= r);
      return e;
    };
    if (n_sfx > 0 && expected(sfx_rate, n_sfx) >= expected(mtp_.value(), n_mtp)) {
      plan.n_sfx = n_sfx;
      if (mtp && n_mtp > n_sfx) {
        plan.source = DraftSource::kMerged;
        plan.n_mtp = n_mtp - n_sfx;
      } else {
        plan.source = DraftSource::kSuffix;
      }
    } else if (n_mtp > 0) {
      plan.source = DraftSource::kMtp;
      plan.n_mtp = n_mtp;
    }
    return plan;
  }

  void Observe(const WindowRecord& r) override {
    const int drafted = r.T - 1;
    if (drafted <= 0) return;
    // Attribute accepted tokens to the source that drafted them (suffix tokens come first).
    const int n_sfx = drafted - r.T_mtp;
    if (n_sfx > 0) sfx_[sfx_class_].Add(std::min(r.accepted, n_sfx), n_sfx);
    if (r.T_mtp > 0 && r.accepted >= n_sfx) mtp_.Add(r.accepted - n_sfx, r.T_mtp);
  }
  const char* name() const override { return "adaptive"; }
  std::string SaveState() const override {
    std::string s;
    SaveTo(s);
    return s;
  }
  Status LoadState(std::string_view b) override {
    if (!LoadFrom(b) || !b.empty()) return Status::Corruption("draft policy state", name());
    return Status::Ok();
  }

 protected:
  virtual int Budget(int k) const { return k; }
  void SaveTo(std::string& s) const {
    for (const Rate& r : {mtp_, sfx_[0], sfx_[1], sfx_[2]}) Put(s, r.success), Put(s, r.trials);
    Put<std::int64_t>(s, windows_);
    Put<std::int32_t>(s, sfx_class_);
  }
  bool LoadFrom(std::string_view& b) {
    Rate r[kMatchClasses + 1];
    std::int64_t w = 0;
    std::int32_t c = 0;
    for (Rate& x : r)
      if (!Take(b, x.success) || !Take(b, x.trials)) return false;
    if (!Take(b, w) || !Take(b, c) || c < 0 || c >= kMatchClasses) return false;
    mtp_ = r[0];
    for (int i = 0; i < kMatchClasses; ++i) sfx_[i] = r[i + 1];
    windows_ = static_cast<long>(w);
    sfx_class_ = c;
    return true;
  }

 private:
  Rate mtp_;
  Rate sfx_[kMatchClasses] = {Rate(), Rate(), Rate(8.0, 9.0)};
  int sfx_class_ = 0;  // match class of the last plan: the window Observe sees next
  long windows_ = 0;
};

class LatencyPolicy final : public AdaptivePolicy {
 public:
  void Observe(const WindowRecord& r) override {
    AdaptivePolicy::Observe(r);
    const double v = static_cast<double>(r.verify_ns);
    if (cooldown_ > 0) --cooldown_;
    if (mean_ns_ > 0 && v > std::max(3.0 * mean_ns_, mean_ns_ + 50e6)) cooldown_ = 4;
    mean_ns_ = mean_ns_ == 0 ? v : 0.8 * mean_ns_ + 0.2 * v;
  }
  const char* name() const override { return "latency"; }
  std::string SaveState() const override {
    std::string s;
    SaveTo(s);
    Put(s, mean_ns_);
    Put<std::int32_t>(s, cooldown_);
    return s;
  }
  Status LoadState(std::string_view b) override {
    double mean = 0;
    std::int32_t cool = 0;
    if (!LoadFrom(b) || !Take(b, mean) || !Take(b, cool) || !b.empty())
      return Status::Corruption("draft policy state", name());
    mean_ns_ = mean;
    cooldown_ = cool;
    return Status::Ok();
  }

 protected:
  int Budget(int k) const override { return cooldown_ > 0 ? 0 : k; }

 private:
  double mean_ns_ = 0;
  int cooldown_ = 0;
};

}  // namespace

std::unique_ptr<DraftPolicy> DraftPolicy::Create(const std::string& name) {
  if (name == "static") return std::make_unique<StaticPolicy>();
  if (name == "adaptive") return std::make_unique<AdaptivePolicy>();
  if (name == "latency") return std::make_unique<LatencyPolicy>();
  return nullptr;
}

}  // namespace lockstep
