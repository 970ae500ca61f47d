// Batch normalization's CPU reference: training statistics (biased for normalizing, unbiased for
// the running update, as torch), eval with the running statistics, the batch-1 refusal, and the
// backward's known identities; a fused ReLU (forward and backward, float and double) and a fused
// residual add against the separate passes, bitwise. The gradients against central differences are
// in test_gradcheck.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/norm/batchnorm.h"
#include "kernels/pointwise/add.h"
#include "kernels/pointwise/relu.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

struct Stats {
  double mean = 0, var = 0;  // biased
};

Stats channel_stats(const BatchNormShape& s, const std::vector<float>& v, int c) {
  Stats st;
  for (int n = 0; n < s.n; ++n)
    for (int64_t i = 0; i < s.hw; ++i) st.mean += v[size_t((int64_t(n) * s.c + c) * s.hw + i)];
  st.mean /= double(s.count());
  for (int n = 0; n < s.n; ++n)
    for (int64_t i = 0; i < s.hw; ++i) {
      const double d = v[size_t((int64_t(n) * s.c + c) * s.hw + i)] - st.mean;
      st.var += d * d;
    }
  st.var /= double(s.count());
  return st;
}

}  // namespace

TEST(BatchNormCpu, TrainingNormalizesEachChannelAndMovesTheRunningStatistics) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const BatchNormShape s{3, 5, 7};  // N, C, H*W odd
  std::vector<float> x = test::random_vector(size_t(s.n * s.c * s.hw), seed, -2.f, 3.f);
  const std::vector<float> gamma = test::random_vector(size_t(s.c), seed + 1, 0.5f, 2.f);
  const std::vector<float> beta = test::random_vector(size_t(s.c), seed + 2);
  std::vector<float> y(x.size()), mean(size_t(s.c)), invstd(size_t(s.c));
  std::vector<float> rm(size_t(s.c), 0.5f), rv(size_t(s.c), 2.f);
  float count = 3.f;
  BatchNormTrainArgs a;
  a.momentum = 0.1f;
  a.eps = 1e-5f;
  a.running_mean = rm.data();
  a.running_var = rv.data();
  a.num_batches = &count;
  batchnorm_forward_train(s, x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                          invstd.data(), a, nullptr, Exec{});
  const double m = double(s.count());
  for (int c = 0; c < s.c; ++c) {
    const Stats in = channel_stats(s, x, c), out = channel_stats(s, y, c);
    EXPECT_NEAR(mean[size_t(c)], in.mean, 1e-6);
    EXPECT_NEAR(invstd[size_t(c)], 1.0 / std::sqrt(in.var + 1e-5), 1e-5);
    EXPECT_NEAR(out.mean, beta[size_t(c)], 1e-5);
    EXPECT_NEAR(out.var, gamma[size_t(c)] * gamma[size_t(c)] * in.var / (in.var + 1e-5), 1e-4);
    EXPECT_NEAR(rm[size_t(c)], 0.9 * 0.5 + 0.1 * in.mean, 1e-6);
    EXPECT_NEAR(rv[size_t(c)], 0.9 * 2.0 + 0.1 * in.var * m / (m - 1), 1e-5);  // unbiased
  }
  EXPECT_EQ(count, 4.f);
}

TEST(BatchNormCpu, EvalUsesTheRunningStatistics) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const BatchNormShape s{1, 3, 4};  // batch 1 is fine in eval
  const std::vector<float> x = test::random_vector(12, seed);
  const std::vector<float> gamma = {1.5f, -0.5f, 2.f}, beta = {0.1f, 0.2f, -0.3f};
  const std::vector<float> rm = {0.3f, -0.2f, 0.f}, rv = {0.5f, 2.f, 1.f};
  std::vector<float> y(12);
  batchnorm_forward_eval(s, x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), 1e-3f,
                         y.data(), Exec{});
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 4; ++i) {
      const size_t k = size_t(c * 4 + i);
      const double want =
          (x[k] - rm[size_t(c)]) / std::sqrt(rv[size_t(c)] + 1e-3) * gamma[size_t(c)] +
          beta[size_t(c)];
      EXPECT_NEAR(y[k], want, 1e-6);
    }
}

TEST(BatchNormCpu, TrainingRefusesOneValuePerChannelLikeTorch) {
  const std::vector<float> v(4, 1.f);
  std::vector<float> out(4), st(4);
  // BatchNorm1d on a batch of 1: (N, F) = (1, 4).
  EXPECT_THROW(batchnorm_forward_train({1, 4, 1}, v.data(), v.data(), v.data(), out.data(),
                                       st.data(), st.data(), BatchNormTrainArgs{}, nullptr, Exec{}),
               Error);
  // Two images are enough, and so is one image with two values per channel.
  batchnorm_forward_train({2, 2, 1}, v.data(), v.data(), v.data(), out.data(), st.data(), st.data(),
                          BatchNormTrainArgs{}, nullptr, Exec{});
  batchnorm_forward_train({1, 2, 2}, v.data(), v.data(), v.data(), out.data(), st.data(), st.data(),
                          BatchNormTrainArgs{}, nullptr, Exec{});
  EXPECT_THROW(check_batchnorm_shape({0, 2, 2}, false), Error);
}

