#pragma once
// Int8 convolution for inference: int8 activations and weights, int32 accumulation, and an
// epilogue that requantizes (or dequantizes), applies ReLU and a following max-pool in the same
// pass. A linear layer is this conv with the kernel covering its whole input image (1x1 output).
//
// Layouts (chosen for 4-byte dp4a loads along the reduction):
//   x (N, H, W, CP)            channels padded to CP (a multiple of 4) with zeros
//   w (OC, KH, KW, CGP)        CGP = C/groups rounded up to 4 for groups == 1 (zero padded),
//                              C/groups otherwise; input channel ci of group g is x's g*C/groups+ci
//   y int8 (N, PH, PW, OCP)    OCP a multiple of 4; channels OC..OCP-1 are written as zero
//   y float (N, PH, PW, OC)    dequantized (the logits)
// where (PH, PW) is the pooled output size ((OH, OW) without a pool).
//
// The integer part is exact and defined identically on the CPU and the GPU:
//   acc   = sum x * w over the window (int32)
//   v     = fma(float(acc), mult[o], add[o])          one correctly rounded fused multiply-add
//   v     = max(v, 0) with relu
//   int8  : q = round_half_even(clamp(v, -127, 127))  (std::nearbyint / __float2int_rn)
//   float : y = v
//   pool  : the max over the window of the values above (padded positions never win)
// so the CUDA kernels and the CPU twin agree bit for bit.
#include <cmath>
#include <cstdint>

#include "runtime/exec.h"

