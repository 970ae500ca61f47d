#pragma once
// A grouped convolution on the dense variants of conv2d.h (igemm, wgmma, wgmma-nhwc, or the dense
// op's fixed rule for auto). The grouped kernels of conv2d_grouped.h are direct loops, right for
// depthwise layers (a channel a group) but blind to the tensor cores where a group has several
// channels: a 200 -> 200 3x3 layer in 4 groups on 8x8 images, batch 128, took 0.3-1.5 ms a pass
// on them (H100), cuDNN 0.1 ms. Three forms (GroupedDenseForm):
//   Direct: the grouped convolution itself, one dense pass that runs each group on its own
//     channels (conv2d_*_runs_directly: wgmma-nhwc's forward and stride-1 input gradient on a
//     group-major channels-last copy, its weight gradient the wgmma gather one group a block);
//     G narrow GEMMs in one launch, no multiplies between groups, and no copies but the
//     channels-last one the kernel makes anyway;
//   PerGroup: the activations are copied group-major into the scratch (conv2d_grouped_layout.h),
//     where group g's (N, C/G, H, W) is one dense tensor; its weights (OC/G, C/G, KH, KW), bias,
//     dw and db are already contiguous slices of the grouped ones; G dense passes, then the
//     outputs are copied back;
//   BlockDiagonal: one dense convolution C -> OC on the block-diagonal dense weights (zero
//     between groups) written into the scratch, its weight gradient into the scratch and its
//     diagonal blocks added to dw: G times the multiplies, but no activation copies and one
//     dense pass, which with few channels a group keeps the tensor cores' tiles full where G
//     narrow passes would leave them mostly empty.
//
// Takes dilation 1 and 2 <= G <= kGroupedDenseMaxGroups with at least 2 input channels a group
// (a depthwise layer has its own kernels). Other shapes, and a scratch smaller than the
// _scratch_floats functions ask, are refused with cnn::Error. Contracts as conv2d_grouped.h (the
// weight gradient accumulates).
#include <cstddef>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_grouped.h"
#include "runtime/exec.h"

