// The path grammar of a lockstep.export file (instrument/SCHEMA.md), both directions, in one
// place: the exporter (instrument/export_writer.cpp) builds its group and dataset names here and
// the export reader (compare/) parses them back here, so the two cannot drift apart.
//
//   checkpoints/{W:05d}_{pre_verify|post_verify|commit}        CheckpointName / ParseCheckpointName
//     stage{S}/layer{L}/<k|v|k_spec|v_spec|conv_state|ssm_state>  ItemRel / ParseItemRel
//     stage{S}/mtp/<k|v>
//     stage{S}/<hidden_out|logits>
//
// ItemPath is the whole in-file path ("checkpoints/00003_commit/stage1/layer7/k"). Parse* accept
// exactly what the builders produce for a valid address (the round trip is tested over every item
// kind, tests/h5/paths_test.cpp) and nothing else. Pure functions, no HDF5 calls.
#pragma once

#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "lockstep/engine/observer.h"

namespace lockstep {

// "stage12" with prefix "stage" -> 12 (digits only, no sign, fits an int); -1 otherwise.
inline int ParseIndex(std::string_view name, std::string_view prefix) {
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 9 ||
      name.compare(0, prefix.size(), prefix) != 0)
    return -1;
  int v = -1;
  const char* b = name.data() + prefix.size();
  const char* e = name.data() + name.size();
  auto [p, ec] = std::from_chars(b, e, v);
  return ec == std::errc() && p == e && *b != '+' && *b != '-' ? v : -1;
}

// ---- checkpoints ----

// The group under /checkpoints that holds one checkpoint.
struct CheckpointId {
  int window = 0;
  CheckpointPoint point = CheckpointPoint::kCommit;
};

// "00003_commit": the window zero-padded to 5 digits (wider windows keep all their digits), '_',
// the point's name.
inline std::string CheckpointName(int window, CheckpointPoint point) {
  std::string w = std::to_string(window);
  if (w.size() < 5) w.insert(0, 5 - w.size(), '0');
  return w + "_" + CheckpointPointName(point);
}

// "00003_commit" -> {3, kCommit}; nullopt for any name CheckpointName does not produce.
inline std::optional<CheckpointId> ParseCheckpointName(std::string_view name) {
  const auto u = name.find('_');
  if (u == std::string_view::npos || u < 5 || u > 10) return std::nullopt;
  const std::optional<CheckpointPoint> point = ParseCheckpointPoint(name.substr(u + 1));
  if (!point) return std::nullopt;
  int window = -1;
  const char* b = name.data();
  auto [p, ec] = std::from_chars(b, b + u, window);
  if (ec != std::errc() || p != b + u || *b == '-' || window < 0 ||
      CheckpointName(window, *point) != name)
    return std::nullopt;
  return CheckpointId{window, *point};
}

// "checkpoints/00003_commit": the group's path from the file's root (no leading '/').
inline std::string CheckpointGroupName(int window, CheckpointPoint point) {
  return "checkpoints/" + CheckpointName(window, point);
}

// ---- items ----

// Where one state item lives inside its checkpoint group (layer -1 for non-layer kinds).
struct ItemAddress {
  int stage = 0;
  int layer = -1;
  ItemKind kind = ItemKind::kK;
};

// "stage1/layer7/k", "stage0/mtp/v", "stage3/logits": the item's path inside its checkpoint.
inline std::string ItemRel(int stage, int layer, ItemKind kind) {
  const std::string g = "stage" + std::to_string(stage) + "/";
  switch (kind) {
    case ItemKind::kMtpK:
      return g + "mtp/k";
    case ItemKind::kMtpV:
      return g + "mtp/v";
    case ItemKind::kHiddenOut:
    case ItemKind::kLogits:
    case ItemKind::kSeqState:
      return g + ItemKindName(kind);
    default:
      return g + "layer" + std::to_string(layer) + "/" + ItemKindName(kind);
  }
}

// The inverse of ItemRel: stage, layer (-1 for non-layer kinds), kind; nullopt for anything else.
inline std::optional<ItemAddress> ParseItemRel(std::string_view rel) {
  const auto a = rel.find('/');
  if (a == std::string_view::npos) return std::nullopt;
  ItemAddress out;
  out.stage = ParseIndex(rel.substr(0, a), "stage");
  if (out.stage < 0) return std::nullopt;
  const std::string_view rest = rel.substr(a + 1);
  const auto b = rest.find('/');
  std::optional<ItemKind> k;
  if (b == std::string_view::npos) {
    k = ParseItemKind(rest);
    if (k != ItemKind::kHiddenOut && k != ItemKind::kLogits && k != ItemKind::kSeqState)
      return std::nullopt;
  } else if (rest.substr(0, b) == "mtp") {
    k = ParseItemKind("mtp_" + std::string(rest.substr(b + 1)));
    if (k != ItemKind::kMtpK && k != ItemKind::kMtpV) return std::nullopt;
  } else {
    out.layer = ParseIndex(rest.substr(0, b), "layer");
    k = ParseItemKind(rest.substr(b + 1));
    if (out.layer < 0 || !k || !IsLayerItem(*k)) return std::nullopt;
  }
  out.kind = *k;
  return out;
}

// The HDF5 path of one state item ("checkpoints/00003_commit/stage1/layer7/k"): the one place
// that turns (checkpoint, stage, layer, item) into a path, shared by the writer, compare/ and
// tests.
// The optional op-digest tables (instrument/SCHEMA.md "/ops"): written by instrument/'s op
// export, read by compare/'s export reader.
inline constexpr const char* kOpsGroupPath = "ops";
inline constexpr const char* kOpsTablePath = "ops/table";
inline constexpr const char* kOpsRecordsPath = "ops/records";
inline constexpr const char* kOpsL2Path = "ops/l2";
inline constexpr const char* kOpsDumpPath = "ops/dump";

inline std::string ItemPath(int window, CheckpointPoint point, int stage, int layer,
                            ItemKind kind) {
  return CheckpointGroupName(window, point) + "/" + ItemRel(stage, layer, kind);
}

}  // namespace lockstep
