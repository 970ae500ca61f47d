#pragma once
// The k-tile of the TF32 halo weight gradient (conv2d_wgmma_wgrad_tf32_halo.cu), as plain host
// code so that it is tested on any machine. For a stride-1 convolution
//   dw[oc][c][ky][kx] = sum over n, oy, ox of dy[n][oc][oy][ox] x[n][c][oy + ky - ph][ox + kx - pw]
// is the GEMM dw^T (M = (tap, c), N = oc) += A (M, K) B (K, N), K = output pixels. TF32 wgmma
// reads shared-memory operands K-major only, so a tap's shift of K (one pixel, 4 bytes) cannot be
// a descriptor offset: A (x) comes from registers instead, each thread loading its fragment at the
// tap's offset, and one x tile in shared memory serves every tap. B (dy) is K-major as NCHW holds
// it: tiled TMA boxes of 32 pixels x 64 output channels, straight from the FP32 dy.
//
// A k-tile is `rows` consecutive output rows of one image (rows OW <= 64 pixels), k = r OW + col. Its x tile is ONE tiled TMA box of the FP32 NCHW x itself:
// rows_x input rows from oy0 - pad_h, `pitch` columns from 0, 64 channels, landing as
// x_slot[c][i][j] (c pitch `chan_stride` = rows_x pitch floats). The pitch runs past W, and those
// columns lie outside the tensor and are zero filled: so the column -p of a row, which A reads as
// the float p before the row's start, is the previous row's (or channel's, or the slot's zeroed
// guard's) column pitch - p >= W, a zero. Tap (ky, kx) of pixel k reads
//   x_slot[c][r + ky][col + kx - pad_w] = chan_stride c + pixel_offset(k) + tap_offset(ky, kx).
// pitch / 4 and rows_x are odd, so chan_stride / 4 is: the 8 channels of a fragment load (lanes
// l / 4) then start on 8 different 4-bank groups and its 4 pixels (lanes l % 4) on consecutive
// banks, no conflict.
#include <cstdint>
#include <string>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_halo_layout.h"  // CNN_HALO_HD
#include "runtime/exec.h"

namespace cnn {

// The most shared memory the ring takes (one block an SM, 227 KB its limit).
constexpr int64_t kWgradTf32HaloRingBytes = 216 * 1024;
// The zeroed floats before each x tile: the reads of column -pad_w of its first row land there.
constexpr int kWgradTf32HaloGuardFloats = 32;

struct WgradTf32HaloGeometry {
  int rows = 0;         // output rows a k-tile
  int k = 0;            // pixels a k-tile: rows OW (a multiple of 8, at most 64)
  int ksteps = 0;       // k / 8
  int dy_boxes = 0;     // 32-pixel dy boxes a k-tile: ceil(k / 32)
  int bands = 0;        // k-tiles an image: ceil(OH / rows)
  int64_t ktiles = 0;   // N bands
  int pitch = 0;        // x tile row pitch (floats): W + pad_w at least, a multiple of 4, odd / 4
  int rows_x = 0;       // x tile rows: rows + KH - 1, odd
  int chan_stride = 0;  // rows_x pitch
  int stages = 0;       // of the ring
  int64_t x_box_bytes() const { return int64_t(64) * chan_stride * 4; }
  // The x slot: the guard, then the box, to 1024 bytes (the dy slot after it is swizzled).
  int64_t x_slot_bytes() const {
    return (kWgradTf32HaloGuardFloats * 4 + x_box_bytes() + 1023) / 1024 * 1024;
  }
  int64_t dy_box_bytes() const { return int64_t(dy_boxes) * 64 * 128; }
  int64_t stage_bytes() const { return x_slot_bytes() + dy_box_bytes(); }
  // Float offset of k-tile pixel k (row k / OW, column k % OW) in a channel of the x tile.
  CNN_HALO_HD int pixel_offset(int kk, int ow) const { return (kk / ow) * pitch + kk % ow; }
  // Float offset of tap (ky, kx): the row and column it reads past the pixel's own.
  CNN_HALO_HD int tap_offset(int ky, int kx, int pad_w) const { return ky * pitch + kx - pad_w; }
};

// Why the TF32 halo kernel's k-tile cannot express `s` (not stride 1, dilated or grouped, OW not
// a multiple of 8 or over 64, W not a multiple of 4, fewer than 16 input channels or 4 taps, a
// box or stage too large), or "" when it can. The device, precision and pointers are the
// launcher's (conv2d_wgmma_wgrad_tf32_halo.h).
std::string wgrad_tf32_halo_shape_refusal(const Conv2dShape& s);

// The geometry of `s`; throws cnn::Error (one line naming `what` and the refusal) where it
// cannot run.
WgradTf32HaloGeometry wgrad_tf32_halo_geometry(const Conv2dShape& s, const char* what);

// The filter taps a block takes (at most 6: three consumer warpgroups of up to 2, whose
// accumulators and two register sets of A fit 128 registers a thread) and how its consumers split
// them: group g of `groups` holds taps [first, first + count); consumer w of its
// three takes [first + count w / 3, first + count (w + 1) / 3).
constexpr int kWgradTf32HaloTapsPerConsumer = 2;
struct WgradTf32HaloTaps {
  int groups = 0;
  CNN_HALO_HD int first(int g, int taps) const { return int(int64_t(taps) * g / groups); }
  CNN_HALO_HD int count(int g, int taps) const { return first(g + 1, taps) - first(g, taps); }
  CNN_HALO_HD static int consumer_first(int count, int w) { return count * w / 3; }
  CNN_HALO_HD static int consumer_count(int count, int w) {
    return consumer_first(count, w + 1) - consumer_first(count, w);
  }
};
inline WgradTf32HaloTaps wgrad_tf32_halo_taps(int taps) {
  return {(taps + 3 * kWgradTf32HaloTapsPerConsumer - 1) / (3 * kWgradTf32HaloTapsPerConsumer)};
}

// The kernel's arithmetic on the CPU: every k-tile's x tile and dy boxes as the TMA lands them
// (zero outside the tensors, the guard zero), and for every tap, channel, output channel and
// pixel the product the kernel's fragment offsets address, added into dw (OC, C, KH, KW) in
// double. For tests: it fails exactly where the geometry or the offsets are wrong.
void wgrad_tf32_halo_model(const Conv2dShape& s, const float* x, const float* dy, double* dw);

}  // namespace cnn
