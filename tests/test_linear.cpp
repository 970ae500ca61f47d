// Fully connected CPU reference: hand-computed products, accumulation (and the weight gradient's
// overwrite), the ReLU epilogue, shape and variant checks, and gradient checks of dx, dw and db
// in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/gemm/linear.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

// x (2, 3), w (2, 3), b (2): y = x w^T + b = [[-1.5, -1], [-1.5, 3.5]].
const std::vector<float> kX = {1, 2, 3, 4, 5, 6};
const std::vector<float> kW = {1, 0, -1, 0.5f, 0.5f, 0.5f};
const std::vector<float> kB = {0.5f, -4};
const LinearShape kShape{2, 3, 2};

double grad_error(const std::vector<double>& analytic, const std::vector<double>& numeric) {
  double worst = 0;
  for (size_t i = 0; i < analytic.size(); ++i)
    worst = std::max(worst, std::fabs(analytic[i] - numeric[i]) /
                                std::max({1e-3, std::fabs(analytic[i]), std::fabs(numeric[i])}));
  return worst;
}

}  // namespace

TEST(Linear, ForwardHandValues) {
  std::vector<float> y(4, -99.f);
  linear_forward(kShape, kX.data(), kW.data(), kB.data(), y.data(), false, Algo::Auto, Exec{});
  EXPECT_EQ(y, (std::vector<float>{-1.5f, -1.f, -1.5f, 3.5f}));
  linear_forward(kShape, kX.data(), kW.data(), kB.data(), y.data(), true, Algo::Auto, Exec{});
  EXPECT_EQ(y, (std::vector<float>{0.f, 0.f, 0.f, 3.5f}));
  linear_forward(kShape, kX.data(), kW.data(), nullptr, y.data(), false, Algo::Naive, Exec{});
  EXPECT_EQ(y, (std::vector<float>{-2.f, 3.f, -2.f, 7.5f}));
}

TEST(Linear, BackwardDataHandValues) {
  // dx = dy w = [[1*1 + 2*0.5, 0 + 1, -1 + 1], [3 + 2, 2, -3 + 2]].
  const std::vector<float> dy = {1, 2, 3, 4};
  std::vector<float> dx(6, -99.f);
  linear_backward_data(kShape, dy.data(), kW.data(), dx.data(), Algo::Tiled, Exec{});
  EXPECT_EQ(dx, (std::vector<float>{2, 1, 0, 5, 2, -1}));
}

TEST(Linear, BackwardWeightAccumulates) {
  // dw = dy^T x = [[1*x0 + 3*x1], [2*x0 + 4*x1]] = [[13, 17, 21], [18, 24, 30]]; db = [4, 6].
  const std::vector<float> dy = {1, 2, 3, 4};
  std::vector<float> dw(6, 1.f), db(2, 1.f);
  Exec ex;
  ASSERT_EQ(linear_backward_weight_scratch_floats(kShape, ex), 0u);
  linear_backward_weight(kShape, kX.data(), dy.data(), dw.data(), db.data(), nullptr, Algo::Auto,
                         ex);
  EXPECT_EQ(dw, (std::vector<float>{14, 18, 22, 19, 25, 31}));
  EXPECT_EQ(db, (std::vector<float>{5, 7}));
  linear_backward_weight(kShape, kX.data(), dy.data(), dw.data(), nullptr, nullptr, Algo::Auto,
                         ex);  // db may be null
  EXPECT_EQ(dw, (std::vector<float>{27, 35, 43, 37, 49, 61}));
  EXPECT_EQ(db, (std::vector<float>{5, 7}));
}

// overwrite_dw writes dw without reading it (a NaN there goes), with the bits of += onto zeros,
// on the reference (naive) and the fast path; db is still added to.
TEST(Linear, BackwardWeightOverwriteWritesDwAndAddsDb) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const LinearShape s{7, 45, 13};
  const std::vector<float> x = test::random_vector(size_t(s.n) * s.in, seed);
  const std::vector<float> dy = test::random_vector(size_t(s.n) * s.out, seed + 1);
  const std::vector<float> db0 = test::random_vector(size_t(s.out), seed + 2);
  const size_t nw = size_t(s.out) * s.in;
  for (Algo algo : {Algo::Naive, Algo::Auto}) {
    SCOPED_TRACE(algo_name(algo));
    std::vector<float> dw_add(nw, 0.f), db_add = db0;
    linear_backward_weight(s, x.data(), dy.data(), dw_add.data(), db_add.data(), nullptr, algo,
                           Exec{});
    std::vector<float> dw_set(nw, std::numeric_limits<float>::quiet_NaN()), db_set = db0;
    linear_backward_weight(s, x.data(), dy.data(), dw_set.data(), db_set.data(), nullptr, algo,
                           Exec{}, true);
    EXPECT_EQ(dw_set, dw_add);
    EXPECT_EQ(db_set, db_add);
  }
}

TEST(Linear, RejectsBadShapesAndNullPointers) {
  std::vector<float> buf(16);
  Exec ex;
  EXPECT_THROW(linear_forward(LinearShape{0, 3, 2}, buf.data(), buf.data(), nullptr, buf.data(),
                              false, Algo::Auto, ex),
               Error);
  EXPECT_THROW(linear_forward(LinearShape{2, 3, -1}, buf.data(), buf.data(), nullptr, buf.data(),
                              false, Algo::Auto, ex),
               Error);
  EXPECT_THROW(linear_backward_data(kShape, nullptr, buf.data(), buf.data(), Algo::Auto, ex),
               Error);
}

TEST(Linear, GradientCheckDouble) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  const LinearShape s{3, 7, 5};
  auto rnd = [&](size_t n) {
    std::vector<double> v(n);
    for (auto& e : v) e = u(rng);
    return v;
  };
  std::vector<double> x = rnd(s.n * s.in), w = rnd(s.out * s.in), b = rnd(s.out);
  const std::vector<double> r = rnd(s.n * s.out);  // L = sum r * y, so dL/dy = r
  std::vector<double> y(s.n * s.out);
  auto loss = [&] {
    linear_forward_cpu(s, x.data(), w.data(), b.data(), y.data(), false);
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += r[i] * y[i];
    return l;
  };
  auto numeric = [&](std::vector<double>& v) {
    std::vector<double> g(v.size());
    const double h = 1e-3;  // y is linear in x, w and b: no truncation error
    for (size_t i = 0; i < v.size(); ++i) {
      const double keep = v[i];
      v[i] = keep + h;
      const double up = loss();
      v[i] = keep - h;
      const double down = loss();
      v[i] = keep;
      g[i] = (up - down) / (2 * h);
    }
    return g;
  };
  std::vector<double> dx(x.size()), dw(w.size(), 0.0), db(b.size(), 0.0);
  linear_backward_data_cpu(s, r.data(), w.data(), dx.data());
  linear_backward_weight_cpu(s, x.data(), r.data(), dw.data(), db.data());
  const double ex = grad_error(dx, numeric(x)), ew = grad_error(dw, numeric(w)),
               eb = grad_error(db, numeric(b));
  std::printf("linear gradient check: max rel error dx %.3g dw %.3g db %.3g\n", ex, ew, eb);
  EXPECT_LT(ex, 1e-6);
  EXPECT_LT(ew, 1e-6);
  EXPECT_LT(eb, 1e-6);
}
