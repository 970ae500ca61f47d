#include "runtime/memory.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "runtime/error.h"

#ifdef CNN_HAVE_CUDA
#include "runtime/cuda_check.h"
#endif

namespace cnn {

void* raw_alloc(std::size_t bytes, Device dev) {
  if (bytes == 0) return nullptr;
  if (dev == Device::CPU) {
    // 64-byte alignment keeps vectorized CPU loops and pinned-style copies happy.
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    CNN_CHECK(p, "out of host memory: cannot allocate {:.1f} MiB (lower training.batch_size)",
              bytes / 1048576.0);
    return p;
  }
#ifdef CNN_HAVE_CUDA
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // an allocation failure is not sticky: clear it, keep the context
    std::size_t free_b = 0, total_b = 0;
    const bool info = cudaMemGetInfo(&free_b, &total_b) == cudaSuccess;
    (void)cudaGetLastError();
    int dev = -1;
    (void)cudaGetDevice(&dev);
    const std::string where = info ? fmt::format("GPU {} has {:.1f} MiB free of {:.1f} MiB", dev,
                                                 free_b / 1048576.0, total_b / 1048576.0)
                                   : fmt::format("GPU {}, free memory unknown", dev);
    CNN_FAIL(
        "out of GPU memory: cannot allocate {:.1f} MiB; {} ({}); lower training.batch_size or "
        "free the GPU of other processes",
        bytes / 1048576.0, where, cudaGetErrorString(err));
  }
  return p;
#else
  CNN_FAIL("CUDA memory requested but this build has no CUDA");
#endif
}

void raw_free(void* p, Device dev) noexcept {
  if (!p) return;
  if (dev == Device::CPU) {
    std::free(p);
    return;
  }
#ifdef CNN_HAVE_CUDA
  cudaFree(p);
#endif
}

void raw_copy(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes,
              cudaStream_t stream) {
  if (bytes == 0) return;
  if (dst_dev == Device::CPU && src_dev == Device::CPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef CNN_HAVE_CUDA
  if (stream)
    CNN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  else
    CNN_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
#else
  (void)stream;
  CNN_FAIL("CUDA copy requested but this build has no CUDA");
#endif
}

void raw_zero(void* p, Device dev, std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  if (dev == Device::CPU) {
    std::memset(p, 0, bytes);
    return;
  }
#ifdef CNN_HAVE_CUDA
  CNN_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
#else
  (void)stream;
  CNN_FAIL("CUDA memset requested but this build has no CUDA");
#endif
}

void stream_sync(Device dev, cudaStream_t stream) {
  if (dev == Device::CPU) return;
#ifdef CNN_HAVE_CUDA
  CNN_CUDA_CHECK(cudaStreamSynchronize(stream));
#else
  (void)stream;
#endif
}

}  // namespace cnn
