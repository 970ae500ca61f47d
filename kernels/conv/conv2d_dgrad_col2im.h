#pragma once
// Input gradient of the dense convolution as one GEMM on explicit copies and a col2im gather
// (conv2d_dgrad_col2im.cu), for layers of few output pixels a plane and many channels: there the
// implicit GEMMs split each image's few dx pixels into phases and tiles that leave most of the
// SMs idle (ResNet-18's stride-2 conv16, 256 -> 512 channels, 8x8 -> 4x4, batch 128: 135 us on
// the best of them, H100, for a 4.8 GFLOP pass). Each call:
//   1. writes, in one launch, channels-last copies of dy and w (OC the fast index, row stride
//   conv2d_dgrad_col2im_ld_oc):
//        dyt[n*OH*OW + p][oc] = dy[n][oc][p],   wt[(c, kh, kw)][oc] = w[oc][c][kh][kw];
//   2. cols (C*KH*KW rows of K = N*OH*OW, row stride conv2d_dgrad_col2im_ld_pix) = wt dyt^T on
//   the wgmma GEMM (gemm_wgmma.h: both operands K-major by TMA; TF32, 3xTF32 at FP32, or BF16
//   operands rounded by its producer; its split groups in the rest of the scratch):
//        cols[(c, kh, kw)][n*OH*OW + p] = sum over oc of w[oc][c][kh][kw] dy[n][oc][p];
//   3. dx[n][c][iy][ix] = the sum, over the taps (kh, kw) whose output pixel (oy, ox) with
//   iy = oy*sh - ph + kh, ix = ox*sw - pw + kw lies in the plane, of cols[(c, kh, kw)][n, oy, ox]
//   (one thread a dx element, the taps in a fixed order): dx overwritten, as
//   conv2d_backward_data's contract says.
// No atomics anywhere: bitwise repeatable.
// Refused (cnn::Error naming why, so that autotune leaves it out and the caller falls back): a
// dilated or grouped shape, more than kDgradCol2imMaxPixels output pixels a plane (cols is KH*KW
// output-sized planes a channel; on larger planes the implicit GEMMs fill the GPU), scratch past
// kDgradCol2imMaxFloats, no wgmma GEMM on this device.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/conv/conv2d.h"
#include "runtime/exec.h"

namespace cnn {

// The copies live in the network's scratch, which every layer shares: 128 MB at most (ResNet-18's
// stride-2 conv16 at batch 128 takes 28 MB, its 512-channel 4x4 layers 51 MB).
inline constexpr int64_t kDgradCol2imMaxFloats = int64_t{1} << 25;
inline constexpr int kDgradCol2imMaxPixels = 256;  // output pixels a plane: 16x16

// Why this shape cannot run (see above; every precision can), or "" when it can. Host code.
std::string conv2d_dgrad_col2im_refusal(const Conv2dShape& s);

// The row stride of the channels-last copies dyt and wt: OC rounded up to 4 floats (16 bytes,
// for TMA); and that of cols: N*OH*OW rounded up to 4.
int64_t conv2d_dgrad_col2im_ld_oc(const Conv2dShape& s);
int64_t conv2d_dgrad_col2im_ld_pix(const Conv2dShape& s);

// Scratch floats of one call (0 where refused): the three copies, each rounded up to 16 bytes,
// then the GEMM's split-group workspace.
std::size_t conv2d_dgrad_col2im_scratch_floats(const Conv2dShape& s, const Exec& ex);

// dx = the input gradient. d_scratch: conv2d_dgrad_col2im_scratch_floats(s, ex) floats, 16-byte
// aligned. Throws cnn::Error with the refusal's reason when it is not empty.
void conv2d_backward_data_col2im(const Conv2dShape& s, const float* d_dy, const float* d_w,
                                 float* d_dx, float* d_scratch, const Exec& ex);

// Steps 1 and 3 alone on the device (d_dyt: N*OH*OW rows and d_wt: C*KH*KW rows, both of stride
// conv2d_dgrad_col2im_ld_oc, the columns past OC left as they are; d_cols: C*KH*KW rows of stride
// conv2d_dgrad_col2im_ld_pix), and their CPU twins; for tests.
void conv2d_dgrad_col2im_copies_cuda(const Conv2dShape& s, const float* d_dy, const float* d_w,
                                     float* d_dyt, float* d_wt, cudaStream_t stream);
void conv2d_dgrad_col2im_copies_cpu(const Conv2dShape& s, const float* dy, const float* w,
                                    float* dyt, float* wt);
void conv2d_dgrad_col2im_gather_cuda(const Conv2dShape& s, const float* d_cols, float* d_dx,
                                     cudaStream_t stream);
void conv2d_dgrad_col2im_gather_cpu(const Conv2dShape& s, const float* cols, float* dx);

}  // namespace cnn
