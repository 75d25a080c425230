// CUDA backend: compiled whenever nvcc is found (LOCKSTEP_CUDA=ON), so CI proves the CUDA build
// links. The kernels arrive with the CUDA issue; until then this unit only checks that the
// toolkit, cuBLAS and the architectures we target compile, and reports device presence.
#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace lockstep::cuda {

// Number of CUDA devices visible to this process (0 when none or no driver).
int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// cuBLAS version linked into this build (proves the library links).
int CublasVersion() {
  int v = 0;
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 0;
  cublasGetVersion(h, &v);
  cublasDestroy(h);
  return v;
}

}  // namespace lockstep::cuda
