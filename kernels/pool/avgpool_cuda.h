#pragma once
// CUDA launchers for avgpool.h (kernels/pool/avgpool.cu). Called by avgpool.cpp after the checks.
#include <cstdint>

#include "kernels/pool/avgpool.h"
#include "runtime/stream.h"

namespace cnn {

void avgpool_forward_cuda(const AvgPoolShape& s, const float* d_x, float* d_y, cudaStream_t stream);
void avgpool_backward_cuda(const AvgPoolShape& s, const float* d_dy, float* d_dx,
                           cudaStream_t stream);
void global_avgpool_forward_cuda(int64_t planes, int64_t plane, const float* d_x, float* d_y,
                                 cudaStream_t stream);
void global_avgpool_backward_cuda(int64_t planes, int64_t plane, const float* d_dy, float* d_dx,
                                  cudaStream_t stream);

}  // namespace cnn
