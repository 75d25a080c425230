// Test helper: every state item of an engine's current slot as bytes, for bitwise comparisons of
// two runs (K/V committed rows with int8 scales, K/V capacity, GDN conv + ssm checkpoints and
// their positions, MTP draft K/V rows).
#pragma once

#include <cstddef>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "lockstep/engine/engine.h"

namespace lockstep::test {

// Item name ("stage0/layer3/k", ...) -> bytes.
using SlotItems = std::map<std::string, std::vector<std::byte>>;

inline void AppendBytes(std::vector<std::byte>& out, const void* p, std::size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  out.insert(out.end(), b, b + n);
}

inline void AddKv(SlotItems& items, const std::string& name, const KvCache& kv) {
  std::vector<std::byte>& k = items[name + "/k"];
  std::vector<std::byte>& v = items[name + "/v"];
  const std::size_t sc = static_cast<std::size_t>(kv.n_heads_kv()) * sizeof(float);
  for (int r = 0; r < kv.rows_committed(); ++r) {
    AppendBytes(k, kv.KRaw(r), kv.row_bytes());
    AppendBytes(v, kv.VRaw(r), kv.row_bytes());
    if (kv.KScales(r) != nullptr) {
      AppendBytes(k, kv.KScales(r), sc);
      AppendBytes(v, kv.VScales(r), sc);
    }
  }
  const int meta[2] = {kv.rows_committed(), kv.rows_capacity()};
  AppendBytes(items[name + "/rows"], meta, sizeof(meta));
}

inline SlotItems CurrentSlotItems(Engine& e) {
  SlotItems items;
  const int n_layers = e.weights().config.n_layers;
  for (int is = 0; is < e.n_stages(); ++is) {
    StageSession& s = e.stage(is);
    for (int il = 0; il < n_layers; ++il) {
      const std::string name = "stage" + std::to_string(is) + "/layer" + std::to_string(il);
      if (KvCache* kv = s.kv(il)) AddKv(items, name, *kv);
      if (GdnState* g = s.gdn(il)) {
        AppendBytes(items[name + "/conv"], g->conv(), g->conv_size() * sizeof(float));
        AppendBytes(items[name + "/ssm"], g->ssm(), g->ssm_size() * sizeof(float));
        const int pos = g->position();
        AppendBytes(items[name + "/gdn_position"], &pos, sizeof(pos));
      }
    }
    if (KvCache* m = s.mtp_kv()) AddKv(items, "stage" + std::to_string(is) + "/mtp", *m);
  }
  return items;
}

// The names of the items that differ (or exist on one side only).
inline std::vector<std::string> DifferingItems(const SlotItems& a, const SlotItems& b) {
  std::vector<std::string> out;
  for (const auto& [name, bytes] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second != bytes) out.push_back(name);
  }
  for (const auto& [name, bytes] : b)
    if (a.find(name) == a.end()) out.push_back(name);
  return out;
}

}  // namespace lockstep::test
