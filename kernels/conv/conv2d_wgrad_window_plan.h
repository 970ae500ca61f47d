#pragma once
// The plan of the window weight-gradient kernel (conv2d_igemm_wgrad_window.cu), plain C++ so that
// the CPU build can test it: which warp tiling a shape takes, how the output rows are cut into
// bands, the shared-memory strides, the split over blocks, and a CPU model of the kernel's whole
// index scheme (tests/test_conv_wgrad_window.cpp runs it against conv2d_backward_weight_cpu).
//
// The kernel, for stride-1 convolutions with a small OC:
//   dw[oc][c][ky][kx] (+ db[oc]) = sum over units u = (image n, band of `rows` output rows of
//   full width OW) and positions q = r * OW + ox of the band of
//   dy[n][oc][oy0 + r][ox] * window[c][r + ky][ox + kx],
// where window[c][wr][col] = x[n][c][oy0 + wr - ph][col - pw] (zero outside the image) is staged
// once a unit in shared memory, (rows + KH - 1) x (OW + KW - 1) a channel. A block owns a chunk of
// `cb` input channels (grid x) and a run of `units_per_split` units (grid y); it reads the window
// element of (position q, tap (ky, kx)) at table[q] + ky * ws + kx, table[q] = r * ws + ox.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/conv/conv2d.h"
#include "runtime/exec.h"

namespace cnn {

struct WgradWindowPlan {
  // Warp tiling (4 warps a block, wm x wt x wc): a warp owns mtw 16-row tiles of OC, cgw groups
  // of 8 channels and one of wt runs of ceil(KH*KW / wt) taps; the block owns oc_pad = 16 mtw wm
  // rows and cb = 8 cgw wc channels, every tap.
  int mtw = 0, cgw = 0, wm = 0, wt = 0, wc = 0;
  int oc_pad = 0, cb = 0, chunks = 0;  // chunks = ceil(C / cb): grid x
  int kstep = 0;                       // positions an MMA k-step: 8 (TF32), 16 (BF16)
  // Bands: `rows` output rows a unit (the last band of an image may have fewer valid rows).
  int rows = 0, bands = 0, units = 0, units_per_split = 0, splits = 0;  // splits: grid y
  // dy copied in 16-byte pieces: OH*OW a multiple of 4, and so (the plan sees to it) rows * OW.
  bool dy_vec = false;
  // Window (floats): row width ww = OW + KW - 1, row stride ws, rows wr = rows + KH - 1,
  // channel stride cs. dy tile: positions p = rows * OW, padded to kp (a multiple of kstep),
  // row (oc) stride ds.
  int ww = 0, ws = 0, wr = 0, cs = 0;
  int p = 0, kp = 0, ds = 0;
  int stage_floats = 0;  // cb * cs + oc_pad * ds: one of the two stages
  std::size_t smem = 0;  // bytes: two stages and the kp-int position table
  int64_t slots = 0;     // a split's scratch row: OC*C*KH*KW + OC (db always counted)
};

// Constants of the plan (the split target is a tuning constant, not a device query, so that the
// deterministic scratch is a function of the shape alone).
constexpr int kWgradWindowThreads = 128;
constexpr int kWgradWindowTargetBlocks = 2 * 132;        // two resident blocks on each H200 SM
constexpr int kWgradWindowTargetPositions = 128;         // output positions a unit, at most
constexpr std::size_t kWgradWindowMaxSmem = 110 * 1024;  // two blocks an SM (228 KB)

// Empty string when the kernel takes the shape at `prec`, else why not (one phrase). Stride 1,
// square kernels 1x1/3x3 (OC <= 128) and 5x5 (OC <= 64), TF32 or BF16, a band of one row within
// the shared-memory limit, tensors under 2^31 elements.
std::string wgrad_window_refusal(const Conv2dShape& s, Precision prec);
inline bool wgrad_window_supported(const Conv2dShape& s, Precision prec) {
  return wgrad_window_refusal(s, prec).empty();
}

// The plan of a supported shape (rows, splits and slots do not depend on the precision).
WgradWindowPlan wgrad_window_plan(const Conv2dShape& s, Precision prec);

// Scratch floats of the deterministic path (splits * slots); 0 when not deterministic or when the
// kernel does not take the shape at TF32 (the same size serves BF16).
std::size_t wgrad_window_scratch_floats(const Conv2dShape& s, const Exec& ex);

// The kernel's arithmetic on the CPU, in FP32 values without rounding: every block (chunk, split)
// stages its units' windows and dy tiles into buffers laid out as the kernel's shared memory (the
// cells the kernel never writes hold NaN, so a read of one shows in the result), reads them through
// the position table and the tap offsets, and adds its partial tile to dw (and db from chunk 0),
// as the atomic path does. dw/db accumulate; db may be null.
void wgrad_window_model_cpu(const Conv2dShape& s, Precision prec, const float* x, const float* dy,
                            float* dw, float* db);

}  // namespace cnn
