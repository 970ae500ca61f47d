#pragma once
// Max pooling, NCHW, with the argmax remembered for backward.
#include <cstdint>

#include "runtime/exec.h"

namespace cnn {

struct MaxPoolShape {
  int n = 1, c = 1, h = 1, w = 1;  // input
  int kh = 2, kw = 2;
  int stride_h = 2, stride_w = 2;
  int pad_h = 0, pad_w = 0;  // padded positions never win (-inf)
  int oh() const { return (h + 2 * pad_h - kh) / stride_h + 1; }
  int ow() const { return (w + 2 * pad_w - kw) / stride_w + 1; }
};

// Throws naming the bad field. Padding must be at most half the window (as in PyTorch), which
// guarantees that every window holds at least one real input element.
void check_maxpool_shape(const MaxPoolShape& s);

// y (N, C, OH, OW); argmax (N, C, OH, OW) = index h*W+w within the input plane of the winner.
// Ties go to the first maximum in row-major window order (as in PyTorch). NaN wins.
void maxpool_forward(const MaxPoolShape& s, const float* x, float* y, int32_t* argmax,
                     const Exec& ex);
// dx (N, C, H, W) = sum of dy routed to each argmax. Overwrites dx. Deterministic (gather).
// relu_y (optional): the pool's own forward output y. When given, dy[o] counts only where
// y[o] > 0: the backward of a ReLU just before the pool, fused (max(relu(v)) > 0 exactly when the
// winning element's ReLU passed its gradient), so the full-size ReLU backward pass is skipped.
void maxpool_backward(const MaxPoolShape& s, const float* dy, const int32_t* argmax, float* dx,
                      const Exec& ex, const float* relu_y = nullptr);

void maxpool_forward_cpu(const MaxPoolShape& s, const float* x, float* y, int32_t* argmax);
void maxpool_backward_cpu(const MaxPoolShape& s, const float* dy, const int32_t* argmax, float* dx,
                          const float* relu_y = nullptr);
// Double twins for the numerical gradient checker (argmax stays int32).
void maxpool_forward_cpu(const MaxPoolShape& s, const double* x, double* y, int32_t* argmax);
void maxpool_backward_cpu(const MaxPoolShape& s, const double* dy, const int32_t* argmax,
                          double* dx, const double* relu_y = nullptr);

}  // namespace cnn
