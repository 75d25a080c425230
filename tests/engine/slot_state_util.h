// Test helper: every state item of an engine's current slot as bytes, for bitwise comparisons of
// two runs (K/V committed rows with int8 scales, K/V capacity, GDN conv + ssm checkpoints and
// their positions, MTP draft K/V rows).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "lockstep/engine/engine.h"
#include "lockstep/engine/observer.h"

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

// Records every state item of every checkpoint it is shown (all windows, all points): rows with
// their int8 scales, shape, rows and capacity, keyed by (window, point, stage, layer, kind).
class ItemRecorder final : public Observer {
 public:
  using Key = std::tuple<int, int, int, int, int>;
  bool WantsCheckpoint(int, CheckpointPoint) const override { return true; }
  void OnCheckpointBegin(const CheckpointInfo&) override {}
  void OnCheckpointEnd(const CheckpointInfo&) override {}
  void OnState(const CheckpointInfo& info, const StateView& v) override {
    std::vector<std::byte>& out = items[Key{info.window, static_cast<int>(info.point), v.stage,
                                            v.layer, static_cast<int>(v.kind)}];
    const std::int64_t meta[2] = {v.rows, v.rows_capacity};
    AppendBytes(out, meta, sizeof(meta));
    for (std::int64_t d : v.shape) AppendBytes(out, &d, sizeof(d));
    for (int r = 0; r < v.rows; ++r) {
      AppendBytes(out, v.row(r), v.row_bytes);
      if (v.scales) AppendBytes(out, v.scales(r), static_cast<std::size_t>(v.shape[1]) * 4);
      if (v.dtype == DType::kF32) {
        const auto* f = reinterpret_cast<const float*>(v.row(r));
        for (std::size_t i = 0; i < v.row_bytes / sizeof(float); ++i)
          if (std::isnan(f[i])) ++nan_values;
      }
    }
  }
  void OnWindow(const WindowRecord& rec) override { windows.push_back(rec); }

  std::map<Key, std::vector<std::byte>> items;
  std::vector<WindowRecord> windows;
  std::int64_t nan_values = 0;  // NaN elements seen in f32 items (poison: a stale read)
};

// Keys of items that differ between two recorders (or exist in one only), as text.
inline std::vector<std::string> DifferingItems(const ItemRecorder& a, const ItemRecorder& b) {
  auto name = [](const ItemRecorder::Key& k) {
    return "window " + std::to_string(std::get<0>(k)) + " point " + std::to_string(std::get<1>(k)) +
           " stage " + std::to_string(std::get<2>(k)) + " layer " + std::to_string(std::get<3>(k)) +
           " kind " + ItemKindName(static_cast<ItemKind>(std::get<4>(k)));
  };
  std::vector<std::string> out;
  for (const auto& [k, bytes] : a.items) {
    auto it = b.items.find(k);
    if (it == b.items.end() || it->second != bytes) out.push_back(name(k));
  }
  for (const auto& [k, bytes] : b.items)
    if (a.items.find(k) == a.items.end()) out.push_back(name(k));
  return out;
}

}  // namespace lockstep::test
