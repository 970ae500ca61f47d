#pragma once
// Softmax cross-entropy, fused forward + backward, numerically stable (max subtracted).
#include <cstdint>

#include "runtime/exec.h"

namespace cnn {

struct XentShape {
  int n = 1, classes = 2;
};

// For each row i: loss_rows[i] = logsumexp(logits_i) - logits_i[label_i];
// pred[i] = argmax of logits_i (first maximum); if dlogits is non-null,
// dlogits_i = (softmax(logits_i) - onehot(label_i)) * grad_scale (usually 1/N).
// label_smoothing eps in [0, 1) (torch's CrossEntropyLoss(label_smoothing=eps)): the target is
// t = (1 - eps) * onehot + eps / classes, so loss_rows[i] = -sum_j t_j log softmax_j and
// dlogits_i = (softmax(logits_i) - t) * grad_scale.
// Labels outside [0, classes) are a caller error (checked on the host by the data loader); the
// kernels do not read out of bounds for them but give that row a NaN loss.
void softmax_xent(const XentShape& s, const float* logits, const int32_t* labels, float* loss_rows,
                  int32_t* pred, float* dlogits, float grad_scale, const Exec& ex,
                  float label_smoothing = 0.0f);

// Adds this batch into running device counters, in fixed order (deterministic):
// totals[0] += sum(loss_rows), totals[1] += count(pred == label) (as double), totals[2] += n.
// Only logging points read the totals back to the host.
void accumulate_metrics(int n, const float* loss_rows, const int32_t* pred, const int32_t* labels,
                        double* totals, const Exec& ex);

void softmax_xent_cpu(const XentShape& s, const float* logits, const int32_t* labels,
                      float* loss_rows, int32_t* pred, float* dlogits, float grad_scale,
                      float label_smoothing = 0.0f);
// Double twin for the numerical gradient checker.
void softmax_xent_cpu(const XentShape& s, const double* logits, const int32_t* labels,
                      double* loss_rows, int32_t* pred, double* dlogits, double grad_scale,
                      double label_smoothing = 0.0);
void accumulate_metrics_cpu(int n, const float* loss_rows, const int32_t* pred,
                            const int32_t* labels, double* totals);

}  // namespace cnn
