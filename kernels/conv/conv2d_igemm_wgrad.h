#pragma once
// Weight gradient of the implicit-GEMM convolution, its dedicated kernel (conv2d_igemm_wgrad.cu).
// Internal to the kernels library: conv2d_igemm.cu dispatches here (see IgemmVariant in
// conv2d_igemm.h); same contract as conv2d_backward_weight_igemm_cuda (dw/db accumulate).
//
//   dw[oc][j = (c, ky, kx)] (+ db[oc] as column j = C*KH*KW) = sum over k = (n, oy, ox) of
//   dy[n][oc][oy][ox] * x[n][c][oy*sh - ph + ky][ox*sw - pw + kx]
//
// Unlike the generic variant (the k-major main loop of gemm_tile.cuh) both operands sit in shared
// memory k-contiguous ([row][32 k], 16-byte chunks XOR-swizzled by row), so dy, contiguous along
// the output positions k, moves in 16-byte cp.async copies, and the x gather needs no division:
// a per-block table gives each output position of the block's K range {offset of its input
// window, bit mask of the taps inside the image}.
#include <cstddef>

#include "kernels/conv/conv2d.h"
#include "runtime/exec.h"

namespace cnn {

// True when the dedicated kernel handles the shape (KH*KW <= 32, grid and 32-bit offset limits).
bool conv2d_wgrad_dedicated_supported(const Conv2dShape& s);

// Scratch floats of the deterministic path (0 unless ex.deterministic); shape only.
std::size_t conv2d_wgrad_dedicated_scratch_floats(const Conv2dShape& s, const Exec& ex);

void conv2d_backward_weight_dedicated_cuda(const Conv2dShape& s, const float* d_x,
                                           const float* d_dy, float* d_dw, float* d_db,
                                           float* d_scratch, const Exec& ex);

// Second stage of a deterministic split weight gradient (this kernel's and the window kernel's):
// dw[i] (i < weight_slots) or db[i - weight_slots] += sum over s < splits of
// d_scratch[s * slots + i], in split order, on ex.stream.
void launch_wgrad_split_reduce(const float* d_scratch, int splits, int slots, int weight_slots,
                               float* d_dw, float* d_db, const Exec& ex);

}  // namespace cnn
