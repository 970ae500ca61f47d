#pragma once
// A grouped convolution on the dense variants of conv2d.h (igemm, wgmma, wgmma-nhwc, or the dense
// op's fixed rule for auto). The grouped kernels of conv2d_grouped.h are direct loops, right for
// depthwise layers (a channel a group) but blind to the tensor cores where a group has several
// channels: a 200 -> 200 3x3 layer in 4 groups on 8x8 images, batch 128, took 0.3-1.5 ms a pass
// on them (H100), cuDNN 0.1 ms. Two forms (GroupedDenseForm):
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

enum class GroupedDenseForm { PerGroup, BlockDiagonal };
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
const char* grouped_dense_form_name(GroupedDenseForm f);  // "groups", "diagonal"
// One group's dense convolution: (N, C/G, H, W) -> (N, OC/G, OH, OW).
Conv2dShape conv2d_group_shape(const Conv2dGroupedShape& s);
// The block-diagonal form's dense convolution: (N, C, H, W) -> (N, OC, OH, OW).
Conv2dShape conv2d_block_diagonal_shape(const Conv2dGroupedShape& s);

// Each function takes the form explicitly (the grouped op passes conv2d_grouped_dense_form).
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
