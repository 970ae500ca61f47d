#pragma once
// CUDA launchers for relu.h (kernels/relu.cu). Called by relu.cpp after the checks.
#include <cstdint>

#include "runtime/stream.h"

namespace cnn {

void relu_forward_cuda(int64_t count, const float* d_x, float* d_y, cudaStream_t stream);
void relu_backward_cuda(int64_t count, const float* d_y, const float* d_dy, float* d_dx,
                        cudaStream_t stream);

}  // namespace cnn
