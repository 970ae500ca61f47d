// CPU twin of the fused linear-head backward: the separate CPU references, one after another (the
// previous layer's bias gradient as linear_backward_weight_cpu sums a bias gradient).
#include <cstdint>

#include "kernels/gemm/linear_head.h"
#include "kernels/pointwise/relu.h"

namespace cnn {

void linear_head_backward_cpu(const LinearShape& s, const float* x, const float* dy, const float* w,
                              float* dw, float* db, float* dx, bool mask_input_relu,
                              float* input_db) {
  linear_backward_weight_cpu(s, x, dy, dw, db);
  if (!dx) return;
  linear_backward_data_cpu(s, dy, w, dx);
  if (mask_input_relu) relu_backward_cpu(int64_t(s.n) * s.in, x, dx, dx);
  if (!input_db) return;
  for (int k = 0; k < s.in; ++k) {
    double acc = 0;
    for (int i = 0; i < s.n; ++i) acc += dx[int64_t(i) * s.in + k];
    input_db[k] = static_cast<float>(input_db[k] + acc);
  }
}

}  // namespace cnn
