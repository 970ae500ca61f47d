#pragma once
// The error measure of the tests that check a GEMM or an implicit-GEMM convolution against its
// FP32 CPU reference on U(-1, 1) inputs (gpu_gemm_cuda.cpp, gpu_conv2d_fast.cpp,
// gpu_conv_wgrad_window.cpp): one copy, so the tolerances cannot drift apart.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/exec.h"

namespace cnn::test {

// max |got - ref| / max(max |ref|, typical): error relative to the output's scale, so that
// outputs that cancel to near zero do not dominate; NaN/inf in got (an unwritten poisoned
// element) gives infinity.
inline double rel_to_max(const std::vector<float>& got, const std::vector<float>& ref,
                         double typical = 0) {
  if (got.size() != ref.size()) return INFINITY;
  double worst = 0, scale = std::max(1e-30, typical);
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isinf(got[i])) return INFINITY;
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
  }
  return worst / scale;
}

// Typical magnitude of a sum of k products of U(-1, 1) values (sqrt(k)/3): the error scale of
// an output that happens to cancel to near zero (e.g. a bias gradient of one channel), so
// that TF32 rounding of its terms is judged against the terms, not against the remainder.
inline double typical(int64_t k) {
  return std::sqrt(static_cast<double>(std::max<int64_t>(1, k))) / 3;
}

// TF32 against unrounded operands; otherwise FP32 summation alone (FP32, or BF16 against
// operands rounded as the kernel rounds them).
inline double tolerance(Precision p, int64_t k) {
  return p == Precision::TF32 ? 2e-3 : 1e-5 * std::sqrt(std::max(1.0, static_cast<double>(k)));
}

}  // namespace cnn::test
