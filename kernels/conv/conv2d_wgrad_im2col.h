#pragma once
// Weight gradient of the dense convolution as one GEMM on explicit copies
// (conv2d_wgrad_im2col.cu), for layers of few output pixels a plane and many channels: there the
// implicit GEMMs' k-tiles (32 output pixels of one image) are half padding or more and their
// grids of 128 x 128 tiles run in two waves (ResNet-18's 512-channel 4x4 layers at batch 128:
// 183 us on mma.sync, 390 on the wgmma kernel, H100). Each call:
//   1. writes, in one launch, cols (C*KH*KW rows of K = N*OH*OW, row stride
//   conv2d_wgrad_im2col_ld):
//        cols[(c, kh, kw)][n*OH*OW + p] = x[n][c][p's tap (kh, kw)], 0 in the padding,
//      and dyk (OC rows, the same stride): dyk[oc][n*OH*OW + p] = dy[n][oc][p];
//   2. where db is given, db[oc] += the sum of row oc of dyk (one block a row, a fixed order);
//   3. dw (OC, C*KH*KW) += dyk cols^T on the wgmma GEMM (gemm_wgmma.h: both operands K-major by
//      TMA; TF32, 3xTF32 at FP32, or BF16 operands rounded by its producer; its split groups in
//      the rest of the scratch).
// No atomics anywhere: bitwise repeatable in both reduction modes.
// Refused (cnn::Error naming why, so that autotune leaves it out and the caller falls back): a
// dilated or grouped shape, more than kWgradIm2colMaxPixels output pixels a plane (the copies are
// KH*KW times x; their traffic outweighs the padding saved on larger planes), copies past
// kWgradIm2colMaxFloats, no wgmma GEMM on this device.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/conv/conv2d.h"
#include "runtime/exec.h"

namespace cnn {

// The copies live in the network's scratch, which every layer shares: 128 MB at most (ResNet-18's
// 256-channel 8x8 layers at batch 128 take 84 MB, its 512-channel 4x4 ones 42 MB).
inline constexpr int64_t kWgradIm2colMaxFloats = int64_t{1} << 25;
inline constexpr int kWgradIm2colMaxPixels = 256;  // output pixels a plane: 16x16

// Why this shape cannot run (see above; every precision can), or "" when it can. Host code.
std::string conv2d_wgrad_im2col_refusal(const Conv2dShape& s);

// The row stride of both copies: N*OH*OW rounded up to 4 floats (16 bytes, for TMA).
int64_t conv2d_wgrad_im2col_ld(const Conv2dShape& s);

// Scratch floats of one call (0 where refused): the two copies, each rounded up to 16 bytes
// (staged_scratch.h), then the GEMM's split-group workspace.
std::size_t conv2d_wgrad_im2col_scratch_floats(const Conv2dShape& s, const Exec& ex);

// dw += the weight gradient; db (unless null) += the bias gradient. d_scratch:
// conv2d_wgrad_im2col_scratch_floats(s, ex) floats, 16-byte aligned. Throws cnn::Error with the
// refusal's reason when it is not empty.
void conv2d_backward_weight_im2col(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                   float* d_dw, float* d_db, float* d_scratch, const Exec& ex);

// Step 1 alone on the device (d_cols: C*KH*KW rows, d_dyk: OC rows, both of stride
// conv2d_wgrad_im2col_ld; the columns past N*OH*OW are left as they are), and its CPU twin; for
// tests.
void conv2d_wgrad_im2col_copies_cuda(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                     float* d_cols, float* d_dyk, cudaStream_t stream);
void conv2d_wgrad_im2col_copies_cpu(const Conv2dShape& s, const float* x, const float* dy,
                                    float* cols, float* dyk);

}  // namespace cnn
