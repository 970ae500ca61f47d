#pragma once
// ReLU over a flat array, forward and backward.
#include <cstdint>

#include "kernels/exec.h"

namespace cnn {

void relu_forward(int64_t count, const float* x, float* y, const Exec& ex);  // y may equal x
// dx = dy where y > 0, else 0. y is the forward OUTPUT. dx may equal dy.
void relu_backward(int64_t count, const float* y, const float* dy, float* dx, const Exec& ex);

void relu_forward_cpu(int64_t count, const float* x, float* y);
void relu_backward_cpu(int64_t count, const float* y, const float* dy, float* dx);

}  // namespace cnn
