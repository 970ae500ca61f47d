// Max-pool CPU reference: hand-computed windows, ties, padding, NaN, overlapping backward, shape
// checks and a gradient check in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "runtime/error.h"
#include "kernels/pool/maxpool.h"
#include "kernels/pointwise/relu.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

MaxPoolShape make_shape(int n, int c, int h, int w, int k, int stride, int pad) {
  MaxPoolShape s;
  s.n = n, s.c = c, s.h = h, s.w = w;
  s.kh = s.kw = k;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  return s;
}

struct PoolOut {
  std::vector<float> y;
  std::vector<int32_t> argmax;
};

PoolOut pool(const MaxPoolShape& s, const std::vector<float>& x) {
  const size_t out = size_t(s.n) * s.c * s.oh() * s.ow();
  PoolOut r{std::vector<float>(out, -99.f), std::vector<int32_t>(out, -99)};
  maxpool_forward(s, x.data(), r.y.data(), r.argmax.data(), Exec{});
  return r;
}

}  // namespace

TEST(MaxPool, Forward2x2Stride2) {
  const MaxPoolShape s = make_shape(1, 1, 4, 4, 2, 2, 0);
  std::vector<float> x(16);
  std::iota(x.begin(), x.end(), 1.f);  // 1..16 row-major
  x[0] = 50.f;                         // top-left window's max at its first element
  PoolOut r = pool(s, x);
  EXPECT_EQ(r.y, (std::vector<float>{50.f, 8.f, 14.f, 16.f}));
  EXPECT_EQ(r.argmax, (std::vector<int32_t>{0, 7, 13, 15}));
}

TEST(MaxPool, TiesGoToFirstInRowMajorWindowOrder) {
  const MaxPoolShape s = make_shape(1, 1, 2, 4, 2, 2, 0);
  // Left window: all equal -> index 0. Right window [3 5; 5 1] -> the 5 at (0, 3).
  const std::vector<float> x = {7, 7, 3, 5, 7, 7, 5, 1};
  PoolOut r = pool(s, x);
  EXPECT_EQ(r.y, (std::vector<float>{7.f, 5.f}));
  EXPECT_EQ(r.argmax, (std::vector<int32_t>{0, 3}));
}

TEST(MaxPool, PaddingNeverWins) {
  // 2x2 all-negative input, 3x3 windows with padding 1: every window sees all four values plus
  // padding; the padding (an implicit -inf, not 0) must never win.
  const MaxPoolShape s = make_shape(1, 1, 2, 2, 3, 1, 1);
  ASSERT_EQ(s.oh(), 2);
  const std::vector<float> x = {-4.f, -3.f, -2.f, -1.5f};
  PoolOut r = pool(s, x);
  EXPECT_EQ(r.y, (std::vector<float>(4, -1.5f)));
  EXPECT_EQ(r.argmax, (std::vector<int32_t>(4, 3)));
  // All -inf: the first real element still wins, so argmax is never a padded position.
  const float inf = std::numeric_limits<float>::infinity();
  PoolOut q = pool(s, std::vector<float>(4, -inf));
  EXPECT_EQ(q.argmax, (std::vector<int32_t>(4, 0)));
}

TEST(MaxPool, Pad1Stride2On3x3) {
  // 3x3 input, 3x3 window, stride 2, pad 1 -> 2x2 output, windows centred on the corners.
  const MaxPoolShape s = make_shape(1, 1, 3, 3, 3, 2, 1);
  ASSERT_EQ(s.oh(), 2);
  const std::vector<float> x = {1, 2, 3, 4, 0, 6, 7, 8, 5};
  PoolOut r = pool(s, x);
  // Windows: rows/cols {0,1} x {0,1} -> 4 at 3; {0,1} x {1,2} -> 6 at 5;
  //          {1,2} x {0,1} -> 8 at 7; {1,2} x {1,2} -> 8 at 7.
  EXPECT_EQ(r.y, (std::vector<float>{4, 6, 8, 8}));
  EXPECT_EQ(r.argmax, (std::vector<int32_t>{3, 5, 7, 7}));
  // Backward: position 7 won two windows, so it collects both gradients.
  const std::vector<float> dy = {1.f, 2.f, 3.f, 4.f};
  std::vector<float> dx(9, -99.f);
  maxpool_backward(s, dy.data(), r.argmax.data(), dx.data(), Exec{});
  EXPECT_EQ(dx, (std::vector<float>{0, 0, 0, 1, 0, 2, 0, 7, 0}));
}

TEST(MaxPool, NaNWinsAndPropagates) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const MaxPoolShape s = make_shape(1, 1, 2, 4, 2, 2, 0);
  const std::vector<float> x = {1, nan, 9, nan, 5, 3, nan, 2};
  PoolOut r = pool(s, x);
  EXPECT_TRUE(std::isnan(r.y[0]));
  EXPECT_EQ(r.argmax[0], 1);
  EXPECT_TRUE(std::isnan(r.y[1]));
  EXPECT_EQ(r.argmax[1], 3) << "the first NaN in window order wins";
}

