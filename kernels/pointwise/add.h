#pragma once
// Elementwise sum of two flat arrays: the add that joins a residual block's two paths, and the
// summing of gradients where one tensor feeds two layers.
#include <cstdint>

#include "runtime/exec.h"

namespace cnn {

// y = a + b. y may equal a or b (in-place accumulation).
void add_forward(int64_t count, const float* a, const float* b, float* y, const Exec& ex);

void add_forward_cpu(int64_t count, const float* a, const float* b, float* y);
// Double twin for the numerical gradient checker, which runs whole networks in double.
void add_forward_cpu(int64_t count, const double* a, const double* b, double* y);

}  // namespace cnn
