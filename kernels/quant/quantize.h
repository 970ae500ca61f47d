#pragma once
// Float activations (N, C, H, W) to int8 (N, H, W, CP) for the int8 convolution (qconv.h):
//   q = round_half_even(clamp(x * inv_scale, -127, 127)), channels C..CP-1 zero.
// One IEEE multiply and the rounding of qconv.h, identical on the CPU and the GPU.
#include <cstdint>

#include "runtime/exec.h"

namespace cnn {

struct QuantizeShape {
  int n = 1, c = 1, h = 1, w = 1;
  int cp = 4;  // padded channel stride of the output, >= c, a multiple of 4
};

void quantize_nchw_to_nhwc(const QuantizeShape& s, const float* x, float inv_scale, int8_t* y,
                           const Exec& ex);
void quantize_nchw_to_nhwc_cpu(const QuantizeShape& s, const float* x, float inv_scale, int8_t* y);

}  // namespace cnn
