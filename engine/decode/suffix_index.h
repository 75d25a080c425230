// Suffix index for suffix drafting: an incremental suffix automaton over the token sequence
// (prompt + generated tokens) that proposes the continuation of the longest suffix of the
// sequence that also occurred earlier.
//
// SuffixAutomaton: single-threaded; Append is O(1) amortised (map-based transitions, O(log a)
// per lookup for alphabet size a). Each state keeps `len`, `link`, the first end position of its
// strings and an occurrence count. Counts are exact for the states within kCountDepth
// suffix-link steps of each appended position (those are the long, specific contexts drafting
// looks at); deeper (shorter) contexts may be under-counted. This cap keeps Append O(1) on
// highly repetitive input where suffix-link paths grow with the sequence.
//
// SuffixIndex: the drafter's view. Mode kSync appends on the caller's thread, so what is indexed
// at draft time is exactly the sequence so far. Mode kAsync hands appends to a background thread
// and Propose() reads whatever has been indexed at that moment: the proposal (and so the
// speculative path) depends on thread timing ON PURPOSE, like production engines with
// asynchronous index updates. Proposals never read tokens that are not indexed yet.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace lockstep {

// One proposal: the continuation after the earliest earlier occurrence of the longest repeated
// suffix. Empty `tokens` (and every field zero) when nothing matched.
struct SuffixProposal {
  std::vector<std::int32_t> tokens;  // up to max_len continuation tokens
  int match_len = 0;                 // length of the matched suffix (tokens)
  // Times the matched suffix occurred before the current end (>= 1 on a match). Exact under the
  // condition stated at SuffixAutomaton::kCountDepth; otherwise a lower bound, never more.
  int occurrences = 0;
  // match_len * log2(1 + occurrences): longer and more frequent contexts score higher.
  double score = 0.0;
  // Distance from the earliest earlier end of the match to the current end (0 when nothing
  // matched). When `tokens` stop at the current end (tokens.size() == period), the text ends
  // with a repetition of period `period`: see ExtendPeriodic.
  int period = 0;
};

// Continues a proposal that stops at the current end up to max_len tokens by repeating its
// period: token i >= period is token i - period. That is what Propose would return after the
// proposed tokens were appended (the match then ends one period later), so a short loop yields
// a full-length draft instead of one period. No-op when the proposal stopped before the current
// end (it had all the tokens it wanted) or is empty.
void ExtendPeriodic(SuffixProposal& p, int max_len);

// ---- SuffixAutomaton ----

// The online suffix automaton (Blumer et al. 1985) over int32 tokens. State 0 is the root.
// Memory: at most 2n states (64 B) and 3n transitions (a 48 B map node each) for n tokens:
// measured 103 B/token on random text, 137 B/token on periodic text, at most ~300.
// Thread safety: none; SuffixIndex adds the locking.
class SuffixAutomaton {
 public:
  // Append gives the new position to the first kCountDepth non-root states on the new state's
  // suffix-link path (the new state first). The state with the longest string s ending at
  // position j sits at depth <= 2 + R_j - |s| on that path, where R_j is the longest suffix of
  // the first j+1 tokens that also ended earlier. So a count is exact when, at every end of s,
  // R_j <= |s| + kCountDepth - 2; in particular every count is exact while no substring of
  // kCountDepth tokens has occurred twice. Otherwise it is under-counted, by the ends where
  // the condition failed (e.g. "a" x 200, "b", "a" x 5: "aaaaa" ended 197 times, counted 65).
  // A count always includes the first end (the state was then the new one) and, for Propose's
  // state link(last), the current end (depth 2), so `occurrences` >= 1 on a match.
  // Cost: the walk is a chain of dependent loads; on periodic or all-identical text (where it
  // runs all 64 steps) it takes ~120 of the ~160 ns per Append (suffix_bench, 2-core AMD EPYC
  // VM: 27 M appends/s with a cap of 1 against 6 M/s with 64). Random text stops at the root
  // after a few steps.
  static constexpr int kCountDepth = 64;

  SuffixAutomaton();
  // Appends one token (any int32 value). Aborts past INT_MAX / 2 tokens (positions are int).
  void Append(std::int32_t token);
  std::size_t size() const { return seq_.size(); }  // tokens indexed
  const std::vector<std::int32_t>& sequence() const { return seq_; }
  // Proposal for the sequence indexed so far. With L the length of the longest suffix that also
  // ends at an earlier position and e the earliest such end, returns tokens
  // sequence()[e+1 .. min(e+max_len, size()-1)] (at least one token; may overlap the matched
  // suffix itself, as in periodic text), match_len = L, occurrences = earlier ends of that
  // suffix. Empty when max_len <= 0, when nothing repeats (L == 0), or when L < min_match
  // (min_match <= 1 accepts any match). O(max_len).
  SuffixProposal Propose(int max_len, int min_match) const;

 private:
  struct State {
    int len = 0;         // length of the longest string in the state
    int link = -1;       // suffix link; -1 only for the root
    int first_end = -1;  // end position (index into seq_) of the first occurrence
    int count = 0;       // occurrences = |end set| (see kCountDepth for when exact)
    std::map<std::int32_t, int> next;
  };
  std::vector<State> st_;
  int last_ = 0;  // state of the whole sequence
  std::vector<std::int32_t> seq_;
};

// ---- SuffixIndex ----

// Thread safety: every member function may be called from any thread, concurrently, except the
// destructor. mu_ guards the automaton, so Propose() and indexed() see it between appends:
// between two Append calls in kSync, between two tokens in kAsync. In kAsync the indexer opens
// the lock after every token, but std::mutex is not fair: while a backlog is being indexed, a
// caller can wait longer than one token's append (at most until the backlog is indexed).
class SuffixIndex {
 public:
  enum class Mode { kSync, kAsync };
  // kAsync starts the indexer thread; the destructor stops and joins it (tokens still pending
  // are dropped).
  explicit SuffixIndex(Mode mode);
  ~SuffixIndex();
  SuffixIndex(const SuffixIndex&) = delete;
  SuffixIndex& operator=(const SuffixIndex&) = delete;

  Mode mode() const { return mode_; }
  // Adds tokens to the end of the sequence (sync: now; async: queued for the indexer thread,
  // which indexes them in order, one token per critical section). Thread-safe; concurrent
  // callers' batches are not interleaved, but their order is whichever locks first.
  void Append(const std::vector<std::int32_t>& tokens);
  // Proposal from what is indexed right now (see SuffixAutomaton::Propose). Thread-safe.
  SuffixProposal Propose(int max_len, int min_match) const;
  // Blocks until nothing is pending: every token appended before the call (and any appended
  // meanwhile) is indexed (tests; never used by the async drafter). Returns at once in kSync.
  void Flush();
  std::size_t indexed() const;  // tokens indexed so far; never decreases. Thread-safe.

 private:
  void Run();  // the kAsync indexer thread

  Mode mode_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // pending_ grew or stop_ was set
  std::condition_variable cv_idle_;  // pending_ became empty
  SuffixAutomaton sam_;              // GUARDED_BY(mu_)
  // GUARDED_BY(mu_). A token leaves pending_ and enters sam_ in one critical section, so
  // "pending_ is empty" means "everything is indexed".
  std::deque<std::int32_t> pending_;
  bool stop_ = false;  // GUARDED_BY(mu_)
  std::thread worker_;
};

}  // namespace lockstep
