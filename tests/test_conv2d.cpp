// conv2d on the CPU: shape checks, hand-computed cases, stride/padding against an independent
// formulation, bias/ReLU, the double overloads, adjoint identities and a numerical gradient check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

Conv2dShape make_shape(int n, int c, int h, int w, int oc, int kh, int kw, int sh = 1, int sw = 1,
                       int ph = 0, int pw = 0) {
  Conv2dShape s;
  s.n = n, s.c = c, s.h = h, s.w = w, s.oc = oc, s.kh = kh, s.kw = kw;
  s.stride_h = sh, s.stride_w = sw, s.pad_h = ph, s.pad_w = pw;
  return s;
}

size_t x_size(const Conv2dShape& s) {
  return size_t(s.n) * s.c * s.h * s.w;
}
size_t w_size(const Conv2dShape& s) {
  return size_t(s.oc) * s.c * s.kh * s.kw;
}
size_t y_size(const Conv2dShape& s) {
  return size_t(s.n) * s.oc * s.oh() * s.ow();
}

std::vector<double> random_doubles(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> d(-1.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// The message of the cnn::Error thrown by check_conv2d_shape, or "" if none was thrown.
std::string shape_error(const Conv2dShape& s) {
  try {
    check_conv2d_shape(s);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Conv2dShapeCheck, AcceptsValidShapes) {
  EXPECT_NO_THROW(check_conv2d_shape(make_shape(1, 1, 1, 1, 1, 1, 1)));
  EXPECT_NO_THROW(check_conv2d_shape(make_shape(2, 3, 2, 2, 4, 4, 4, 1, 1, 1, 1)));  // k == padded
  EXPECT_NO_THROW(check_conv2d_shape(make_shape(128, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2)));
}

TEST(Conv2dShapeCheck, NamesTheBadFieldAndValue) {
  auto with = [](auto edit) {
    Conv2dShape s = make_shape(2, 3, 8, 9, 4, 3, 3);
    edit(s);
    return shape_error(s);
  };
  EXPECT_NE(with([](Conv2dShape& s) { s.n = 0; }).find("n = 0"), std::string::npos);
  EXPECT_NE(with([](Conv2dShape& s) { s.c = -2; }).find("c = -2"), std::string::npos);
  EXPECT_NE(with([](Conv2dShape& s) { s.h = 0; }).find("h = 0"), std::string::npos);
  EXPECT_NE(with([](Conv2dShape& s) { s.w = -1; }).find("w = -1"), std::string::npos);
  EXPECT_NE(with([](Conv2dShape& s) { s.oc = 0; }).find("oc = 0"), std::string::npos);
  EXPECT_NE(with([](Conv2dShape& s) { s.kh = 0; }).find("kh = 0"), std::string::npos);
  EXPECT_NE(with([](Conv2dShape& s) { s.kw = -3; }).find("kw = -3"), std::string::npos);
  EXPECT_NE(with([](Conv2dShape& s) { s.stride_h = 0; }).find("stride_h = 0"), std::string::npos);
  EXPECT_NE(with([](Conv2dShape& s) { s.stride_w = -1; }).find("stride_w = -1"), std::string::npos);
  EXPECT_NE(with([](Conv2dShape& s) { s.pad_h = -1; }).find("pad_h = -1"), std::string::npos);
  EXPECT_NE(with([](Conv2dShape& s) { s.pad_w = -2; }).find("pad_w = -2"), std::string::npos);
  // Kernel larger than the padded input: 8 + 2*1 = 10 < 11.
  const std::string big = with([](Conv2dShape& s) {
    s.kh = 11;
    s.pad_h = 1;
  });
  EXPECT_NE(big.find("kh = 11"), std::string::npos) << big;
  EXPECT_NE(big.find("10"), std::string::npos) << big;
  EXPECT_NE(with([](Conv2dShape& s) { s.kw = 10; }).find("kw = 10"), std::string::npos);
}

TEST(Conv2dShapeCheck, ApiRejectsBadShapeBeforeTouchingMemory) {
  Conv2dShape s = make_shape(1, 1, 2, 2, 1, 3, 3);
  EXPECT_THROW(
      conv2d_forward(s, nullptr, nullptr, nullptr, nullptr, false, nullptr, Algo::Auto, Exec{}),
      Error);
  s = make_shape(1, 1, 3, 3, 1, 2, 2);
  EXPECT_THROW(
      conv2d_forward(s, nullptr, nullptr, nullptr, nullptr, false, nullptr, Algo::Auto, Exec{}),
      Error);  // null pointers
}

// x = 1..9 (3x3), w = [1 2; 3 4]: every number below is worked out by hand.
TEST(Conv2dCpu, HandComputedTinyCase) {
  const Conv2dShape s = make_shape(1, 1, 3, 3, 1, 2, 2);
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<float> w = {1, 2, 3, 4};
  std::vector<float> y(4, -1.f);
  conv2d_forward_cpu(s, x.data(), w.data(), nullptr, y.data(), false);
  EXPECT_EQ(y, (std::vector<float>{37, 47, 67, 77}));

  const std::vector<float> b = {-40};
  conv2d_forward_cpu(s, x.data(), w.data(), b.data(), y.data(), true);
  EXPECT_EQ(y, (std::vector<float>{0, 7, 27, 37}));

  // Through the dispatching API as well (CPU ignores the algorithm).
  conv2d_forward(s, x.data(), w.data(), b.data(), y.data(), false, nullptr, Algo::Tiled, Exec{});
  EXPECT_EQ(y, (std::vector<float>{-3, 7, 27, 37}));

  const std::vector<float> dy = {1, 1, 1, 1};
  std::vector<float> dx(9, 123.f);  // overwritten, not accumulated
  conv2d_backward_data_cpu(s, dy.data(), w.data(), dx.data());
  EXPECT_EQ(dx, (std::vector<float>{1, 3, 2, 4, 10, 6, 3, 7, 4}));

  std::vector<float> dw = {1, 1, 1, 1}, db = {0.5f};  // accumulated into
  conv2d_backward_weight_cpu(s, x.data(), dy.data(), dw.data(), db.data());
  EXPECT_EQ(dw, (std::vector<float>{13, 17, 25, 29}));
  EXPECT_EQ(db, (std::vector<float>{4.5f}));
  conv2d_backward_weight(s, x.data(), dy.data(), dw.data(), nullptr, nullptr, Algo::Auto, Exec{});
  EXPECT_EQ(dw, (std::vector<float>{25, 33, 49, 57}));
}

// 3x3 ones kernel, pad 1, stride 2 on 1..9: each output is a clipped 2x2 window sum.
TEST(Conv2dCpu, HandComputedStrideAndPadding) {
  const Conv2dShape s = make_shape(1, 1, 3, 3, 1, 3, 3, 2, 2, 1, 1);
  ASSERT_EQ(s.oh(), 2);
  ASSERT_EQ(s.ow(), 2);
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<float> w(9, 1.f);
  std::vector<float> y(4);
  conv2d_forward_cpu(s, x.data(), w.data(), nullptr, y.data(), false);
  EXPECT_EQ(y, (std::vector<float>{12, 16, 24, 28}));

  // dy = e_(0,1): dx receives the window of output (0,1), i.e. input rows 0..1, cols 1..2.
  const std::vector<float> dy = {0, 1, 0, 0};
  std::vector<float> dx(9, 7.f);
  conv2d_backward_data_cpu(s, dy.data(), w.data(), dx.data());
  EXPECT_EQ(dx, (std::vector<float>{0, 1, 1, 0, 1, 1, 0, 0, 0}));

  // Stride 3 with a 1x1 kernel skips inputs entirely: their gradient is exactly zero.
  const Conv2dShape skip = make_shape(1, 1, 4, 4, 1, 1, 1, 3, 3);
  const std::vector<float> w1 = {2.f}, dy4 = {1, 2, 3, 4};
  std::vector<float> dx16(16, 7.f);
  conv2d_backward_data_cpu(skip, dy4.data(), w1.data(), dx16.data());
  EXPECT_EQ(dx16, (std::vector<float>{2, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 8}));
}

// Strided, padded convolution == stride-1 convolution of the explicitly zero-padded input,
// sampled every stride: an independent formulation of the same thing.
TEST(Conv2dCpu, StrideAndPaddingMatchExplicitPadThenSubsample) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Conv2dShape shapes[] = {make_shape(2, 3, 7, 6, 4, 3, 2, 2, 1, 1, 2),
                                make_shape(1, 2, 9, 5, 3, 5, 3, 3, 2, 2, 0),
                                make_shape(3, 1, 4, 4, 2, 1, 1, 3, 3, 1, 1)};
  for (const Conv2dShape& s : shapes) {
    const auto x = random_doubles(x_size(s), seed);
    const auto w = random_doubles(w_size(s), seed + 1);
    const int hp = s.h + 2 * s.pad_h, wp = s.w + 2 * s.pad_w;
    std::vector<double> xp(size_t(s.n) * s.c * hp * wp, 0.0);  // (N, C, H+2ph, W+2pw)
    for (int nc = 0; nc < s.n * s.c; ++nc)
      for (int i = 0; i < s.h; ++i)
        for (int j = 0; j < s.w; ++j)
          xp[(size_t(nc) * hp + i + s.pad_h) * wp + j + s.pad_w] =
              x[(size_t(nc) * s.h + i) * s.w + j];
    const Conv2dShape dense = make_shape(s.n, s.c, hp, wp, s.oc, s.kh, s.kw);
    std::vector<double> yd(y_size(dense)), y(y_size(s));
    conv2d_forward_cpu(dense, xp.data(), w.data(), nullptr, yd.data(), false);
    conv2d_forward_cpu(s, x.data(), w.data(), nullptr, y.data(), false);
    for (int no = 0; no < s.n * s.oc; ++no)
      for (int oy = 0; oy < s.oh(); ++oy)
        for (int ox = 0; ox < s.ow(); ++ox)
          EXPECT_NEAR(
              y[(size_t(no) * s.oh() + oy) * s.ow() + ox],
              yd[(size_t(no) * dense.oh() + oy * s.stride_h) * dense.ow() + ox * s.stride_w],
              1e-12);
  }
}

TEST(Conv2dCpu, BiasAndReluEpilogue) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Conv2dShape s = make_shape(2, 3, 6, 7, 5, 3, 3, 1, 2, 1, 1);
  const auto x = test::random_vector(x_size(s), seed);
  const auto w = test::random_vector(w_size(s), seed + 1);
  const auto b = test::random_vector(s.oc, seed + 2);
  std::vector<float> plain(y_size(s)), biased(y_size(s)), fused(y_size(s));
  conv2d_forward_cpu(s, x.data(), w.data(), nullptr, plain.data(), false);
  conv2d_forward_cpu(s, x.data(), w.data(), b.data(), biased.data(), false);
  conv2d_forward_cpu(s, x.data(), w.data(), b.data(), fused.data(), true);
  const size_t plane = size_t(s.oh()) * s.ow();
  int negatives = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const int oc = int(i / plane % s.oc);
    EXPECT_NEAR(biased[i], plain[i] + b[oc], 1e-5);
    EXPECT_EQ(fused[i], std::max(biased[i], 0.f));
    negatives += biased[i] < 0;
  }
  EXPECT_GT(negatives, 0);  // the ReLU had something to do
}

