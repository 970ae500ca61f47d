#pragma once
// CUDA launcher for add.h (kernels/pointwise/add.cu). Called by add.cpp after the checks.
#include <cstdint>

#include "runtime/stream.h"

namespace cnn {

void add_forward_cuda(int64_t count, const float* d_a, const float* d_b, float* d_y,
                      cudaStream_t stream);

}  // namespace cnn
