// CPU reference for ReLU: plain loops, one template for float and double.
#include "kernels/pointwise/relu.h"

namespace cnn {
namespace {

// Written as "not (x <= 0)" so that NaN passes through, exactly as the CUDA kernel does.
template <class T>
void forward(int64_t count, const T* x, T* y) {
  for (int64_t i = 0; i < count; ++i) y[i] = (x[i] <= T(0)) ? T(0) : x[i];
}

template <class T>
void backward(int64_t count, const T* y, const T* dy, T* dx) {
  for (int64_t i = 0; i < count; ++i) dx[i] = (y[i] > T(0)) ? dy[i] : T(0);
}

}  // namespace

void relu_forward_cpu(int64_t count, const float* x, float* y) {
  forward(count, x, y);
}
void relu_forward_cpu(int64_t count, const double* x, double* y) {
  forward(count, x, y);
}
void relu_backward_cpu(int64_t count, const float* y, const float* dy, float* dx) {
  backward(count, y, dy, dx);
}
void relu_backward_cpu(int64_t count, const double* y, const double* dy, double* dx) {
  backward(count, y, dy, dx);
}

}  // namespace cnn
