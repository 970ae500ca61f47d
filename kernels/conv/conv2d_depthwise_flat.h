#pragma once
// The flat depthwise kernels (kernels/conv/conv2d_depthwise_flat.cu): forward and input gradient
// of a depthwise convolution with stride 1 or 2 (depthwise_flat_applicable: C/G == 1, square
// 3x3, 5x5 or 7x7 kernels, padding below the kernel size, dilation 1, any channel multiplier).
// The fast variant's only kernels for stride 2 (MobileNet's downsampling layers); for stride 1
// one of its four (DepthwiseKernel::Flat, conv2d_grouped.h).
//   forward:        one thread per output; the input read through L1 (neighbouring outputs
//                   share most of their taps); bias and ReLU fused.
//   input gradient: one thread per S x S block of dx (S the stride): each tap (ky, kx) reaches
//                   exactly one pixel of the block (the one whose iy + pad - ky and
//                   ix + pad - kx are multiples of S), so a block sums K*K products per output
//                   channel, no tap tested against a pixel it cannot reach and no division;
//                   summed over the channel multiplier's dy planes. Every dx element written
//                   once: no atomics, bitwise repeatable.
// Both flatten (plane, position) into one index, so that small planes (7 x 7) fill their blocks
// and no grid dimension limits the batch. FP32 FFMA at every precision, as the other grouped
// kernels. Device pointers; asynchronous on `stream`; the caller has checked the shape.
#include "kernels/conv/conv2d_grouped.h"
#include "runtime/stream.h"

namespace cnn {

bool depthwise_flat_applicable(const Conv2dGroupedShape& s);

void depthwise_flat_forward_cuda(const Conv2dGroupedShape& s, const float* d_x, const float* d_w,
                                 const float* d_b, float* d_y, bool relu, cudaStream_t stream);
void depthwise_flat_backward_data_cuda(const Conv2dGroupedShape& s, const float* d_dy,
                                       const float* d_w, float* d_dx, cudaStream_t stream);

}  // namespace cnn
