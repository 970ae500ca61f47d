#pragma once
// The add that ends a residual block in int8: two int8 tensors of different scales requantized
// into the block output's scale, with the ReLU that follows the block fused:
//   v = fma(float(a), mult_a, float(b) * mult_b)     mult_a = s_a / s_out, mult_b = s_b / s_out
//   v = max(v, 0) with relu
//   y = round_half_even(clamp(v, -127, 127))        (the rounding of qconv.h)
// One IEEE multiply then one fused multiply-add, in this order on the CPU and the GPU, so the
// twins agree bit for bit. Layouts: a, b, y (N, H, W, CP), channels C..CP-1 written as zero.
#include <cstdint>

#include "runtime/exec.h"

namespace cnn {

struct QAddShape {
  int n = 1, h = 1, w = 1, c = 1;
  int cp = 4;  // padded channel stride, >= c, a multiple of 4
};

struct QAddScales {
  float mult_a = 1.f, mult_b = 1.f;
  bool relu = false;
};

void qadd_forward(const QAddShape& s, const int8_t* a, const int8_t* b, const QAddScales& k,
                  int8_t* y, const Exec& ex);
void qadd_forward_cpu(const QAddShape& s, const int8_t* a, const int8_t* b, const QAddScales& k,
                      int8_t* y);

// The value of one output before rounding (the CPU side of the formula above; tests use it).
float qadd_value(int8_t a, int8_t b, const QAddScales& k);

}  // namespace cnn
