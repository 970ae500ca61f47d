#pragma once
// ReLU over a flat array, forward and backward.
#include <cstdint>

#include "runtime/exec.h"

namespace cnn {

// y = x where x > 0, else 0; a NaN input stays NaN (so the NaN watch still sees it).
void relu_forward(int64_t count, const float* x, float* y, const Exec& ex);  // y may equal x
// dx = dy where y > 0, else 0. y is the forward OUTPUT. dx may equal dy.
void relu_backward(int64_t count, const float* y, const float* dy, float* dx, const Exec& ex);

void relu_forward_cpu(int64_t count, const float* x, float* y);
void relu_backward_cpu(int64_t count, const float* y, const float* dy, float* dx);
// Double twins for the numerical gradient checker, which runs whole networks in double.
void relu_forward_cpu(int64_t count, const double* x, double* y);
void relu_backward_cpu(int64_t count, const double* y, const double* dy, double* dx);

}  // namespace cnn
