#include "decode/suffix_index.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>
#include <utility>

#include "util/check.h"

namespace lockstep {

// ---- SuffixAutomaton ----

SuffixAutomaton::SuffixAutomaton() {
  // st_ grows by push_back; a State that moved with a copy would copy its whole map.
  static_assert(std::is_nothrow_move_constructible_v<State>);
  st_.emplace_back();  // root: len 0, link -1, no first end, count 0
}

void SuffixAutomaton::Append(std::int32_t token) {
  // Positions and lengths are int (like the public SuffixProposal fields).
  LOCKSTEP_CHECK_LT(seq_.size(), static_cast<std::size_t>(INT_MAX / 2)) << "suffix index is full";
  const int i = static_cast<int>(seq_.size());
  seq_.push_back(token);

  const int cur = static_cast<int>(st_.size());
  const int cur_len = st_[static_cast<std::size_t>(last_)].len + 1;
  st_.emplace_back();  // may reallocate: take no State& across an emplace_back
  State& c = st_[static_cast<std::size_t>(cur)];
  c.len = cur_len;
  c.first_end = i;

  // Every suffix of the old sequence with no transition on `token` now gets one, to cur.
  int p = last_;
  int q = -1;
  while (p != -1) {
    auto [it, inserted] = st_[static_cast<std::size_t>(p)].next.try_emplace(token, cur);
    if (!inserted) {
      q = it->second;
      break;
    }
    p = st_[static_cast<std::size_t>(p)].link;
  }

  if (p == -1) {
    st_[static_cast<std::size_t>(cur)].link = 0;
  } else if (st_[static_cast<std::size_t>(p)].len + 1 == st_[static_cast<std::size_t>(q)].len) {
    st_[static_cast<std::size_t>(cur)].link = q;
  } else {
    // q holds strings longer than len(p)+1 that do not end here: split off the short ones.
    // The clone copies q's count and first_end: before this position its end set is q's.
    const int clone = static_cast<int>(st_.size());
    State copy = st_[static_cast<std::size_t>(q)];
    copy.len = st_[static_cast<std::size_t>(p)].len + 1;
    st_.push_back(std::move(copy));
    while (p != -1) {
      auto& next = st_[static_cast<std::size_t>(p)].next;
      auto it = next.find(token);
      if (it == next.end() || it->second != q) break;
      it->second = clone;
      p = st_[static_cast<std::size_t>(p)].link;
    }
    st_[static_cast<std::size_t>(q)].link = clone;
    st_[static_cast<std::size_t>(cur)].link = clone;
  }
  last_ = cur;

  // Position i is a new end of every state on cur's suffix-link path. Only the first
  // kCountDepth (non-root) states get it: see the header for what stays exact. A new clone is
  // link(cur), always second on the path, so it gets +1 on top of q's inherited count.
  int s = cur;
  for (int d = 0; d < kCountDepth && s > 0; ++d) {
    ++st_[static_cast<std::size_t>(s)].count;
    s = st_[static_cast<std::size_t>(s)].link;
  }
}

SuffixProposal SuffixAutomaton::Propose(int max_len, int min_match) const {
  SuffixProposal out;
  if (max_len <= 0 || last_ == 0) return out;
  // link(last) holds the longest suffix whose end set is larger than {size()-1}: the longest
  // suffix that also ended earlier.
  const int v = st_[static_cast<std::size_t>(last_)].link;
  if (v <= 0) return out;
  const State& s = st_[static_cast<std::size_t>(v)];
  if (s.len < min_match) return out;

  const int n = static_cast<int>(seq_.size());
  const int e = s.first_end;  // earliest end of the match; v's end set has >= 2 members
  LOCKSTEP_CHECK(e >= 0 && e < n - 1) << "first_end " << e << " of state " << v << " at size " << n;
  // The count includes the first occurrence (the state holding a string at its first end is
  // the new state, depth 1) and the current one (v = link(last), depth 2), so it is >= 2.
  LOCKSTEP_CHECK_GE(s.count, 2) << "state " << v;

  const int take = std::min(max_len, n - 1 - e);  // no overflow for max_len near INT_MAX
  const auto first = seq_.begin() + (e + 1);
  out.tokens.assign(first, first + take);
  out.match_len = s.len;
  out.occurrences = s.count - 1;
  out.score = s.len * std::log2(1.0 + out.occurrences);
  out.period = n - 1 - e;
  return out;
}

void ExtendPeriodic(SuffixProposal& p, int max_len) {
  if (p.period <= 0 || static_cast<int>(p.tokens.size()) != p.period) return;
  const std::size_t period = static_cast<std::size_t>(p.period);
  while (static_cast<int>(p.tokens.size()) < max_len)
    p.tokens.push_back(p.tokens[p.tokens.size() - period]);
}

// ---- SuffixIndex ----

SuffixIndex::SuffixIndex(Mode mode) : mode_(mode) {
  if (mode_ == Mode::kAsync) worker_ = std::thread([this] { Run(); });
}

SuffixIndex::~SuffixIndex() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void SuffixIndex::Append(const std::vector<std::int32_t>& tokens) {
  if (tokens.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (mode_ == Mode::kSync) {
      for (std::int32_t t : tokens) sam_.Append(t);
      return;
    }
    pending_.insert(pending_.end(), tokens.begin(), tokens.end());
  }
  cv_.notify_one();
}

SuffixProposal SuffixIndex::Propose(int max_len, int min_match) const {
  std::lock_guard<std::mutex> lock(mu_);
  return sam_.Propose(max_len, min_match);
}

void SuffixIndex::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_idle_.wait(lock, [this] { return pending_.empty(); });
}

std::size_t SuffixIndex::indexed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sam_.size();
}

// One token per critical section: it leaves pending_ and enters sam_ atomically, so there is no
// "popped but not yet indexed" state for Flush to track, and a caller of Append or Propose
// waits for at most one automaton append (plus the unfairness of std::mutex, below).
void SuffixIndex::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !pending_.empty(); });
    if (stop_) return;  // tokens still pending are dropped: nobody can read them any more
    sam_.Append(pending_.front());
    pending_.pop_front();
    if (pending_.empty()) {
      cv_idle_.notify_all();
    } else {
      // Open the lock between tokens. std::mutex is not fair, so this is best effort: a waiter
      // may lose the race until the backlog (what the callers themselves queued) is indexed.
      lock.unlock();
      lock.lock();
    }
  }
}

}  // namespace lockstep
