// Softmax cross-entropy dispatch: checks the shape once, then runs the CPU reference or the CUDA
// launcher.
#include "kernels/loss/softmax_xent.h"

#include <cstdint>

#include "kernels/loss/softmax_xent_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {

void softmax_xent(const XentShape& s, const float* logits, const int32_t* labels, float* loss_rows,
                  int32_t* pred, float* dlogits, float grad_scale, const Exec& ex,
                  float label_smoothing) {
  CNN_CHECK(s.n >= 1 && s.classes >= 1,
            "softmax_xent: shape (N, classes) = ({}, {}) must be positive", s.n, s.classes);
  CNN_CHECK(int64_t(s.n) * s.classes <= INT32_MAX,
            "softmax_xent: {} x {} logits exceed 2^31-1 elements", s.n, s.classes);
  CNN_CHECK(logits && labels && loss_rows && pred,
            "softmax_xent: logits, labels, loss_rows and pred must not be null");
  CNN_CHECK(label_smoothing >= 0.f && label_smoothing < 1.f,
            "softmax_xent: label_smoothing {} must be in [0, 1)", label_smoothing);
  if (ex.device == Device::CPU)
    return softmax_xent_cpu(s, logits, labels, loss_rows, pred, dlogits, grad_scale,
                            label_smoothing);
  CNN_CUDA_BRANCH("softmax_xent", softmax_xent_cuda(s, logits, labels, loss_rows, pred, dlogits,
                                                    grad_scale, label_smoothing, ex.stream));
}

void accumulate_metrics(int n, const float* loss_rows, const int32_t* pred, const int32_t* labels,
                        double* totals, const Exec& ex) {
  CNN_CHECK(n >= 0, "accumulate_metrics: row count must be >= 0, got {}", n);
  CNN_CHECK(totals && (n == 0 || (loss_rows && pred && labels)),
            "accumulate_metrics: null pointer for {} rows", n);
  if (n == 0) return;
  if (ex.device == Device::CPU) return accumulate_metrics_cpu(n, loss_rows, pred, labels, totals);
  CNN_CUDA_BRANCH("accumulate_metrics",
                  accumulate_metrics_cuda(n, loss_rows, pred, labels, totals, ex.stream));
}

}  // namespace cnn
