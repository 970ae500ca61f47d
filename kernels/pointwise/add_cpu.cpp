// CPU reference for the elementwise add: a plain loop, one template for float and double.
#include "kernels/pointwise/add.h"

namespace cnn {
namespace {

template <class T>
void add(int64_t count, const T* a, const T* b, T* y) {
  for (int64_t i = 0; i < count; ++i) y[i] = a[i] + b[i];
}

}  // namespace

void add_forward_cpu(int64_t count, const float* a, const float* b, float* y) {
  add(count, a, b, y);
}
void add_forward_cpu(int64_t count, const double* a, const double* b, double* y) {
  add(count, a, b, y);
}

}  // namespace cnn
