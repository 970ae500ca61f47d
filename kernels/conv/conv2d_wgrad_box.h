#pragma once
// The k-tile geometry of the wgmma weight gradient whose im2col operand comes by tiled TMA
// (conv2d_wgmma_wgrad.cu, B by boxes), as plain host code so that any machine tests it.
//
// A k-tile is 32 output pixels of one image: a box of br output rows x bw output columns
// (bw * br = 32), boxes covering each image's OH x OW grid row-major (boxes_x across, boxes_y
// down); pixel q = r * bw + col of the k-tile is output pixel (oy0 + r, ox0 + col), a pixel past
// OH or OW is zero in dy (TMA's out-of-bounds fill, or the gather's), so whatever B holds there
// adds nothing. Both operands come as boxes of bw pixels a row, output rows outermost
// (conv2d_wgrad_box_smem.h has the shared-memory layout and the wgmma descriptors):
//   A = dy viewed (OW, OC, OH, N), box (bw, BM, br, 1) at (ox0, m0, oy0, n);
//   B^T = the tap-class copies of x (below) viewed (Wc, C, Hc, R N), boxes of `run` channels
//     at wgrad_box_corner: the copy's row of output pixels for tap (kh, kw) and channels
//     [c0, c0 + run); channels past C are TMA's out-of-bounds zeros.
// The GEMM's columns come in pieces of `run` consecutive channels of one tap (`groups` of them,
// `cgroups` a tap): piece g = tap * cgroups + cg is channels [run cg, run cg + run) of tap
// (kh, kw) = (tap / KW, tap % KW); column run g + i is dw[.][run cg + i][kh][kw] when
// run cg + i < C, else discarded. Column run groups (the first past the pieces) is the bias
// gradient's column of ones. run divides the tile's 128 columns, so a tile holds whole pieces.
//
// Why runs. The H200's TMA unit took ~2.4 us a stage for 16 boxes of 1 KB (one per 8 channels:
// 16 rows of 64 bytes each) while the stage's tensor work is ~0.3 us (Nsight Compute, VGG conv4):
// boxes, not bytes, set the pace. A piece of `run` channels is one box (bw, run, br, 1) where the
// shared-memory layout allows it (conv2d_wgrad_box_smem.h: run 8 or 128, or bw 32), else br
// boxes (bw, run, 1, 1), one a slab: 128 channels at 16x16 are 1 box of B a stage instead of 16.
// wgrad_box_choose_run picks the run (WgradBoxRun below); run 8 is the first layout (one 1 KB
// box per 8-channel group), kept for C of a few channels and for measurement.
//
// Why copies, and why these. Two rules of tiled TMA make a box of x itself unusable:
//   - the innermost coordinate of a load times the element size must be a multiple of 16 bytes
//     (not in the driver's documentation; Hopper raises an illegal instruction otherwise, as
//     reported in triton-lang/triton#7385 and #9112, tile-ai/tilelang#2527 / #2681): a box of x
//     starts at column ox0 sw - pw + kw, e.g. -1 for a 3x3 padding-1 tap, 4 bytes off;
//   - with INTERLEAVE_NONE the traversal stride of dimension 0 is ignored (cuda.h,
//     cuTensorMapEncodeTiled: "TMA doesn't support the stride for dimension zero"), so a stride-2
//     box of x cannot pick every other column.
// So a pre-pass writes, per tap class (qh, qw) = (kh mod sh, kw mod 4 sw), a copy of x indexed
// by output pixel:
//   copy (qh, qw)[n][c][h'][w'] = x[n][c][h' sh + qh - ph][w' sw + qw - pw], 0 outside x,
// h' < Hc = OH + (KH - 1) / sh, w' < Wc = round_up(OW + 4 ((KW - 1) / (4 sw)), 4) (rows of a
// multiple of 16 bytes). Tap (kh, kw) = (qh + sh mh, qw + 4 sw mw) reads its input pixel of
// output (oy, ox) at copy row oy + mh, column ox + 4 mw: a box of the copy at (ox0 + 4 mw,
// oy0 + mh) with unit traversal strides, as the dy box. Its innermost coordinate is a multiple
// of 4 floats (ox0 is a multiple of bw >= 8) and every coordinate is >= 0 (the padding is the
// copy's zeros, not TMA's out-of-bounds fill); only boxes that run past the copy's end (output
// pixels past OH or OW) or past C read TMA's zeros, as the verified TMA loads of dy do. There are
// R = min(KH, sh) min(KW, 4 sw) copies (3 for a 3x3 stride-1 convolution, 7 for a 7x7 stride-2
// stem, whose copies are a quarter of x each), R N C Hc Wc floats in the caller's scratch. A 1x1
// stride-1 unpadded convolution with W a multiple of 4 has one copy equal to x: the boxes read x.
// Likewise, at stride 1 with W a multiple of 4 and pw < copies_w, the class qw = pw (qh = 0) is x
// shifted by ph rows and no column: its boxes read x itself at row oy0 + kh - ph (TMA's zero fill
// is the padding, above x as below it: negative coordinates past the innermost zero-fill on the
// H200, scripts/tma_coordinate_probe.cu, y = -1 and -3) and its copy is not written (the direct
// class: for a 3x3 padding-1 convolution, 2 copies written instead of 3). The launcher does so
// where x is 16-byte aligned; the copy's room in the scratch stays, so its size depends on the
// shape alone.
//
// The driver's other rules (cuda.h, cuTensorMapEncodeTiled): boxDim[0] * 4 bytes at most the
// swizzle span (the span is bw * 4 bytes: 32B, 64B, 128B swizzle) and a multiple of 16 (bw a
// multiple of 4); global strides multiples of 16 bytes (Wc a multiple of 4). bw is the smallest
// of 8, 16, 32 that covers OW.
#include <cstdint>
#include <string>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_wgrad_box_smem.h"

