// CPU reference for average pooling: plain loops, sums in double, one template for float and
// double.
#include <algorithm>
#include <vector>

#include "kernels/pool/avgpool.h"

namespace cnn {
namespace {

template <class T>
void forward(const AvgPoolShape& s, const T* x, T* y) {
  const int oh = s.oh(), ow = s.ow();
  const double inv = 1.0 / double(s.kh * s.kw);  // count_include_pad: padding counts
  for (int64_t p = 0; p < int64_t(s.n) * s.c; ++p) {
    const T* xp = x + p * s.h * s.w;  // (H, W)
    for (int i = 0; i < oh; ++i)
      for (int j = 0; j < ow; ++j) {
        double sum = 0;
        for (int a = 0; a < s.kh; ++a) {
          const int ih = i * s.stride_h - s.pad_h + a;
          if (ih < 0 || ih >= s.h) continue;
          for (int b = 0; b < s.kw; ++b) {
            const int iw = j * s.stride_w - s.pad_w + b;
            if (iw >= 0 && iw < s.w) sum += xp[ih * s.w + iw];
          }
        }
        y[(p * oh + i) * ow + j] = static_cast<T>(sum * inv);
      }
  }
}

template <class T>
void backward(const AvgPoolShape& s, const T* dy, T* dx) {
  const int oh = s.oh(), ow = s.ow();
  const double inv = 1.0 / double(s.kh * s.kw);
  std::vector<double> acc(size_t(s.h) * s.w);
  for (int64_t p = 0; p < int64_t(s.n) * s.c; ++p) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int i = 0; i < oh; ++i)
      for (int j = 0; j < ow; ++j) {
        const double g = double(dy[(p * oh + i) * ow + j]) * inv;
        for (int a = 0; a < s.kh; ++a) {
          const int ih = i * s.stride_h - s.pad_h + a;
          if (ih < 0 || ih >= s.h) continue;
          for (int b = 0; b < s.kw; ++b) {
            const int iw = j * s.stride_w - s.pad_w + b;
            if (iw >= 0 && iw < s.w) acc[size_t(ih) * s.w + iw] += g;
          }
        }
      }
    for (size_t k = 0; k < acc.size(); ++k) dx[p * int64_t(acc.size()) + int64_t(k)] = T(acc[k]);
  }
}

template <class T>
void global_forward(int64_t planes, int64_t plane, const T* x, T* y) {
  for (int64_t p = 0; p < planes; ++p) {
    double sum = 0;
    for (int64_t k = 0; k < plane; ++k) sum += x[p * plane + k];
    y[p] = static_cast<T>(sum / double(plane));
  }
}

template <class T>
void global_backward(int64_t planes, int64_t plane, const T* dy, T* dx) {
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t k = 0; k < plane; ++k)
      dx[p * plane + k] = static_cast<T>(double(dy[p]) / double(plane));
}

}  // namespace

void avgpool_forward_cpu(const AvgPoolShape& s, const float* x, float* y) {
  forward(s, x, y);
}
void avgpool_forward_cpu(const AvgPoolShape& s, const double* x, double* y) {
  forward(s, x, y);
}
void avgpool_backward_cpu(const AvgPoolShape& s, const float* dy, float* dx) {
  backward(s, dy, dx);
}
void avgpool_backward_cpu(const AvgPoolShape& s, const double* dy, double* dx) {
  backward(s, dy, dx);
}
void global_avgpool_forward_cpu(int64_t planes, int64_t plane, const float* x, float* y) {
  global_forward(planes, plane, x, y);
}
void global_avgpool_forward_cpu(int64_t planes, int64_t plane, const double* x, double* y) {
  global_forward(planes, plane, x, y);
}
void global_avgpool_backward_cpu(int64_t planes, int64_t plane, const float* dy, float* dx) {
  global_backward(planes, plane, dy, dx);
}
void global_avgpool_backward_cpu(int64_t planes, int64_t plane, const double* dy, double* dx) {
  global_backward(planes, plane, dy, dx);
}

}  // namespace cnn
