#pragma once
// Int8 average pooling for inference, as torch.nn.AvgPool2d with its defaults
// (count_include_pad=True, ceil_mode=False): every window divides by kh * kw, padded zeros
// included. The input's scale and the output's differ, so the mean is requantized:
//   acc = sum of x over the window (int32, exact)
//   v   = float(acc) * mult           mult = s_in / (s_out * kh * kw); one IEEE multiply
//   v   = max(v, 0) with relu
//   y   = round_half_even(clamp(v, -127, 127))   (the rounding of qconv.h)
// float(acc) is exact (|acc| <= 127 * kh * kw < 2^24), so the CPU twin and the CUDA kernel agree
// bit for bit. Layouts: x (N, H, W, CP), y (N, OH, OW, CP), channels C..CP-1 written as zero.
#include <cstdint>

#include "runtime/exec.h"

namespace cnn {

struct QAvgPoolShape {
  int n = 1, h = 1, w = 1, c = 1;
  int cp = 4;  // padded channel stride of x and y, >= c, a multiple of 4
  int kh = 2, kw = 2, stride_h = 2, stride_w = 2, pad_h = 0, pad_w = 0;
  int oh() const { return (h + 2 * pad_h - kh) / stride_h + 1; }
  int ow() const { return (w + 2 * pad_w - kw) / stride_w + 1; }
};

// Throws naming the bad field (the pooling rules: padding at most half the window, a window of
// at most 2^16 elements so the int32 sum and its float conversion stay exact).
void check_qavgpool_shape(const QAvgPoolShape& s);

void qavgpool_forward(const QAvgPoolShape& s, const int8_t* x, float mult, bool relu, int8_t* y,
                      const Exec& ex);
void qavgpool_forward_cpu(const QAvgPoolShape& s, const int8_t* x, float mult, bool relu,
                          int8_t* y);

// The value of one output before rounding (the CPU side of the formula above; tests use it).
float qavgpool_value(int32_t acc, float mult, bool relu);

}  // namespace cnn