TEST(Conv2dCpu, DoubleOverloadsAgreeWithFloat) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Conv2dShape s = make_shape(2, 3, 9, 8, 4, 3, 5, 2, 1, 1, 2);
  const auto xf = test::random_vector(x_size(s), seed);
  const auto wf = test::random_vector(w_size(s), seed + 1);
  const auto bf = test::random_vector(s.oc, seed + 2);
  const auto gf = test::random_vector(y_size(s), seed + 3);
  auto to_d = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  const auto xd = to_d(xf), wd = to_d(wf), bd = to_d(bf), gd = to_d(gf);

  std::vector<float> yf(y_size(s)), dxf(x_size(s)), dwf(w_size(s), 0.25f), dbf(s.oc, -0.5f);
  std::vector<double> yd(y_size(s)), dxd(x_size(s)), dwd(w_size(s), 0.25), dbd(s.oc, -0.5);
  conv2d_forward_cpu(s, xf.data(), wf.data(), bf.data(), yf.data(), true);
  conv2d_forward_cpu(s, xd.data(), wd.data(), bd.data(), yd.data(), true);
  conv2d_backward_data_cpu(s, gf.data(), wf.data(), dxf.data());
  conv2d_backward_data_cpu(s, gd.data(), wd.data(), dxd.data());
  conv2d_backward_weight_cpu(s, xf.data(), gf.data(), dwf.data(), dbf.data());
  conv2d_backward_weight_cpu(s, xd.data(), gd.data(), dwd.data(), dbd.data());
  // Both accumulate in double; the float results differ only by the final rounding.
  auto expect_close = [](const std::vector<float>& f, const std::vector<double>& d) {
    ASSERT_EQ(f.size(), d.size());
    for (size_t i = 0; i < f.size(); ++i)
      EXPECT_NEAR(f[i], d[i], 1e-6 * std::max(1.0, std::fabs(d[i]))) << "at " << i;
  };
  expect_close(yf, yd);
  expect_close(dxf, dxd);
  expect_close(dwf, dwd);
  expect_close(dbf, dbd);
}

