#pragma once
// training.stop_at_accuracy and the run's summary file: the first evaluation that reaches the
// target ends the run, and the time from the process's start to that evaluation is what a speed
// run reports (the final log line and logs/<run>/run.json, read by scripts/speedrun.sh).
#include <cstdint>
#include <string>

namespace cnn {

class StartupClock;
struct TrainConfig;

class AccuracyTarget {
 public:
  // target_percent: 0 = off.
  AccuracyTarget(double target_percent, const StartupClock& clock);
  bool on() const { return target_ > 0; }

  // After every evaluation (accuracy in [0, 1]): true, once, when it first reaches the target;
  // the epoch (1-based), step and time since the process started are kept, and the accuracy as
  // the run's latest.
  bool reached_now(int64_t epoch, int64_t step, double accuracy);
  bool reached() const { return epoch_ > 0; }

  // For the final log line: "; reached 93.0% (93.12%) at epoch 7, 1.42 s after start", or
  // "; target 93.0% not reached", or "" when off.
  std::string summary() const;

  // run.json in `dir`, written atomically: the target and when it was reached, start-up phases,
  // best and final accuracy, steps and total time. Called when the run ends.
  void write_run_json(const std::string& dir, const TrainConfig& cfg, int64_t epochs_done,
                      int64_t steps, double best_accuracy) const;

 private:
  double target_;  // percent
  const StartupClock& clock_;
  int64_t epoch_ = 0, step_ = 0;
  double accuracy_ = 0, seconds_ = 0, latest_ = 0;
};

}  // namespace cnn
