// Fused head-and-loss dispatch: checks the arguments once, then runs the CPU twin or the CUDA
// launcher; and how the launcher cuts the batch, which needs no GPU to compute.
#include "kernels/gemm/linear_head_loss.h"

#include <algorithm>

#include "kernels/gemm/linear_head_loss_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {

LinearHeadLossPlan linear_head_loss_plan(const LinearShape& s, bool deterministic,
                                         int rows_per_block) {
  constexpr int kWarpRows = 8;  // one row a warp of the forward-only kernel
  LinearHeadLossPlan p;
  if (rows_per_block > 0)
    p.rows_per_block = std::min(rows_per_block, s.n);
  else if (deterministic)
    p.rows_per_block = s.n <= kLinearHeadLossMaxRows ? s.n : kWarpRows;
  else
    p.rows_per_block = std::min(kLinearHeadLossRows, s.n);
  // Deterministic mode sums each output in one owner: one block, or the separate backward.
  p.fused_backward = !deterministic || p.rows_per_block >= s.n;
  return p;
}

void linear_head_loss_step(const LinearShape& s, const float* x, const float* w, const float* b,
                           float* y, const XentTargets& t, float* dy, float* dw, float* db,
                           float* dx, bool mask_input_relu, float* input_db, const Exec& ex) {
  check_linear_shape(s);
  CNN_CHECK(s.out <= kLinearHeadMaxOut,
            "linear_head_loss_step: {} outputs; the fused kernel takes at most {}", s.out,
            kLinearHeadMaxOut);
  CNN_CHECK(x && w && y && dy && dw, "linear_head_loss_step: x, w, y, dy and dw must not be null");
  CNN_CHECK(t.labels && t.loss_rows && t.pred,
            "linear_head_loss_step: labels, loss_rows and pred must not be null");
  CNN_CHECK(t.label_smoothing >= 0.f && t.label_smoothing < 1.f,
            "linear_head_loss_step: label_smoothing {} must be in [0, 1)", t.label_smoothing);
  CNN_CHECK(!input_db || (dx && mask_input_relu),
            "linear_head_loss_step: input_db needs dx and the input ReLU mask");
  if (ex.device == Device::CPU)
    return linear_head_loss_step_cpu(s, x, w, b, y, t, dy, dw, db, dx, mask_input_relu, input_db);
  CNN_CUDA_BRANCH("linear_head_loss_step",
                  linear_head_loss_step_cuda(s, x, w, b, y, t, dy, dw, db, dx, mask_input_relu,
                                             input_db, ex.deterministic, ex.stream));
}

}  // namespace cnn
