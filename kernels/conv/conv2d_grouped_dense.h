#pragma once
// A grouped convolution run as one dense convolution a group, on the dense variants of conv2d.h
// (igemm, wgmma, wgmma-nhwc, or the dense op's fixed rule for auto). The grouped kernels of
// conv2d_grouped.h are direct loops, right for depthwise layers (a channel a group) but blind
// to the tensor cores where a group has tens of channels: a 200 -> 200 3x3 layer in 4 groups on
// 8x8 images, batch 128, took 0.3-1.5 ms a pass on them (H100), cuDNN 0.1 ms.
//
// The activations are copied group-major into the scratch (conv2d_group_major.h), where group g's
// (N, C/G, H, W) is one dense tensor; its weights (OC/G, C/G, KH, KW), bias, dw and db are
// already contiguous slices of the grouped ones; the outputs are copied back. So a pass costs one
// copy of each activation it reads and writes plus G dense passes.
//
// Takes dilation 1 and 2 <= G <= kGroupedDenseMaxGroups with at least 2 input channels a group:
// each group is a launch (or a few) of the dense kernels, and a depthwise layer has its own
// kernels. Other shapes, and a scratch smaller than the _scratch_floats functions ask, are
// refused with cnn::Error. Contracts as conv2d_grouped.h (the weight gradient accumulates).
#include <cstddef>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_grouped.h"
#include "runtime/exec.h"

namespace cnn {

constexpr int kGroupedDenseMaxGroups = 32;

bool conv2d_grouped_dense_applicable(const Conv2dGroupedShape& s);
// One group's dense convolution: (N, C/G, H, W) -> (N, OC/G, OH, OW).
Conv2dShape conv2d_group_shape(const Conv2dGroupedShape& s);

// Scratch floats of each pass with dense variant `algo` (16-byte aligned when given): the
// group-major copies and the dense pass's own scratch. A function of the shape, algo,
// ex.device, ex.precision and ex.deterministic only; 0 where the shape is not applicable.
std::size_t conv2d_grouped_dense_forward_scratch_floats(const Conv2dGroupedShape& s, Algo algo,
                                                        const Exec& ex);
std::size_t conv2d_grouped_dense_backward_data_scratch_floats(const Conv2dGroupedShape& s,
                                                              Algo algo, const Exec& ex);
std::size_t conv2d_grouped_dense_backward_weight_scratch_floats(const Conv2dGroupedShape& s,
                                                                Algo algo, const Exec& ex);

void conv2d_grouped_dense_forward(const Conv2dGroupedShape& s, const float* x, const float* w,
                                  const float* b, float* y, bool relu, float* scratch, Algo algo,
                                  const Exec& ex);
void conv2d_grouped_dense_backward_data(const Conv2dGroupedShape& s, const float* dy,
                                        const float* w, float* dx, float* scratch, Algo algo,
                                        const Exec& ex);
void conv2d_grouped_dense_backward_weight(const Conv2dGroupedShape& s, const float* x,
                                          const float* dy, float* dw, float* db, float* scratch,
                                          Algo algo, const Exec& ex);

}  // namespace cnn
