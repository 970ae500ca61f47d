// CPU twin of the int8 convolution: plain loops, exact int32 sums, the epilogue of qconv.h.
// Images run in parallel (each writes its own output rows).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/quant/qconv.h"
#include "runtime/thread_pool.h"

namespace cnn {
namespace {

// acc (OH, OW, OC) of image `img`.
void accumulate_image(const QConvShape& s, const int8_t* x, const int8_t* w, int img,
                      int32_t* acc) {
  const int oh = s.oh(), ow = s.ow(), cg = s.cg(), ocg = s.ocg();
  const int8_t* xi = x + int64_t(img) * s.h * s.w * s.cp;
  for (int y = 0; y < oh; ++y)
    for (int xo = 0; xo < ow; ++xo)
      for (int o = 0; o < s.oc; ++o) {
        const int g = o / ocg;
        int32_t sum = 0;
        for (int r = 0; r < s.kh; ++r) {
          const int iy = y * s.stride_h - s.pad_h + r * s.dil_h;
          if (iy < 0 || iy >= s.h) continue;
          for (int q = 0; q < s.kw; ++q) {
            const int ix = xo * s.stride_w - s.pad_w + q * s.dil_w;
            if (ix < 0 || ix >= s.w) continue;
            const int8_t* xp = xi + (int64_t(iy) * s.w + ix) * s.cp + g * cg;
            const int8_t* wp = w + ((int64_t(o) * s.kh + r) * s.kw + q) * s.cgp;
            for (int ci = 0; ci < cg; ++ci) sum += int32_t(xp[ci]) * int32_t(wp[ci]);
          }
        }
        acc[(int64_t(y) * ow + xo) * s.oc + o] = sum;
      }
}

float epilogue_value(int32_t acc, const QEpilogue& ep, int o) {
  float v = std::fma(static_cast<float>(acc), ep.mult[o], ep.add[o]);
  if (ep.relu) v = v > 0.f ? v : 0.f;  // as the CUDA epilogue, -0 included
  return v;
}

// Runs the epilogue and pool of every image; put(img, py, px, o, value) stores one output.
template <class T, class Put>
void run(const QConvShape& s, const int8_t* x, const int8_t* w, const QEpilogue& ep, Put put) {
  const int oh = s.oh(), ow = s.ow(), ph = s.ph(), pw = s.pw();
  parallel_for(0, s.n, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> acc(size_t(oh) * size_t(ow) * size_t(s.oc));
    for (int64_t img = begin; img < end; ++img) {
      accumulate_image(s, x, w, int(img), acc.data());
      for (int py = 0; py < ph; ++py)
        for (int px = 0; px < pw; ++px)
          for (int o = 0; o < s.oc; ++o) {
            T best = std::numeric_limits<T>::lowest();
            for (int r = 0; r < s.pool_kh; ++r) {
              const int y = py * s.pool_sh - s.pool_ph + r;
              if (y < 0 || y >= oh) continue;
              for (int q = 0; q < s.pool_kw; ++q) {
                const int xo = px * s.pool_sw - s.pool_pw + q;
                if (xo < 0 || xo >= ow) continue;
                const float v = epilogue_value(acc[(int64_t(y) * ow + xo) * s.oc + o], ep, o);
                T t;
                if constexpr (std::is_same_v<T, int8_t>)
                  t = requantize_value(v);
                else
                  t = v;
                best = t > best ? t : best;
              }
            }
            put(img, py, px, o, best);
          }
    }
  });
}

}  // namespace

void qconv_accumulate_cpu(const QConvShape& s, const int8_t* x, const int8_t* w, int32_t* acc) {
  const int64_t per_image = int64_t(s.oh()) * s.ow() * s.oc;
  for (int img = 0; img < s.n; ++img) accumulate_image(s, x, w, img, acc + img * per_image);
}

void qconv_forward_cpu(const QConvShape& s, const int8_t* x, const int8_t* w, const QEpilogue& ep,
                       int8_t* y) {
  const int ph = s.ph(), pw = s.pw();
  run<int8_t>(s, x, w, ep, [&](int64_t img, int py, int px, int o, int8_t v) {
    int8_t* row = y + ((img * ph + py) * pw + px) * s.ocp;
    row[o] = v;
    if (o == s.oc - 1)
      for (int z = s.oc; z < s.ocp; ++z) row[z] = 0;
  });
}

void qconv_forward_float_cpu(const QConvShape& s, const int8_t* x, const int8_t* w,
                             const QEpilogue& ep, float* y) {
  const int ph = s.ph(), pw = s.pw();
  run<float>(s, x, w, ep, [&](int64_t img, int py, int px, int o, float v) {
    y[((img * ph + py) * pw + px) * s.oc + o] = v;
  });
}

}  // namespace cnn
