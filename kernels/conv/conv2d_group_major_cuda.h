#pragma once
// CUDA launcher of conv2d_group_major.h (conv2d_group_major.cu), called after the checks.
#include <cstdint>

#include "runtime/stream.h"

namespace cnn {

void group_major_copy_cuda(const float* d_src, float* d_dst, int n, int groups, int64_t plane,
                           bool to_group_major, cudaStream_t stream);

}  // namespace cnn
