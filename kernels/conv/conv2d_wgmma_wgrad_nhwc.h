#pragma once
// Weight gradient of the dense convolution in BF16 on the Hopper tensor cores (sm_90a), from
// channels-last copies of x and dy (conv2d_wgmma_wgrad_nhwc.cu). Same contract as
// conv2d_backward_weight (kernels/conv/conv2d.h):
//   dw (OC, C, KH, KW) += sum over n, output pixels p of dy[n][oc][p] * x[n][c][p's tap (kh, kw)]
//   db (OC) += sum of dy (where db is given: FP32 sums of the FP32 dy, in the pre-pass launch)
// as the GEMM dw (M = OC, N = (tap, C)) += A (M, K) B (K, N), K = N*OH*OW output pixels, with x
// and dy rounded to BF16 (nearest even, as every BF16 pass) and FP32 accumulation. Each call:
//   1. writes x into an (N, H, W, C padded to 64) BF16 copy and dy into an (N*OH*OW, OC padded to
//      64) one, in the caller's scratch, and adds db, in one launch
//      (wgrad_nhwc_prepass_bf16_cuda, conv2d_nhwc_prepass.h);
//   2. runs the GEMM: a stage is 64 output pixels of k; A (64 pixels x 64 output channels of dy)
//      comes by a tiled TMA of the dy copy, B (the same 64 pixels' input pixels at one tap x 64
//      channels) by a TMA im2col copy of the x copy, exactly the forward's A tile; both land
//      pixel-major (MN-major) in the 128-byte swizzle, which BF16 wgmma reads transposed;
//   3. atomically adds each block's FP32 tile into dw (K is split across blocks).
// A dilated shape runs the same way, each tap's im2col copy at its dilated offset (the halo
// instance refuses it).
// The halo instance (WgradNhwcLoad::Halo, stride 1) replaces step 2's per-tap im2col copies by
// one dy box and one x box (with the halo) a k-tile that every tap reads at a row offset
// (conv2d_wgrad_halo_layout.h, conv2d_wgmma_wgrad_halo.cu).
// Refused (cnn::Error naming why, so that autotune leaves it out and the caller falls back): no
// compute capability 9.0 device or sm_90a build; a precision other than BF16; deterministic mode
// (the atomics' order varies); shapes the im2col TMA cannot express (strides above 8, far
// paddings); tensors past 2^31-1 elements.
#include <cstddef>
#include <string>

#include "kernels/conv/conv2d.h"
#include "runtime/exec.h"

namespace cnn {

// How the kernel loads x: TMA im2col copies per tap and 64 channels, halo boxes serving every
// tap, or the pick (conv2d_wgrad_wgmma_nhwc_pick_halo; CNN_WGMMA_WGRAD_NHWC_HALO).
enum class WgradNhwcLoad { Auto, Im2col, Halo };

struct WgmmaWgradNhwcOptions {
  int splits = 0;  // blocks K is split across per output tile: 0 picks, else 1 or more
  // The columns each consumer warpgroup multiplies (wgmma n): 64 (two blocks an SM) or 128 (one
  // block an SM, half the shared-memory operand traffic per product; where the layer has at
  // least two x pieces); 0: CNN_WGMMA_WGRAD_NHWC_N, else 64 (faster on the H200).
  // Im2col only (the halo instance multiplies 64 x 64 a tap).
  int consumer_n = 0;
  WgradNhwcLoad b_load = WgradNhwcLoad::Auto;
};

// Whether Auto loads halo boxes for `s`: stride 1, the halo k-tile fits (wgrad_halo_refusal), at
// least 4 taps, 16 input channels (fewer: the 64-channel x box is mostly padding, and the im2col
// instance was faster on the H200) and kWgradHaloMinUseful of the multiplied k rows output
// pixels.
bool conv2d_wgrad_wgmma_nhwc_pick_halo(const Conv2dShape& s);

// A 3x3 layer on 4x4 planes multiplies 49.6% pixels, and its halo k-tiles still beat the per-tap
// copies by 1.3x (ResNet-18's 512-channel layers at batch 128: 60.3 against 79.1 us, H100).
inline constexpr double kWgradHaloMinUseful = 0.45;

// The K split (blocks per output tile) the halo instance picks for `s` on this device; for notes.
int conv2d_wgrad_wgmma_nhwc_halo_splits(const Conv2dShape& s);

// True when this build has the sm_90a kernel and the current device is compute capability 9.0.
bool conv2d_wgrad_wgmma_nhwc_available();

// Why this call cannot run (see above), or "" when it can.
std::string conv2d_wgrad_wgmma_nhwc_refusal(const Conv2dShape& s, const Exec& ex);

// The scratch floats of one call: the two BF16 copies, each rounded up to 128 bytes. A function
// of the shape alone.
std::size_t conv2d_wgrad_wgmma_nhwc_scratch_floats(const Conv2dShape& s);

// The split of K (blocks per output tile) a call of this shape gets with splits 0 (clamped so
// that every split has at least one 64-pixel k-tile); for tests and the notes.
int conv2d_wgrad_wgmma_nhwc_splits(const Conv2dShape& s);

// dw (and db unless null) += the gradients above. d_scratch:
// conv2d_wgrad_wgmma_nhwc_scratch_floats(s) floats, 16-byte aligned. Throws cnn::Error with the
// refusal's reason when it is not empty.
void conv2d_backward_weight_wgmma_nhwc(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                       float* d_dw, float* d_db, float* d_scratch, const Exec& ex,
                                       const WgmmaWgradNhwcOptions& opt = {});

// Both gradients of a stride-1 convolution with one channels-last copy of dy: the weight gradient
// above, which writes its BF16 copies of x and dy into d_scratch, then the input gradient from
// that dy copy (conv2d_backward_data_wgmma_nhwc_from_copy: the layout of its own copy), whose
// weight pack goes over the x copy, read by then. The input gradient's own copy of dy (a read of
// the FP32 dy and a write of the copy) is saved. dw, db += and dx = as the two calls would
// (dx bitwise; the rest the weight gradient's own). Applies
// (conv2d_backward_wgmma_nhwc_shares_dy) where the weight gradient can run (its refusal is
// empty), the stride is 1 and the input gradient's weight pack fits in the x copy's span;
// elsewhere the call runs nothing and returns false. d_scratch:
// conv2d_wgrad_wgmma_nhwc_scratch_floats(s) floats, 16-byte aligned.
bool conv2d_backward_wgmma_nhwc_shares_dy(const Conv2dShape& s, const Exec& ex);
bool conv2d_backward_wgmma_nhwc_shared_dy(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                          const float* d_w, float* d_dw, float* d_db, float* d_dx,
                                          float* d_scratch, const Exec& ex);

}  // namespace cnn
