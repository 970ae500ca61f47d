// CPU twin of the fused head-and-loss step: the separate CPU references, one after another.
#include "kernels/gemm/linear_head_loss.h"

namespace cnn {

void linear_head_loss_step_cpu(const LinearShape& s, const float* x, const float* w, const float* b,
                               float* y, const XentTargets& t, float* dy, float* dw, float* db,
                               float* dx, bool mask_input_relu, float* input_db) {
  linear_forward_cpu(s, x, w, b, y, false);
  softmax_xent_cpu(XentShape{s.n, s.out}, y, t.labels, t.loss_rows, t.pred, dy, t.grad_scale,
                   t.label_smoothing);
  linear_head_backward_cpu(s, x, dy, w, dw, db, dx, mask_input_relu, input_db);
}

}  // namespace cnn
