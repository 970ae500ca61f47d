// CPU reference for the fully connected layer: plain loops with double accumulation, one
// template for float and double.
#include <cstdint>

#include "kernels/gemm/linear.h"

namespace cnn {
namespace {

template <class T>
void forward(const LinearShape& s, const T* x, const T* w, const T* b, T* y, bool relu) {
  for (int i = 0; i < s.n; ++i) {
    for (int o = 0; o < s.out; ++o) {
      double acc = 0;
      for (int k = 0; k < s.in; ++k)
        acc += double(x[int64_t(i) * s.in + k]) * w[int64_t(o) * s.in + k];
      T v = static_cast<T>(acc + (b ? double(b[o]) : 0.0));
      if (relu) v = (v <= T(0)) ? T(0) : v;  // NaN passes, as in relu_forward
      y[int64_t(i) * s.out + o] = v;
    }
  }
}

template <class T>
void backward_data(const LinearShape& s, const T* dy, const T* w, T* dx) {
  for (int i = 0; i < s.n; ++i) {
    for (int k = 0; k < s.in; ++k) {
      double acc = 0;
      for (int o = 0; o < s.out; ++o)
        acc += double(dy[int64_t(i) * s.out + o]) * w[int64_t(o) * s.in + k];
      dx[int64_t(i) * s.in + k] = static_cast<T>(acc);
    }
  }
}

template <class T>
void backward_weight(const LinearShape& s, const T* x, const T* dy, T* dw, T* db,
                     bool overwrite_dw) {
  for (int o = 0; o < s.out; ++o) {
    for (int k = 0; k < s.in; ++k) {
      double acc = 0;
      for (int i = 0; i < s.n; ++i)
        acc += double(dy[int64_t(i) * s.out + o]) * x[int64_t(i) * s.in + k];
      T& g = dw[int64_t(o) * s.in + k];
      g = static_cast<T>(overwrite_dw ? acc : g + acc);
    }
    if (db) {
      double acc = 0;
      for (int i = 0; i < s.n; ++i) acc += dy[int64_t(i) * s.out + o];
      db[o] = static_cast<T>(db[o] + acc);
    }
  }
}

}  // namespace

void linear_forward_cpu(const LinearShape& s, const float* x, const float* w, const float* b,
                        float* y, bool relu) {
  forward(s, x, w, b, y, relu);
}
void linear_forward_cpu(const LinearShape& s, const double* x, const double* w, const double* b,
                        double* y, bool relu) {
  forward(s, x, w, b, y, relu);
}
void linear_backward_data_cpu(const LinearShape& s, const float* dy, const float* w, float* dx) {
  backward_data(s, dy, w, dx);
}
void linear_backward_data_cpu(const LinearShape& s, const double* dy, const double* w, double* dx) {
  backward_data(s, dy, w, dx);
}
void linear_backward_weight_cpu(const LinearShape& s, const float* x, const float* dy, float* dw,
                                float* db, bool overwrite_dw) {
  backward_weight(s, x, dy, dw, db, overwrite_dw);
}
void linear_backward_weight_cpu(const LinearShape& s, const double* x, const double* dy, double* dw,
                                double* db) {
  backward_weight(s, x, dy, dw, db, false);
}

}  // namespace cnn
