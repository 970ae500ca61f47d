#pragma once
// Weight gradient of stride-1 convolutions with a small OC on the tensor cores (TF32 / BF16
// mma.sync), its input window kept in shared memory and reused by every filter tap
// (conv2d_igemm_wgrad_window.cu; the plan and a CPU model of its index scheme in
// conv2d_wgrad_window_plan.h). Internal to the kernels library: conv2d_igemm.cu dispatches here
// (IgemmVariant::Window, and Auto where wgrad_window_preferred says so); same contract as
// conv2d_backward_weight_igemm_cuda (dw/db accumulate; deterministic mode sums per-split partials
// from scratch in split order).
#include <cstddef>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_wgrad_window_plan.h"
#include "runtime/exec.h"

namespace cnn {

// Where Auto takes the window kernel: supported, 3x3 (OC <= 128) or 5x5 (OC <= 64), C >= 8
// (fewer channels leave most of a block's 8-channel groups empty), and at most 4 channel chunks
// unless dy fits in 16 MB (each chunk reads all of dy).
bool wgrad_window_preferred(const Conv2dShape& s, const Exec& ex);

// d_scratch: wgrad_window_scratch_floats(s, ex) floats when ex.deterministic, else unused.
void conv2d_backward_weight_window_cuda(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                        float* d_dw, float* d_db, float* d_scratch, const Exec& ex);

}  // namespace cnn
