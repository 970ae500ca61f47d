// Time to accuracy on the CPU: training.stop_at_accuracy ends a run at the first evaluation that
// reaches it and run.json says when; the start-up breakdown is logged; the keys are validated.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/config/config.h"
#include "app/train/run_summary.h"
#include "app/train/startup.h"
#include "app/train/trainer.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;
namespace fs = std::filesystem;

namespace {

TrainConfig tiny(const fs::path& dir, std::vector<std::string> extra = {}) {
  extra.push_back("training.device=cpu");
  extra.push_back("logging.progress=off");
  extra.push_back("logging.dir=" + dir.string());
  return load_config(test::source_dir() + "/configs/tiny.yaml", extra);
}

std::string config_error(const std::vector<std::string>& sets) {
  try {
    load_config(test::source_dir() + "/configs/tiny.yaml", sets);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return "";
}

}  // namespace

TEST(TimeToAccuracy, KeysParseValidateAndRoundTrip) {
  const TrainConfig d = load_config(test::source_dir() + "/configs/tiny.yaml");
  EXPECT_DOUBLE_EQ(d.training.stop_at_accuracy, 0);
  EXPECT_TRUE(d.training.autotune_cache);
  EXPECT_FALSE(d.training.eval_flip);
  const TrainConfig c = load_config(test::source_dir() + "/configs/tiny.yaml",
                                    {"training.stop_at_accuracy=93.5",
                                     "training.autotune_cache=false", "training.eval_flip=true"});
  EXPECT_DOUBLE_EQ(c.training.stop_at_accuracy, 93.5);
  EXPECT_FALSE(c.training.autotune_cache);
  EXPECT_TRUE(c.training.eval_flip);
  const TrainConfig again = parse_config(c.resolved_yaml, "resolved.yaml");
  EXPECT_DOUBLE_EQ(again.training.stop_at_accuracy, 93.5);
  EXPECT_FALSE(again.training.autotune_cache);
  EXPECT_TRUE(again.training.eval_flip);

  // A fraction is refused with the percentage it probably meant.
  const std::string frac = config_error({"training.stop_at_accuracy=0.93"});
  EXPECT_TRUE(test::contains(frac, "training.stop_at_accuracy")) << frac;
  EXPECT_TRUE(test::contains(frac, "percent")) << frac;
  EXPECT_TRUE(test::contains(frac, "did you mean 93")) << frac;
  const std::string big = config_error({"training.stop_at_accuracy=101"});
  EXPECT_TRUE(test::contains(big, "training.stop_at_accuracy")) << big;
  const std::string word = config_error({"training.autotune_cache=maybe"});
  EXPECT_TRUE(test::contains(word, "training.autotune_cache")) << word;

  EXPECT_EQ(d.training.eval_from_epoch, 1);
  const TrainConfig late =
      load_config(test::source_dir() + "/configs/tiny.yaml", {"training.eval_from_epoch=7"});
  EXPECT_EQ(late.training.eval_from_epoch, 7);
  EXPECT_EQ(parse_config(late.resolved_yaml, "resolved.yaml").training.eval_from_epoch, 7);
  const std::string zero = config_error({"training.eval_from_epoch=0"});
  EXPECT_TRUE(test::contains(zero, "training.eval_from_epoch")) << zero;
}

// Epochs before training.eval_from_epoch are not evaluated (the target cannot be reached there,
// however good the model), the last epoch always is.
TEST(TimeToAccuracy, EvaluationStartsAtEvalFromEpoch) {
  const fs::path dir = test::fresh_dir("tta", "from");
  TrainConfig cfg = tiny(
      dir, {"training.epochs=4", "training.stop_at_accuracy=1.5", "training.eval_from_epoch=3"});
  ASSERT_EQ(run_training(cfg, TrainArgs{}), 0);
  const auto j = nlohmann::json::parse(test::slurp(dir / cfg.name / "run.json"));
  ASSERT_TRUE(j.at("reached").get<bool>()) << j.dump(1);
  EXPECT_EQ(j.at("reached_epoch").get<int>(), 3) << "epochs 1 and 2 must not be evaluated";

  const fs::path dir2 = test::fresh_dir("tta", "from_last");
  TrainConfig cfg2 = tiny(dir2, {"training.epochs=2", "training.eval_from_epoch=5"});
  ASSERT_EQ(run_training(cfg2, TrainArgs{}), 0);
  const std::string log = test::slurp(dir2 / cfg2.name / "train.log");
  EXPECT_TRUE(test::contains(log, "epoch 2 test") || test::contains(log, "epoch 2 validation"))
      << log;
  EXPECT_FALSE(test::contains(log, "epoch 1 test") || test::contains(log, "epoch 1 validation"))
      << log;
}

TEST(TimeToAccuracy, StopsAtTheFirstEvaluationThatReachesTheTarget) {
  const fs::path dir = test::fresh_dir("tta", "stop");
  // tiny.yaml reaches 100% on its synthetic test set within its first epochs; 20 epochs would
  // take far longer than the run is allowed to.
  TrainConfig cfg = tiny(dir, {"training.epochs=20", "training.stop_at_accuracy=60"});
  ASSERT_EQ(run_training(cfg, TrainArgs{}), 0);
  const fs::path run = dir / cfg.name;
  const auto j = nlohmann::json::parse(test::slurp(run / "run.json"));
  ASSERT_TRUE(j.at("reached").get<bool>()) << j.dump(1);
  const int epoch = j.at("reached_epoch").get<int>();
  EXPECT_GE(epoch, 1);
  EXPECT_LT(epoch, 20) << "the run should stop at the target";
  EXPECT_EQ(j.at("epochs").get<int>(), epoch);
  EXPECT_GE(j.at("reached_accuracy").get<double>(), 60.0);
  EXPECT_DOUBLE_EQ(j.at("target_accuracy").get<double>(), 60.0);
  const double t = j.at("time_to_target_s").get<double>();
  EXPECT_GT(t, 0);
  EXPECT_GE(j.at("total_s").get<double>(), t);
  EXPECT_GT(j.at("startup_s").get<double>(), 0);
  EXPECT_LE(j.at("startup_s").get<double>(), t);
  for (const char* phase : {"exec to main", "config", "dataset decode", "autotune", "first step"})
    EXPECT_TRUE(j.at("startup_phases_s").contains(phase)) << phase;

  // The final line says when, and the last checkpoint and confusion matrix are written.
  const std::string log = test::slurp(run / "train.log");
  EXPECT_TRUE(test::contains(log, fmt::format("reached 60.0% ("))) << log;
  EXPECT_TRUE(test::contains(log, fmt::format("at epoch {}, ", epoch))) << log;
  EXPECT_TRUE(test::contains(log, "s after start")) << log;
  EXPECT_TRUE(test::contains(log, "start-up: ")) << log;
  EXPECT_TRUE(test::contains(log, "s before the first step (exec to main ")) << log;
  EXPECT_TRUE(fs::exists(run / "last.safetensors"));
  EXPECT_TRUE(fs::exists(run / "confusion.csv"));
}

TEST(TimeToAccuracy, WithoutATargetTheRunGoesOnAndRunJsonSaysSo) {
  const fs::path dir = test::fresh_dir("tta", "off");
  TrainConfig cfg = tiny(dir, {"training.epochs=2"});
  ASSERT_EQ(run_training(cfg, TrainArgs{}), 0);
  const auto j = nlohmann::json::parse(test::slurp(dir / cfg.name / "run.json"));
  EXPECT_TRUE(j.at("target_accuracy").is_null());
  EXPECT_FALSE(j.at("reached").get<bool>());
  EXPECT_TRUE(j.at("time_to_target_s").is_null());
  EXPECT_EQ(j.at("epochs").get<int>(), 2);
  EXPECT_GT(j.at("final_accuracy").get<double>(), 0);

  // An unreachable target: the run trains every epoch and says the target was missed.
  const fs::path dir2 = test::fresh_dir("tta", "missed");
  TrainConfig cfg2 = tiny(dir2, {"training.epochs=1", "training.stop_at_accuracy=100",
                                 "data.synthetic.test=7", "training.max_steps=1"});
  ASSERT_EQ(run_training(cfg2, TrainArgs{}), 0);
  const auto j2 = nlohmann::json::parse(test::slurp(dir2 / cfg2.name / "run.json"));
  if (!j2.at("reached").get<bool>()) {
    EXPECT_TRUE(
        test::contains(test::slurp(dir2 / cfg2.name / "train.log"), "target 100.0% not reached"));
  }
}

TEST(TimeToAccuracy, TargetIsReachedOnceAndCountsFromTheProcessStart) {
  StartupClock clock;
  AccuracyTarget off(0, clock);
  EXPECT_FALSE(off.reached_now(1, 10, 1.0));
  EXPECT_EQ(off.summary(), "");
  AccuracyTarget t(93.0, clock);
  EXPECT_EQ(t.summary(), "; target 93.0% not reached");
  EXPECT_FALSE(t.reached_now(1, 10, 0.9299));
  // 9,300 of 10,000 is 93.0% even where the division rounds below it.
  EXPECT_TRUE(t.reached_now(2, 20, 9300.0 / 10000.0));
  EXPECT_FALSE(t.reached_now(3, 30, 0.95)) << "the first time counts";
  EXPECT_TRUE(test::contains(t.summary(), "; reached 93.0% (93.00%) at epoch 2, ")) << t.summary();
  EXPECT_GE(clock.seconds_since_start(), 0);
}

TEST(TimeToAccuracy, StartupClockBooksEachPhaseOnce) {
  StartupClock clock;
  ASSERT_EQ(clock.phases().size(), 1u);
  EXPECT_EQ(clock.phases()[0].first, "exec to main");
  EXPECT_GE(clock.phases()[0].second, 0);
  clock.mark("config");  // since main: in a test binary, the tests before this one
  // 200 ms: long beside a preempted mark under a loaded sanitizer build, so the checks below hold.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  clock.mark("dataset decode");
  clock.mark("autotune");
  ASSERT_EQ(clock.phases().size(), 4u);
  EXPECT_GE(clock.phases()[2].second, 0.195);
  EXPECT_LT(clock.phases()[3].second, clock.phases()[2].second);
  EXPECT_GE(clock.seconds_since_start(), 0.2);
  EXPECT_TRUE(test::contains(clock.describe(), "dataset decode 0.") ||
              test::contains(clock.describe(), "dataset decode 1."))
      << clock.describe();
}
