#pragma once
// The channels-last view of a convolution that the Hopper TMA im2col kernel
// (conv2d_wgmma_nhwc.h) runs on, as plain host code so that it is tested on any machine:
//   - the im2col tensor map's geometry (bounding-box corners, traversal strides, padded channels)
//     computed from a Conv2dShape, and a model of the traversal the TMA walks with it;
//   - the CPU twins of the two pre-pass kernels: NCHW activations into a zero-padded NHWC copy,
//     and the weights into (rows, KH, KW, K padded) K-major rows, both rounded to TF32 (32
//     channels a 128-byte row) or to BF16 (64 channels a row, stored as the bf16 bit patterns);
//     for 3xTF32 (FP32 accuracy), the copy unrounded and the weights as two TF32 packs whose sum
//     is the weight.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"

namespace cnn {

#if defined(__CUDACC__)
#define CNN_NHWC_HD __host__ __device__
#else
#define CNN_NHWC_HD
#endif

constexpr int kNhwcChannelBlock = 32;      // fp32 channels per 128-byte swizzle row = one k-tile
constexpr int kNhwcChannelBlockBf16 = 64;  // bf16 channels per 128-byte swizzle row

// How cuTensorMapEncodeIm2col and the im2col copies see one convolution `g` (a GEMM view: for the
// input gradient, the convolution of dy with the flipped weights, padding KH-1-ph, possibly
// negative). The tensor is (N, H, W, c_pad) channels-last. A TMA im2col copy starts at a pixel
// (x, y, n) inside the bounding box, loads channels [c, c + 32) of pixel (x + kx, y + ky, n) (zero
// outside the tensor), then steps x by stride_w; past the box's right edge x returns to its left
// edge and y steps by stride_h; past its bottom edge y returns to the top and n steps by one.
// The box is the set of the filter's top-left input pixels (tap (0, 0)), one per output pixel:
//   x in [-pad_w, (OW - 1) stride_w - pad_w], y in [-pad_h, (OH - 1) stride_h - pad_h],
// so traversal order = output-pixel order m = (n, oy, ox) and a 128-row tile starting at m0 is
// one copy per (tap, 32 channels). The driver takes the box as offsets from the tensor's corners:
//   pixelBoxLowerCorner = {lower_w, lower_h} = {-pad_w, -pad_h}             (from (0, 0))
//   pixelBoxUpperCorner = {upper_w, upper_h} = {(OW-1) stride_w - pad_w - (W-1), ...}
//                                                                  (from (W - 1, H - 1))
// (arrays innermost dimension first, like globalDim), elementStrides = {1, stride_w, stride_h, 1},
// and the copy's im2col offsets are the tap (kx, ky), dilated: (dil_w kx, dil_h ky). The box is
// the same at any dilation (OW, OH are the dilated convolution's); only the offsets stretch.
// A grouped convolution (g.groups > 1) reads a group-major copy, (G, N, H, W, c_pad) as
// G N images of c_pad = C/G rounded up channels (nhwc_copy_image); group g's walk starts g N
// images in.
struct Im2colGeometry {
  int lower_w = 0, lower_h = 0, upper_w = 0, upper_h = 0;
  int stride_w = 1, stride_h = 1;
  int dil_w = 1, dil_h = 1;  // the taps' spacing: im2col offsets (dil_w kx, dil_h ky)
  int c_pad = 0;             // channels of the NHWC copy: C/G rounded up to the channel block
  int chunks = 0;  // c_pad / channel block
  int taps = 0;    // kh * kw
  int ktiles = 0;  // taps * chunks: k ordered (tap, channel), channel innermost
};

// Throws cnn::Error (one line, naming `what`) where the TMA cannot express the convolution: a
// corner outside [-128, 127] (4-D im2col maps), a stride above 8, a tap more than 127 pixels
// from the window's corner (dilation x (kernel - 1)). channel_block: the channels of
// one k-tile, kNhwcChannelBlock (TF32) or kNhwcChannelBlockBf16.
Im2colGeometry im2col_geometry(const Conv2dShape& g, const char* what,
                               int channel_block = kNhwcChannelBlock);
// The same for an output of oh x ow pixels that is not g.oh() x g.ow(): the box ends where the
// last of them reads (a phase of a strided input gradient, below, whose rows need not match
// g's symmetric padding).
Im2colGeometry im2col_geometry(const Conv2dShape& g, int oh, int ow, const char* what,
                               int channel_block = kNhwcChannelBlock);

struct Im2colPixel {
  int n, y, x;
};
// The pixel where the copy for the tile starting at output pixel m0 starts (tap (0, 0)).
Im2colPixel im2col_start(const Conv2dShape& g, const Im2colGeometry& geo, int64_t m0);
// The pixel of row `steps` of a copy started at `start`: the traversal above, written as the
// hardware walks it (one step at a time, wrapping at the corners), not from the conv formula.
Im2colPixel im2col_walk(const Conv2dShape& g, const Im2colGeometry& geo, Im2colPixel start,
                        int steps);

// Round to the nearest TF32 (10 stored mantissa bits), ties away from zero: cvt.rna.tf32.f32.
float round_tf32_cpu(float v);

// The bf16 bit pattern of round_to_bf16(v) (kernels/common/bf16_round.h: nearest, ties to even,
// what cvt.rn.bf16.f32 gives), the upper half of the rounded float.
uint16_t bf16_bits_cpu(float v);

// A grouped convolution's copy is group-major: group g of image i is image nhwc_copy_image(i G +
// g, n, G) = g n + i of the copy, so that the im2col walk of one group's output pixels steps
// from image to image within the group.
CNN_NHWC_HD inline int nhwc_copy_image(int i, int n, int groups) {
  return i % groups * n + i / groups;
}

// CPU twin of the activation pre-pass: x (n, c, hw) into out (n, hw, c_pad), channels >= c zero.
// groups > 1: x (n, groups c, hw) into out (groups, n, hw, c_pad), c channels a group.
void nchw_to_nhwc_tf32_cpu(const float* x, int n, int c, int64_t hw, int c_pad, float* out,
                           int groups = 1);
// The same rounded to BF16 (c_pad a multiple of 64 in the kernel), as bf16 bit patterns.
void nchw_to_nhwc_bf16_cpu(const float* x, int n, int c, int64_t hw, int c_pad, uint16_t* out,
                           int groups = 1);
// The same unrounded (the 3xTF32 kernel splits the values itself, after loading them).
void nchw_to_nhwc_fp32_cpu(const float* x, int n, int c, int64_t hw, int c_pad, float* out,
                           int groups = 1);
// The split for 3xTF32 at two blocks an SM: big = the TF32 copy, small = round_tf32(x - big) at
// the same place (zero in the padding).
void nchw_to_nhwc_tf32_split_cpu(const float* x, int n, int c, int64_t hw, int c_pad, float* big,
                                 float* small, int groups = 1);

// The input gradient's tap order along one axis (kernel k, stride s, padding p): the taps of
// phase 0 of the strided input gradient (conv2d_dgrad_phase.h: first, first + s, ...) last to
// first, then phase 1's, and so on; pack position i holds the returned tap. At stride 1 there
// is one phase and this is the plain flip, k - 1 - i. Each phase's taps are then one run of
// positions, flipped as the stride-1 convolution of dy that computes the phase reads them.
CNN_NHWC_HD inline int phase_flipped_tap(int i, int k, int s, int p) {
  int start = 0;
  for (int ph = 0; ph < s; ++ph) {
    const int first = (ph + p) % s;
    const int taps = k > first ? (k - first + s - 1) / s : 0;
    if (i < start + taps) return first + s * (taps - 1 - (i - start));
    start += taps;
  }
  return -1;  // i >= k
}

// CPU twin of the weight pre-pass: out (rows, taps, k_pad), element (r, t, k) =
//   k < k_count ? round_tf32(w[weight_pack_source(r, k, t)]) : 0, the source
//   (r / R) ld_g + (r % R) ld_r + k ld_k + weight_pack_tap(t), R = rows_per_group.
// The forward: rows = OC, k = input channel of the group (C/G of them), ld_r = C/G taps,
// ld_k = taps, no flip, one group of rows (row r is output channel r of w itself).
// The input gradient: rows = C, k = output channel of the group (OC/G), ld_r = taps,
// ld_k = C/G taps, R = C/G rows a group (row r reads group r / R's output channels), ld_g =
// OC/G C/G taps, flip: pack tap t = (i, j) of the kh x kw grid (t = i kw + j) holds tap
// (phase_flipped_tap(i, kh, stride_h, pad_h), phase_flipped_tap(j, kw, stride_w, pad_w)).
struct WeightPack {
  int rows = 0, taps = 0, k_count = 0, k_pad = 0;
  int64_t ld_r = 0, ld_k = 0;
  int rows_per_group = 0;  // 0: all rows one group
  int64_t ld_g = 0;
  bool flip = false;
  int kh = 1, kw = 1;                                    // the tap grid (taps = kh kw)
  int stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;  // flip's phase order
};
// The source tap (ky kw + kx of the weights) of pack tap t.
CNN_NHWC_HD inline int weight_pack_tap(const WeightPack& wp, int t) {
  if (!wp.flip) return t;
  const int i = t / wp.kw, j = t - i * wp.kw;
  return phase_flipped_tap(i, wp.kh, wp.stride_h, wp.pad_h) * wp.kw +
         phase_flipped_tap(j, wp.kw, wp.stride_w, wp.pad_w);
}
int64_t weight_pack_source(const WeightPack& wp, int r, int k, int t);
// k_block: k_pad is k_count rounded up to it (kNhwcChannelBlock, or kNhwcChannelBlockBf16).
WeightPack forward_weight_pack(const Conv2dShape& s, int k_block = kNhwcChannelBlock);
WeightPack backward_data_weight_pack(const Conv2dShape& s, int k_block = kNhwcChannelBlock);
void pack_weights_tf32_cpu(const WeightPack& wp, const float* w, float* out);
// The same rounded to BF16, as bf16 bit patterns.
void pack_weights_bf16_cpu(const WeightPack& wp, const float* w, uint16_t* out);
// The split for 3xTF32: big = the TF32 pack above, small = round_tf32(w - big) at the same place
// (zero in the padding), so that big + small holds w to about 22 bits.
void pack_weights_tf32_split_cpu(const WeightPack& wp, const float* w, float* big, float* small);

// The input gradient as the GEMM view above: the convolution of dy (N, OC, OH, OW) with the
// flipped weights, stride 1, the same dilation d and groups, padding d (KH-1) - ph (x d (KW-1) -
// pw), giving dx (N, C, H, W). At stride 1 it is the whole input gradient; at larger strides it
// gives the copy's and the pack's sizes, and the phases below are what runs.
Conv2dShape backward_data_as_forward(const Conv2dShape& s);

// One phase (py, px) of a strided input gradient as the kernel runs it: the stride-1
// convolution of dy (N, OC, OH, OW) with the phase's ty x tx taps (conv2d_dgrad_phase.h), whose
// output pixel (qy, qx) is dx's pixel (py + stride_h qy, px + stride_w qx). Its B operand is the
// input gradient's pack (backward_data_weight_pack, phase-ordered): tap (u, v) of the phase is
// pack tap (tap_y0 + u) kw + tap_x0 + v.
struct NhwcDgradPhase {
  int py = 0, px = 0;
  int oh = 0, ow = 0;          // the phase's pixels a column / a row of dx
  int ty = 0, tx = 0;          // its taps; 0: its pixels of dx are zero
  int tap_y0 = 0, tap_x0 = 0;  // its first tap's row and column in the pack's tap grid
  Conv2dShape g;               // n, c = OC, h = OH, w = OW, oc = C, kh = ty, kw = tx, groups
  Im2colGeometry geo;          // for an oh x ow output (when ty, tx > 0)
};
// Why wgmma-nhwc does not run s's input gradient ("" where it does): a strided one with
// dilation.
std::string nhwc_input_gradient_refusal(const Conv2dShape& s);
// The phases of s (stride above 1, dilation 1) that have pixels, py-major. Throws naming `what`
// where the TMA cannot express one (im2col_geometry's refusals).
std::vector<NhwcDgradPhase> nhwc_dgrad_phases(const Conv2dShape& s, const char* what,
                                              int channel_block = kNhwcChannelBlock);

}  // namespace cnn