namespace cnn {

struct QConvShape {
  int n = 1, h = 1, w = 1, c = 1, cp = 4;  // input (N, H, W, CP), C real channels
  int oc = 1, ocp = 4;                     // output channels, padded stride of an int8 output
  int kh = 1, kw = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  int groups = 1;
  int cgp = 4;  // weights' innermost extent (see above)
  // The max-pool that follows (1x1 stride 1: none); padded positions never win.
  int pool_kh = 1, pool_kw = 1, pool_sh = 1, pool_sw = 1, pool_ph = 0, pool_pw = 0;
  int oh() const { return (h + 2 * pad_h - dil_h * (kh - 1) - 1) / stride_h + 1; }
  int ow() const { return (w + 2 * pad_w - dil_w * (kw - 1) - 1) / stride_w + 1; }
  int ph() const { return (oh() + 2 * pool_ph - pool_kh) / pool_sh + 1; }
  int pw() const { return (ow() + 2 * pool_pw - pool_kw) / pool_sw + 1; }
  int cg() const { return c / groups; }
  int ocg() const { return oc / groups; }
};

// The weights' innermost extent for this shape (CGP above).
int qconv_weight_inner(int c, int groups);
inline int round_up4(int v) {
  return (v + 3) / 4 * 4;
}

void check_qconv_shape(const QConvShape& s);  // throws naming the bad field

struct QEpilogue {
  const float* mult = nullptr;  // (OC) on the op's device
  const float* add = nullptr;   // (OC)
  bool relu = false;
};

// The tensor-core path (qconv_igemm.cu): an implicit GEMM with mma.sync m16n8k32 s8, rows the
// conv outputs of whole pool windows (so the max-pool stays fused), columns the output channels,
// the reduction k = (kh, kw, ci) in the order of w's layout. It reads its weights repacked once
// (qconv_pack_igemm_weights) into (OCT, KP): OCT = OCP rounded up to kQIgemmTileN rows and
// KP = KH*KW*CGP rounded up to kQIgemmTileK, zero padded, so every tile load is a whole,
// aligned 16-byte copy. Supported: groups == 1 and a pool window of at most kQIgemmTileM outputs.
constexpr int kQIgemmTileM = 128, kQIgemmTileN = 64, kQIgemmTileK = 64;
bool qconv_igemm_supported(const QConvShape& s);
int64_t qconv_igemm_weight_size(const QConvShape& s);  // bytes of the repacked weights
// w (OC, KH, KW, CGP) -> packed (OCT, KP), host memory both.
void qconv_pack_igemm_weights(const QConvShape& s, const int8_t* w, int8_t* packed);

// Split-K of the tensor-core kernel: when a shape has fewer tiles than the device runs at once
// (a linear layer at batch 256: 2 x 16 tiles on 132 SMs), the k-tiles of each tile are split
// over a thread-block cluster of `splits` blocks (sm_90), which sum their int32 partial tiles
// through distributed shared memory before the one epilogue: the sum is exact, so the bits do
// not depend on the split. The rule: double the splits (up to kQIgemmMaxSplits) while the
// doubled grid still fits in one block an SM and each split keeps at least
// kQIgemmMinKTilesPerSplit k-tiles. One block an SM, not the two that fit: on the H200 LeNet's
// fc1 at batch 256 (32 tiles) ran 17.4 us at 4 splits (128 blocks), 19.4 at 8 (256 blocks),
// 19.0 at 2. On GPUs without clusters (before sm_90): 1.
constexpr int kQIgemmMaxSplits = 8, kQIgemmMinKTilesPerSplit = 4;
int qconv_igemm_pick_splits(const QConvShape& s, int sm_count);

// The tiles of the tensor-core path. Conv128x64: qconv_igemm.cu, every shape the path takes.
// Linear*: qconv_linear_mma.cu, a plain GEMM for linear layers (qconv_is_linear) with smaller or
// wider tiles and deeper cp.async pipelines (4-6 stages), so that a layer of few rows (LeNet's fc1
// at batch 256: 2 x 16 tiles of 128 x 64) spreads over more SMs and keeps more loads in flight.
// Both read the same repacked weights and split K the same way (exact int32 cluster sums).
enum class QIgemmTile { Auto, Conv128x64, Linear64x64, Linear64x128, Linear128x128 };
const char* qigemm_tile_name(QIgemmTile t);
struct QIgemmPlan {
  QIgemmTile tile = QIgemmTile::Conv128x64;
  int splits = 1;
};
// The tile and split count a call runs (tile and splits 0/Auto: the rule's, otherwise forced).
// The rule: Conv128x64 with qconv_igemm_pick_splits for convolutions; for linear layers the
// linear tile and split with the least estimated time (qconv.cpp: a latency model of one
// block's loads, mma and split sum times the waves of blocks; a guess until measured).
QIgemmPlan qconv_igemm_plan(const QConvShape& s, int sm_count, QIgemmTile tile = QIgemmTile::Auto,
                            int splits = 0);

// A linear layer in qconv form: one output per image, the kernel the whole input (no padding,
// pool or groups, the activations' channel stride that of the weights). Then x is (N, K) and w
// (OC, K) with K = H * W * CP, and y (N, stride) a plain GEMM's.
bool qconv_is_linear(const QConvShape& s);

// The CUDA kernels of a qconv call:
//   Direct       qconv.cu: one thread an output, dp4a; every shape
//   FewChannels  qconv_few_channels.cu: first layers of C <= 4, dp4a over 4 taps of a row (C = 1)
//                or the 4 channels of a pixel; qconv_few_channels_supported
//   FewChannelsTensorCores  qconv_few_channels_mma.cu: the same tiles and words, the sums on
//                mma.sync m16n8k32 s8; qconv_few_channels_mma_supported
//   TensorCores  qconv_igemm.cu: mma.sync implicit GEMM (+ split-K); qconv_igemm_supported, and
//                the weights repacked by qconv_pack_igemm_weights
//   LinearDp4a   qconv_linear.cu: a block of 4 warps a few rows x a few columns of a linear
//                layer, dp4a over K, a shuffle reduction; qconv_is_linear
//   Auto         qconv_pick_kernel's choice
enum class QConvKernel {
  Auto,
  Direct,
  FewChannels,
  TensorCores,
  LinearDp4a,
  FewChannelsTensorCores
};
const char* qconv_kernel_name(QConvKernel k);
// The one rule for which kernel runs a conv/linear call on CUDA (./infer, ./quantize --evaluate
// and ./bench --infer follow it through Int8Network), called with the batch of the call.
// specialized false: Direct (CNN_INT8_DIRECT=1, for comparisons and bisecting). Otherwise, in
// this order:
//   qconv_few_channels_mma_supported  FewChannelsTensorCores: the few-channel kernel's tiles and
//       words with the sums on mma.sync (s8, sm_80 and later; the build targets sm_90, so the rule
//       does not ask the device). The dp4a version is instruction bound (LeNet's conv1 at batch
//       256 on the H200: 26 us, 6 cycles an issued instruction, 99 registers) on 2 dp4a a word
//       of a 5x5 kernel per output and channel, where one mma does 16 x 8 outputs x 8 words
//   qconv_few_channels_supported  FewChannels (pool windows over kQFewMmaMaxWindow outputs, or
//       tiles the tensor-core layout does not fit in shared memory). Not the igemm TensorCores:
//       it pads a reduction over 1-4 channels to 4 channels and 64-wide k steps and spends most
//       of its work on zeros
//   a linear layer of at most kQLinearDp4aMaxCols columns (a classifier: a 64-wide tile would
//       compute mostly zeros) or at most kQLinearDp4aMaxRows rows (small batches: a 128-row
//       tile mostly empty, the layer bound by reading its weights once)  LinearDp4a
//   qconv_igemm_supported         TensorCores
//   else                          Direct (groups > 1, pool windows over 128 outputs)
constexpr int kQLinearDp4aMaxCols = 16, kQLinearDp4aMaxRows = 8;
QConvKernel qconv_pick_kernel(const QConvShape& s, bool specialized);

// How a CUDA call chooses its kernel. kernel Direct (the default path): the direct kernel.
// Auto: qconv_pick_kernel's rule with the specialized kernels allowed; only its TensorCores
// reads w_igemm, so a caller need not repack weights for a shape the rule gives another kernel.
// Any other kernel: forced (benchmarks, tests), refused when it does not take the shape.
struct QConvPath {
  const int8_t* w_igemm = nullptr;  // the repacked weights on the op's device, or null
  QConvKernel kernel = QConvKernel::Direct;
  int splits = 0;                      // TensorCores: 1, 2, 4 or 8 k-splits; 0: qconv_igemm_plan's
  QIgemmTile tile = QIgemmTile::Auto;  // TensorCores: Auto: qconv_igemm_plan's
  // LinearDp4a with at most kQLinearDp4aMaxCols outputs (a classifier), CUDA: launched as a
  // programmatic dependent of the kernel before it in the stream (sm_90), so that its launch and
  // its weight loads overlap that kernel's end; it reads x only after that kernel has completed.
  // Only for weights, mult and add that the kernel before does not write (a network's).
  bool overlap_launch = false;
  QConvPath() = default;
  explicit QConvPath(const int8_t* w, QConvKernel k = QConvKernel::Auto, int sp = 0,
                     QIgemmTile t = QIgemmTile::Auto)
      : w_igemm(w), kernel(k), splits(sp), tile(t) {}
};
// The kernel a CUDA call with this path runs. Throws naming what does not fit: TensorCores
// (forced or the rule's) without repacked weights, repacked weights for a shape the tensor-core
// kernel does not take, FewChannels, FewChannelsTensorCores or LinearDp4a forced on a shape they
// do not take, a split count that is not 0, 1, 2, 4 or 8, a linear tile forced on a convolution.
QConvKernel qconv_resolve_kernel(const QConvShape& s, const QConvPath& path);

// y_q int8 output (requantized), on the kernel qconv_resolve_kernel(s, path) names (the direct
// one by default). The CPU twin reads w alone. All give the same bits. x and an int8 y 4-byte
// aligned (Buffers are).
void qconv_forward(const QConvShape& s, const int8_t* x, const int8_t* w, const QEpilogue& ep,
                   int8_t* y, const Exec& ex, const QConvPath& path = {});
// y float output (dequantized, e.g. logits).
void qconv_forward_float(const QConvShape& s, const int8_t* x, const int8_t* w, const QEpilogue& ep,
                         float* y, const Exec& ex, const QConvPath& path = {});

// CPU twins: plain loops.
void qconv_forward_cpu(const QConvShape& s, const int8_t* x, const int8_t* w, const QEpilogue& ep,
                       int8_t* y);
void qconv_forward_float_cpu(const QConvShape& s, const int8_t* x, const int8_t* w,
                             const QEpilogue& ep, float* y);
// The int32 accumulators alone (N, OH, OW, OC), unpooled: what the tests compare with a plain
// reference.
void qconv_accumulate_cpu(const QConvShape& s, const int8_t* x, const int8_t* w, int32_t* acc);

// The rounding both twins use, for the CPU side and for tests.
inline int8_t requantize_value(float v) {
  v = v < -127.f ? -127.f : (v > 127.f ? 127.f : v);
  return static_cast<int8_t>(std::nearbyint(v));
}

}  // namespace cnn
