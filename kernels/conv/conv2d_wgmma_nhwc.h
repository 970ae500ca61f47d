#pragma once
// Convolution forward and stride-1 input gradient on the Hopper (sm_90a) wgmma tensor cores with
// the A operand loaded by TMA in im2col mode from a channels-last copy (conv2d_wgmma_nhwc.cu),
// TF32, BF16 or FP32 (3xTF32, below) in (WgmmaNhwcOptions::precision), FP32 accumulate. Each call
// runs two launches, the pre-pass (steps 1 and 2, one grid: conv2d_nhwc_prepass.h) and the
// convolution (step 3):
//   1. writes the activations (x, or dy for the input gradient) into an NHWC copy with the
//      channels zero padded to a multiple of 32 (one 128-byte swizzle row), rounded to TF32;
//      at BF16: to a multiple of 64, rounded to BF16 (nearest even, kernels/common/bf16_round.h),
//      and every later step the same with bf16 elements, 64-channel tiles and wgmma k16;
//   2. writes the weights as (rows, KH, KW, K padded) K-major rows, rounded to TF32: w itself
//      for the forward, w'[c][kh][kw][oc] = w[oc][c][KH-1-kh][KW-1-kw] for the input gradient
//      (redone every call: weights change every step, and they are small);
//   3. runs the implicit GEMM with k ordered (tap, channel): each pipeline stage is one tap x 32
//      channels, filled by ONE thread issuing one TMA im2col copy (128 pixels x 32 channels,
//      padding zero-filled by the hardware) and one tiled TMA of the weights (BN x 32); the
//      consumers and the split-K NCHW epilogue are conv2d_wgmma.cu's (conv2d_wgmma_tile.cuh);
//      or, with halo tiles (NhwcALoad::Halo: stride 1, TF32 and BF16), the tile's input rows
//      with their halo as one tiled TMA box per 32-channel chunk, which every tap reads at a
//      row offset (conv2d_halo_layout.h, conv2d_wgmma_halo.cuh).
// A dilated convolution (Conv2dShape::dil_h, dil_w) runs the same way: the im2col copy of tap
// (ky, kx) reads at offsets (dil_w kx, dil_h ky) from the window's corner, and the input gradient
// is the dilated convolution of dy with the flipped weights (backward_data_as_forward). So does a
// grouped one (Conv2dShape::groups), one group a block: step 1 writes the copy group-major,
// (G, N, H, W, C/G padded), step 2 packs each group's weights (C/G a row), and a block's walk
// starts its group's N images in, its B rows and output channels at the group's. The halo tiles
// refuse both.
// At FP32 it runs 3xTF32, the tensor cores at FP32 accuracy: the weights are packed twice, big =
// TF32(w) and small = TF32(w - big), and the products are
//   small_A big_B + big_A small_B + big_A big_B
// (dropping small_A small_B, about 2^-22 of the product): three wgmmas where TF32 runs one. At
// one block an SM the copy keeps the values unrounded and the consumers split each A value they
// load into big + small in registers (the same A traffic as TF32); at two blocks an SM (32- and
// 64-column tiles, where those registers do not fit) the pre-pass writes the copy twice, big and
// small, and every operand comes from shared memory.
// The copies live in the caller's scratch of conv2d_*_wgmma_nhwc_scratch_floats(s) floats
// (conv2d_nhwc_scratch.h). Nothing here allocates: a layer sizes it once (through
// conv2d_forward_scratch_floats / conv2d_backward_data_scratch_floats, conv2d.h) and the Network
// allocates it before any CUDA graph is captured, so a captured training step holds no allocation.
// A null scratch is refused (after the refusals below, which take precedence).
// A strided input gradient (stride s, dilation 1) runs as its s_h x s_w phases
// (conv2d_dgrad_phase.h, NhwcDgradPhase in conv2d_nhwc_layout.h): the dx pixels (py + s_h qy,
// px + s_w qx) of phase (py, px) are the stride-1 convolution of dy with the taps that reach
// them, about 1 / (s_h s_w) of the filter each. One pre-pass writes dy's copy and packs the
// weights with each phase's taps flipped and contiguous (phase_flipped_tap); then one launch a
// phase reads its run of the pack (NhwcParams::b_tap0) and stores its pixels of dx at their
// stride (ConvTileStore's phase mapping). A phase with pixels but no taps (a 1x1 kernel's odd
// phases) has a zero gradient: dx is zeroed first.
// Refusals (cnn::Error, one line): no compute capability 9.0 device / no sm_90a
// build, a strided input gradient with dilation, strides above 8 or paddings the TMA box corners
// cannot express, tensors past 2^31-1 elements; halo tiles asked for a shape or setting they
// cannot run (a strided input gradient among them).
#include <cstddef>
#include <cstdint>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_nhwc_scratch.h"
#include "runtime/exec.h"
#include "runtime/stream.h"

