#include "runtime/stream_timer.h"

#include "runtime/error.h"
#ifdef CNN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "runtime/cuda_check.h"
#endif

namespace cnn {

double time_on_stream(const std::function<void()>& fn, const Exec& ex, int reps) {
  CNN_CHECK(ex.device == Device::CUDA, "time_on_stream: CUDA only");
  CNN_CHECK(reps >= 1, "time_on_stream: reps must be >= 1, got {}", reps);
#ifdef CNN_HAVE_CUDA
  fn();  // warm-up
  cudaEvent_t start = nullptr, stop = nullptr;
  CNN_CUDA_CHECK(cudaEventCreate(&start));
  if (cudaEventCreate(&stop) != cudaSuccess) {
    cudaEventDestroy(start);
    CNN_FAIL("time_on_stream: cudaEventCreate failed");
  }
  float ms = 0.f;
  cudaError_t err = cudaEventRecord(start, ex.stream);
  try {
    for (int r = 0; r < reps && err == cudaSuccess; ++r) fn();
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  if (err == cudaSuccess) err = cudaEventRecord(stop, ex.stream);
  if (err == cudaSuccess) err = cudaEventSynchronize(stop);
  if (err == cudaSuccess) err = cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  CNN_CUDA_CHECK(err);
  return 1000.0 * ms / reps;
#else
  (void)fn;
  CNN_FAIL("time_on_stream: built without CUDA");
#endif
}

void check_device_usable(const Exec& ex) {
  if (ex.device != Device::CUDA) return;  // a CPU run has no context to lose (nor maybe a GPU)
#ifdef CNN_HAVE_CUDA
  (void)cudaGetLastError();
  const cudaError_t err = cudaStreamSynchronize(ex.stream);
  CNN_CHECK(err == cudaSuccess, "the GPU reported '{}'; the CUDA context is unusable",
            cudaGetErrorString(err));
#else
  (void)ex;
#endif
}

}  // namespace cnn
