#pragma once
// CUDA launchers for maxpool.h (kernels/maxpool.cu). Called by maxpool.cpp after the checks.
#include <cstdint>

#include "kernels/pool/maxpool.h"
#include "runtime/stream.h"

namespace cnn {

void maxpool_forward_cuda(const MaxPoolShape& s, const float* d_x, float* d_y, int32_t* d_argmax,
                          cudaStream_t stream);
// d_relu_y may be null (see maxpool_backward).
void maxpool_backward_cuda(const MaxPoolShape& s, const float* d_dy, const int32_t* d_argmax,
                           const float* d_relu_y, float* d_dx, cudaStream_t stream);

}  // namespace cnn
