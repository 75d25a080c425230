// Suffix automaton against a brute-force reference, proposal edge cases, and the sync/async
// SuffixIndex (async after Flush equals sync; concurrent Propose only ever sees indexed prefixes).
#include "decode/suffix_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

namespace lockstep {
namespace {

using Tokens = std::vector<std::int32_t>;

// ---- brute-force reference ----

// What Propose must return for seq, found by comparing the suffix with every earlier end.
struct RefMatch {
  int match_len = 0;      // longest suffix that also ends at an earlier position
  int first_end = -1;     // earliest such end
  std::vector<int> ends;  // every earlier end of that suffix (ascending)
};

RefMatch BruteForce(const Tokens& seq) {
  RefMatch r;
  const int n = static_cast<int>(seq.size());
  if (n == 0) return r;
  const auto at = [&](int k) { return seq[static_cast<std::size_t>(k)]; };
  std::vector<int> common(static_cast<std::size_t>(n), 0);  // common suffix of [0..j] and [0..n-1]
  for (int j = 0; j < n - 1; ++j) {
    int k = 0;
    while (k <= j && at(j - k) == at(n - 1 - k)) ++k;
    common[static_cast<std::size_t>(j)] = k;
    r.match_len = std::max(r.match_len, k);
  }
  if (r.match_len == 0) return r;
  for (int j = 0; j < n - 1; ++j)
    if (common[static_cast<std::size_t>(j)] >= r.match_len) r.ends.push_back(j);
  r.first_end = r.ends.front();
  return r;
}

Tokens RefContinuation(const Tokens& seq, const RefMatch& r, int max_len) {
  if (r.match_len == 0 || max_len <= 0) return {};
  const int n = static_cast<int>(seq.size());
  const int end = std::min(r.first_end + max_len, n - 1);
  return Tokens(seq.begin() + (r.first_end + 1), seq.begin() + (end + 1));
}

// Appends seq token by token and checks every prefix against the reference.
//   exact_counts_only_when_guaranteed=false: occurrences must always equal the reference.
//   true: equal where the kCountDepth condition in the header holds, else in [1, reference].
// Adds to *outside how many prefixes fell outside the guarantee.
void CheckAgainstBruteForce(const Tokens& seq, bool exact_counts_only_when_guaranteed,
                            int* outside) {
  SuffixAutomaton sam;
  Tokens prefix;
  std::vector<int> longest_repeat;  // R_j per prefix end j: the reference match_len
  for (std::int32_t t : seq) {
    sam.Append(t);
    prefix.push_back(t);
    const RefMatch ref = BruteForce(prefix);
    longest_repeat.push_back(ref.match_len);
    const std::size_t n = prefix.size();
    for (int max_len : {8, 64}) {
      SuffixProposal p = sam.Propose(max_len, /*min_match=*/1);
      ASSERT_EQ(p.match_len, ref.match_len) << "n=" << n;
      ASSERT_EQ(p.tokens, RefContinuation(prefix, ref, max_len)) << "n=" << n;
      if (ref.match_len == 0) {
        ASSERT_EQ(p.occurrences, 0);
        ASSERT_EQ(p.score, 0.0);
        continue;
      }
      const int ref_occ = static_cast<int>(ref.ends.size());
      const bool guaranteed = std::all_of(ref.ends.begin(), ref.ends.end(), [&](int j) {
        return longest_repeat[static_cast<std::size_t>(j)] <=
               ref.match_len + SuffixAutomaton::kCountDepth - 2;
      });
      if (guaranteed || !exact_counts_only_when_guaranteed) {
        ASSERT_EQ(p.occurrences, ref_occ) << "n=" << n << " guaranteed=" << guaranteed;
      } else {
        ASSERT_GE(p.occurrences, 1) << "n=" << n;
        ASSERT_LE(p.occurrences, ref_occ) << "n=" << n;
        if (max_len == 8) ++*outside;
      }
      ASSERT_DOUBLE_EQ(p.score, p.match_len * std::log2(1.0 + p.occurrences));
    }
  }
}

Tokens RandomTokens(int n, int vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> dist(0, vocab - 1);
  Tokens out(static_cast<std::size_t>(n));
  for (auto& t : out) t = dist(rng);
  return out;
}

// Random text with long repeats: runs of one token and copies of earlier stretches.
Tokens RepetitiveTokens(int n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Tokens out;
  while (static_cast<int>(out.size()) < n) {
    const auto kind = rng() % 3;
    const int len = 1 + static_cast<int>(rng() % 120);
    if (kind == 0 || out.empty()) {
      const auto t = static_cast<std::int32_t>(rng() % 3);
      for (int k = 0; k < len; ++k) out.push_back(t);
    } else if (kind == 1) {
      const std::size_t from = rng() % out.size(), span = out.size() - from;
      for (int k = 0; k < len; ++k) out.push_back(out[from + static_cast<std::size_t>(k) % span]);
    } else {
      for (int k = 0; k < len / 8 + 1; ++k) out.push_back(static_cast<std::int32_t>(rng() % 3));
    }
  }
  out.resize(static_cast<std::size_t>(n));
  return out;
}

Tokens Periodic(int n, int period) {
  Tokens out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = 100 + i % period;
  return out;
}

// ---- SuffixAutomaton ----

TEST(SuffixAutomaton, MatchesBruteForceOnRandomSequences) {
  // Random text over these alphabets repeats nothing near kCountDepth tokens long at n = 400,
  // so every count, hence every `occurrences`, must be exact.
  for (int vocab : {2, 3, 8, 50})
    for (std::uint32_t seed : {1u, 2u, 3u, 4u}) {
      SCOPED_TRACE(::testing::Message() << "vocab=" << vocab << " seed=" << seed);
      int outside = 0;
      CheckAgainstBruteForce(RandomTokens(400, vocab, seed), false, &outside);
      if (HasFatalFailure()) return;
      EXPECT_EQ(outside, 0);
    }
}

TEST(SuffixAutomaton, CountsAreExactWhereTheDepthCapGuaranteesIt) {
  int outside = 0;
  for (std::uint32_t seed : {11u, 12u, 13u, 14u, 15u}) {
    SCOPED_TRACE(::testing::Message() << "seed=" << seed);
    CheckAgainstBruteForce(RepetitiveTokens(400, seed), true, &outside);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(outside, 0) << "the generator no longer reaches past the depth cap";
}

TEST(SuffixAutomaton, DeepShortContextsAreUnderCounted) {
  // The header's example: "a" x 200, "b", "a" x 5. "aaaaa" ended at 4..199 and ends now, but
  // only the ends 4..67 were within kCountDepth of their new state, plus the current one.
  static_assert(SuffixAutomaton::kCountDepth == 64, "update the expected count");
  SuffixAutomaton sam;
  for (int i = 0; i < 200; ++i) sam.Append(1);
  sam.Append(2);
  for (int i = 0; i < 5; ++i) sam.Append(1);
  SuffixProposal p = sam.Propose(3, 1);
  EXPECT_EQ(p.match_len, 5);
  EXPECT_EQ(p.tokens, (Tokens{1, 1, 1}));  // after the first "aaaaa" (ends at 4)
  EXPECT_EQ(p.occurrences, 64);            // true: 196
}

TEST(SuffixAutomaton, EmptySequenceProposesNothing) {
  SuffixAutomaton sam;
  EXPECT_EQ(sam.size(), 0u);
  SuffixProposal p = sam.Propose(8, 1);
  EXPECT_TRUE(p.tokens.empty());
  EXPECT_EQ(p.match_len, 0);
  EXPECT_EQ(p.occurrences, 0);
  EXPECT_EQ(p.score, 0.0);
}

TEST(SuffixAutomaton, SingleTokenProposesNothing) {
  SuffixAutomaton sam;
  sam.Append(7);
  EXPECT_TRUE(sam.Propose(8, 1).tokens.empty());
  EXPECT_EQ(sam.Propose(8, 0).match_len, 0);
  sam.Append(7);  // "7 7": the suffix "7" ended at 0; the continuation is the current token
  SuffixProposal p = sam.Propose(8, 1);
  EXPECT_EQ(p.tokens, (Tokens{7}));
  EXPECT_EQ(p.match_len, 1);
  EXPECT_EQ(p.occurrences, 1);
  EXPECT_DOUBLE_EQ(p.score, 1.0);
}

TEST(SuffixAutomaton, MinMatchFilters) {
  SuffixAutomaton sam;
  for (std::int32_t t : {1, 2, 3, 9, 1, 2, 3}) sam.Append(t);  // "1 2 3" repeats
  EXPECT_EQ(sam.Propose(8, 3).tokens, (Tokens{9, 1, 2, 3}));
  EXPECT_EQ(sam.Propose(8, 3).match_len, 3);
  EXPECT_TRUE(sam.Propose(8, 4).tokens.empty());
  EXPECT_EQ(sam.Propose(8, 4).match_len, 0);
  EXPECT_EQ(sam.Propose(8, 0).match_len, 3);  // min_match <= 1 accepts any match
  EXPECT_EQ(sam.Propose(8, -5).match_len, 3);
}

TEST(SuffixAutomaton, MaxLenTruncatesAndNonPositiveIsEmpty) {
  SuffixAutomaton sam;
  for (std::int32_t t : {5, 1, 2, 3, 4, 6, 5}) sam.Append(t);
  EXPECT_EQ(sam.Propose(1, 1).tokens, (Tokens{1}));
  EXPECT_EQ(sam.Propose(3, 1).tokens, (Tokens{1, 2, 3}));
  EXPECT_EQ(sam.Propose(100, 1).tokens, (Tokens{1, 2, 3, 4, 6, 5}));  // stops at the end
  EXPECT_EQ(sam.Propose(INT32_MAX, 1).tokens.size(), 6u);
  for (int max_len : {0, -1, INT32_MIN}) {
    SuffixProposal p = sam.Propose(max_len, 1);
    EXPECT_TRUE(p.tokens.empty());
    EXPECT_EQ(p.match_len, 0);
    EXPECT_EQ(p.occurrences, 0);
  }
}

TEST(SuffixAutomaton, PeriodicSequenceContinuesThePeriod) {
  for (int period : {1, 2, 3, 7}) {
    SCOPED_TRACE(::testing::Message() << "period=" << period);
    SuffixAutomaton sam;
    const Tokens seq = Periodic(10 * period + 2, period);
    for (std::int32_t t : seq) sam.Append(t);
    const int n = static_cast<int>(seq.size());
    SuffixProposal p = sam.Propose(2 * period + 1, 1);
    // The longest earlier end of the whole-minus-one-period suffix is at n - 1 - period.
    EXPECT_EQ(p.match_len, n - period);
    EXPECT_EQ(p.occurrences, 1);
    ASSERT_EQ(p.tokens.size(), static_cast<std::size_t>(period));  // runs into the current end
    for (int k = 0; k < period; ++k)
      EXPECT_EQ(p.tokens[static_cast<std::size_t>(k)], 100 + (n + k) % period);
  }
}

TEST(SuffixAutomaton, HundredThousandIdenticalTokens) {
  // Suffix-link paths grow with the sequence here; the count cap keeps Append O(1) (see
  // suffix_bench for the rate).
  constexpr int kN = 100000;
  SuffixAutomaton sam;
  for (int i = 0; i < kN; ++i) sam.Append(42);
  EXPECT_EQ(sam.size(), static_cast<std::size_t>(kN));
  SuffixProposal p = sam.Propose(8, 1);
  EXPECT_EQ(p.match_len, kN - 1);
  EXPECT_EQ(p.tokens, Tokens{42});
  EXPECT_EQ(p.occurrences, 1);
  sam.Append(7);
  EXPECT_TRUE(sam.Propose(8, 1).tokens.empty());  // "7" never occurred before
  sam.Append(42);
  p = sam.Propose(4, 1);
  EXPECT_EQ(p.match_len, 1);
  EXPECT_EQ(p.tokens, (Tokens{42, 42, 42, 42}));
}

// ---- SuffixIndex ----

void ExpectSameProposal(const SuffixProposal& a, const SuffixProposal& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.match_len, b.match_len);
  EXPECT_EQ(a.occurrences, b.occurrences);
  EXPECT_EQ(a.score, b.score);
}

bool SameProposal(const SuffixProposal& a, const SuffixProposal& b) {
  return a.tokens == b.tokens && a.match_len == b.match_len && a.occurrences == b.occurrences &&
         a.score == b.score;
}

// Random chunks of 1..16 tokens.
std::vector<Tokens> Chunks(const Tokens& seq, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Tokens> out;
  for (std::size_t i = 0; i < seq.size();) {
    const std::size_t len = std::min<std::size_t>(1 + rng() % 16, seq.size() - i);
    out.emplace_back(seq.begin() + static_cast<std::ptrdiff_t>(i),
                     seq.begin() + static_cast<std::ptrdiff_t>(i + len));
    i += len;
  }
  return out;
}

TEST(SuffixIndex, SyncEqualsRawAutomaton) {
  SuffixIndex index(SuffixIndex::Mode::kSync);
  EXPECT_EQ(index.mode(), SuffixIndex::Mode::kSync);
  SuffixAutomaton sam;
  const Tokens seq = RepetitiveTokens(2000, 21);
  for (const Tokens& chunk : Chunks(seq, 22)) {
    index.Append(chunk);
    for (std::int32_t t : chunk) sam.Append(t);
    ASSERT_EQ(index.indexed(), sam.size());  // sync: indexed as soon as Append returns
    ExpectSameProposal(index.Propose(8, 1), sam.Propose(8, 1));
    ExpectSameProposal(index.Propose(5, 4), sam.Propose(5, 4));
  }
  index.Append({});
  index.Flush();  // no-op in sync
  EXPECT_EQ(index.indexed(), seq.size());
}

TEST(SuffixIndex, AsyncAfterFlushEqualsSync) {
  SuffixIndex sync(SuffixIndex::Mode::kSync), async(SuffixIndex::Mode::kAsync);
  EXPECT_EQ(async.mode(), SuffixIndex::Mode::kAsync);
  async.Flush();  // nothing pending: returns
  const Tokens seq = RepetitiveTokens(3000, 31);
  const std::vector<Tokens> chunks = Chunks(seq, 32);
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    sync.Append(chunks[c]);
    async.Append(chunks[c]);
    if (c % 7 != 0) continue;  // let a backlog build up between flushes
    async.Flush();
    ASSERT_EQ(async.indexed(), sync.indexed());
    ExpectSameProposal(async.Propose(8, 1), sync.Propose(8, 1));
    ExpectSameProposal(async.Propose(16, 3), sync.Propose(16, 3));
  }
  async.Flush();
  EXPECT_EQ(async.indexed(), seq.size());
  ExpectSameProposal(async.Propose(8, 1), sync.Propose(8, 1));
}

TEST(SuffixIndex, ConcurrentProposeDuringAsyncAppends) {
  // Every proposal must be the proposal of some indexed prefix, of a length between indexed()
  // just before and just after the call: never a token that was not appended and indexed.
  constexpr int kN = 6000, kMaxLen = 8, kMinMatch = 2;
  Tokens seq = RepetitiveTokens(kN / 2, 41);
  const Tokens tail = RandomTokens(kN / 2, 5, 42);
  seq.insert(seq.end(), tail.begin(), tail.end());
  std::vector<SuffixProposal> expected;  // [m]: proposal after m tokens
  {
    SuffixAutomaton sam;
    expected.push_back(sam.Propose(kMaxLen, kMinMatch));
    for (std::int32_t t : seq) {
      sam.Append(t);
      expected.push_back(sam.Propose(kMaxLen, kMinMatch));
    }
  }

  SuffixIndex index(SuffixIndex::Mode::kAsync);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (const Tokens& chunk : Chunks(seq, 43)) index.Append(chunk);
    done.store(true);
  });
  auto reader = [&](int* checks) {
    std::size_t last_indexed = 0;
    bool writer_done = false;
    for (int it = 0; it < 200000 && !(writer_done && last_indexed == seq.size()); ++it) {
      writer_done = done.load();
      const std::size_t before = index.indexed();
      const SuffixProposal p = index.Propose(kMaxLen, kMinMatch);
      const std::size_t after = index.indexed();
      ASSERT_LE(last_indexed, before);  // monotonic
      ASSERT_LE(before, after);
      ASSERT_LE(after, seq.size());
      last_indexed = after;
      bool found = false;
      for (std::size_t m = before; m <= after && !found; ++m) found = SameProposal(p, expected[m]);
      ASSERT_TRUE(found) << "indexed " << before << ".." << after << " match_len " << p.match_len;
      ++*checks;
    }
  };
  int checks_a = 0, checks_b = 0;
  std::thread reader_b(reader, &checks_b);
  reader(&checks_a);
  reader_b.join();
  writer.join();
  index.Flush();
  EXPECT_EQ(index.indexed(), seq.size());
  ExpectSameProposal(index.Propose(kMaxLen, kMinMatch), expected.back());
  EXPECT_GT(checks_a + checks_b, 0);
}

TEST(SuffixIndex, DestroyWithPendingTokens) {
  // The destructor stops the indexer without draining its backlog (and must not hang).
  for (int round = 0; round < 3; ++round) {
    SuffixIndex index(SuffixIndex::Mode::kAsync);
    index.Append(RandomTokens(50000, 4096, static_cast<std::uint32_t>(round)));
    EXPECT_LE(index.indexed(), 50000u);
  }
  SuffixIndex idle(SuffixIndex::Mode::kAsync);  // never appended to
}

}  // namespace
}  // namespace lockstep