// The gradient checker's im2col forward computes the reference's sums in another order: equal to
// rounding on shapes that exercise every path (output-channel and pixel tails of the 4 x 8
// register block, stride, asymmetric padding, taps wholly in the padding, batch 3, no bias).
TEST(Conv2dCpu, Im2colDoubleForwardEqualsTheReference) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Conv2dShape shapes[] = {
      make_shape(1, 3, 32, 32, 8, 3, 3, 1, 1, 1, 1),  // whole blocks
      make_shape(3, 5, 9, 7, 6, 3, 5, 2, 1, 1, 2),    // tails in both, stride 2 in H
      make_shape(2, 2, 5, 6, 3, 5, 5, 1, 2, 2, 2),    // stride 2 in W, pad 2
      make_shape(1, 4, 1, 11, 9, 1, 3, 1, 1, 0, 1),   // H = 1
      make_shape(2, 3, 4, 4, 5, 1, 1, 1, 1, 0, 0),    // 1x1
      make_shape(1, 2, 3, 3, 2, 3, 3, 1, 1, 3, 3),    // taps entirely in the padding
  };
  uint64_t k = seed;
  for (const Conv2dShape& s : shapes) {
    const auto x = random_doubles(x_size(s), k++), w = random_doubles(w_size(s), k++);
    const auto b = random_doubles(size_t(s.oc), k++);
    for (const bool bias : {true, false}) {
      std::vector<double> ref(y_size(s)), got(y_size(s), std::nan(""));
      conv2d_forward_cpu(s, x.data(), w.data(), bias ? b.data() : nullptr, ref.data(), false);
      conv2d_forward_im2col_cpu(s, x.data(), w.data(), bias ? b.data() : nullptr, got.data());
      for (size_t i = 0; i < ref.size(); ++i)
        ASSERT_NEAR(got[i], ref[i], 1e-13 * (1 + std::fabs(ref[i])))
            << "shape n" << s.n << " c" << s.c << " " << s.h << "x" << s.w << " oc" << s.oc
            << " at " << i << " bias " << bias;
    }
  }
}

