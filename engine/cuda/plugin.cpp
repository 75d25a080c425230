// liblockstep_cuda.so: the CUDA backend as a plugin of the `lockstep` executable (backend.h).
// The executable dlopens it the first time `--backend cuda` is asked for; engine symbols resolve
// from the executable, so there is one copy of the engine and one backend registry.
#include "cuda/cuda_backend.h"

extern "C" __attribute__((visibility("default"))) void lockstep_register_backends() {
  lockstep::cuda::RegisterCudaBackend();
}
