// Dropout on the GPU: elementwise and memory bound; the mask is recomputed from the hash in both
// passes instead of being stored. No __restrict__: out may alias in.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "runtime/hash_rng.h"  // header-only, no dependencies: the hash the data pipeline also uses
#include "kernels/pointwise/dropout_cuda.h"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;  // grid-stride beyond this

// Thread mapping: each thread owns elements k = tid, tid + stride, ... (grid-stride); element k's
// coin is the top 32 bits of hash3(seed, step, k), the step read once per thread from d_step.
__global__ void dropout_apply(int64_t count, const float* d_in, float* d_out, uint32_t threshold,
                              float scale, uint64_t seed, const int64_t* d_step) {
  ptx::griddep_enter();
  const uint64_t step = d_step ? uint64_t(*d_step) : 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < count; k += stride) {
    const uint32_t bits = uint32_t(hash3(seed, step, uint64_t(k)) >> 32);
    d_out[k] = bits >= threshold ? d_in[k] * scale : 0.0f;
  }
}

}  // namespace

void dropout_apply_cuda(int64_t count, const float* d_in, float* d_out, uint32_t threshold,
                        float scale, uint64_t seed, const int64_t* d_step, cudaStream_t stream) {
  const unsigned blocks =
      unsigned(std::min<int64_t>(ceil_div<int64_t>(count, kThreads), kMaxBlocks));
  dropout_apply<<<blocks, kThreads, 0, stream>>>(count, d_in, d_out, threshold, scale, seed,
                                                 d_step);
  CNN_LAUNCH_CHECK("dropout_apply");
}

}  // namespace cnn
