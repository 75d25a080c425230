// Hot-path trace ring: disabled sites record nothing, events come back oldest first, overflow
// keeps the newest `capacity` events and counts the rest as dropped.
#include "lockstep/engine/trace_ring.h"

#include <gtest/gtest.h>

#include "lockstep/engine/clock.h"

namespace lockstep {
namespace {

TEST(TraceRing, DisabledRecordsNothing) {
  TraceRing r(8);
  r.Record(TraceEventId::kLayerBegin, 1, 0);
  EXPECT_EQ(r.recorded(), 0u);
  EXPECT_TRUE(r.Snapshot().empty());
}

TEST(TraceRing, OrderTimestampsAndOverflow) {
  TraceRing r(8);
  r.Enable();
  for (int i = 0; i < 20; ++i)
    r.Record(TraceEventId::kLayerEnd, i, static_cast<std::uint16_t>(i % 3));
  auto ev = r.Snapshot();
  ASSERT_EQ(ev.size(), 8u);
  EXPECT_EQ(r.dropped(), 12u);
  for (std::size_t i = 0; i < ev.size(); ++i) {
    EXPECT_EQ(ev[i].a, static_cast<std::int32_t>(12 + i));
    EXPECT_EQ(ev[i].id, static_cast<std::uint16_t>(TraceEventId::kLayerEnd));
    if (i > 0) {
      EXPECT_GE(ev[i].t_ns, ev[i - 1].t_ns);
    }
  }
  r.Clear();
  EXPECT_EQ(r.recorded(), 0u);
  r.Record(TraceEventId::kStageBegin, 3, 9);
  ASSERT_EQ(r.Snapshot().size(), 1u);
  EXPECT_EQ(r.Snapshot()[0].b, 9);
}

// Events carry MonotonicNs (clock.h), the clock of the window records they are drawn beside.
TEST(TraceRing, StampsWithTheMonotonicClock) {
  TraceRing r(8);
  r.Enable();
  const std::int64_t before = MonotonicNs();
  r.Record(TraceEventId::kLayerBegin, 0, 0);
  const std::int64_t after = MonotonicNs();
  ASSERT_EQ(r.Snapshot().size(), 1u);
  EXPECT_GE(r.Snapshot()[0].t_ns, before);
  EXPECT_LE(r.Snapshot()[0].t_ns, after);
}

}  // namespace
}  // namespace lockstep
