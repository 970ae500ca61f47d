#pragma once
// Int8 convolution for inputs of few channels (C <= 4: the first layer of a grayscale or RGB
// net), with the epilogue, layouts and integer contract of qconv.h, so its outputs equal the CPU
// twin's (qconv_forward_cpu) bit for bit.
//
// Why a kernel of its own: with C = 1 the tensor-core kernel pads K = KH*KW*4 to its 64-wide k
// step and the direct kernel spends one dp4a (4 products) per tap on 1 real channel. This one
// stages the block's input tile and weights in shared memory as 4-byte words, a word holding the
// 4 padded channels of one pixel (C = 2..4) or, for C = 1, 4 horizontally adjacent pixels, so one
// dp4a covers 4 taps of a kernel row and a 5x5 kernel costs 10 dp4a per output instead of 25.
//
// From int8 input it runs as qconv_forward / qconv_forward_float's FewChannels kernel (chosen by
// qconv_pick_kernel, or forced through QConvPath). The first layer can also read the network's
// float input (N, C, H, W) directly, quantizing it while staging with exactly quantize.h's
// arithmetic (one IEEE multiply by inv_scale, clamp, round half to even): the separate
// quantization pass and its int8 copy of the input disappear: qconv_few_channels_forward_quantize.
#include <cstdint>

#include "kernels/quant/qconv.h"
#include "runtime/exec.h"

namespace cnn {

// groups == 1, C <= 4, dilation 1, kernels up to kQFewMaxKernel, a pool window at most
// kQFewMaxPoolW wide, and the block's tiles within the shared memory budget.
constexpr int kQFewMaxKernel = 11, kQFewMaxPoolW = 3;
bool qconv_few_channels_supported(const QConvShape& s);

// The tensor-core version of the same kernel (qconv_few_channels_mma.cu): the same tiles,
// staging, epilogue and bits, the sums on mma.sync m16n8k32 s8 instead of dp4a. It takes what
// the dp4a kernel takes with a pool window of at most kQFewMmaMaxWindow outputs (a window's
// outputs sit in one 16-row mma tile), within the shared memory budget.
constexpr int kQFewMmaMaxWindow = 16;
bool qconv_few_channels_mma_supported(const QConvShape& s);
// Either few-channel kernel (both can quantize the float input themselves).
inline bool qconv_is_few_channel_kernel(QConvKernel k) {
  return k == QConvKernel::FewChannels || k == QConvKernel::FewChannelsTensorCores;
}

// x float (N, C, H, W), quantized as quantize_nchw_to_nhwc(x, inv_scale) would, then convolved;
// y int8 4-byte aligned. The CPU twin runs those two steps. kernel: Auto runs the tensor-core
// kernel where it takes the shape (qconv_pick_kernel's rule), else the dp4a one; FewChannels or
// FewChannelsTensorCores forces one (refused on a shape it does not take).
void qconv_few_channels_forward_quantize(const QConvShape& s, const float* x, float inv_scale,
                                         const int8_t* w, const QEpilogue& ep, int8_t* y,
                                         const Exec& ex, QConvKernel kernel = QConvKernel::Auto);

}  // namespace cnn
