#include "lockstep/engine/poison.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace lockstep {

namespace {
std::atomic<int> g_override{-1};
}  // namespace

bool PoisonFresh() {
  static const bool from_env = [] {
    const char* v = std::getenv("LOCKSTEP_POISON_FRESH");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  const int o = g_override.load(std::memory_order_relaxed);
  return o < 0 ? from_env : o != 0;
}

void SetPoisonFreshForTesting(int on) {
  g_override.store(on < 0 ? -1 : (on != 0 ? 1 : 0), std::memory_order_relaxed);
}

}  // namespace lockstep