// <conv(x, w), g> = <x, backward_data(g)> = <w, backward_weight(x, g)>: the backward passes are
// the exact adjoints of the forward map, checked in double on awkward shapes.
TEST(Conv2dCpu, BackwardPassesAreAdjointsOfForward) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Conv2dShape shapes[] = {
      make_shape(2, 3, 7, 6, 4, 3, 2, 2, 1, 1, 2), make_shape(1, 2, 9, 11, 3, 5, 3, 3, 2, 2, 0),
      make_shape(3, 1, 5, 5, 2, 2, 2, 3, 3, 0, 0), make_shape(1, 4, 3, 3, 2, 3, 3, 1, 1, 2, 2)};
  for (const Conv2dShape& s : shapes) {
    const auto x = random_doubles(x_size(s), seed);
    const auto w = random_doubles(w_size(s), seed + 1);
    const auto g = random_doubles(y_size(s), seed + 2);
    std::vector<double> y(y_size(s)), dx(x_size(s)), dw(w_size(s), 0.0);
    conv2d_forward_cpu(s, x.data(), w.data(), nullptr, y.data(), false);
    conv2d_backward_data_cpu(s, g.data(), w.data(), dx.data());
    conv2d_backward_weight_cpu(s, x.data(), g.data(), dw.data(), nullptr);
    const double lhs = dot(y, g);
    EXPECT_NEAR(dot(x, dx), lhs, 1e-12 * std::max(1.0, std::fabs(lhs)));
    EXPECT_NEAR(dot(w, dw), lhs, 1e-12 * std::max(1.0, std::fabs(lhs)));
  }
}

