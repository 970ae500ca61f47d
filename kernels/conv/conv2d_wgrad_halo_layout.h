#pragma once
// The halo k-tile of the BF16 channels-last weight gradient (conv2d_wgmma_wgrad_halo.cu), as plain
// host code so that it is tested on any machine. For a stride-1 convolution
//   dw[oc][c][ky][kx] = sum over n, oy, ox of dy[n][oc][oy][ox] * x[n][c][oy + ky - ph][ox + kx -
//   pw]
// is a GEMM whose K runs over output pixels. The kernel lays the K of one k-tile out on a row
// pitch of
//   wp = OW + KW - 1 = W + 2 pad_w
// pixels, with both operands loaded as ONE tiled TMA box each of the channels-last copies:
//   dy: `images` x `rows_dy` rows x wp columns from (n0, oy0, 0): columns past OW, rows past OH
//       and images past N lie outside the tensor and are zero filled;
//   x:  `images` x `rows_x` rows x wp columns from (n0, oy0 - pad_h, -pad_w): the input rows the
//       dy rows need, with their halo (zero outside the image).
// Box row r (= pixel (i, j) of image m at r = (m rows + i) wp + j) of dy meets, at filter tap
// (ky, kx), box row r + ky wp + kx of x: so the B operand of every tap is the x box shifted by
// ky wp + kx rows, and one pair of boxes serves all taps. A row of dy that is not an output
// pixel is zero, so what it meets adds nothing. Where a whole image of OH + KH - 1 rows fits in
// `max_k_rows`, a k-tile holds several images (rows_dy = rows_x = OH + KH - 1: the same image
// pitch in both boxes, the dy rows past OH zero); else a band of rows_dy output rows of one.
#include <cstdint>
#include <string>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_halo_layout.h"  // CNN_HALO_HD

namespace cnn {

// The shared memory of the kernel's ring of stages (one block an SM); the epilogue reuses it to
// gather a block's 64 x 64 x 8-tap FP32 tile (128 KB).
constexpr int64_t kWgradHaloRingBytes = 200 * 1024;

struct WgradHaloGeometry {
  int wp = 0;            // row pitch in pixels: OW + KW - 1
  int images = 0;        // images a k-tile: several whole images where they fit, else 1
  int rows_dy = 0;       // dy rows a box (an image's OH + KH - 1, or a band of output rows)
  int rows_x = 0;        // x rows a box: rows_dy, or the band's rows + KH - 1
  int bands = 0;         // k-tiles an image (1 where whole images fit)
  int64_t ktiles = 0;    // k-tiles in all: ceil(N / images) bands
  int k_rows = 0;        // rows a k-tile multiplies: through its last output pixel, to 16s
  int dy_slot_rows = 0;  // 128-byte rows of a dy slot: the box and every row multiplied, to 8s
  int x_slot_rows = 0;   // of an x slot: the box and every row a tap reads, to 8s
  int stages = 0;        // of the ring: as many as kWgradHaloRingBytes holds, 2 to 8
  // A stage: the dy slot then the x slot, each 1024-byte aligned (the swizzle's period).
  int64_t dy_slot_bytes() const { return (int64_t(dy_slot_rows) * 128 + 1023) / 1024 * 1024; }
  int64_t x_slot_bytes() const { return (int64_t(x_slot_rows) * 128 + 1023) / 1024 * 1024; }
  int64_t stage_bytes() const { return dy_slot_bytes() + x_slot_bytes(); }
  int64_t dy_box_bytes() const { return int64_t(images) * rows_dy * wp * 128; }
  int64_t x_box_bytes() const { return int64_t(images) * rows_x * wp * 128; }
};

// Why the halo k-tile of at most max_k_rows rows (a multiple of 16, at most 256) cannot run `s`
// (stride > 1, a pitch above max_k_rows, a box dimension past the TMA's 256, fewer than 2 stages
// in the ring), or "" when it can.
std::string wgrad_halo_refusal(const Conv2dShape& s, int max_k_rows = 128);

// The geometry of `s`; throws cnn::Error (one line naming `what` and the refusal) where it
// cannot run.
WgradHaloGeometry wgrad_halo_geometry(const Conv2dShape& s, const char* what, int max_k_rows = 128);

// The fraction of the multiplied k rows that are output pixels: N OH OW / (ktiles k_rows).
double wgrad_halo_useful_fraction(const Conv2dShape& s, const WgradHaloGeometry& h);

// The k-tile `kt`'s first image and first output row.
struct WgradHaloTileStart {
  int n0 = 0, oy0 = 0;
};
inline WgradHaloTileStart wgrad_halo_tile_start(const WgradHaloGeometry& h, int64_t kt) {
  if (h.bands == 1) return {int(kt * h.images), 0};
  return {int(kt / h.bands), int(kt % h.bands) * h.rows_dy};
}

// The filter taps split among the kernel's blocks and warpgroups: `groups` blocks of taps along
// the grid, each of at most 2 kTapsPerConsumer taps, its taps [first, first + count) split
// between its two consumer warpgroups (the first takes the larger half).
constexpr int kWgradHaloTapsPerConsumer = 4;
struct WgradHaloTaps {
  int groups = 0;
  CNN_HALO_HD int first(int g, int taps) const { return int(int64_t(taps) * g / groups); }
  CNN_HALO_HD int count(int g, int taps) const { return first(g + 1, taps) - first(g, taps); }
};
inline WgradHaloTaps wgrad_halo_taps(int taps) {
  return {(taps + 2 * kWgradHaloTapsPerConsumer - 1) / (2 * kWgradHaloTapsPerConsumer)};
}

}  // namespace cnn
