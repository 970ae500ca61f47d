#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "layers/lr_schedule.h"
#include "runtime/error.h"

using namespace cnn;

namespace {

constexpr double kTol = 1e-12;
const double kPi = std::acos(-1.0);

ScheduleOptions options(ScheduleType type) {
  ScheduleOptions s;
  s.type = type;
  return s;
}

ScheduleOptions warm_cosine() {
  ScheduleOptions s;
  s.type = ScheduleType::Cosine;
  s.warmup_epochs = 0.5;
  s.min_lr = 0.001;
  return s;
}

}  // namespace

TEST(LrSchedule, ConstantWithAndWithoutWarmup) {
  ScheduleOptions s = options(ScheduleType::Constant);
  for (double t : {0.0, 0.5, 3.0, 10.0, 12.0}) EXPECT_DOUBLE_EQ(learning_rate(s, 0.1, t, 10), 0.1);

  s.warmup_epochs = 2;
  s.warmup_start_factor = 0.1;
  EXPECT_NEAR(learning_rate(s, 0.1, 0, 10), 0.01, kTol);      // base * f
  EXPECT_NEAR(learning_rate(s, 0.1, 1, 10), 0.055, kTol);     // half-way: base * (0.1 + 0.9/2)
  EXPECT_NEAR(learning_rate(s, 0.1, 0.5, 10), 0.0325, kTol);  // base * (0.1 + 0.9/4)
  EXPECT_NEAR(learning_rate(s, 0.1, 2, 10), 0.1, kTol);       // warm-up over
  EXPECT_NEAR(learning_rate(s, 0.1, 7, 10), 0.1, kTol);
}

TEST(LrSchedule, StepDropsAtBoundaries) {
  ScheduleOptions s = options(ScheduleType::Step);
  s.step_epochs = 3;
  s.gamma = 0.5;
  EXPECT_NEAR(learning_rate(s, 0.2, 0, 10), 0.2, kTol);
  EXPECT_NEAR(learning_rate(s, 0.2, 2.999, 10), 0.2, kTol);
  EXPECT_NEAR(learning_rate(s, 0.2, 3, 10), 0.1, kTol);
  EXPECT_NEAR(learning_rate(s, 0.2, 5.9, 10), 0.1, kTol);
  EXPECT_NEAR(learning_rate(s, 0.2, 6, 10), 0.05, kTol);
  EXPECT_NEAR(learning_rate(s, 0.2, 9, 10), 0.025, kTol);
  EXPECT_NEAR(learning_rate(s, 0.2, 10, 10), 0.025, kTol);
  EXPECT_NEAR(learning_rate(s, 0.2, 50, 10), 0.025, kTol);  // held past the end

  // A boundary reached as step / steps_per_epoch, which is not exact in binary.
  s.step_epochs = 0.3;
  EXPECT_NEAR(learning_rate(s, 0.2, 3.0 / 10.0, 10), 0.1, kTol);
  EXPECT_NEAR(learning_rate(s, 0.2, 9.0 / 10.0, 10), 0.025, kTol);
}

TEST(LrSchedule, StepAfterWarmupCountsFromWarmupEnd) {
  ScheduleOptions s = options(ScheduleType::Step);
  s.step_epochs = 2;
  s.gamma = 0.1;
  s.warmup_epochs = 1;
  s.warmup_start_factor = 0.5;
  EXPECT_NEAR(learning_rate(s, 1.0, 0, 10), 0.5, kTol);
  EXPECT_NEAR(learning_rate(s, 1.0, 0.5, 10), 0.75, kTol);
  EXPECT_NEAR(learning_rate(s, 1.0, 1, 10), 1.0, kTol);
  EXPECT_NEAR(learning_rate(s, 1.0, 2.9, 10), 1.0, kTol);
  EXPECT_NEAR(learning_rate(s, 1.0, 3, 10), 0.1, kTol);
  EXPECT_NEAR(learning_rate(s, 1.0, 5, 10), 0.01, kTol);
}

TEST(LrSchedule, CosineHitsHandComputedPoints) {
  ScheduleOptions s = options(ScheduleType::Cosine);
  s.min_lr = 0.001;
  const double base = 0.1, min = 0.001, total = 20;
  EXPECT_NEAR(learning_rate(s, base, 0, total), base, kTol);
  EXPECT_NEAR(learning_rate(s, base, 10, total), (base + min) / 2, kTol);
  EXPECT_NEAR(learning_rate(s, base, 5, total), min + (base - min) * (1 + std::cos(kPi / 4)) / 2,
              kTol);
  EXPECT_NEAR(learning_rate(s, base, 20, total), min, kTol);
  EXPECT_NEAR(learning_rate(s, base, 25, total), min, kTol);

  // With warm-up the cosine spans [W, T]: its midpoint moves to W + (T - W) / 2.
  s.warmup_epochs = 4;
  s.warmup_start_factor = 0;
  EXPECT_NEAR(learning_rate(s, base, 0, total), 0.0, kTol);
  EXPECT_NEAR(learning_rate(s, base, 1, total), base / 4, kTol);
  EXPECT_NEAR(learning_rate(s, base, 4, total), base, kTol);
  EXPECT_NEAR(learning_rate(s, base, 12, total), (base + min) / 2, kTol);
  EXPECT_NEAR(learning_rate(s, base, 20, total), min, kTol);
}

