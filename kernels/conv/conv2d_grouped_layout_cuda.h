#pragma once
// CUDA launcher of conv2d_grouped_layout.h (conv2d_grouped_layout.cu), called after the checks.
#include <cstdint>

#include "kernels/conv/conv2d_grouped_layout.h"
#include "runtime/stream.h"

namespace cnn {

void group_major_copy_cuda(const float* d_src, float* d_dst, int n, int groups, int64_t plane,
                           bool to_group_major, cudaStream_t stream);
void block_diagonal_expand_cuda(const BlockDiagonal& b, const float* d_w, float* d_wd,
                                cudaStream_t stream);
void block_diagonal_add_back_cuda(const BlockDiagonal& b, const float* d_dwd, float* d_dw,
                                  cudaStream_t stream);
void zero_floats_cuda(float* d_p, int64_t count, cudaStream_t stream);

}  // namespace cnn
