// CPU twin of the int8 residual add (qadd.h): one loop, the formula spelled as the CUDA kernel
// spells it.
#include <cmath>

#include "kernels/quant/qadd.h"
#include "kernels/quant/qconv.h"

namespace cnn {

float qadd_value(int8_t a, int8_t b, const QAddScales& k) {
  const float sb = static_cast<float>(b) * k.mult_b;  // rounded to float before the fma
  float v = std::fma(static_cast<float>(a), k.mult_a, sb);
  if (k.relu) v = v > 0.f ? v : 0.f;  // as the CUDA kernel, -0 included
  return v;
}

void qadd_forward_cpu(const QAddShape& s, const int8_t* a, const int8_t* b, const QAddScales& k,
                      int8_t* y) {
  const int64_t total = int64_t(s.n) * s.h * s.w * s.cp;
  for (int64_t i = 0; i < total; ++i)
    y[i] = int(i % s.cp) < s.c ? requantize_value(qadd_value(a[i], b[i], k)) : int8_t(0);
}

}  // namespace cnn
