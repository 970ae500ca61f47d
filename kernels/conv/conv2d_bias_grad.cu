// The convolution's bias gradient alone (see conv2d_bias_grad.h).
#include <algorithm>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_bias_grad.h"
#include "kernels/conv/direct_conv_common.cuh"
#include "runtime/cuda_check.h"
#include "runtime/error.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;

// Block (oc, part) sums channel oc over images part, part + gridDim.y, ..., each image's HW
// contiguous floats read by consecutive threads, then adds the block's sum to db[oc].
__global__ void __launch_bounds__(kThreads)
    conv2d_bias_grad_kernel(const float* __restrict__ dy, int n, int oc, int64_t hw,
                            float* __restrict__ db) {
  ptx::griddep_enter();
  __shared__ float s_warp[kThreads / 32];
  const int o = int(blockIdx.x);
  float sum = 0.f;
  for (int img = int(blockIdx.y); img < n; img += int(gridDim.y)) {
    const float* row = dy + (int64_t(img) * oc + o) * hw;
    for (int64_t p = threadIdx.x; p < hw; p += kThreads) sum += row[p];
  }
  sum = block_sum(sum, s_warp);
  if (threadIdx.x == 0) atomicAdd(db + o, sum);
}

}  // namespace

void conv2d_bias_grad_cuda(const float* d_dy, int n, int oc, int64_t hw, float* d_db,
                           cudaStream_t stream) {
  CNN_CHECK(d_dy && d_db, "conv2d_bias_grad: null tensor pointer");
  CNN_CHECK(n >= 1 && oc >= 1 && hw >= 1,
            "conv2d_bias_grad: n={} oc={} hw={} (expected positive sizes)", n, oc, hw);
  // About two blocks an SM of a large GPU in all, at least an image each.
  const int parts = std::clamp((264 + oc - 1) / oc, 1, std::min(n, 65535));
  conv2d_bias_grad_kernel<<<dim3(unsigned(oc), unsigned(parts)), kThreads, 0, stream>>>(d_dy, n, oc,
                                                                                        hw, d_db);
  CNN_LAUNCH_CHECK("conv2d_bias_grad");
}

}  // namespace cnn
