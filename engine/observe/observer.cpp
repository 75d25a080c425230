// The names of observer.h's enums: the one spelling of each checkpoint point and item kind, used by
// the exporter, the reader, the comparator, injections and reports.
#include "lockstep/engine/observer.h"

namespace lockstep {

namespace {

// Indexed by the enum's value (the schema's order).
constexpr std::array<const char*, kNumCheckpointPoints> kPointNames = {"pre_verify", "post_verify",
                                                                       "commit"};
constexpr std::array<const char*, kNumItemKinds> kKindNames = {
    "k",     "v",     "k_spec",     "v_spec", "conv_state", "ssm_state",
    "mtp_k", "mtp_v", "hidden_out", "logits", "seq_state"};
static_assert(static_cast<std::size_t>(CheckpointPoint::kCommit) + 1 == kNumCheckpointPoints);
static_assert(static_cast<std::size_t>(ItemKind::kSeqState) + 1 == kNumItemKinds);

}  // namespace

const char* CheckpointPointName(CheckpointPoint p) {
  const auto i = static_cast<std::size_t>(p);
  return i < kPointNames.size() ? kPointNames[i] : "?";
}

std::optional<CheckpointPoint> ParseCheckpointPoint(std::string_view name) {
  for (CheckpointPoint p : AllCheckpointPoints())
    if (name == CheckpointPointName(p)) return p;
  return std::nullopt;
}

std::vector<std::string> AllCheckpointPointNames() {
  std::vector<std::string> names;
  for (CheckpointPoint p : AllCheckpointPoints()) names.emplace_back(CheckpointPointName(p));
  return names;
}

const char* ItemKindName(ItemKind k) {
  const auto i = static_cast<std::size_t>(k);
  return i < kKindNames.size() ? kKindNames[i] : "?";
}

std::optional<ItemKind> ParseItemKind(std::string_view name) {
  for (ItemKind k : AllItemKinds())
    if (name == ItemKindName(k)) return k;
  return std::nullopt;
}

}  // namespace lockstep
