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
    entries_.erase(lru);
    ++counters_.evictions;
  }
}

void PrefixCache::Clear() { entries_.clear(); }

PrefixCacheCounters PrefixCache::counters() const {
  PrefixCacheCounters c = counters_;
  c.entries = static_cast<std::int64_t>(entries_.size());
  c.bytes = bytes();
  return c;
}

}  // namespace lockstep
