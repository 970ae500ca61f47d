#pragma once
// The first convolution of a network fused with the ReLU and the 2x2 / stride-2 max-pool after it
// (conv1 -> relu -> maxpool of the reference network): conv + bias + ReLU + pool in one pass that
// writes only the pooled output and the pool's argmax, never the full-size conv output; and the
// conv's weight and bias gradients computed straight from the pool's output gradient, never
// materializing the full-size conv gradient.
//
// Semantics are exactly those of conv2d_forward(relu = true) followed by maxpool_forward (2x2,
// stride 2, no padding): the max is taken over the ReLU'd values in row-major window order,
// strictly greater replaces, NaN wins. So among non-positive values (all ReLU'd to 0) the FIRST
// window element wins, as in the unfused chain. argmax has maxpool_forward's convention (index
// oy*OW + ox within the conv output plane), so maxpool_backward stays usable on it.
// The backward equals maxpool_backward(dy, argmax, relu_y = y) followed by
// conv2d_backward_weight: a pooled gradient counts only where the pooled y > 0.
// Precision: with CNN_CRP_TENSOR_CORES=1, at ex.precision tf32 or bf16 on a GPU of compute
// capability 8.0 or later, both passes run on the tensor cores (conv_relu_pool_mma.cu, as the
// other convolutions at those precisions): x, w and the conv's gradient rounded to TF32
// (nearest, ties away from zero) or BF16 (nearest, ties to even), the bias not, FP32 sums, db the
// sum of the rounded gradient; the ReLU and pool rules above are unchanged. Otherwise FP32.
//
// Only the single-input-channel shapes of a first layer are supported (conv2d_1ch.h's case):
// conv_relu_pool_applicable() says when; the Network runs the three layers apart otherwise.
// The input gradient is not computed (the first layer needs none).
#include <cstddef>
#include <cstdint>

#include "kernels/conv/conv2d.h"
#include "runtime/exec.h"
#include "kernels/pool/maxpool.h"

namespace cnn {

// One input channel, stride 1, a square odd kernel of 1, 3, 5 or 7 (any padding), an even conv
// output height and width (the 2x2 windows tile it exactly), and tensors under 2^31 elements.
bool conv_relu_pool_applicable(const Conv2dShape& s);
// The pool over the conv output: (N, OC, OH, OW), 2x2, stride 2, no padding.
MaxPoolShape conv_relu_pool_pool_shape(const Conv2dShape& s);

// x (N, 1, H, W); w (OC, 1, K, K); b (OC) or null;
// y (N, OC, OH/2, OW/2) = maxpool(relu(conv(x, w) + b)); argmax (N, OC, OH/2, OW/2).
// Overwrites y and argmax. Throws unless conv_relu_pool_applicable(s).
void conv_relu_pool_forward(const Conv2dShape& s, const float* x, const float* w, const float* b,
                            float* y, int32_t* argmax, const Exec& ex);

// dw (OC, 1, K, K) += sum over batch of x (*) dconv; db (OC) += sum of dconv (db may be null),
// where dconv = maxpool_backward(dy, argmax, relu_y = y), never formed. y, dy and argmax are
// (N, OC, OH/2, OW/2): the forward's pooled output and argmax and the pooled output's gradient.
// ACCUMULATES into dw/db. Default: atomicAdd; ex.deterministic: fixed-order two-stage reduction
// through `scratch` (conv_relu_pool_backward_weight_scratch_floats), bitwise repeatable.
std::size_t conv_relu_pool_backward_weight_scratch_floats(const Conv2dShape& s, const Exec& ex);
void conv_relu_pool_backward_weight(const Conv2dShape& s, const float* x, const float* y,
                                    const float* dy, const int32_t* argmax, float* dw, float* db,
                                    float* scratch, const Exec& ex);

// CPU twins: the unfused chain of CPU references (conv2d_forward_cpu with ReLU, maxpool_*_cpu,
// conv2d_backward_weight_cpu) through a full-size temporary. Same contracts as above.
void conv_relu_pool_forward_cpu(const Conv2dShape& s, const float* x, const float* w,
                                const float* b, float* y, int32_t* argmax);
void conv_relu_pool_backward_weight_cpu(const Conv2dShape& s, const float* x, const float* y,
                                        const float* dy, const int32_t* argmax, float* dw,
                                        float* db);

}  // namespace cnn
