// ReLU CPU reference: hand-computed values, NaN propagation, in-place use, gradient check.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "runtime/error.h"
#include "kernels/pointwise/relu.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// Central differences of f at every entry of x (x is perturbed and restored).
template <class F>
std::vector<double> numerical_grad(std::vector<double>& x, F f, double h) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = f();
    x[i] = keep - h;
    const double down = f();
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

double grad_error(const std::vector<double>& analytic, const std::vector<double>& numeric) {
  double worst = 0;
  for (size_t i = 0; i < analytic.size(); ++i)
    worst = std::max(worst, std::fabs(analytic[i] - numeric[i]) /
                                std::max({1e-3, std::fabs(analytic[i]), std::fabs(numeric[i])}));
  return worst;
}

}  // namespace

TEST(Relu, ForwardHandValues) {
  const std::vector<float> x = {-2.f, -0.5f, 0.f, 0.5f, 3.f, kNaN, -0.f};
  std::vector<float> y(x.size(), 99.f);
  relu_forward_cpu(int64_t(x.size()), x.data(), y.data());
  EXPECT_EQ(y[0], 0.f);
  EXPECT_EQ(y[1], 0.f);
  EXPECT_EQ(y[2], 0.f);
  EXPECT_EQ(y[3], 0.5f);
  EXPECT_EQ(y[4], 3.f);
  EXPECT_TRUE(std::isnan(y[5])) << "a NaN input must stay NaN for the NaN watch";
  EXPECT_EQ(y[6], 0.f);
}

TEST(Relu, BackwardHandValues) {
  const std::vector<float> y = {0.f, 0.5f, 3.f, 0.f};
  const std::vector<float> dy = {1.f, 2.f, 3.f, 4.f};
  std::vector<float> dx(4, 99.f);
  relu_backward_cpu(4, y.data(), dy.data(), dx.data());
  EXPECT_EQ(dx, (std::vector<float>{0.f, 2.f, 3.f, 0.f}));
}

TEST(Relu, DispatchInPlaceOnCpu) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::vector<float> v = test::random_vector(1001, seed);
  std::vector<float> ref(v.size());
  relu_forward_cpu(int64_t(v.size()), v.data(), ref.data());
  Exec ex;  // CPU
  relu_forward(int64_t(v.size()), v.data(), v.data(), ex);
  EXPECT_EQ(v, ref);
  std::vector<float> g = test::random_vector(v.size(), seed + 1);
  std::vector<float> gref(v.size());
  relu_backward_cpu(int64_t(v.size()), v.data(), g.data(), gref.data());
  relu_backward(int64_t(v.size()), v.data(), g.data(), g.data(), ex);  // dx aliases dy
  EXPECT_EQ(g, gref);
}

TEST(Relu, RejectsBadArguments) {
  Exec ex;
  float x = 1.f;
  EXPECT_THROW(relu_forward(-1, &x, &x, ex), Error);
  EXPECT_THROW(relu_forward(4, nullptr, &x, ex), Error);
  EXPECT_NO_THROW(relu_forward(0, nullptr, nullptr, ex));
}

TEST(Relu, GradientCheckDouble) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  const int n = 257;
  std::vector<double> x(n), r(n);
  for (auto& v : x) {
    do v = u(rng);
    while (std::fabs(v) < 0.01);  // keep away from the kink, where the derivative jumps
  }
  for (auto& v : r) v = u(rng);
  std::vector<double> y(n);
  auto loss = [&] {  // L = sum r * relu(x)
    relu_forward_cpu(n, x.data(), y.data());
    double l = 0;
    for (int i = 0; i < n; ++i) l += r[i] * y[i];
    return l;
  };
  loss();
  std::vector<double> dx(n);
  relu_backward_cpu(n, y.data(), r.data(), dx.data());
  const double err =
      grad_error(dx, numerical_grad(x, loss, 1e-3));  // piecewise linear: no truncation error
  std::printf("relu gradient check: max rel error %.3g\n", err);
  EXPECT_LT(err, 1e-6);
}