namespace cnn {

// How the kernel brings A (the activations) into shared memory: one TMA im2col copy of 128
// output pixels per filter tap and channel chunk, or one tiled TMA box of a tile's output rows
// with their halo per channel chunk, which every tap reads at a row offset (stride 1, TF32 or
// BF16: conv2d_halo_layout.h, conv2d_wgmma_halo.cuh).
enum class NhwcALoad { Auto, Im2col, Halo };

// How a strided input gradient's phases launch: up to four in one grid (each block finds its
// phase by its index; TF32 and BF16, 128-row tiles), or one launch each (FP32 3xTF32 always).
// Auto: stacked unless CNN_WGMMA_NHWC_STACK=0.
enum class NhwcPhaseLaunch { Auto, Stacked, Separate };

struct WgmmaNhwcOptions {
  int splits = 0;  // K split across a cluster: 0 picks (1..8), else 1, 2, 4 or 8
  // 0 picks (conv2d_wgmma_nhwc_pick_block_n, CNN_WGMMA_CONV_BN), else 32, 64 or 128.
  int block_n = 0;
  // Resident blocks an SM: 0 picks (conv2d_wgmma_nhwc_pick_blocks_per_sm,
  // CNN_WGMMA_NHWC_PER_SM), 1 (a ring of 6-10 stages), 2 (half the ring each; block_n 32 or 64)
  // or 3 (3 stages each; block_n 32 only). FP32 (3xTF32): one, or two (block_n 32 or 64, a ring
  // of 2 stages of both operands' two parts); the pick is capped at two.
  int blocks_per_sm = 0;
  // Tile rows (output pixels): 0 picks (conv2d_wgmma_nhwc_pick_block_m, CNN_WGMMA_NHWC_BM), else
  // 128, or 256 (TF32 and BF16, block_n 128, one block an SM: each consumer warpgroup multiplies
  // two 64-row blocks on one B tile, twice the work a pipeline stage).
  int block_m = 0;
  Precision precision = Precision::TF32;  // TF32, BF16, or FP32 (3xTF32)
  // Auto picks (CNN_WGMMA_NHWC_HALO, else conv2d_wgmma_nhwc_pick_halo where block_m and
  // blocks_per_sm are 0). Halo tiles have 128 rows (three blocks an SM of 32 columns, two of 64,
  // one of 128) or 256 (32 or 64 columns, one block an SM); block_m 0 picks
  // (conv2d_wgmma_nhwc_pick_halo_rows). They refuse blocks_per_sm other than 0 and FP32.
  NhwcALoad a_load = NhwcALoad::Auto;
  NhwcPhaseLaunch phase_launch = NhwcPhaseLaunch::Auto;
};

// True when this build has the sm_90a kernels and the current device is compute capability 9.0.
bool conv2d_wgmma_nhwc_available();

// Blocks an SM for a grid of `blocks` (tiles x splits) of block_n-column tiles on `sms` SMs: 1
// for block_n 128; else 2 when one an SM would take more than one wave, and with block_n 32, 3
// when two would; else 1.
int conv2d_wgmma_nhwc_pick_blocks_per_sm(int64_t blocks, int sms, int block_n);

// The tile rows for an M x n implicit GEMM of block_n-column tiles on `sms` SMs: 256 when
// block_n is 128 and twice the 256-row grid's tiles cover at least 90% of the SMs, else 128.
int conv2d_wgmma_nhwc_pick_block_m(int64_t m, int n, int block_n, int sms);

// Whether Auto loads A as halo tiles for the GEMM view g (the input gradient's: the convolution
// of dy with the flipped weights) at `precision`: TF32 or BF16, a shape the halo tile can run
// (halo_refusal), at least 16 filter taps (5x5 and up: on 3x3 layers the im2col copies were as
// fast or faster), and at least half of the 128-row tiles' rows output pixels.
bool conv2d_wgmma_nhwc_pick_halo(const Conv2dShape& g, Precision precision);

// The halo tile's rows for g at width block_n on `sms` SMs: 256 with 32- or 64-column tiles
// where that grid fills 90% of the SMs at one block an SM and drops at most 5% more of its rows
// than 128-row tiles would (conv2d_halo_layout.h), else 128.
int conv2d_wgmma_nhwc_pick_halo_rows(const Conv2dShape& g, int block_n, int sms);

// The tile width for an M x n implicit GEMM: 32 when n <= 32, else conv2d_wgmma_pick_block_n's.
int conv2d_wgmma_nhwc_pick_block_n(int64_t m, int n);

// y (N, OC, OH, OW) = relu?(conv(x, w) + b), as conv2d_forward; b may be null. d_scratch: see above
// (16-byte aligned, not null).
void conv2d_forward_wgmma_nhwc(const Conv2dShape& s, const float* d_x, const float* d_w,
                               const float* d_b, float* d_y, bool relu, float* d_scratch,
                               cudaStream_t stream, const WgmmaNhwcOptions& opt = {});

// dx (N, C, H, W) = conv_transpose(dy, w), as conv2d_backward_data (overwrites dx). A strided
// one (dilation 1) runs one launch a phase of dx (see the file comment).
void conv2d_backward_data_wgmma_nhwc(const Conv2dShape& s, const float* d_dy, const float* d_w,
                                     float* d_dx, float* d_scratch, cudaStream_t stream,
                                     const WgmmaNhwcOptions& opt = {});

// The same at BF16 from a channels-last BF16 copy of dy already written, (N, OH, OW, OC rounded
// up to 64) as bf16 bit patterns, 16-byte aligned: the layout of the pre-pass's own copy and of
// the BF16 weight gradient's (conv2d_wgmma_wgrad_nhwc.h, which hands it over). The pre-pass packs
// the weights only, at the start of d_scratch (conv2d_backward_data_wgmma_nhwc_pack_floats(s)
// floats, which must not overlap the copy). opt.precision must be BF16.
void conv2d_backward_data_wgmma_nhwc_from_copy(const Conv2dShape& s, const uint16_t* d_dy_copy,
                                               const float* d_w, float* d_dx, float* d_scratch,
                                               cudaStream_t stream, const WgmmaNhwcOptions& opt);

}  // namespace cnn