namespace cnn {

constexpr int kGroupedDenseMaxGroups = 32;

bool conv2d_grouped_dense_applicable(const Conv2dGroupedShape& s);

enum class GroupedDenseForm { PerGroup, BlockDiagonal, Direct };
// The form for this shape: CNN_GROUPED_DENSE=groups|diagonal, else BlockDiagonal where its dense
// convolution has at most kBlockDiagonalMaxChannels input and output channels or a group has
// fewer than kPerGroupMinChannels, PerGroup otherwise (wide layers of wide groups, where G times
// the multiplies would outweigh what full tiles gain). Measured on an H100 (batch 128, TF32, the
// best variant a pass; forward + weight + input gradient, us): per group a dense pass of a few
// channels ran 3-15x slower a multiply than the block-diagonal one from 32 to 64 channels a
// group and ~100x at 4-8, so the diagonal form won or tied on every layer of 64 to 256
// channels: 128 -> 128 in 32 groups (32x32) 754 against 2190 on the per-group passes, 256 ->
// 256 in 32 groups (stride 2) 483 against 829, 64 -> 128 in 2 groups 505 against 719, 256 -> 256
// in 4 groups (16x16) 613 against 637, 200 -> 200 in 4 groups (8x8) 249 against 232.
constexpr int kBlockDiagonalMaxChannels = 256;
constexpr int kPerGroupMinChannels = 16;
GroupedDenseForm conv2d_grouped_dense_form(const Conv2dGroupedShape& s);
// The form of one pass at `precision`: Direct where conv2d_*_runs_directly takes the grouped
// shape (runs_directly, the pass's answer), the groups are wide enough for that pass (below) and
// CNN_GROUPED_DENSE forces no form (=direct: wherever it runs directly); else
// conv2d_grouped_dense_form(s).
// A group's GEMM pads its k (the forward's input channels, the input gradient's output channels)
// to a k-tile (32 channels at TF32 and FP32, 64 at BF16) and its other side to a tile of 32
// columns or more, so narrow groups waste most of it. The rule: the forward where the input
// channels fill at least 3/4 of their k-tiles and a group has 16 output channels or more, the
// input gradient the same with the sides swapped, the weight gradient (the gather: k is pixels)
// from 8 channels a group on both sides (at BF16 from 8 groups: the block-diagonal form's weight
// gradient is the BF16 channels-last kernel, twice the TF32 gather's rate). Measured on an H100
// (batch 128, TF32, us, forward / weight / input gradient, direct against the block-diagonal form's
// best variant), channels a group in -> out: 4 -> 4 (128 channels, 32x32) 1072 / 1003 / 1071
// against 213 / 328 / 213; 8 -> 8 (256, stride 2) 141 / 81 / - against 78 / 181 / 224; 16 -> 32
// (128 -> 256, 16x16) 91 / 177 / 89 against 97 / 165 / 98; 32 -> 64 (64 -> 128, 32x32) 119 / 254 /
// 162 against 136 / 190 / 179; 64 -> 64 (256, 16x16) 100 / 214 / 100 against 161 / 290 / 162. At
// BF16 a 32 -> 64 group's direct forward (k padded to 64) took 120 us, as long as at TF32.
enum class GroupedPass { Forward, BackwardData, BackwardWeight };
GroupedDenseForm conv2d_grouped_dense_pass_form(const Conv2dGroupedShape& s, GroupedPass pass,
                                                Precision precision, bool runs_directly);
// Whether the dense op runs s itself (grouped or dilated) in `pass` under dense variant `algo`:
// the pass's conv2d_*_runs_directly on conv2d_grouped_as_dense(s).
bool conv2d_grouped_pass_runs_directly(const Conv2dGroupedShape& s, GroupedPass pass, Algo algo,
                                       const Exec& ex);
// The form a pass runs under dense variant `algo` on ex: conv2d_grouped_dense_pass_form with that
// answer (what the grouped op runs, and the benchmark's note).
GroupedDenseForm conv2d_grouped_dense_form_for(const Conv2dGroupedShape& s, GroupedPass pass,
                                               Algo algo, const Exec& ex);
const char* grouped_dense_form_name(GroupedDenseForm f);  // "groups", "diagonal", "direct"
// The convolution as a Conv2dShape, groups and dilation kept (the Direct form's, and what
// conv2d_*_runs_directly is asked about).
Conv2dShape conv2d_grouped_as_dense(const Conv2dGroupedShape& s);
// One group's dense convolution: (N, C/G, H, W) -> (N, OC/G, OH, OW).
Conv2dShape conv2d_group_shape(const Conv2dGroupedShape& s);
// The block-diagonal form's dense convolution: (N, C, H, W) -> (N, OC, OH, OW).
Conv2dShape conv2d_block_diagonal_shape(const Conv2dGroupedShape& s);

// Each function takes the form explicitly (the grouped op passes conv2d_grouped_dense_pass_form's;
// Direct on a shape or variant that does not run directly is refused with cnn::Error).
// Scratch floats of each pass with dense variant `algo` and `form` (16-byte aligned when given):
// the group-major copies or the block-diagonal weights (or their gradient), and the dense pass's
// own scratch. A function of the shape, algo, ex.device, ex.precision and ex.deterministic only; 0
// where the shape is not applicable.
std::size_t conv2d_grouped_dense_forward_scratch_floats(const Conv2dGroupedShape& s, Algo algo,
                                                        const Exec& ex, GroupedDenseForm form);
std::size_t conv2d_grouped_dense_backward_data_scratch_floats(const Conv2dGroupedShape& s,
                                                              Algo algo, const Exec& ex,
                                                              GroupedDenseForm form);
std::size_t conv2d_grouped_dense_backward_weight_scratch_floats(const Conv2dGroupedShape& s,
                                                                Algo algo, const Exec& ex,
                                                                GroupedDenseForm form);

void conv2d_grouped_dense_forward(const Conv2dGroupedShape& s, const float* x, const float* w,
                                  const float* b, float* y, bool relu, float* scratch, Algo algo,
                                  const Exec& ex, GroupedDenseForm form);
void conv2d_grouped_dense_backward_data(const Conv2dGroupedShape& s, const float* dy,
                                        const float* w, float* dx, float* scratch, Algo algo,
                                        const Exec& ex, GroupedDenseForm form);
void conv2d_grouped_dense_backward_weight(const Conv2dGroupedShape& s, const float* x,
                                          const float* dy, float* dw, float* db, float* scratch,
                                          Algo algo, const Exec& ex, GroupedDenseForm form);

}  // namespace cnn