namespace cnn {

constexpr int kWgradBoxPixels = 32;  // pixels per k-tile: one 128-byte row of fp32
// The run of channels a piece of B (a box, or br boxes) holds: 8, 16, 32, 64 or 128 forced, or
// kWgradBoxRunAuto: wgrad_box_choose_run's pick.
constexpr int kWgradBoxRunAuto = 0;

struct WgradBoxGeometry {
  int bw = 32, br = 1;           // box: output columns x output rows, bw * br = 32
  int boxes_x = 0, boxes_y = 0;  // boxes per image across and down
  int kt_img = 0;                // boxes_x * boxes_y: k-tiles per image
  int run = 8;                   // channels a piece (file comment)
  WgradBoxBLayout b;             // how B's boxes of a piece land (conv2d_wgrad_box_smem.h)
  int b_boxes = 0;               // boxes of B a stage of a full tile
  int cgroups = 0;               // ceil(C / run): pieces a tap
  int taps = 0;                  // KH * KW
  int groups = 0;                // taps * cgroups: pieces of run columns loaded by TMA
  int bias_col = 0;              // run * groups: the column of ones for db
  // The tap-class copies of x (file comment): copy q = qh * copies_w + qw of image n is plane
  // q N + n of the (Wc, C, Hc, R N) view.
  int copies_h = 1, copies_w = 1;  // min(KH, sh), min(KW, 4 sw)
  int copies = 1;                  // R = copies_h * copies_w
  int copy_h = 0, copy_w = 0;      // Hc, Wc
  bool reads_x = false;            // the one copy would equal x: the boxes read x, no pre-pass
  // The class whose copy is x shifted by whole rows and by 0 columns (stride 1, qw = pw, W a
  // multiple of 4: the direct class below), -1 if none: its boxes may read x itself.
  int direct_copy = -1;
  int64_t copy_floats = 0;  // R N C Hc Wc, 0 when reads_x: scratch floats of the copies
};

// Why the box geometry cannot express this convolution (a copy or the number of boxes past the
// 32-bit indices), or "" when it can. Pointer alignment is the launcher's (conv2d_wgmma_wgrad.cu).
std::string wgrad_box_refusal(const Conv2dShape& s);

// The run wgrad_box_geometry takes for kWgradBoxRunAuto, of 8, 16, 32, 64, 128. The rule: the
// fewest boxes of B a stage among the runs whose columns (taps * run * ceil(C / run); channels
// past C are zero columns the tensor cores multiply) are at most a quarter more than run 8's,
// ties to the narrower run. Where at least 3/4 of the boxes' pixels lie inside the output, a
// cost model overrides the rule when it predicts at least 7% less: column tiles of 128 x
// (100 + 6 x boxes of B a stage), fitted to 19 layers timed at runs 32, 64 and 128 (H100,
// docs/performance.md "The run of channels by a cost model"). So C >= 128 (or 100) takes 128,
// C = 64 takes 64, C = 3 or 24 keep 8, and C = 96 or 160 at 8x8 take 128 (160 at 8x8: 91.8 us
// against 103.6 at the rule's 64).
int wgrad_box_choose_run(const Conv2dShape& s);

// Boxes of B a stage of a full tile for run `run` at box width bw.
int wgrad_box_b_boxes(int bw, int run);

// Throws cnn::Error naming the reason when wgrad_box_refusal(s) is not empty, or `run` is none of
// kWgradBoxRunAuto, 8, 16, 32, 64, 128.
WgradBoxGeometry wgrad_box_geometry(const Conv2dShape& s, int run = kWgradBoxRunAuto);

// The output pixel at the box's corner for k-tile `t` of an image (t < kt_img).
struct WgradBoxOrigin {
  int ox0, oy0;
};
inline WgradBoxOrigin wgrad_box_origin(const WgradBoxGeometry& g, int t) {
  const int by = t / g.boxes_x, bx = t - by * g.boxes_x;
  return {bx * g.bw, by * g.br};
}

// B's box of piece `group` at `origin` (the first of them where a piece is br boxes: box r is
// r rows on): column x and row y of the copy, first channel c, copy; the box's coordinates in
// the (Wc, C, Hc, R N) view are (x, c, y, copy * N + image). With `direct` and a tap of the
// direct class (g.direct_copy), the box reads x itself instead: copy -1, coordinates (x, c, y,
// image) in x viewed (W, C, H, N), y = oy0 + kh - ph (negative in the top padding rows, which
// TMA fills with zeros as it does past the bottom; x is the copy's column 0 there, so x and
// its innermost coordinate, a multiple of 4, are the copy's).
struct WgradBoxCorner {
  int x, y, c, copy;
};
inline WgradBoxCorner wgrad_box_corner(const Conv2dShape& s, const WgradBoxGeometry& g,
                                       WgradBoxOrigin origin, int group, bool direct = false) {
  const int tap = group / g.cgroups, cg = group - tap * g.cgroups;
  const int kh = tap / s.kw, kw = tap - kh * s.kw;
  const int qh = kh % g.copies_h, qw = kw % g.copies_w;  // the tap's class
  const int copy = qh * g.copies_w + qw;
  // copies_w = 4 sw whenever kw >= copies_w (the file comment's mw > 0); likewise copies_h.
  const int x = origin.ox0 + 4 * (kw / g.copies_w), y = origin.oy0 + kh / g.copies_h;
  if (direct && copy == g.direct_copy) return {x, y - s.pad_h, cg * g.run, -1};
  return {x, y, cg * g.run, copy};
}

// Where column `col` of the GEMM lands: dw's index (oc * C*KH*KW + this), -1 for the bias
// column, -2 for a discarded column (a channel past C, or past the bias column).
int64_t wgrad_box_column_slot(const Conv2dShape& s, const WgradBoxGeometry& g, int col);

// CPU twin of the pre-pass: writes all g.copy_floats floats of the copies (R, N, C, Hc, Wc) of
// x (N, C, H, W) (nothing when g.reads_x), except copy `skip` (the direct class when its boxes
// read x; -1: none), whose floats it leaves as they are.
void wgrad_box_copies_cpu(const Conv2dShape& s, const WgradBoxGeometry& g, const float* x,
                          float* copies, int skip = -1);

// Emulations of the hardware for the CPU model and tests, as measured on the H200 and as the PTX
// ISA documents:
// Byte offset, from an atom-aligned destination, at which a tiled TMA box with 32-bit elements
// lands its element (box row `row`, counting all dimensions past the innermost as one row index,
// innermost first; column `col`) with rows of `row_floats` and swizzle span `span` bytes (0: no
// swizzle): a row narrower than the span takes the whole span, then the swizzle.
uint32_t tma_box_landing_offset(int row_floats, uint32_t span, int row, int col);
// The shared-memory address a wgmma reads for element (row, k), k < 8, of a K-major TF32 operand
// through a swizzled descriptor (the canonical layouts of the PTX ISA, "Shared Memory Matrix
// Layout": rows span bytes apart in 8-row core-matrix groups SBO apart, then the swizzle on the
// address). Refuses (cnn::Error) a descriptor without swizzle.
uint32_t wgmma_kmajor_read_address(uint64_t desc, int row, int k);

// The kernel's tile rows for this shape: 64 when OC <= 64, else 128.
inline int wgrad_box_bm(const Conv2dShape& s) {
  return s.oc <= 64 ? 64 : 128;
}

// CPU model of the whole scheme: dw, db accumulated k-tile by k-tile the way the kernel's
// operands reach the tensor cores: the copies of x written by wgrad_box_copies_cpu; per k-tile and
// BM x 128 tile, a stage of shared memory (poisoned with NaN) into which the TMA boxes land as
// tma_box_landing_offset says (out-of-bounds zeros included) and the constant columns are
// written as the kernel writes them; the operands read back through the kernel's descriptors
// (conv2d_wgrad_box_smem.h) as wgmma_kmajor_read_address says; the columns mapped back by
// wgrad_box_column_slot; accumulated in double. For tests.
// `direct`: the direct class's boxes read x (wgrad_box_corner), its copy is not written.
void wgrad_box_model_cpu(const Conv2dShape& s, const float* x, const float* dy, float* dw,
                         float* db, int run = kWgradBoxRunAuto, bool direct = true);

}  // namespace cnn
