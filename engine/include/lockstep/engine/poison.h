// Poisoned fresh allocations (tests): with LOCKSTEP_POISON_FRESH=1 in the environment, fresh K/V
// pages and GDN per-step scratch are filled with NaN instead of zero, so a read of memory nothing
// wrote (a stale slot, a tail row, a scratch step before its write) turns into NaN and shows in
// any bitwise comparison. State whose zero is meaningful (a fresh GDN checkpoint: the model's
// initial state) is zeroed explicitly, never by allocation. Product runs never set it.
//
// Thread safety: the variable is read once (first call); the test override is atomic.
#pragma once

namespace lockstep {

// True when fresh allocations are to be poisoned (the test override, else the environment).
bool PoisonFresh();
// Tests: 1 / 0 force poison on / off for allocations made from now on; -1 returns to the
// environment's value.
void SetPoisonFreshForTesting(int on);

}  // namespace lockstep
