#pragma once
// Convolutions with a single input channel (the first layer, conv1: 1 -> 32, 5x5, pad 2) on the
// GPU (kernels/conv2d_1ch.cu). With C == 1 the reduction is only KH*KW long, so a GEMM view
// wastes most of its tile; these kernels instead slide a register window over the input:
//   forward:         each thread computes a 1x4 strip of output pixels for 8 output channels
//                    from a shared-memory input tile; bias + ReLU fused.
//   backward_weight: each thread accumulates all KH*KW weight (and the bias) gradients of 4
//                    output channels over its strips in registers; a warp reduce-scatter and a
//                    block sum leave one partial per weight per block, atomicAdd-ed into dw/db,
//                    or with ex.deterministic written to scratch and summed in a fixed order.
// Fast paths: square 3x3 or 5x5 kernels with stride 1 (any padding, any image size). Other
// C == 1 shapes run simple direct kernels (correct, not tuned). FP32 whatever ex.precision
// says (these kernels are bound by memory and issue, not by multiply throughput).
// Same contracts as kernels/conv2d.h (dw/db ACCUMULATE; y is overwritten); all pointers are
// device pointers, launches asynchronous on ex.stream. Requires s.c == 1.
#include <cstddef>

#include "kernels/conv/conv2d.h"
#include "runtime/exec.h"

namespace cnn {

// True when the shape has one input channel (the only requirement of these launchers).
inline bool conv2d_1ch_applicable(const Conv2dShape& s) {
  return s.c == 1;
}

void conv2d_forward_1ch_cuda(const Conv2dShape& s, const float* d_x, const float* d_w,
                             const float* d_b, float* d_y, bool relu, const Exec& ex);

// Floats of scratch conv2d_backward_weight_1ch_cuda needs: 0 unless ex.deterministic. Depends on
// the shape only.
std::size_t conv2d_backward_weight_1ch_scratch_floats(const Conv2dShape& s, const Exec& ex);

void conv2d_backward_weight_1ch_cuda(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                     float* d_dw, float* d_db, float* d_scratch, const Exec& ex);

}  // namespace cnn
