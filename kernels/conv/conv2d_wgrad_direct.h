#pragma once
// The direct FP32 weight gradient of stride-1 3x3 convolutions (conv2d_wgrad_direct.cu; the plan
// and its layout in conv2d_wgrad_direct_plan.h). Internal to the kernels library: conv2d.cu's
// weight gradient runs it for algo `tiled` where it takes the shape. Same contract as
// conv2d_backward_weight (dw/db accumulate with atomics; ex.deterministic: each split's tile goes
// to scratch and a second pass adds the splits in order, bitwise repeatable).
//
// Built for narrow layers (32-64 channels at 28x28 or 14x14), where an implicit GEMM is a
// 32 x 288 product over 100k positions split over K into many small blocks: here each block
// stages a band of rows once and every tap reuses it from registers.
#include <cstddef>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_wgrad_direct_plan.h"
#include "runtime/stream.h"

namespace cnn {

// d_scratch: wgrad_direct_scratch_floats(s, deterministic) floats when deterministic, else unused.
// Throws (cnn::Error) where wgrad_direct_refusal names a reason.
void conv2d_backward_weight_direct_cuda(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                        float* d_dw, float* d_db, float* d_scratch,
                                        bool deterministic, cudaStream_t stream);

}  // namespace cnn