// Central differences of L(x, w, b) = sum(conv(x, w) + b) .* g, in double.
TEST(Conv2dCpu, NumericalGradientCheckInDouble) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Conv2dShape s = make_shape(2, 3, 7, 6, 4, 3, 2, 2, 1, 1, 2);
  auto x = random_doubles(x_size(s), seed);
  auto w = random_doubles(w_size(s), seed + 1);
  auto b = random_doubles(s.oc, seed + 2);
  const auto g = random_doubles(y_size(s), seed + 3);
  std::vector<double> y(y_size(s));
  auto loss = [&] {
    conv2d_forward_cpu(s, x.data(), w.data(), b.data(), y.data(), false);
    return dot(y, g);
  };

  std::vector<double> dx(x_size(s)), dw(w_size(s), 0.0), db(s.oc, 0.0);
  conv2d_backward_data_cpu(s, g.data(), w.data(), dx.data());
  conv2d_backward_weight_cpu(s, x.data(), g.data(), dw.data(), db.data());

  // L is linear in each single parameter, so central differences have no truncation error and a
  // large step keeps the cancellation error (~1e-16 |L| / eps) far below the tolerance.
  const double eps = 1e-3;
  auto worst_rel_error = [&](std::vector<double>& param, const std::vector<double>& grad) {
    double worst = 0;
    for (size_t i = 0; i < param.size(); ++i) {
      const double keep = param[i];
      param[i] = keep + eps;
      const double up = loss();
      param[i] = keep - eps;
      const double down = loss();
      param[i] = keep;
      const double numeric = (up - down) / (2 * eps);
      const double denom = std::max({std::fabs(numeric), std::fabs(grad[i]), 1e-6});
      worst = std::max(worst, std::fabs(numeric - grad[i]) / denom);
    }
    return worst;
  };
  const double ex = worst_rel_error(x, dx), ew = worst_rel_error(w, dw),
               eb = worst_rel_error(b, db);
  std::printf("conv2d gradcheck (double): worst rel error dx %.2e, dw %.2e, db %.2e\n", ex, ew, eb);
  EXPECT_LT(ex, 1e-6);
  EXPECT_LT(ew, 1e-6);
  EXPECT_LT(eb, 1e-6);
}

TEST(Conv2dCpu, BackwardWeightAccumulatesAndAllowsNullBias) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Conv2dShape s = make_shape(2, 2, 5, 6, 3, 3, 3, 1, 1, 1, 1);
  const auto x = test::random_vector(x_size(s), seed);
  const auto g = test::random_vector(y_size(s), seed + 1);
  const auto start = test::random_vector(w_size(s), seed + 2);
  std::vector<float> fresh(w_size(s), 0.f), acc = start, twice(w_size(s), 0.f);
  conv2d_backward_weight_cpu(s, x.data(), g.data(), fresh.data(), nullptr);
  conv2d_backward_weight_cpu(s, x.data(), g.data(), acc.data(), nullptr);
  conv2d_backward_weight_cpu(s, x.data(), g.data(), twice.data(), nullptr);
  conv2d_backward_weight_cpu(s, x.data(), g.data(), twice.data(), nullptr);
  for (size_t i = 0; i < fresh.size(); ++i) {
    EXPECT_NEAR(acc[i], start[i] + fresh[i], 1e-5);
    EXPECT_NEAR(twice[i], 2 * fresh[i], 1e-5);
  }
}

#ifndef CNN_HAVE_CUDA
TEST(Conv2dCpu, CudaRequestFailsClearlyWithoutCuda) {
  const Conv2dShape s = make_shape(1, 1, 3, 3, 1, 2, 2);
  std::vector<float> x(9), w(4), y(4);
  Exec ex;
  ex.device = Device::CUDA;
  try {
    conv2d_forward(s, x.data(), w.data(), nullptr, y.data(), false, nullptr, Algo::Auto, ex);
    FAIL() << "expected cnn::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
  }
}
#endif