TEST(BatchNormCpu, BackwardIdentities) {
  // dbeta = sum(dy); dgamma = sum(dy * xhat); dx sums to zero per channel and is orthogonal to
  // xhat (the normalization removes the mean and the scale); parameter gradients accumulate.
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const BatchNormShape s{4, 3, 5};
  const size_t count = size_t(s.n * s.c * s.hw);
  const std::vector<float> x = test::random_vector(count, seed, -1.f, 2.f);
  const std::vector<float> dy = test::random_vector(count, seed + 1);
  const std::vector<float> gamma = {0.7f, 1.3f, -0.4f}, beta = {0.f, 0.1f, 0.2f};
  std::vector<float> y(count), mean(3), invstd(3), dx(count);
  std::vector<float> dgamma = {1.f, 1.f, 1.f}, dbeta = {2.f, 2.f, 2.f};
  batchnorm_forward_train_cpu(s, x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                              invstd.data(), BatchNormTrainArgs{});
  batchnorm_backward(s, x.data(), dy.data(), gamma.data(), mean.data(), invstd.data(), dx.data(),
                     dgamma.data(), dbeta.data(), nullptr, Exec{});
  for (int c = 0; c < s.c; ++c) {
    double sdy = 0, sdyxh = 0, sdx = 0, sdxxh = 0;
    for (int n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < s.hw; ++i) {
        const size_t k = size_t((int64_t(n) * s.c + c) * s.hw + i);
        const double xhat = (x[k] - mean[size_t(c)]) * invstd[size_t(c)];
        sdy += dy[k];
        sdyxh += dy[k] * xhat;
        sdx += dx[k];
        sdxxh += dx[k] * xhat;
      }
    EXPECT_NEAR(dbeta[size_t(c)], 2.0 + sdy, 1e-5);
    EXPECT_NEAR(dgamma[size_t(c)], 1.0 + sdyxh, 1e-5);
    EXPECT_NEAR(sdx, 0.0, 1e-5);
    EXPECT_NEAR(sdxxh, 0.0, 1e-3);  // exact only for eps = 0: off by ~eps / var * sum(dy xhat)
  }
}

namespace {

// The fused ReLU against batchnorm then relu_forward_cpu / relu_backward_cpu then batchnorm's
// backward: the same arithmetic on the same values, so the same bits (T: float or double).
template <class T>
void check_fused_relu_matches_separate_pass(const BatchNormShape& s, uint64_t seed) {
  const size_t count = size_t(s.n) * size_t(s.c) * size_t(s.hw), c = size_t(s.c);
  const auto vec = [](const std::vector<float>& f) { return std::vector<T>(f.begin(), f.end()); };
  const std::vector<T> x = vec(test::random_vector(count, seed, -1.f, 2.f));
  const std::vector<T> dy = vec(test::random_vector(count, seed + 1));
  const std::vector<T> gamma = vec(test::random_vector(c, seed + 2, 0.5f, 1.5f));
  const std::vector<T> beta = vec(test::random_vector(c, seed + 3, -0.5f, 0.5f));
  std::vector<T> y(count), fused_y(count), mean(c), invstd(c), fused_mean(c), fused_invstd(c);
  const auto forward = [&](std::vector<T>& out, std::vector<T>& m, std::vector<T>& is, bool relu) {
    if constexpr (std::is_same_v<T, float>)
      batchnorm_forward_train_cpu(s, x.data(), gamma.data(), beta.data(), out.data(), m.data(),
                                  is.data(), BatchNormTrainArgs{}, relu);
    else
      batchnorm_forward_train_cpu(s, x.data(), gamma.data(), beta.data(), out.data(), m.data(),
                                  is.data(), 1e-5, relu);
  };
  forward(y, mean, invstd, false);
  relu_forward_cpu(int64_t(count), y.data(), y.data());
  forward(fused_y, fused_mean, fused_invstd, true);
  EXPECT_EQ(fused_y, y);
  EXPECT_EQ(fused_mean, mean);
  const size_t zeros = size_t(std::count(y.begin(), y.end(), T(0)));
  EXPECT_GT(zeros, 0u) << "the ReLU cut nothing: the mask is not exercised";
  EXPECT_LT(zeros, count) << "the ReLU cut everything";

  std::vector<T> masked(count), dx(count, T(7)), fused_dx(count, T(7));
  std::vector<T> dgamma(c, T(1)), dbeta(c, T(2)), fused_dgamma = dgamma, fused_dbeta = dbeta;
  relu_backward_cpu(int64_t(count), y.data(), dy.data(), masked.data());
  batchnorm_backward_cpu(s, x.data(), masked.data(), gamma.data(), mean.data(), invstd.data(),
                         dx.data(), dgamma.data(), dbeta.data());
  const std::vector<T> dy_before = dy;
  batchnorm_backward_cpu(s, x.data(), dy.data(), gamma.data(), mean.data(), invstd.data(),
                         fused_dx.data(), fused_dgamma.data(), fused_dbeta.data(), fused_y.data());
  EXPECT_EQ(fused_dx, dx);
  EXPECT_EQ(fused_dgamma, dgamma);
  EXPECT_EQ(fused_dbeta, dbeta);
  EXPECT_EQ(dy, dy_before);
}

}  // namespace

