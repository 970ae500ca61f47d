// CPU twin of quantize.h: one multiply, clamp, round half to even.
#include "kernels/quant/qconv.h"
#include "kernels/quant/quantize.h"

namespace cnn {

void quantize_nchw_to_nhwc_cpu(const QuantizeShape& s, const float* x, float inv_scale, int8_t* y) {
  for (int64_t i = 0; i < s.n; ++i)
    for (int r = 0; r < s.h; ++r)
      for (int q = 0; q < s.w; ++q) {
        int8_t* out = y + ((i * s.h + r) * s.w + q) * s.cp;
        for (int c = 0; c < s.cp; ++c)
          out[c] = c < s.c ? requantize_value(x[((i * s.c + c) * s.h + r) * s.w + q] * inv_scale)
                           : int8_t(0);
      }
}

}  // namespace cnn
