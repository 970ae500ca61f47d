#pragma once
// What the BatchNorm GPU tests (gpu_batchnorm.cpp, gpu_batchnorm_one_pass.cpp) compare: every
// output of one training forward and backward, bitwise between device runs, or against a
// reference within a tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "kernels/norm/batchnorm.h"
#include "tests/test_util.h"

namespace cnn::test {

// The outputs of a training forward and backward: y and the saved statistics, the running
// buffers and batch count after the update, dx, and dgamma / dbeta accumulated.
struct BatchNormOutputs {
  std::vector<float> y, mean, invstd, rm, rv, count, dx, dgamma, dbeta;
};

// The outputs before a CPU-twin training pass: y, dx and the saved statistics sized for s, the
// running buffers and dgamma / dbeta at their starting values, the batch count at 5 (where the
// device runs start it too).
inline BatchNormOutputs outputs_before(const BatchNormShape& s, const std::vector<float>& rm,
                                       const std::vector<float>& rv,
                                       const std::vector<float>& dgamma,
                                       const std::vector<float>& dbeta) {
  BatchNormOutputs o;
  const size_t n = size_t(s.n) * size_t(s.c) * size_t(s.hw);
  o.y.resize(n);
  o.dx.resize(n);
  o.mean.resize(size_t(s.c));
  o.invstd.resize(size_t(s.c));
  o.rm = rm;
  o.rv = rv;
  o.count = {5.f};
  o.dgamma = dgamma;
  o.dbeta = dbeta;
  return o;
}

// Training arguments (torch's momentum and eps, BatchNormTrainArgs' defaults) that update o's
// running buffers and batch count.
inline BatchNormTrainArgs train_args_into(BatchNormOutputs& o) {
  BatchNormTrainArgs a;
  a.running_mean = o.rm.data();
  a.running_var = o.rv.data();
  a.num_batches = o.count.data();
  return a;
}

// Every output of two device runs, bitwise.
inline void expect_same_bits(const BatchNormOutputs& a, const BatchNormOutputs& b,
                             const char* what) {
  EXPECT_EQ(a.y, b.y) << what;
  EXPECT_EQ(a.mean, b.mean) << what;
  EXPECT_EQ(a.invstd, b.invstd) << what;
  EXPECT_EQ(a.rm, b.rm) << what;
  EXPECT_EQ(a.rv, b.rv) << what;
  EXPECT_EQ(a.count, b.count) << what;
  EXPECT_EQ(a.dx, b.dx) << what;
  EXPECT_EQ(a.dgamma, b.dgamma) << what;
  EXPECT_EQ(a.dbeta, b.dbeta) << what;
}

// The largest |gamma * invstd * dy|: the size of the terms the input gradient is a sum of.
inline double dx_term_scale(const BatchNormShape& s, const std::vector<float>& gamma,
                            const std::vector<float>& dy, const std::vector<float>& invstd) {
  double m = 0;
  for (size_t i = 0; i < dy.size(); ++i) {
    const size_t c = (i / size_t(s.hw)) % size_t(s.c);
    m = std::max(m, std::fabs(double(gamma[c]) * invstd[c] * dy[i]));
  }
  return m;
}

// Every output of `got` against `ref` within tol (printed, labelled `label`), none NaN.
// Near-zero elements are measured against a tenth of the tensor's largest value: at an offset,
// float's x - mean keeps only ~1e-5 of the spread, which is no error of the kernel. dx is
// gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)): terms of the size of
// gamma * invstd * dy that cancel, fully when a channel holds two values (xhat = +-1, dx is then
// eps-sized noise), so its error is measured against the terms, not their remainder.
inline void expect_close(const BatchNormShape& s, const std::vector<float>& gamma,
                         const std::vector<float>& dy, const BatchNormOutputs& got,
                         const BatchNormOutputs& ref, double tol, const std::string& label) {
  const std::vector<
      std::pair<const char*, std::pair<const std::vector<float>*, const std::vector<float>*>>>
      pairs = {{"y", {&got.y, &ref.y}},
               {"mean", {&got.mean, &ref.mean}},
               {"invstd", {&got.invstd, &ref.invstd}},
               {"running_mean", {&got.rm, &ref.rm}},
               {"running_var", {&got.rv, &ref.rv}},
               {"count", {&got.count, &ref.count}},
               {"dx", {&got.dx, &ref.dx}},
               {"dgamma", {&got.dgamma, &ref.dgamma}},
               {"dbeta", {&got.dbeta, &ref.dbeta}}};
  for (const auto& [what, p] : pairs) {
    EXPECT_FALSE(any_nan(*p.first)) << what;
    double scale = 0;
    for (float v : *p.second) scale = std::max(scale, double(std::fabs(v)));
    if (std::string(what) == "dx") scale = std::max(scale, dx_term_scale(s, gamma, dy, ref.invstd));
    const double e = max_rel_error(*p.first, *p.second, 0.1 * scale);
    std::printf("%s (%d, %d, %lld) %s: rel error %.3g\n", label.c_str(), s.n, s.c, (long long)s.hw,
                what, e);
    EXPECT_LT(e, tol) << label << " " << what;
  }
}

}  // namespace cnn::test
