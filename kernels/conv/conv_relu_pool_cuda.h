#pragma once
// CUDA launchers for conv_relu_pool.h (kernels/conv_relu_pool.cu). Called by conv_relu_pool.cpp
// after the checks; all pointers are device pointers, launches asynchronous on ex.stream.
#include <cstddef>
#include <cstdint>

#include "kernels/conv/conv2d.h"
#include "runtime/exec.h"

namespace cnn {

// Whether the current device runs the tensor-core kernels (compute capability 8.0 or later); the
// three launchers after them take them at precision tf32 / bf16 under CNN_CRP_TENSOR_CORES=1.
bool conv_relu_pool_mma_supported();
// The forward on the tensor cores (TF32 or BF16 operands as ex.precision says, FP32 sums).
void conv_relu_pool_forward_mma_cuda(const Conv2dShape& s, const float* d_x, const float* d_w,
                                     const float* d_b, float* d_y, int32_t* d_argmax,
                                     const Exec& ex);
// The weight gradient on the tensor cores (dconv and x rounded as ex.precision says, FP32 sums;
// db through a column of ones, from the rounded dconv), and its deterministic scratch.
std::size_t conv_relu_pool_backward_weight_mma_scratch_floats(const Conv2dShape& s, const Exec& ex);
void conv_relu_pool_backward_weight_mma_cuda(const Conv2dShape& s, const float* d_x,
                                             const float* d_y, const float* d_dy,
                                             const int32_t* d_argmax, float* d_dw, float* d_db,
                                             float* d_scratch, const Exec& ex);

void conv_relu_pool_forward_cuda(const Conv2dShape& s, const float* d_x, const float* d_w,
                                 const float* d_b, float* d_y, int32_t* d_argmax, const Exec& ex);
std::size_t conv_relu_pool_backward_weight_scratch_floats_cuda(const Conv2dShape& s,
                                                               const Exec& ex);
void conv_relu_pool_backward_weight_cuda(const Conv2dShape& s, const float* d_x, const float* d_y,
                                         const float* d_dy, const int32_t* d_argmax, float* d_dw,
                                         float* d_db, float* d_scratch, const Exec& ex);

}  // namespace cnn
