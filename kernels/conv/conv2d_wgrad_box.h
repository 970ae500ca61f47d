#pragma once
// The k-tile geometry of the wgmma weight gradient whose im2col operand comes by tiled TMA
// (conv2d_wgmma_wgrad.cu, B by boxes), as plain host code so that any machine tests it.
//
// A k-tile is 32 output pixels of one image: a box of br output rows x bw output columns
// (bw * br = 32), boxes covering each image's OH x OW grid row-major (boxes_x across, boxes_y
// down); pixel q = r * bw + col of the k-tile is output pixel (oy0 + r, ox0 + col), a pixel past
// OH or OW is zero in both operands (TMA's out-of-bounds fill). Both operands land in shared
// memory as rows of 32 pixels in that order:
//   A = dy viewed (OW, OH, OC, N), box (bw, br, BM, 1) at (ox0, oy0, m0, n);
//   B^T = x viewed (W, H, C, N), box (bw sw, br sh, 8, 1), traversal strides (sw, sh, 1, 1), at
//     (ox0 sw - pw + kw, oy0 sh - ph + kh, c0, n) for tap (kh, kw) and channels [c0, c0 + 8):
//     input pixel (ox sw - pw + kw, oy sh - ph + kh) of each output pixel, zero outside x
//     (the padding) and for channels past C.
// The GEMM's columns come in groups of 8 (one box of B each): group g = tap * cgroups + cg is
// channels [8 cg, 8 cg + 8) of tap (kh, kw) = (tap / KW, tap % KW); column 8 g + i is
// dw[.][8 cg + i][kh][kw] when 8 cg + i < C, else discarded. Column 8 groups (the first past
// the groups) is the bias gradient's column of ones.
//
// The driver's rules shape it (cuda.h, cuTensorMapEncodeTiled): TMA loads ceil(boxDim /
// elementStride) elements, so B's inner box dimension is bw sw; with the 128-byte swizzle that
// dimension's bytes (boxDim[0] * 4, counted before striding) may not exceed 128, so bw sw <= 32
// (bw <= 16 at stride 2, 8 at stride 3 or 4; stride > 4 refused); and boxDim[0] * 4 must be a
// multiple of 16 (bw sw a multiple of 4). bw is the smallest of 8, 16, 32 that covers OW, at
// most that cap.
#include <cstdint>
#include <string>

#include "kernels/conv/conv2d.h"

namespace cnn {

constexpr int kWgradBoxPixels = 32;   // pixels per k-tile: one 128-byte row of fp32
constexpr int kWgradBoxChannels = 8;  // channels per B box: one 8-row swizzle group

struct WgradBoxGeometry {
  int bw = 32, br = 1;           // box: output columns x output rows, bw * br = 32
  int boxes_x = 0, boxes_y = 0;  // boxes per image across and down
  int kt_img = 0;                // boxes_x * boxes_y: k-tiles per image
  int cgroups = 0;               // ceil(C / 8)
  int taps = 0;                  // KH * KW
  int groups = 0;                // taps * cgroups: 8-column groups loaded by TMA
  int bias_col = 0;              // 8 * groups: the column of ones for db
};

// Why the box geometry cannot express this convolution (a stride above 4), or "" when it can.
// Pointer alignment and the 16-byte stride rules are the launcher's (conv2d_wgmma_wgrad.cu).
std::string wgrad_box_refusal(const Conv2dShape& s);

// Throws cnn::Error naming the reason when wgrad_box_refusal(s) is not empty.
WgradBoxGeometry wgrad_box_geometry(const Conv2dShape& s);

// The output pixel at the box's corner for k-tile `t` of an image (t < kt_img).
struct WgradBoxOrigin {
  int ox0, oy0;
};
inline WgradBoxOrigin wgrad_box_origin(const WgradBoxGeometry& g, int t) {
  const int by = t / g.boxes_x, bx = t - by * g.boxes_x;
  return {bx * g.bw, by * g.br};
}

// The coordinates (innermost first: x, y, channel) of B's box for group `group` at `origin`.
struct WgradBoxCorner {
  int x, y, c;
};
inline WgradBoxCorner wgrad_box_corner(const Conv2dShape& s, const WgradBoxGeometry& g,
                                       WgradBoxOrigin origin, int group) {
  const int tap = group / g.cgroups, cg = group - tap * g.cgroups;
  const int kh = tap / s.kw, kw = tap - kh * s.kw;
  return {origin.ox0 * s.stride_w - s.pad_w + kw, origin.oy0 * s.stride_h - s.pad_h + kh,
          cg * kWgradBoxChannels};
}

// Where column `col` of the GEMM lands: dw's index (oc * C*KH*KW + this), -1 for the bias
// column, -2 for a discarded column (a channel past C, or past the bias column).
int64_t wgrad_box_column_slot(const Conv2dShape& s, const WgradBoxGeometry& g, int col);

// CPU model of the whole scheme: dw, db accumulated k-tile by k-tile the way the kernel's
// operands hold them (the TMA boxes emulated element by element, with their out-of-bounds
// zeros, and the columns mapped back by wgrad_box_column_slot), in double. For tests.
void wgrad_box_model_cpu(const Conv2dShape& s, const float* x, const float* dy, float* dw,
                         float* db);

}  // namespace cnn
