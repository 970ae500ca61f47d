#pragma once
// A dilated convolution of stride 1 and one group on the dense kernels of conv2d.h (igemm, wgmma,
// wgmma-nhwc, or the dense op's fixed rule for auto). Where wgmma-nhwc takes the dilated shape
// itself (conv2d_*_runs_directly: its TMA im2col reads each tap at its dilated offset; the
// forward and input gradient at fp32, tf32 and bf16, the weight gradient at bf16), the pass is
// that one dense pass, with no copies. Otherwise, with dilation d, output row i reads input
// rows i - pad + d k: one residue modulo d. So the padded input splits into d_h x d_w phase
// images (conv2d_dilation_phases.h), and on the batch of all phases the convolution is one
// undilated dense convolution with no padding; its output phases interleave back into y. The
// input gradient runs the same way on dy's phases (zero past the output's edge), the weight
// gradient on both. A pass costs a copy of each activation it reads and writes plus one dense
// pass; the direct loops of conv2d_grouped.h that served dilation before leave the tensor cores
// idle (a 64 -> 128 3x3 pass at batch 128 on 32x32 took them 1.7-7.3 ms on an H100).
//
// Takes groups 1, stride 1, dilation >= 1 on both axes and >= 2 on one; refuses others, and a
// scratch smaller than the _scratch_floats functions ask, with cnn::Error. Contracts as
// conv2d_grouped.h (the weight gradient accumulates).
#include <cstddef>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_grouped.h"
#include "runtime/exec.h"

namespace cnn {

bool conv2d_dilated_dense_applicable(const Conv2dGroupedShape& s);
// The undilated dense convolution over the batch of phases: (d_h d_w N, C, HS, WS) -> (d_h d_w N,
// OC, HS - KH + 1, WS - KW + 1), HS = ceil((H + 2 pad_h) / d_h) (and for W).
Conv2dShape conv2d_dilated_phase_shape(const Conv2dGroupedShape& s);

// Scratch floats of each pass with dense variant `algo` (16-byte aligned when given): the dense
// pass's own where it reads the dilated taps itself; else the phase layouts of the pass's input
// and output, and the phase pass's own scratch. 0 where the shape is not applicable.
std::size_t conv2d_dilated_dense_forward_scratch_floats(const Conv2dGroupedShape& s, Algo algo,
                                                        const Exec& ex);
std::size_t conv2d_dilated_dense_backward_data_scratch_floats(const Conv2dGroupedShape& s,
                                                              Algo algo, const Exec& ex);
std::size_t conv2d_dilated_dense_backward_weight_scratch_floats(const Conv2dGroupedShape& s,
                                                                Algo algo, const Exec& ex);

void conv2d_dilated_dense_forward(const Conv2dGroupedShape& s, const float* x, const float* w,
                                  const float* b, float* y, bool relu, float* scratch, Algo algo,
                                  const Exec& ex);
void conv2d_dilated_dense_backward_data(const Conv2dGroupedShape& s, const float* dy,
                                        const float* w, float* dx, float* scratch, Algo algo,
                                        const Exec& ex);
void conv2d_dilated_dense_backward_weight(const Conv2dGroupedShape& s, const float* x,
                                          const float* dy, float* dw, float* db, float* scratch,
                                          Algo algo, const Exec& ex);

}  // namespace cnn
