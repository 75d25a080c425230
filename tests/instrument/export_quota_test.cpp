// ExportQuota (issue 43): the byte budget of one export, projected at the first checkpoint and
// enforced as a hard stop; once over, it stays over and names the budget and where it was passed.
#include "lockstep/instrument/export_quota.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

WindowSelection Windows(const char* text) {
  auto w = WindowSelection::Parse(text);
  EXPECT_TRUE(w.ok()) << text;
  return w.ok() ? *w : WindowSelection{};
}

TEST(ExportQuota, TheFirstCheckpointProjectsTheWholeExport) {
  // 100 bytes a checkpoint, 3 points, windows 0-9 of 10: 3,000 bytes in all.
  ExportQuota fits(3000, 10, Windows("all"), 3);
  for (int w = 0; w < 10; ++w)
    for (int p = 0; p < 3; ++p) {
      EXPECT_TRUE(fits.Take(100, w)) << w;
      fits.EndCheckpoint(w);
    }
  EXPECT_FALSE(fits.over());
  EXPECT_EQ(fits.taken(), 3000u);
  // One byte less: the projection at the first checkpoint (100 + 100 x 27 more = 2,800 is a
  // floor; with the 2 points of window 0 left out it still passes 2,799) stops it there.
  ExportQuota tight(2799, 10, Windows("all"), 3);
  EXPECT_TRUE(tight.Take(100, 0));
  tight.EndCheckpoint(0);
  EXPECT_TRUE(tight.over());
  EXPECT_FALSE(tight.Take(1, 0)) << "over is for good";
  const std::string m(tight.Error().message());
  EXPECT_NE(m.find("--max-export-mib"), std::string::npos) << m;
  EXPECT_NE(m.find("first checkpoint took 0.1 KiB, and the 27 more"), std::string::npos) << m;
  // The projection counts only the selected windows: "0-1" of 10 is 100 + 100 x 3 = 400.
  ExportQuota few(400, 10, Windows("0-1"), 3);
  EXPECT_TRUE(few.Take(100, 0));
  few.EndCheckpoint(0);
  EXPECT_FALSE(few.over());
}

TEST(ExportQuota, AnItemPastTheBudgetIsAHardStop) {
  // No projection (windows unknown): the budget is enforced item by item.
  ExportQuota q(1000, 0, Windows("all"), 3);
  EXPECT_TRUE(q.Take(600, 0));
  q.EndCheckpoint(0);
  EXPECT_TRUE(q.Take(400, 1));
  EXPECT_FALSE(q.over()) << "exactly the budget is within it";
  EXPECT_FALSE(q.Take(1, 2));
  EXPECT_TRUE(q.over());
  EXPECT_EQ(q.taken(), 1000u) << "the refused item is not counted";
  EXPECT_NE(std::string(q.Error().message()).find("window 2 would take it to 1.0 KiB"),
            std::string::npos)
      << q.Error().message();
  ExportQuota none(0, 10, Windows("all"), 3);  // 0: no budget
  EXPECT_TRUE(none.Take(std::uint64_t{1} << 40, 0));
  none.EndCheckpoint(0);
  EXPECT_FALSE(none.over());
}

}  // namespace
}  // namespace lockstep