TEST(BatchNormCpu, FusedReluGivesTheSeparatePassBits) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const BatchNormShape& s : {BatchNormShape{3, 5, 7}, BatchNormShape{6, 9, 1},
                                  BatchNormShape{1, 1, 33 * 33}, BatchNormShape{2, 65, 49}}) {
    SCOPED_TRACE(::testing::Message()
                 << "(N, C, HW) = (" << s.n << ", " << s.c << ", " << s.hw << ")");
    check_fused_relu_matches_separate_pass<float>(s, seed);
    check_fused_relu_matches_separate_pass<double>(s, seed);
  }
}

TEST(BatchNormCpu, FusedReluInEvalGivesTheSeparatePassBits) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const BatchNormShape s{1, 3, 7};  // batch 1 is fine in eval
  const std::vector<float> x = test::random_vector(21, seed);
  const std::vector<float> gamma = {1.5f, -0.5f, 2.f}, beta = {0.1f, 0.2f, -0.3f};
  const std::vector<float> rm = {0.3f, -0.2f, 0.f}, rv = {0.5f, 2.f, 1.f};
  std::vector<float> y(21), fused(21);
  batchnorm_forward_eval(s, x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), 1e-3f,
                         y.data(), Exec{});
  relu_forward(21, y.data(), y.data(), Exec{});
  batchnorm_forward_eval(s, x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), 1e-3f,
                         fused.data(), Exec{}, true);
  EXPECT_EQ(fused, y);
  EXPECT_GT(std::count(y.begin(), y.end(), 0.f), 0);
}

// A NaN passes the fused ReLU forward, as relu_forward, so that the NaN watch still sees it.
TEST(BatchNormCpu, FusedReluLetsNaNThroughLikeTheReluLayer) {
  const BatchNormShape s{2, 1, 2};
  const float nan = std::nanf("");
  const std::vector<float> x = {1.f, nan, 3.f, 4.f}, gamma = {1.f}, beta = {0.f};
  const std::vector<float> rm = {0.f}, rv = {1.f};
  std::vector<float> y(4);
  batchnorm_forward_eval(s, x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), 1e-5f,
                         y.data(), Exec{}, true);
  EXPECT_TRUE(std::isnan(y[1]));
  EXPECT_GT(y[0], 0.f);
}

// A residual add run inside the forward (train and eval), with and without the ReLU after it:
// the bits of the batchnorm, then the add pass, then the relu pass.
TEST(BatchNormCpu, ResidualAddGivesTheSeparatePassBits) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const BatchNormShape& s :
       {BatchNormShape{3, 5, 7}, BatchNormShape{6, 9, 1}, BatchNormShape{2, 65, 49}}) {
    SCOPED_TRACE(::testing::Message()
                 << "(N, C, HW) = (" << s.n << ", " << s.c << ", " << s.hw << ")");
    const size_t count = size_t(s.n) * size_t(s.c) * size_t(s.hw), c = size_t(s.c);
    const std::vector<float> x = test::random_vector(count, seed);
    const std::vector<float> res = test::random_vector(count, seed + 1);
    const std::vector<float> gamma = test::random_vector(c, seed + 2, 0.5f, 1.5f);
    const std::vector<float> beta = test::random_vector(c, seed + 3, -0.5f, 0.5f);
    const std::vector<float> rm = test::random_vector(c, seed + 4);
    const std::vector<float> rv = test::random_vector(c, seed + 5, 0.5f, 2.f);
    for (bool training : {true, false})
      for (bool relu : {false, true}) {
        SCOPED_TRACE(::testing::Message() << (training ? "training" : "eval") << " relu " << relu);
        std::vector<float> apart(count), fused(count), mean(c), invstd(c);
        const auto forward = [&](std::vector<float>& y, bool relu_in, const float* residual) {
          if (training)
            batchnorm_forward_train_cpu(s, x.data(), gamma.data(), beta.data(), y.data(),
                                        mean.data(), invstd.data(), BatchNormTrainArgs{}, relu_in,
                                        residual);
          else
            batchnorm_forward_eval_cpu(s, x.data(), gamma.data(), beta.data(), rm.data(), rv.data(),
                                       1e-5f, y.data(), relu_in, residual);
        };
        forward(apart, false, nullptr);
        add_forward_cpu(int64_t(count), apart.data(), res.data(), apart.data());
        if (relu) relu_forward_cpu(int64_t(count), apart.data(), apart.data());
        forward(fused, relu, res.data());
        EXPECT_EQ(fused, apart);
        if (relu) {
          EXPECT_GT(std::count(fused.begin(), fused.end(), 0.f), 0);
        }
      }
  }
}
