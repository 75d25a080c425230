#include "lockstep/engine/prefix_cache.h"

#include <algorithm>
#include <unordered_map>

#include "util/check.h"

namespace lockstep {

namespace {

std::uint64_t Fnv1a(std::span<const std::int32_t> tokens) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::int32_t t : tokens) {
    auto u = static_cast<std::uint32_t>(t);
    for (int b = 0; b < 4; ++b) {
      h ^= (u >> (8 * b)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return h;
}

std::uint64_t GdnBytes(const Engine::SlotSnapshot& snap) {
  std::uint64_t n = 0;
  for (const StageSlotSnapshot& s : snap.stages)
    for (const auto& [il, cp] : s.gdn) n += (cp.conv.size() + cp.ssm.size()) * sizeof(float);
  return n;
}

// Calls f(prefix) for every K/V prefix of the snapshot (attention layers and MTP).
template <typename F>
void ForEachPrefix(const Engine::SlotSnapshot& snap, F&& f) {
  for (const StageSlotSnapshot& s : snap.stages) {
    for (const auto& [il, pre] : s.kv)
      if (pre) f(*pre);
    if (s.mtp_kv) f(*s.mtp_kv);
  }
}

}  // namespace

struct PrefixCache::Slot {
  std::uint64_t hash = 0;
  std::uint64_t last_used = 0;
  PrefixEntry entry;
};

PrefixCache::PrefixCache(int grid, std::uint64_t budget_bytes, TokenHash hash)
    : grid_(grid), budget_(budget_bytes), hash_(hash ? std::move(hash) : TokenHash(Fnv1a)) {
  LOCKSTEP_CHECK_GE(grid, 1);
}

PrefixCache::~PrefixCache() = default;

const PrefixCache::Slot* PrefixCache::Find(std::span<const std::int32_t> key_tokens,
                                           bool uses_mtp) const {
  const std::uint64_t h = hash_(key_tokens);
  for (const auto& s : entries_) {
    if (s->hash != h || s->entry.uses_mtp != uses_mtp) continue;
    // Never trust the hash: the stored tokens must be the prompt's, every one.
    if (std::equal(key_tokens.begin(), key_tokens.end(), s->entry.tokens.begin(),
                   s->entry.tokens.end()))
      return s.get();
  }
  return nullptr;
}

const PrefixEntry* PrefixCache::Lookup(std::span<const std::int32_t> prompt, bool uses_mtp) {
  ++counters_.queries;
  const int n = static_cast<int>(prompt.size());
  // Deepest first: s = the largest grid multiple <= n-1, then down.
  for (int s = (n - 1) / grid_ * grid_; s >= grid_; s -= grid_) {
    const Slot* found = Find(prompt.first(static_cast<std::size_t>(s) + 1), uses_mtp);
    if (found == nullptr) continue;
    Slot* hit = const_cast<Slot*>(found);
    hit->last_used = ++tick_;
    ++counters_.hits;
    counters_.tokens_reused += s;
    return &hit->entry;
  }
  return nullptr;
}

bool PrefixCache::Wants(int s, std::span<const std::int32_t> prompt, bool uses_mtp) const {
  const int n = static_cast<int>(prompt.size());
  if (s < 1 || s > n - 1 || s % grid_ != 0) return false;
  return Find(prompt.first(static_cast<std::size_t>(s) + 1), uses_mtp) == nullptr;
}

void PrefixCache::Insert(PrefixEntry entry) {
  LOCKSTEP_CHECK_EQ(entry.tokens.size(), static_cast<std::size_t>(entry.position()) + 1);
  if (!entry.source) entry.source = std::make_shared<const std::vector<std::int32_t>>(entry.tokens);
  // The entries one prompt stores after each chunk share one copy of it.
  for (const auto& held : entries_)
    if (held->entry.source != entry.source && *held->entry.source == *entry.source) {
      entry.source = held->entry.source;
      break;
    }
  auto s = std::make_unique<Slot>();
  s->hash = hash_(entry.tokens);
  s->last_used = ++tick_;
  counters_.snapshot_bytes += GdnBytes(entry.snap);
  s->entry = std::move(entry);
  entries_.push_back(std::move(s));
  ++counters_.inserts;
  Trim();
}

std::uint64_t PrefixCache::bytes() const {
  // A page counts when every reference to it is an entry's: use_count() == the entries' count.
  std::unordered_map<const KvPage*, std::pair<long, std::size_t>> refs;  // page -> (refs, bytes)
  std::unordered_map<const KvPage*, long> use;
  std::uint64_t n = 0;
  for (const auto& s : entries_) {
    n += GdnBytes(s->entry.snap);
    ForEachPrefix(s->entry.snap, [&](const KvPrefix& pre) {
      for (const auto& p : pre.pages) {
        auto& r = refs[p.get()];
        ++r.first;
        r.second = pre.page_bytes;
        use[p.get()] = p.use_count();
      }
    });
  }
  for (const auto& [page, r] : refs)
    if (use[page] == r.first) n += r.second;
  return n;
}

void PrefixCache::Trim() {
  while (!entries_.empty() && bytes() > budget_) {
    auto lru = std::min_element(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
      return a->last_used < b->last_used;
    });
    evicted_.push_back({(*lru)->entry.source, (*lru)->entry.position(), (*lru)->entry.uses_mtp});
    if (evicted_.size() > kEvictedKeys) evicted_.pop_front();
    entries_.erase(lru);
    ++counters_.evictions;
  }
}

void PrefixCache::Clear() {
  entries_.clear();
  evicted_.clear();
}

const char* ReuseReasonName(ReuseReason r) {
  switch (r) {
    case ReuseReason::kCacheOff:
      return "cache_off";
    case ReuseReason::kKeptSlot:
      return "kept_slot";
    case ReuseReason::kDifferentConfig:
      return "different_config";
    case ReuseReason::kEvicted:
      return "evicted";
    case ReuseReason::kPrefixMismatch:
      return "prefix_mismatch";
    case ReuseReason::kSnapshotGrid:
      return "snapshot_grid";
    case ReuseReason::kNoEntry:
      return "no_entry";
  }
  return "?";
}

namespace {

// How many leading tokens a and b share.
int SharedPrefix(std::span<const std::int32_t> a, std::span<const std::int32_t> b) {
  const auto m = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return static_cast<int>(m.first - a.begin());
}

}  // namespace

bool PrefixCache::WasEvicted(std::span<const std::int32_t> prompt, bool uses_mtp, int after,
                             int upto) const {
  for (const Evicted& e : evicted_) {
    if (e.uses_mtp != uses_mtp || e.position <= after || e.position > upto) continue;
    if (SharedPrefix(*e.source, prompt) >= e.position + 1) return true;
  }
  return false;
}

ReuseExplanation PrefixCache::Explain(std::span<const std::int32_t> prompt, bool uses_mtp,
                                      int reused) const {
  const int n = static_cast<int>(prompt.size());
  auto grid_floor = [&](int tokens) { return tokens < 1 ? 0 : (tokens - 1) / grid_ * grid_; };
  const int deepest = grid_floor(n);  // the deepest position any entry could give this prompt
  for (int q = reused + grid_; q <= deepest; q += grid_)
    if (Find(prompt.first(static_cast<std::size_t>(q) + 1), !uses_mtp) != nullptr)
      return {ReuseReason::kDifferentConfig, -1};
  if (WasEvicted(prompt, uses_mtp, reused, deepest)) return {ReuseReason::kEvicted, -1};
  int longest = 0;
  bool differs = false;  // a stored prompt that goes on past `longest` with another token
  for (const auto& held : entries_) {
    if (held->entry.uses_mtp != uses_mtp) continue;
    const std::vector<std::int32_t>& src = *held->entry.source;
    const int l = SharedPrefix(src, prompt);
    const bool d = l < static_cast<int>(src.size()) && l < n;
    if (l > longest) {
      longest = l;
      differs = d;
    } else if (l == longest) {
      differs = differs || d;
    }
  }
  if (longest == 0) return {ReuseReason::kNoEntry, -1};
  // A stored prompt shares a deeper grid prefix than the lookup found and no entry of it is
  // there (nor among the evicted keys): it ended before its prefill got there.
  if (grid_floor(longest) > reused) return {ReuseReason::kNoEntry, -1};
  if (differs) return {ReuseReason::kPrefixMismatch, longest};
  return {ReuseReason::kSnapshotGrid, -1};
}

PrefixCacheCounters PrefixCache::counters() const {
  PrefixCacheCounters c = counters_;
  c.entries = static_cast<std::int64_t>(entries_.size());
  c.bytes = bytes();
  return c;
}

}  // namespace lockstep
