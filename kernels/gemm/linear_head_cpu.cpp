// CPU twin of the fused linear-head backward: the separate CPU references, one after another.
#include <cstdint>

#include "kernels/gemm/linear_head.h"
#include "kernels/pointwise/relu.h"

namespace cnn {

void linear_head_backward_cpu(const LinearShape& s, const float* x, const float* dy, const float* w,
                              float* dw, float* db, float* dx, bool mask_input_relu) {
  linear_backward_weight_cpu(s, x, dy, dw, db);
  if (!dx) return;
  linear_backward_data_cpu(s, dy, w, dx);
  if (mask_input_relu) relu_backward_cpu(int64_t(s.n) * s.in, x, dx, dx);
}

}  // namespace cnn
