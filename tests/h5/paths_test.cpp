// The export's path grammar (h5/include/lockstep/h5/paths.h): every builder's output parses back
// to what built it, over every checkpoint point and item kind, and the parsers refuse what no
// builder produces.
#include "lockstep/h5/paths.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace lockstep {
namespace {

TEST(ExportPaths, CheckpointNamesRoundTripEveryPoint) {
  for (CheckpointPoint p : AllCheckpointPoints()) {
    for (int w : {0, 3, 99999, 100000, 2147483647}) {
      const std::string name = CheckpointName(w, p);
      const auto back = ParseCheckpointName(name);
      ASSERT_TRUE(back.has_value()) << name;
      EXPECT_EQ(back->window, w) << name;
      EXPECT_EQ(back->point, p) << name;
      EXPECT_EQ(CheckpointGroupName(w, p), "checkpoints/" + name);
    }
  }
  EXPECT_EQ(CheckpointName(3, CheckpointPoint::kCommit), "00003_commit");
  EXPECT_EQ(CheckpointName(123456, CheckpointPoint::kPreVerify), "123456_pre_verify");
}

TEST(ExportPaths, CheckpointNamesRefuseOtherSpellings) {
  for (const char* bad : {"3_commit", "0003_commit", "000003_commit", "00003_Commit", "00003commit",
                          "00003_", "_commit", "-0003_commit", "+0003_commit", "00003_commit/",
                          "0000a_commit", "00003_commit_", ""})
    EXPECT_FALSE(ParseCheckpointName(bad).has_value()) << bad;
}

TEST(ExportPaths, ItemPathsRoundTripEveryKind) {
  int kinds = 0;
  for (ItemKind k : AllItemKinds()) {
    ++kinds;
    for (int stage : {0, 1, 12}) {
      for (int layer : {0, 7, 47}) {
        const int l = IsLayerItem(k) ? layer : -1;
        const std::string rel = ItemRel(stage, l, k);
        const auto back = ParseItemRel(rel);
        ASSERT_TRUE(back.has_value()) << rel;
        EXPECT_EQ(back->stage, stage) << rel;
        EXPECT_EQ(back->layer, l) << rel;
        EXPECT_EQ(back->kind, k) << rel;
        for (CheckpointPoint p : AllCheckpointPoints())
          EXPECT_EQ(ItemPath(5, p, stage, l, k), CheckpointGroupName(5, p) + "/" + rel);
      }
    }
  }
  EXPECT_EQ(kinds, static_cast<int>(kNumItemKinds));
  EXPECT_EQ(ItemPath(3, CheckpointPoint::kCommit, 1, 7, ItemKind::kK),
            "checkpoints/00003_commit/stage1/layer7/k");
  EXPECT_EQ(ItemRel(0, -1, ItemKind::kMtpV), "stage0/mtp/v");
  EXPECT_EQ(ItemRel(3, -1, ItemKind::kLogits), "stage3/logits");
}

TEST(ExportPaths, ItemPathsRefuseOtherSpellings) {
  for (const char* bad :
       {"stage1", "stage1/", "stage1/k", "stage1/layer7/logits", "stage1/layer7/mtp_k",
        "stage1/mtp/k_spec", "stage1/mtp/logits", "stage1/layer/k", "stage1/layer-1/k",
        "stage+1/layer7/k", "stagex/logits", "stage1/layer7/k/x", "stage1/hidden", "layer7/k",
        "stage1/mtp_k", "stage1/layer7/K", ""})
    EXPECT_FALSE(ParseItemRel(bad).has_value()) << bad;
}

}  // namespace
}  // namespace lockstep
