// PrefixCache: the conversation (prefix) cache of one engine (issue 22, "What to build" 4).
//
// An entry is a slot's state captured right after a prefill chunk ending at position s on the
// snapshot grid (EngineConfig::SnapshotGrid(), a multiple of prefill_chunk) with s <= n-1 for a
// prompt of n tokens: K/V rows [0, s) as shared pages (copy on write, kv_cache.h), every GDN
// checkpoint at s, the MTP draft K/V rows [0, s) and the MTP drafter's last row (m, logits of
// row s-1). Only prefill-computed state is stored. Its key is (tokens [0, s], uses_mtp): token s
// pins MTP row s-1 (that row's input is h_{s-1} with token s), and a request whose MTP use
// differs must not hit (its draft K/V items would differ from its cold run).
//
// Lookup (on admission) returns the deepest grid position s <= n-1 whose stored tokens equal the
// prompt's [0, s], compared token by token (the hash only finds candidates). A hit resumes
// prefill at s on the same absolute chunk grid as a cold run, so a warm request computes exactly
// the cold arithmetic from s on: cold == warm, bitwise. It never resumes between snapshots.
//
// Memory: bytes() = GDN snapshot floats + K/V pages referenced only by entries (a page a live
// slot also holds is not charged: freeing the entry would not free it). Past the budget the
// least recently used entries are evicted (Trim); evicting only drops references, so a page a
// live slot uses is never freed.
//
// Reuse reasons (issue 40, item 3): after a lookup, Explain says why a prompt reused no more than
// it did, from the entries held, the prompts that stored them and the keys evicted lately.
//
// Not thread-safe: the scheduler's driver thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lockstep/engine/conversation.h"
#include "lockstep/engine/engine.h"

