// Dropout's CPU reference: the mask's statistics, scaling, repeatability in (seed, step), the
// backward drawing the forward's mask, and p = 0.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/pointwise/dropout.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

TEST(DropoutCpu, KeepsAboutOneMinusPAndScalesTheKept) {
  const int64_t n = 1 << 20;
  const std::vector<float> x(size_t(n), 2.f);
  for (float p : {0.1f, 0.5f, 0.9f}) {
    DropoutArgs a;
    a.p = p;
    a.seed = test::fresh_seed();
    const int64_t step = 17;
    a.step = &step;
    std::vector<float> y(static_cast<size_t>(n));
    dropout_forward(n, x.data(), y.data(), a, Exec{});
    int64_t kept = 0;
    for (float v : y) {
      ASSERT_TRUE(v == 0.f || v == 2.f * (1.f / (1.f - p))) << v;
      kept += v != 0.f;
    }
    // Binomial(n, 1 - p): 5 standard deviations is a false alarm once in ~3.5 million runs.
    const double mean = double(n) * (1 - p), sd = std::sqrt(double(n) * p * (1 - p));
    EXPECT_NEAR(double(kept), mean, 5 * sd) << "p " << p << " seed " << a.seed;
  }
}

TEST(DropoutCpu, MaskIsAFunctionOfSeedStepAndIndexOnly) {
  const int64_t n = 4096;
  const std::vector<float> x = test::random_vector(size_t(n), test::fresh_seed());
  DropoutArgs a;
  a.p = 0.5f;
  a.seed = 1234;
  int64_t step = 3;
  a.step = &step;
  std::vector<float> y1(static_cast<size_t>(n)), y2(static_cast<size_t>(n)),
      y3(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
  dropout_forward(n, x.data(), y1.data(), a, Exec{});
  dropout_forward(n, x.data(), y2.data(), a, Exec{});
  EXPECT_EQ(y1, y2);  // bitwise
  // The backward at the same step applies the same mask and scale.
  const std::vector<float> ones(size_t(n), 1.f);
  dropout_backward(n, ones.data(), dx.data(), a, Exec{});
  for (int64_t k = 0; k < n; ++k) EXPECT_EQ(y1[size_t(k)], x[size_t(k)] * dx[size_t(k)]);
  // Another step, another mask; a prefix of a longer tensor has the same mask.
  step = 4;
  dropout_forward(n, x.data(), y3.data(), a, Exec{});
  EXPECT_NE(y1, y3);
  step = 3;
  std::vector<float> head(100);
  dropout_forward(100, x.data(), head.data(), a, Exec{});
  EXPECT_TRUE(std::equal(head.begin(), head.end(), y1.begin()));
  // A null step reads as step 0.
  std::vector<float> z0(static_cast<size_t>(n)), z1(static_cast<size_t>(n));
  const int64_t zero = 0;
  a.step = nullptr;
  dropout_forward(n, x.data(), z0.data(), a, Exec{});
  a.step = &zero;
  dropout_forward(n, x.data(), z1.data(), a, Exec{});
  EXPECT_EQ(z0, z1);
}

TEST(DropoutCpu, PZeroIsIdentityAndPOneIsRefused) {
  const std::vector<float> x = test::random_vector(64, test::fresh_seed());
  std::vector<float> y(64);
  DropoutArgs a;
  a.p = 0.f;
  dropout_forward(64, x.data(), y.data(), a, Exec{});
  EXPECT_EQ(x, y);
  a.p = 1.f;
  EXPECT_THROW(dropout_forward(64, x.data(), y.data(), a, Exec{}), Error);
  a.p = -0.1f;
  EXPECT_THROW(dropout_forward(64, x.data(), y.data(), a, Exec{}), Error);
}
