#pragma once
// Input gradient of the implicit-GEMM convolution, its dedicated kernel (conv2d_igemm_dgrad.cu).
// Internal to the kernels library: conv2d_igemm.cu dispatches here (see IgemmVariant in
// conv2d_igemm.h); same contract as conv2d_backward_data_igemm_cuda (dx is overwritten).
//
//   dx[m = (n, iy, ix)][c] = sum over k = (oc, ky, kx) of
//                            dy[n][oc][iy + ph - ky][ix + pw - kx] * w[oc][c][ky][kx]
//
// Stride 1 only, TF32 tensor cores only (FP32 stays on the generic variant). Instead of gathering
// every A element from global memory (25 loads of each dy value for a 5x5 kernel), a block of 64
// consecutive pixels stages, per chunk of 8 output channels, the dy rows its pixels touch (a
// zero-padded slab, each value copied once) and the chunk's weights (a plain contiguous copy,
// 16-byte cp.async when aligned); the MMA fragments are then read from shared memory at
// {pixel offset + tap offset}.
#include "kernels/conv/conv2d.h"
#include "runtime/exec.h"

namespace cnn {

// True when the dedicated kernel handles the shape and precision (TF32, stride 1, KH*KW <= 25,
// shared memory per block within its limit, 32-bit offsets).
bool conv2d_dgrad_dedicated_supported(const Conv2dShape& s, const Exec& ex);

void conv2d_backward_data_dedicated_cuda(const Conv2dShape& s, const float* d_dy, const float* d_w,
                                         float* d_dx, const Exec& ex);

}  // namespace cnn
