#pragma once
// Fast CPU convolution: per image, im2col into a column matrix and one packed GEMM (gemm_cpu),
// images spread over the CPU thread pool. Same contracts as the conv2d_*_cpu references in
// kernels/conv2d.h (the shape is assumed already checked by the conv2d API). Results are bitwise
// repeatable, independent of the thread count (see conv2d_backward_weight_cpu_fast).
#include "kernels/conv/conv2d.h"

namespace cnn {

// y (N, OC, OH, OW) = conv(x, w) + b, ReLU applied when relu. b may be null.
void conv2d_forward_cpu_fast(const Conv2dShape& s, const float* x, const float* w, const float* b,
                             float* y, bool relu);

// dx (N, C, H, W) = conv_transpose(dy, w). Overwrites dx.
void conv2d_backward_data_cpu_fast(const Conv2dShape& s, const float* dy, const float* w,
                                   float* dx);

// dw (OC, C, KH, KW) += sum over the batch of x (*) dy; db (OC) += sums of dy (db may be null).
// ACCUMULATES. The batch is cut into a fixed number of image groups (not one per thread), each
// reduced into its own partial sum, and the partials are added in group order: bitwise the same
// for any thread count.
void conv2d_backward_weight_cpu_fast(const Conv2dShape& s, const float* x, const float* dy,
                                     float* dw, float* db);

}  // namespace cnn
