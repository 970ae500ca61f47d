// CPU twin of the int8 average pool (qavgpool.h): plain loops, the formula spelled as the CUDA
// kernel spells it.
#include "kernels/quant/qavgpool.h"
#include "kernels/quant/qconv.h"

namespace cnn {

float qavgpool_value(int32_t acc, float mult, bool relu) {
  float v = static_cast<float>(acc) * mult;
  if (relu) v = v > 0.f ? v : 0.f;  // as the CUDA kernel, -0 included
  return v;
}

void qavgpool_forward_cpu(const QAvgPoolShape& s, const int8_t* x, float mult, bool relu,
                          int8_t* y) {
  for (int64_t i = 0; i < s.n; ++i)
    for (int r = 0; r < s.oh(); ++r)
      for (int q = 0; q < s.ow(); ++q) {
        int8_t* out = y + ((i * s.oh() + r) * s.ow() + q) * s.cp;
        for (int c = 0; c < s.cp; ++c) {
          if (c >= s.c) {
            out[c] = 0;
            continue;
          }
          int32_t acc = 0;
          for (int dr = 0; dr < s.kh; ++dr)
            for (int dq = 0; dq < s.kw; ++dq) {
              const int ir = r * s.stride_h - s.pad_h + dr, iq = q * s.stride_w - s.pad_w + dq;
              if (ir < 0 || ir >= s.h || iq < 0 || iq >= s.w) continue;  // a padded zero
              acc += x[((i * s.h + ir) * s.w + iq) * s.cp + c];
            }
          out[c] = requantize_value(qavgpool_value(acc, mult, relu));
        }
      }
}

}  // namespace cnn
