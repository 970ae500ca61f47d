#pragma once
// Fast CPU fully connected layer through gemm_cpu (packed, multithreaded). Same contracts as the
// linear_*_cpu references in kernels/linear.h; the shape is assumed already checked. Results are
// bitwise repeatable and independent of the thread count.
#include "kernels/gemm/linear.h"

namespace cnn {

// y (N, OUT) = x (N, IN) * w^T + b, ReLU applied when relu. b may be null.
void linear_forward_cpu_fast(const LinearShape& s, const float* x, const float* w, const float* b,
                             float* y, bool relu);
// dx (N, IN) = dy (N, OUT) * w (OUT, IN). Overwrites dx.
void linear_backward_data_cpu_fast(const LinearShape& s, const float* dy, const float* w,
                                   float* dx);
// dw (OUT, IN) += dy^T * x (= with overwrite_dw); db (OUT) += column sums of dy (db may be
// null). ACCUMULATES except dw under overwrite_dw.
void linear_backward_weight_cpu_fast(const LinearShape& s, const float* x, const float* dy,
                                     float* dw, float* db, bool overwrite_dw = false);

}  // namespace cnn
