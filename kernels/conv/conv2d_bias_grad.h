#pragma once
// The convolution's bias gradient alone, for the weight-gradient kernels that do not fold it into
// their GEMM (the BF16 channels-last ones, conv2d_wgmma_wgrad_nhwc.h):
//   db[oc] += sum over n and pixels of dy[n][oc][p], dy (N, OC, HW) NCHW, in FP32 from the FP32
// dy (not rounded to the pass's operand precision). Its CPU twin is conv2d_backward_weight_cpu's
// db (kernels/conv/conv2d.h).
#include <cuda_runtime.h>

#include <cstdint>

namespace cnn {

// Blocks of (channel, run of images) add their sums with atomics: not bitwise repeatable (the
// callers refuse deterministic mode).
void conv2d_bias_grad_cuda(const float* d_dy, int n, int oc, int64_t hw, float* d_db,
                           cudaStream_t stream);

}  // namespace cnn
