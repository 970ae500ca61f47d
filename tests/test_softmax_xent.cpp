// Softmax cross-entropy CPU reference: hand-computed softmax of [1, 2, 3], large logits, ties,
// grad scaling, bad labels, metrics, and a gradient check of the mean loss in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "runtime/error.h"
#include "kernels/loss/softmax_xent.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

// softmax([1, 2, 3]) and -log softmax_3 = log(e + e^2 + e^3) - 3.
constexpr double kP0 = 0.09003057317038046, kP1 = 0.24472847105479764, kP2 = 0.6652409557748219,
                 kLoss2 = 0.40760596444437977;

}  // namespace

TEST(SoftmaxXent, HandValuesOneTwoThree) {
  const std::vector<float> logits = {1, 2, 3};
  const std::vector<int32_t> label = {2};
  float loss = -1;
  int32_t pred = -1;
  std::vector<float> d(3);
  softmax_xent(XentShape{1, 3}, logits.data(), label.data(), &loss, &pred, d.data(), 1.f, Exec{});
  EXPECT_NEAR(loss, kLoss2, 1e-6);
  EXPECT_EQ(pred, 2);
  EXPECT_NEAR(d[0], kP0, 1e-7);
  EXPECT_NEAR(d[1], kP1, 1e-7);
  EXPECT_NEAR(d[2], kP2 - 1, 1e-7);
}

TEST(SoftmaxXent, LargeLogitsAreStable) {
  // Shifting by 1000 changes nothing; a naive exp would overflow to inf.
  const std::vector<float> logits = {1001, 1002, 1003, -999, -998, -997};
  const std::vector<int32_t> labels = {0, 2};
  std::vector<float> loss(2), d(6);
  std::vector<int32_t> pred(2);
  softmax_xent_cpu(XentShape{2, 3}, logits.data(), labels.data(), loss.data(), pred.data(),
                   d.data(), 0.5f);
  EXPECT_NEAR(loss[0], -std::log(kP0), 1e-5);
  EXPECT_NEAR(loss[1], kLoss2, 1e-5);
  EXPECT_EQ(pred, (std::vector<int32_t>{2, 2}));
  const double want[6] = {(kP0 - 1) * 0.5, kP1 * 0.5, kP2 * 0.5,
                          kP0 * 0.5,       kP1 * 0.5, (kP2 - 1) * 0.5};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(d[i], want[i], 1e-6) << i;
}

TEST(SoftmaxXent, TiesPredictFirstMaximumAndNullGradient) {
  const std::vector<float> logits = {5, 5, 1, 0, 2, 2};
  const std::vector<int32_t> labels = {1, 0};
  std::vector<float> loss(2);
  std::vector<int32_t> pred(2);
  softmax_xent(XentShape{2, 3}, logits.data(), labels.data(), loss.data(), pred.data(), nullptr,
               1.f, Exec{});
  EXPECT_EQ(pred, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(loss[0], std::log(2 + std::exp(-4.0)), 1e-6);
}

TEST(SoftmaxXent, BadLabelGivesNaNLossNotACrash) {
  const std::vector<float> logits = {1, 2, 3};
  const std::vector<int32_t> label = {7};
  float loss = 0;
  int32_t pred = -1;
  std::vector<float> d(3);
  softmax_xent_cpu(XentShape{1, 3}, logits.data(), label.data(), &loss, &pred, d.data(), 1.f);
  EXPECT_TRUE(std::isnan(loss));
  EXPECT_NEAR(d[2], kP2, 1e-7);  // softmax without the one-hot
}

TEST(SoftmaxXent, RejectsBadShapes) {
  float f[4] = {};
  int32_t i[4] = {};
  EXPECT_THROW(softmax_xent(XentShape{0, 3}, f, i, f, i, f, 1.f, Exec{}), Error);
  EXPECT_THROW(softmax_xent(XentShape{1, 0}, f, i, f, i, f, 1.f, Exec{}), Error);
  EXPECT_THROW(softmax_xent(XentShape{1, 3}, nullptr, i, f, i, f, 1.f, Exec{}), Error);
}

TEST(SoftmaxXent, AccumulateMetrics) {
  const std::vector<float> loss = {0.5f, 1.5f, 2.f};
  const std::vector<int32_t> pred = {1, 2, 3}, labels = {1, 0, 3};
  double totals[3] = {10, 1, 4};
  accumulate_metrics(3, loss.data(), pred.data(), labels.data(), totals, Exec{});
  EXPECT_EQ(totals[0], 14.0);
  EXPECT_EQ(totals[1], 3.0);
  EXPECT_EQ(totals[2], 7.0);
  accumulate_metrics(0, nullptr, nullptr, nullptr, totals, Exec{});
  EXPECT_EQ(totals[2], 7.0);
}

TEST(SoftmaxXent, GradientCheckOfMeanLossDouble) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-3, 3);
  const XentShape s{5, 7};
  std::vector<double> logits(s.n * s.classes);
  for (auto& v : logits) v = u(rng);
  std::vector<int32_t> labels(s.n);
  for (auto& l : labels) l = std::uniform_int_distribution<int>(0, s.classes - 1)(rng);
  std::vector<double> loss_rows(s.n), d(logits.size());
  std::vector<int32_t> pred(s.n);
  auto mean_loss = [&] {
    softmax_xent_cpu(s, logits.data(), labels.data(), loss_rows.data(), pred.data(), nullptr, 1.0);
    double l = 0;
    for (double v : loss_rows) l += v;
    return l / s.n;
  };
  softmax_xent_cpu(s, logits.data(), labels.data(), loss_rows.data(), pred.data(), d.data(),
                   1.0 / s.n);
  double worst = 0;
  const double h = 1e-4;  // truncation ~h^2, rounding ~1e-16/h: both far below 1e-6
  for (size_t i = 0; i < logits.size(); ++i) {
    const double keep = logits[i];
    logits[i] = keep + h;
    const double up = mean_loss();
    logits[i] = keep - h;
    const double down = mean_loss();
    logits[i] = keep;
    const double num = (up - down) / (2 * h);
    worst =
        std::max(worst, std::fabs(d[i] - num) / std::max({1e-3, std::fabs(d[i]), std::fabs(num)}));
  }
  std::printf("softmax_xent gradient check: max rel error %.3g\n", worst);
  EXPECT_LT(worst, 1e-6);
}
