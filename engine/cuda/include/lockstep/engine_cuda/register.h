// The one entry point of the CUDA backend that CPU-only code may include: no CUDA header here.
// Registers backend "cuda" (engine/include/lockstep/engine/backend.h); idempotent. Called by
// the `lockstep` executable and the tests when the build has CUDA (LOCKSTEP_HAVE_CUDA).
#pragma once

namespace lockstep::cuda {
void RegisterCudaBackend();
}  // namespace lockstep::cuda
