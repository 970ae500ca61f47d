#include "app/train/run_summary.h"

#include <nlohmann/json.hpp>

#include "app/config/config.h"
#include "app/train/startup.h"
#include "runtime/atomic_file.h"
#include "runtime/error.h"

namespace cnn {

AccuracyTarget::AccuracyTarget(double target_percent, const StartupClock& clock)
    : target_(target_percent), clock_(clock) {}

bool AccuracyTarget::reached_now(int64_t epoch, int64_t step, double accuracy) {
  // Compared in percent with a margin far below one image in a million, so that 93.0 counts as
  // reached by 9300 of 10000 despite rounding in the division.
  latest_ = accuracy;
  if (!on() || reached() || 100.0 * accuracy < target_ - 1e-9) return false;
  epoch_ = epoch;
  step_ = step;
  accuracy_ = accuracy;
  seconds_ = clock_.seconds_since_start();
  return true;
}

std::string AccuracyTarget::summary() const {
  if (!on()) return "";
  if (!reached()) return fmt::format("; target {:.1f}% not reached", target_);
  return fmt::format("; reached {:.1f}% ({:.2f}%) at epoch {}, {:.2f} s after start", target_,
                     100 * accuracy_, epoch_, seconds_);
}

void AccuracyTarget::write_run_json(const std::string& dir, const TrainConfig& cfg,
                                    int64_t epochs_done, int64_t steps,
                                    double best_accuracy) const {
  using json = nlohmann::ordered_json;
  json phases = json::object();
  for (const auto& [phase, s] : clock_.phases()) phases[phase] = s;
  json j = {
      {"name", cfg.name},
      {"seed", cfg.training.seed},
      {"target_accuracy", on() ? json(target_) : json(nullptr)},
      {"reached", reached()},
      {"reached_epoch", reached() ? json(epoch_) : json(nullptr)},
      {"reached_step", reached() ? json(step_) : json(nullptr)},
      {"reached_accuracy", reached() ? json(100 * accuracy_) : json(nullptr)},
      {"time_to_target_s", reached() ? json(seconds_) : json(nullptr)},
      {"startup_s", clock_.before_first_step_s()},
      {"startup_phases_s", phases},
      {"final_accuracy", 100 * latest_},
      {"best_accuracy", 100 * best_accuracy},
      {"epochs", epochs_done},
      {"steps", steps},
      {"total_s", clock_.seconds_since_start()},
  };
  const std::string text = j.dump(2) + "\n";
  write_file_atomically(dir + "/run.json", text.data(), text.size());
}

}  // namespace cnn
