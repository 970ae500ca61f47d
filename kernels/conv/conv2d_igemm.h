#pragma once
// Implicit-GEMM convolutions on the GPU (kernels/conv2d_igemm.cu): the convolution is computed
// as a tiled matrix product whose operands are gathered from the NCHW tensors on the fly (no
// im2col buffer; padding and stride by predication), FP32 FFMA or, with
// ex.precision == Precision::TF32, TF32 tensor cores (mma.sync m16n8k8, FP32 accumulation), or
// with Precision::BF16, BF16 tensor cores (mma.sync m16n8k16, FP32 accumulation).
//   forward:         M = N*OH*OW, N = OC, K = C*KH*KW; bias + ReLU fused in the epilogue.
//   backward_data:   M = N*H*W,   N = C,  K = OC*KH*KW (any stride); a stride above 1 runs one
//                    such GEMM per phase of the input (DgradStrided below).
//   backward_weight: M = OC, N = C*KH*KW (+1 column of ones that yields db), K = N*OH*OW,
//                    split over K across blocks; partial tiles atomicAdd-ed into dw/db, or, with
//                    ex.deterministic, written to scratch and summed in a fixed order.
// Same contracts as the public API in kernels/conv2d.h (dw/db ACCUMULATE; dx and y are
// overwritten). All pointers are device pointers; launches are asynchronous on ex.stream.
// Tensors must have fewer than 2^31 elements (32-bit offsets in the gathers).
#include <cstddef>

#include "kernels/conv/conv2d.h"
#include "runtime/exec.h"

namespace cnn {

// How the BF16 (ex.precision == Precision::BF16) generic kernels keep their operand tiles in
// shared memory (the other precisions ignore it):
//   Auto:   Packed unless CNN_BF16_SMEM=f32 (runtime/env_switches.h);
//   Float:  floats, filled by 4-byte cp.async and rounded to BF16 as the fragments are loaded;
//   Packed: bf16 pairs rounded (to nearest even, as Float) by the loaders, which read global
//           memory into registers one k-tile ahead: half the shared-memory bytes, half the
//           fragment loads, no conversions in the math loop. The MMA operands are bitwise the
//           same; only the split of K into cluster partials (32-deep k-tiles instead of 16) can
//           change the rounding of the sum.
enum class Bf16Tiles { Auto, Float, Packed };

// Fp32Math (runtime/exec.h): how ex.precision == FP32 multiplies in the generic kernels (forward,
// input gradient): FFMA, or 3xTF32 on mma.sync.

void conv2d_forward_igemm_cuda(const Conv2dShape& s, const float* d_x, const float* d_w,
                               const float* d_b, float* d_y, bool relu, const Exec& ex,
                               Bf16Tiles tiles = Bf16Tiles::Auto, Fp32Math fp32 = Fp32Math::Ffma);

// Which weight-gradient / input-gradient kernel runs (kept selectable so that a wrong answer or
// a slower run can be bisected):
//   Auto:      Dedicated unless CNN_CONV_GENERIC=1 (runtime/env_switches.h); the weight
//              gradient runs Window where wgrad_window_preferred says so (stride 1, 3x3 with
//              OC <= 128 or 5x5 with OC <= 64, C >= 8, TF32/BF16, dy re-read from L2: see
//              conv2d_igemm_wgrad_window.h) if CNN_CONV_WGRAD_WINDOW=1;
//   Generic:   on the k-major main loop of gemm_tile.cuh shared with the forward pass (any shape);
//   Dedicated: weight gradient: conv2d_igemm_wgrad.cu (k-contiguous tiles, 16-byte dy copies,
//              tap-mask table for x; FP32 as 3xTF32 on the tensor cores, not FFMA); shapes
//              outside its limits (KH*KW > 32) run Generic.
//           input gradient: conv2d_igemm_dgrad.cu (TF32, stride 1, KH*KW <= 25: dy rows and
//           weights staged in shared memory once per chunk of 8 output channels); FP32 and
//              other shapes run Generic.
//   Window:    weight gradient: conv2d_igemm_wgrad_window.cu (stride 1, small OC: the input
//              window of a band of output rows staged once in shared memory and read by every
//              tap) where it takes the shape, else as Dedicated; input gradient: as Dedicated.
enum class IgemmVariant { Auto, Generic, Dedicated, Window };

// How the generic input gradient (every precision) takes a stride above 1:
//   Auto:     Phases unless CNN_CONV_DGRAD_PHASES=0 (runtime/env_switches.h);
//   Phases:   one dense implicit GEMM per phase (py, px) of the input (conv2d_dgrad_phase.h),
//             each over only the taps that reach its pixels (K = OC * its taps): up to 4 phases
//             with taps (stride 2) stacked in one launch, more one launch each; the pixels of a
//             phase no tap reaches (e.g. 3 of 4 of a 1x1 stride-2 kernel's) are zeroed by a
//             memset of dx first. A shape with a phase of more than 31 taps or OC * taps above
//             4096 (its tap table would not fit) runs Division;
//   Division: one implicit GEMM over every (pixel, tap) pair, those that are no output position
//             predicated to zero after two divisions (all but 1 in stride_h * stride_w of them);
//             kept to measure and bisect against.
enum class DgradStrided { Auto, Phases, Division };

void conv2d_backward_data_igemm_cuda(const Conv2dShape& s, const float* d_dy, const float* d_w,
                                     float* d_dx, const Exec& ex,
                                     IgemmVariant variant = IgemmVariant::Auto,
                                     Bf16Tiles tiles = Bf16Tiles::Auto,
                                     DgradStrided strided = DgradStrided::Auto,
                                     Fp32Math fp32 = Fp32Math::Ffma);

// Floats of scratch conv2d_backward_weight_igemm_cuda needs: 0 unless ex.deterministic. Depends
// on the shape only (the split of K is a fixed chunk of output positions, or the window kernel's
// fixed split of its units); enough for every variant.
std::size_t conv2d_backward_weight_igemm_scratch_floats(const Conv2dShape& s, const Exec& ex);

void conv2d_backward_weight_igemm_cuda(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                       float* d_dw, float* d_db, float* d_scratch, const Exec& ex,
                                       IgemmVariant variant = IgemmVariant::Auto,
                                       Bf16Tiles tiles = Bf16Tiles::Auto);

}  // namespace cnn
