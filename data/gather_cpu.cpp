#include <limits>

#include "data/augment.h"
#include "data/gather.h"
#include "runtime/error.h"

namespace cnn {

void gather_batch_cpu(const GatherParams& p, const uint8_t* images, const int32_t* labels,
                      int64_t n, const int32_t* indices, int batch, float* x, int32_t* y) {
  const int64_t epoch = p.epoch_ptr ? *p.epoch_ptr : p.epoch;
  const int64_t first = gather_batch_offset(p);
  CNN_CHECK(!p.batch_ptr || (first >= 0 && first + batch <= n),
            "gather: batch counter {} selects order entries [{}, {}) outside [0, {})",
            p.batch_ptr ? *p.batch_ptr : 0, first, first + batch, n);
  indices += first;
  const size_t plane = size_t(p.h) * p.w, sample = plane * p.c;
  for (int b = 0; b < batch; ++b) {
    const int64_t i = indices[b];
    CNN_CHECK(i >= 0 && i < n, "gather: index {} at batch position {} is outside [0, {})", i, b, n);
    const AugmentDraw a = draw_augment(p.seed, epoch, i, p.shift, p.flip);
    const uint8_t* src = images + size_t(i) * sample;  // (C, H, W)
    float* dst = x + size_t(b) * sample;               // (C, H, W)
    for (int k = 0; k < p.c; ++k) {
      for (int oy = 0; oy < p.h; ++oy) {
        for (int ox = 0; ox < p.w; ++ox) {
          const int sy = oy + a.dy;
          const int sx = (a.flip != p.mirror ? p.w - 1 - ox : ox) + a.dx;
          // Outside the image is the zero padding of pad + crop (a black pixel, normalized).
          const bool inside = sy >= 0 && sy < p.h && sx >= 0 && sx < p.w;
          const float v = inside ? float(src[(size_t(k) * p.h + sy) * p.w + sx]) : 0.f;
          dst[(size_t(k) * p.h + oy) * p.w + ox] = (v / 255.f - p.mean[k]) / p.stdev[k];
        }
      }
    }
    y[b] = labels[i];
  }
}

}  // namespace cnn
