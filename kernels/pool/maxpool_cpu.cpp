// CPU reference for max pooling: plain loops, one template for float and double.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/pool/maxpool.h"

namespace cnn {
namespace {

template <class T>
void forward(const MaxPoolShape& s, const T* x, T* y, int32_t* argmax) {
  const int oh = s.oh(), ow = s.ow();
  const int64_t planes = int64_t(s.n) * s.c;
  for (int64_t p = 0; p < planes; ++p) {
    const T* xp = x + p * s.h * s.w;  // (H, W)
    for (int i = 0; i < oh; ++i) {
      for (int j = 0; j < ow; ++j) {
        T best = 0;
        int32_t best_idx = -1;  // -1: no real element seen yet (padding never wins)
        for (int a = 0; a < s.kh; ++a) {
          const int ih = i * s.stride_h - s.pad_h + a;
          if (ih < 0 || ih >= s.h) continue;
          for (int b = 0; b < s.kw; ++b) {
            const int iw = j * s.stride_w - s.pad_w + b;
            if (iw < 0 || iw >= s.w) continue;
            const T v = xp[ih * s.w + iw];
            // Strictly greater keeps the first of equal maxima; the first NaN wins and stays.
            const bool take = best_idx < 0 || (!std::isnan(best) && (v > best || std::isnan(v)));
            if (take) {
              best = v;
              best_idx = ih * s.w + iw;
            }
          }
        }
        const int64_t o = (p * oh + i) * ow + j;
        y[o] = best;
        argmax[o] = best_idx;
      }
    }
  }
}

template <class T>
void backward(const MaxPoolShape& s, const T* dy, const int32_t* argmax, T* dx, const T* relu_y) {
  const int64_t plane_in = int64_t(s.h) * s.w, plane_out = int64_t(s.oh()) * s.ow();
  const int64_t planes = int64_t(s.n) * s.c;
  std::vector<double> acc(plane_in);  // (H, W) of one plane
  for (int64_t p = 0; p < planes; ++p) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t o = p * plane_out; o < (p + 1) * plane_out; ++o) {
      if (!relu_y || relu_y[o] > T(0)) acc[argmax[o]] += dy[o];
    }
    for (int64_t k = 0; k < plane_in; ++k) dx[p * plane_in + k] = static_cast<T>(acc[k]);
  }
}

}  // namespace

void maxpool_forward_cpu(const MaxPoolShape& s, const float* x, float* y, int32_t* argmax) {
  forward(s, x, y, argmax);
}
void maxpool_forward_cpu(const MaxPoolShape& s, const double* x, double* y, int32_t* argmax) {
  forward(s, x, y, argmax);
}
void maxpool_backward_cpu(const MaxPoolShape& s, const float* dy, const int32_t* argmax, float* dx,
                          const float* relu_y) {
  backward(s, dy, argmax, dx, relu_y);
}
void maxpool_backward_cpu(const MaxPoolShape& s, const double* dy, const int32_t* argmax,
                          double* dx, const double* relu_y) {
  backward(s, dy, argmax, dx, relu_y);
}

}  // namespace cnn
