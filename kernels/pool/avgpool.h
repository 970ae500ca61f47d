#pragma once
// Average pooling, NCHW, as torch.nn.AvgPool2d with its defaults (count_include_pad=True,
// ceil_mode=False): every window divides by kh * kw, padded zeros included. Global average
// pooling: (N, C, H, W) -> (N, C, 1, 1), the mean of each plane.
#include <cstdint>

#include "kernels/pool/maxpool.h"  // MaxPoolShape: the same window geometry
#include "runtime/exec.h"

namespace cnn {

using AvgPoolShape = MaxPoolShape;

// Throws naming the bad field (the max-pool rules: padding at most half the window).
void check_avgpool_shape(const AvgPoolShape& s);

// y (N, C, OH, OW).
void avgpool_forward(const AvgPoolShape& s, const float* x, float* y, const Exec& ex);
// dx (N, C, H, W) overwritten: each input element gathers dy / (kh * kw) of the windows that
// hold it, in a fixed order (no atomics: deterministic on every device).
void avgpool_backward(const AvgPoolShape& s, const float* dy, float* dx, const Exec& ex);

// planes = N * C, plane = H * W. y (planes) = mean of each plane; dx (planes, plane) =
// dy[p] / plane, overwritten.
void global_avgpool_forward(int64_t planes, int64_t plane, const float* x, float* y,
                            const Exec& ex);
void global_avgpool_backward(int64_t planes, int64_t plane, const float* dy, float* dx,
                             const Exec& ex);

// CPU references (sums in double); double twins for the gradient checks.
void avgpool_forward_cpu(const AvgPoolShape& s, const float* x, float* y);
void avgpool_forward_cpu(const AvgPoolShape& s, const double* x, double* y);
void avgpool_backward_cpu(const AvgPoolShape& s, const float* dy, float* dx);
void avgpool_backward_cpu(const AvgPoolShape& s, const double* dy, double* dx);
void global_avgpool_forward_cpu(int64_t planes, int64_t plane, const float* x, float* y);
void global_avgpool_forward_cpu(int64_t planes, int64_t plane, const double* x, double* y);
void global_avgpool_backward_cpu(int64_t planes, int64_t plane, const float* dy, float* dx);
void global_avgpool_backward_cpu(int64_t planes, int64_t plane, const double* dy, double* dx);

}  // namespace cnn