TEST(LrSchedule, CosineIsMonotoneAfterWarmup) {
  ScheduleOptions s = options(ScheduleType::Cosine);
  s.warmup_epochs = 1.5;
  double prev = learning_rate(s, 0.05, 0, 7);
  for (int step = 1; step <= 700; ++step) {
    const double lr = learning_rate(s, 0.05, step / 100.0, 7);
    if (step <= 150) {
      EXPECT_GE(lr, prev) << "step " << step;
    } else {
      EXPECT_LE(lr, prev) << "step " << step;
    }
    EXPECT_GE(lr, 0.0);
    EXPECT_LE(lr, 0.05 + kTol);
    prev = lr;
  }
}

TEST(LrSchedule, OneCycleHitsHandComputedPoints) {
  ScheduleOptions s = options(ScheduleType::OneCycle);
  s.pct_start = 0.25;
  const double base = 0.4, total = 8;  // peak at epoch 2
  EXPECT_NEAR(learning_rate(s, base, 0, total), base / 25, kTol);
  EXPECT_NEAR(learning_rate(s, base, 1, total), (base / 25 + base) / 2, kTol);
  EXPECT_NEAR(learning_rate(s, base, 2, total), base, kTol);
  EXPECT_NEAR(learning_rate(s, base, 5, total), (base + base / 1e4) / 2, kTol);
  EXPECT_NEAR(learning_rate(s, base, 8, total), base / 1e4, kTol);

  s.min_lr = 0.002;
  EXPECT_NEAR(learning_rate(s, base, 5, total), (base + 0.002) / 2, kTol);
  EXPECT_NEAR(learning_rate(s, base, 8, total), 0.002, kTol);
  EXPECT_NEAR(learning_rate(s, base, 9, total), 0.002, kTol);

  // Warm-up is ignored: the rise from base / 25 is the warm-up.
  s.warmup_epochs = 3;
  EXPECT_NEAR(learning_rate(s, base, 0, total), base / 25, kTol);
  EXPECT_NEAR(learning_rate(s, base, 2, total), base, kTol);
}

TEST(LrSchedule, RejectsBadOptions) {
  ScheduleOptions s = options(ScheduleType::Step);
  EXPECT_THROW(learning_rate(s, 0, 1, 10), Error);
  EXPECT_THROW(learning_rate(s, std::nan(""), 1, 10), Error);
  EXPECT_THROW(learning_rate(s, 0.1, 1, 0), Error);
  EXPECT_THROW(learning_rate(s, 0.1, std::nan(""), 10), Error);
  s.step_epochs = 0;
  EXPECT_THROW(learning_rate(s, 0.1, 1, 10), Error);
  s = options(ScheduleType::Step);
  s.gamma = -1;
  EXPECT_THROW(learning_rate(s, 0.1, 1, 10), Error);
  s = options(ScheduleType::Constant);
  s.warmup_epochs = -1;
  EXPECT_THROW(learning_rate(s, 0.1, 1, 10), Error);
  s.warmup_epochs = 1;
  s.warmup_start_factor = 1.5;
  EXPECT_THROW(learning_rate(s, 0.1, 1, 10), Error);
  s = options(ScheduleType::Cosine);
  s.min_lr = 0.2;
  EXPECT_THROW(learning_rate(s, 0.1, 1, 10), Error);
  s.min_lr = 0;
  s.warmup_epochs = 10;
  EXPECT_THROW(learning_rate(s, 0.1, 1, 10), Error);
  s = options(ScheduleType::OneCycle);
  s.pct_start = 1;
  EXPECT_THROW(learning_rate(s, 0.1, 1, 10), Error);

  try {
    s.pct_start = 0;
    check_schedule(s, 0.1, 10);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pct_start is 0"), std::string::npos) << e.what();
  }
}

TEST(LrSchedule, Names) {
  EXPECT_STREQ(schedule_name(ScheduleType::Constant), "constant");
  EXPECT_STREQ(schedule_name(ScheduleType::Step), "step");
  EXPECT_STREQ(schedule_name(ScheduleType::Cosine), "cosine");
  EXPECT_STREQ(schedule_name(ScheduleType::OneCycle), "onecycle");
}

// Batch k of an epoch starting at schedule step first runs at learning_rate((first + k) / spe):
// the value the step-by-step loop computes, for a fresh epoch and for one resumed inside it.
TEST(LrSchedule, EpochTableMatchesThePerStepSchedule) {
  const ScheduleOptions s = warm_cosine();
  const int64_t spe = 22;
  for (int64_t first : {int64_t(0), int64_t(22), int64_t(37), int64_t(44)}) {
    const std::vector<double> t = epoch_lr_table(s, 0.05, first, spe, 3);
    ASSERT_EQ(t.size(), size_t(spe));
    for (int64_t k = 0; k < spe; ++k)
      EXPECT_EQ(t[size_t(k)], learning_rate(s, 0.05, double(first + k) / double(spe), 3))
          << "first " << first << " batch " << k;
  }
  EXPECT_THROW(epoch_lr_table(s, 0.05, 0, 0, 3), Error);
  ScheduleOptions bad = s;
  bad.warmup_epochs = 5;  // past the 3 epochs: the schedule's own check
  EXPECT_THROW(epoch_lr_table(bad, 0.05, 0, spe, 3), Error);
}

// The config reads a schedule's type through the same names the logs and the resolved config print.
TEST(LrSchedule, NamesRoundTrip) {
  for (const std::string& n : schedule_names()) EXPECT_EQ(schedule_name(schedule_type(n)), n);
  EXPECT_THROW(schedule_type("linear"), Error);
}