namespace lockstep {

struct PrefixCacheCounters {
  std::int64_t queries = 0;          // lookups (one per admitted request)
  std::int64_t hits = 0;             // lookups that found a snapshot
  std::int64_t tokens_reused = 0;    // prompt tokens restored instead of computed, summed
  std::int64_t evictions = 0;        // entries evicted for the budget
  std::int64_t inserts = 0;          // entries stored
  std::uint64_t snapshot_bytes = 0;  // GDN checkpoint bytes copied into entries, summed (pages
                                     // are shared, not copied)
  std::int64_t entries = 0;          // entries held now
  std::uint64_t bytes = 0;           // bytes() now
};

// Why a request reused no more prompt tokens than it did (its PrefixReport, responses, exports,
// `/metrics`), checked in this order:
enum class ReuseReason : std::uint8_t {
  kCacheOff,         // the engine runs without a prefix cache, or the request bypassed it
  kKeptSlot,         // a kept conversation's continuation: its state came from its own slot
  kDifferentConfig,  // a deeper grid prefix is held, but with the other MTP use (another key)
  kEvicted,          // a deeper grid prefix was held and evicted for the budget
  kPrefixMismatch,   // every cached prompt differs from this one at token P (reason_at)
  kSnapshotGrid,     // the shared prefix ends between snapshots (or at the prompt's end): reused
                     // up to the last grid position inside it
  kNoEntry,          // no entry holds a deeper prefix: no cached prompt shares even its first
                     // token, or the one that shares more ended before its prefill got there
};
// "cache_off", "kept_slot", "different_config", "evicted", "prefix_mismatch", "snapshot_grid",
// "no_entry" (the `/metrics` label; the response's text adds "_at=P").
const char* ReuseReasonName(ReuseReason r);
inline constexpr ReuseReason kAllReuseReasons[] = {
    ReuseReason::kCacheOff, ReuseReason::kKeptSlot,       ReuseReason::kDifferentConfig,
    ReuseReason::kEvicted,  ReuseReason::kPrefixMismatch, ReuseReason::kSnapshotGrid,
    ReuseReason::kNoEntry};

struct ReuseExplanation {
  ReuseReason reason = ReuseReason::kNoEntry;
  int at = -1;  // kPrefixMismatch: P, the first token that differs
};

struct PrefixEntry {
  std::vector<std::int32_t> tokens;  // [0, s]: s + 1 tokens
  // The whole prompt of the request that stored it (tokens is its prefix); null = tokens. The
  // entries of one prompt share it (Insert). Only Explain reads it.
  std::shared_ptr<const std::vector<std::int32_t>> source;
  bool uses_mtp = false;
  Engine::SlotSnapshot snap;  // position s
  // The MTP drafter at s (uses_mtp): nothing queued, last extended row s-1 (its m and logits).
  MtpDrafterState mtp;
  int position() const { return snap.position; }
};

class PrefixCache {
 public:
  using TokenHash = std::function<std::uint64_t(std::span<const std::int32_t>)>;
  // `grid`: snapshot positions are its multiples (>= 1); `budget_bytes`: Trim's limit. `hash`
  // (tests) replaces the default 64-bit FNV-1a of the token ids.
  PrefixCache(int grid, std::uint64_t budget_bytes, TokenHash hash = nullptr);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  int grid() const { return grid_; }
  // The deepest entry for `prompt` (n tokens) and `uses_mtp` at a grid position s <= n-1 whose
  // tokens equal prompt[0, s]; nullptr when none. Counts a query, and a hit with s tokens
  // reused; marks the entry used (LRU). The pointer is valid until the next Insert or Trim.
  const PrefixEntry* Lookup(std::span<const std::int32_t> prompt, bool uses_mtp);
  // Whether a prefill chunk ending at `s` of `prompt` should be captured: s on the grid,
  // 1 <= s <= n-1, and no entry holds (prompt[0, s], uses_mtp) yet.
  bool Wants(int s, std::span<const std::int32_t> prompt, bool uses_mtp) const;
  // Why `prompt` (n tokens, `uses_mtp`), which Lookup gave `reused` tokens (0 on a miss), got
  // no more: a held entry at a deeper grid position s <= n-1 with the other MTP use
  // (kDifferentConfig); a deeper grid prefix among the last kEvictedKeys evicted keys (kEvicted);
  // else L, the longest prefix any stored prompt shares with it: 0, or a deeper grid prefix
  // than `reused` inside L (the entry there was never stored) (kNoEntry), a token that differs
  // at L (kPrefixMismatch, at = L), or a stored prompt or this one ending at L (kSnapshotGrid).
  // Counts nothing and marks nothing used.
  ReuseExplanation Explain(std::span<const std::int32_t> prompt, bool uses_mtp, int reused) const;
  static constexpr std::size_t kEvictedKeys = 4096;
  // Stores `entry` (most recently used) and trims to the budget.
  void Insert(PrefixEntry entry);
  // Evicts least recently used entries while bytes() > budget.
  void Trim();
  // Drops every entry.
  void Clear();

  std::uint64_t bytes() const;
  std::uint64_t budget_bytes() const { return budget_; }
  int entries() const { return static_cast<int>(entries_.size()); }
  PrefixCacheCounters counters() const;

 private:
  struct Slot;      // one stored entry with its key and LRU tick
  struct Evicted {  // an evicted key: its prompt's first position + 1 tokens, its MTP use
    std::shared_ptr<const std::vector<std::int32_t>> source;
    int position = 0;
    bool uses_mtp = false;
  };
  const Slot* Find(std::span<const std::int32_t> key_tokens, bool uses_mtp) const;
  bool WasEvicted(std::span<const std::int32_t> prompt, bool uses_mtp, int after, int upto) const;

  int grid_;
  std::uint64_t budget_;
  TokenHash hash_;
  std::uint64_t tick_ = 0;
  std::vector<std::unique_ptr<Slot>> entries_;
  std::deque<Evicted> evicted_;  // the last kEvictedKeys evicted keys, oldest first
  PrefixCacheCounters counters_;
};

}  // namespace lockstep