TEST(MaxPool, NonSquareOverlappingBackwardSums) {
  // 1x1x3x4 input, 2x2 windows, stride 1: 2x3 overlapping windows. A global max at (1, 1) wins
  // the four windows around it.
  const MaxPoolShape s = make_shape(1, 1, 3, 4, 2, 1, 0);
  std::vector<float> x = {0, 1, 2, 3, 4, 100, 5, 6, 7, 8, 9, 10};
  PoolOut r = pool(s, x);
  EXPECT_EQ(r.argmax, (std::vector<int32_t>{5, 5, 7, 5, 5, 11}));
  const std::vector<float> dy = {1, 2, 3, 4, 5, 6};
  std::vector<float> dx(12, -99.f);
  maxpool_backward(s, dy.data(), r.argmax.data(), dx.data(), Exec{});
  EXPECT_EQ(dx, (std::vector<float>{0, 0, 0, 0, 0, 12, 0, 3, 0, 0, 0, 6}));
}

TEST(MaxPool, RejectsBadShapes) {
  float buf[64] = {};
  int32_t idx[64] = {};
  Exec ex;
  EXPECT_THROW(maxpool_forward(make_shape(1, 1, 4, 4, 3, 1, 2), buf, buf, idx, ex), Error)
      << "padding above half the window";
  EXPECT_THROW(maxpool_forward(make_shape(1, 1, 4, 4, 2, 0, 0), buf, buf, idx, ex), Error);
  EXPECT_THROW(maxpool_forward(make_shape(0, 1, 4, 4, 2, 2, 0), buf, buf, idx, ex), Error);
  EXPECT_THROW(maxpool_forward(make_shape(1, 1, 2, 2, 3, 1, 0), buf, buf, idx, ex), Error)
      << "window larger than the input";
  EXPECT_THROW(maxpool_forward(make_shape(1, 1, 4, 4, 2, 2, 0), nullptr, buf, idx, ex), Error);
}

TEST(MaxPool, GradientCheckDouble) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  MaxPoolShape s = make_shape(2, 3, 5, 7, 3, 2, 1);
  s.stride_w = 1;  // overlapping windows along w
  const int nx = s.n * s.c * s.h * s.w, ny = s.n * s.c * s.oh() * s.ow();
  // Distinct values 0.01 apart, so a 1e-6 perturbation never changes a window's winner.
  std::vector<double> x(nx);
  std::iota(x.begin(), x.end(), 0.0);
  std::shuffle(x.begin(), x.end(), rng);
  for (auto& v : x) v = (v - nx / 2) * 0.01;
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> r(ny), y(ny);
  for (auto& v : r) v = u(rng);
  std::vector<int32_t> argmax(ny);
  auto loss = [&] {  // L = sum r * maxpool(x)
    maxpool_forward_cpu(s, x.data(), y.data(), argmax.data());
    double l = 0;
    for (int i = 0; i < ny; ++i) l += r[i] * y[i];
    return l;
  };
  loss();
  std::vector<double> dx(nx);
  maxpool_backward_cpu(s, r.data(), argmax.data(), dx.data());
  std::vector<double> num(nx);
  const double h = 1e-3;  // below the 0.01 gaps, and piecewise linear: no truncation error
  for (int i = 0; i < nx; ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = loss();
    x[i] = keep - h;
    const double down = loss();
    x[i] = keep;
    num[i] = (up - down) / (2 * h);
  }
  double worst = 0;
  for (int i = 0; i < nx; ++i)
    worst = std::max(
        worst, std::fabs(dx[i] - num[i]) / std::max({1e-3, std::fabs(dx[i]), std::fabs(num[i])}));
  std::printf("maxpool gradient check: max rel error %.3g\n", worst);
  EXPECT_LT(worst, 1e-6);
}

// The ReLU backward fused into the pool's backward (relu_y = the pool's output) equals the
// unfused pair: pool backward, then the ReLU mask on the pool's input. Bitwise, ties included.
TEST(MaxPool, FusedReluMaskEqualsSeparateReluBackward) {
  const MaxPoolShape s = make_shape(2, 3, 6, 8, 2, 2, 0);
  const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.c * s.oh() * s.ow();
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> few(-2, 2);  // many zeros after the ReLU: ties at 0
  std::vector<float> pre(nx), r(nx), dy(ny);
  for (auto& v : pre) v = float(few(rng));
  for (auto& v : dy) v = float(few(rng)) + 0.5f;
  relu_forward_cpu(int64_t(nx), pre.data(), r.data());
  PoolOut p = pool(s, r);
  std::vector<float> dx_sep(nx), dx_fused(nx);
  maxpool_backward_cpu(s, dy.data(), p.argmax.data(), dx_sep.data());
  relu_backward_cpu(int64_t(nx), r.data(), dx_sep.data(), dx_sep.data());
  maxpool_backward_cpu(s, dy.data(), p.argmax.data(), dx_fused.data(), p.y.data());
  EXPECT_EQ(dx_fused, dx_sep);
}
