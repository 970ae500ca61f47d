#pragma once
// CUDA launchers for softmax_xent.h (kernels/softmax_xent.cu). Called after the checks.
#include <cstdint>

#include "kernels/loss/softmax_xent.h"
#include "runtime/stream.h"

namespace cnn {

void softmax_xent_cuda(const XentShape& s, const float* d_logits, const int32_t* d_labels,
                       float* d_loss_rows, int32_t* d_pred, float* d_dlogits, float grad_scale,
                       float label_smoothing, cudaStream_t stream);
void accumulate_metrics_cuda(int n, const float* d_loss_rows, const int32_t* d_pred,
                             const int32_t* d_labels, double* d_totals, cudaStream_t stream);

}  // namespace cnn
