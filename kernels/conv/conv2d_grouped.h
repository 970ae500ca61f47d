#pragma once
// Grouped and dilated 2-D convolution (cross-correlation, as torch.nn.Conv2d), NCHW, weights
// (OC, C/G, KH, KW). Input channels [g*C/G, (g+1)*C/G) feed output channels [g*OC/G, (g+1)*OC/G).
// Depthwise is G == C; OC/C is then the channel multiplier. The plain convolution (G = 1,
// dilation 1) has its own faster kernels in conv2d.h; this op serves everything else.
//
// Variants (Algo), forward, input gradient and weight gradient alike:
//   naive  one thread per output element (the seed article's first kernel)
//   tiled  a shared-memory input tile + halo per block (the article's second kernel)
//   fast   groups of 2 to 16 channels: the narrow-group kernels (conv2d_grouped_narrow.h) for
//          the passes they take, the tiled kernels for the others;
//          depthwise 3x3/5x5/7x7, stride 1, "same" padding, dilation 1: register tiling (each
//          thread several outputs along W), float4 loads where aligned, fused bias and ReLU;
//          small problems read their rows without shared memory, large ones stream down
//          their planes (DepthwiseKernel below); every other shape runs the tiled kernels
//          and depthwise 3x3/5x5/7x7 with stride 2 (any padding below the kernel size,
//          dilation 1): the flat kernels (DepthwiseKernel::Flat) for the forward and input
//          gradient, tiled for the weight gradient
//   igemm, wgmma, wgmma-nhwc
//          that dense variant of conv2d.h: on block-diagonal weights or a group at a time for
//          dilation 1 and 2 to 32 groups of at least 2 input channels (conv2d_grouped_dense.h),
//          on the dilation phases for stride 1 and one group (conv2d_dilated_dense.h); other
//          shapes are refused with cnn::Error (autotune leaves them out)
//   auto   on CUDA, the dense kernels with the dense op's own fixed rule where one of those
//          takes the shape and every group has at least kGroupedDenseAutoChannels input and
//          output channels, unless the narrow-group kernels take every pass of groups of at
//          most kGroupedNarrowAutoChannels input channels; else fast (which itself falls back
//          to tiled). The CPU runs the reference loops for every variant but the dense ones.
#include <cstddef>
#include <cstdint>

#include "runtime/exec.h"

