#pragma once
// CUDA launcher for dropout.h (kernels/pointwise/dropout.cu). Called by dropout.cpp after the
// checks; forward and backward are the same masked scaling.
#include <cstdint>

#include "kernels/pointwise/dropout.h"
#include "runtime/stream.h"

namespace cnn {

void dropout_apply_cuda(int64_t count, const float* d_in, float* d_out, uint32_t threshold,
                        float scale, uint64_t seed, const int64_t* d_step, cudaStream_t stream);

}  // namespace cnn