namespace cnn {

struct Conv2dGroupedShape {
  int n = 1, c = 1, h = 1, w = 1;  // input (N, C, H, W)
  int oc = 1, kh = 1, kw = 1;      // weights (OC, C/groups, KH, KW)
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
  int dil_h = 1, dil_w = 1;
  int groups = 1;
  int cg() const { return c / groups; }    // input channels per group
  int ocg() const { return oc / groups; }  // output channels per group
  int oh() const { return (h + 2 * pad_h - dil_h * (kh - 1) - 1) / stride_h + 1; }
  int ow() const { return (w + 2 * pad_w - dil_w * (kw - 1) - 1) / stride_w + 1; }
};

void check_conv2d_grouped_shape(const Conv2dGroupedShape& s);  // throws naming the bad field

// True when the fast depthwise kernels serve this shape (the others fall back to tiled).
bool conv2d_grouped_fast_applicable(const Conv2dGroupedShape& s);
// True when the fast variant runs this stride-2 shape's forward and input gradient on the flat
// kernels (conv2d_depthwise_flat.h).
bool conv2d_grouped_strided_applicable(const Conv2dGroupedShape& s);

// Which kernel the fast variant runs.
//   Tile    a shared-memory input tile per block (forward, input and weight gradient).
//   Rows    forward and input gradient only: no shared memory, each thread reading its rows
//           straight from the cache; for launch-bound problems of at most
//           kDepthwiseRowsMaxOutputs outputs, where the staging would only add latency, and for
//           planes at most kDepthwiseRowsMaxW wide, where the tile's 4-output columns leave most
//           of its lanes idle (H200, 128x256x7x7: 22.5 us forward against tile's 31.0, 22.2
//           against 30.3 for the input gradient; even at 14 wide).
//   Stream  forward, input and weight gradient: each thread walks down a strip of its plane
//           (4 columns wide) row by row, keeping the K rows it needs plus the next ones in
//           flight in registers, so each input row comes from DRAM once and several rows are
//           loading while it computes; for the bandwidth-bound problems of at least
//           kDepthwiseStreamMinOutputs outputs with channel multiplier 1 and W >=
//           kDepthwiseStreamMinW (H200, 128x32x28x28: 11.3 us forward against tile's 16.9,
//           10.2 against 15.0 for the input gradient; 14 wide it loses). Smaller problems are
//           launch- and latency-bound on the tile kernel (H200: 6.3 us for 2^20 outputs, 3.6x
//           the HBM floor, mostly fixed cost), and
//           their strips would be a few rows; below that width the rows are too short for
//           whole 16-byte loads per lane to pay; with a multiplier, the input gradient would
//           re-read and re-write dx once per output channel, where the tile kernel keeps the
//           sums in registers. None of those is measured, so Tile keeps them.
//   Flat    forward and input gradient only: one thread per output (per S x S block of the
//           input gradient), planes and positions flattened into one index
//           (conv2d_depthwise_flat.h); the only fast kernels for stride 2, and for stride 1
//           only where forced (CNN_DEPTHWISE_KERNEL=flat).
enum class DepthwiseKernel { Auto, Tile, Rows, Stream, Flat };
constexpr int64_t kDepthwiseRowsMaxOutputs = int64_t(1) << 18;
constexpr int64_t kDepthwiseStreamMinOutputs = int64_t(1) << 21;
constexpr int kDepthwiseStreamMinW = 28;
constexpr int kDepthwiseRowsMaxW = 8;
const char* depthwise_kernel_name(DepthwiseKernel k);  // "auto", "tile", "rows", "stream", "flat"
// Forward and input gradient: Rows, Stream or Tile, by the rule above.
DepthwiseKernel conv2d_grouped_fast_kernel(const Conv2dGroupedShape& s);
// Weight gradient: Stream where the rule above says Stream, else Tile (there is no rows wgrad).
DepthwiseKernel conv2d_grouped_fast_wgrad_kernel(const Conv2dGroupedShape& s);
// The rows kernel's block count, N * C * ceil(H / rows per block), is below 2^30: its int
// grid-stride index then cannot overflow.
bool depthwise_rows_fits(const Conv2dGroupedShape& s);

// Where a group of this many input and output channels or more makes `auto` run the dense
// kernels (untuned: autotune times every variant). On an H100 at batch 128 the dense kernels beat
// the tiled grouped ones on every layer of 4 to 64 channels a group measured, e.g. a 128 -> 128
// layer in 32 groups (32x32) 213 / 328 / 213 us (forward, weight and input gradient, TF32) against
// 674 / 951 / 893, a 200 -> 200 layer in 4 groups (8x8) 53 / 102 / 52 against 909 / 1141 / 317;
// groups of 1-3 channels are left to the grouped kernels (depthwise ones have their own).
constexpr int kGroupedDenseAutoChannels = 4;
// Where the narrow-group kernels take all three passes of groups of at most this many input
// channels, `auto` runs them rather than the dense kernels: on an H100 the 32-group layer above
// took 116 / 201 / 115 us on them, against the dense kernels' 214 / 330 / 213 (TF32) and 151 /
// 181 / 152 (BF16); groups of 8 lost most passes (docs/performance.md, "Narrow groups").
constexpr int kGroupedNarrowAutoChannels = 4;

// True for igemm, wgmma and wgmma-nhwc: the variants that run on the dense kernels here.
bool conv2d_grouped_dense_variant(Algo algo);
// Throws cnn::Error (one line, led by `what`) when a dense variant is asked for a shape that
// neither dense route takes.
void check_conv2d_grouped_algo(const char* what, const Conv2dGroupedShape& s, Algo algo);
// True when the dense kernels take this shape (grouped, or dilated: the file comment).
bool conv2d_grouped_takes_dense(const Conv2dGroupedShape& s);
// True when `algo` runs this shape on the dense kernels on ex's device: igemm, wgmma, wgmma-nhwc
// (refused at the call where conv2d_grouped_takes_dense is false), and auto by the rule above.
bool conv2d_grouped_runs_dense(const Conv2dGroupedShape& s, Algo algo, const Exec& ex);

// Scratch floats of each pass with `algo` (16-byte aligned when given): the dense variants'
// block-diagonal weights or group-major copies (conv2d_grouped_dense.h); for the weight gradient
// also the grouped kernels' deterministic partial sums. A function of the shape, algo, ex.device,
// ex.precision and ex.deterministic.
std::size_t conv2d_grouped_forward_scratch_floats(const Conv2dGroupedShape& s, Algo algo,
                                                  const Exec& ex);
std::size_t conv2d_grouped_backward_data_scratch_floats(const Conv2dGroupedShape& s, Algo algo,
                                                        const Exec& ex);
std::size_t conv2d_grouped_backward_weight_scratch_floats(const Conv2dGroupedShape& s, Algo algo,
                                                          const Exec& ex);

// y (N, OC, OH, OW) = conv(x, w) + b. b may be null. relu=true applies ReLU in the epilogue.
void conv2d_grouped_forward(const Conv2dGroupedShape& s, const float* x, const float* w,
                            const float* b, float* y, bool relu, float* scratch, Algo algo,
                            const Exec& ex);

// dx (N, C, H, W) = conv_transpose(dy, w). Overwrites dx.
void conv2d_grouped_backward_data(const Conv2dGroupedShape& s, const float* dy, const float* w,
                                  float* dx, float* scratch, Algo algo, const Exec& ex);

// dw (OC, C/G, KH, KW) += sum over the batch of x (*) dy; db (OC) += sum of dy (db may be null).
// ACCUMULATES. Default: atomicAdd; ex.deterministic: fixed-order two-stage reduction through
// `scratch`, bitwise repeatable.
void conv2d_grouped_backward_weight(const Conv2dGroupedShape& s, const float* x, const float* dy,
                                    float* dw, float* db, float* scratch, Algo algo,
                                    const Exec& ex);

// CPU references: plain loops over the definition, double accumulation; float and double twins
// (the double ones serve the numerical gradient checks). Same contracts as above.
void conv2d_grouped_forward_cpu(const Conv2dGroupedShape& s, const float* x, const float* w,
                                const float* b, float* y, bool relu);
void conv2d_grouped_backward_data_cpu(const Conv2dGroupedShape& s, const float* dy, const float* w,
                                      float* dx);
void conv2d_grouped_backward_weight_cpu(const Conv2dGroupedShape& s, const float* x,
                                        const float* dy, float* dw, float* db);
void conv2d_grouped_forward_cpu(const Conv2dGroupedShape& s, const double* x, const double* w,
                                const double* b, double* y, bool relu);
void conv2d_grouped_backward_data_cpu(const Conv2dGroupedShape& s, const double* dy,
                                      const double* w, double* dx);
void conv2d_grouped_backward_weight_cpu(const Conv2dGroupedShape& s, const double* x,
                                        const double* dy, double* dw, double* db);

}  // namespace cnn
