#include "layers/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "runtime/error.h"

namespace cnn {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kOneCycleStartDiv = 25.0;  // onecycle starts at base / 25
constexpr double kOneCycleFloorDiv = 1e4;   // and ends at base / 1e4 when min_lr is 0
// t = step / steps_per_epoch is rounded, and u = t - W again; without this slack a step that
// lies exactly on a boundary (e.g. 2.9999999999 epochs) would drop one step late.
constexpr double kBoundarySlack = 1e-9;

// a at p = 0, b at p = 1, half-way at p = 0.5.
double cos_anneal(double a, double b, double p) {
  p = std::clamp(p, 0.0, 1.0);
  return b + (a - b) * (1.0 + std::cos(kPi * p)) / 2.0;
}

bool finite_positive(double v) {
  return std::isfinite(v) && v > 0;
}

}  // namespace

const char* schedule_name(ScheduleType type) {
  switch (type) {
    case ScheduleType::Constant:
      return "constant";
    case ScheduleType::Step:
      return "step";
    case ScheduleType::Cosine:
      return "cosine";
    case ScheduleType::OneCycle:
      return "onecycle";
  }
  return "unknown";
}

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"constant", "step", "cosine", "onecycle"};
  return names;
}

ScheduleType schedule_type(const std::string& name) {
  for (ScheduleType t :
       {ScheduleType::Constant, ScheduleType::Step, ScheduleType::Cosine, ScheduleType::OneCycle})
    if (name == schedule_name(t)) return t;
  CNN_FAIL("schedule: unknown type '{}', expected constant, step, cosine or onecycle", name);
}

void check_schedule(const ScheduleOptions& s, double base_lr, double total_epochs) {
  CNN_CHECK(finite_positive(base_lr), "schedule: learning rate is {}, expected a positive number",
            base_lr);
  CNN_CHECK(finite_positive(total_epochs), "schedule: total epochs is {}, expected > 0",
            total_epochs);
  CNN_CHECK(std::isfinite(s.warmup_epochs) && s.warmup_epochs >= 0,
            "schedule: warmup_epochs is {}, expected >= 0", s.warmup_epochs);
  CNN_CHECK(std::isfinite(s.warmup_start_factor) && s.warmup_start_factor >= 0 &&
                s.warmup_start_factor <= 1,
            "schedule: warmup_start_factor is {}, expected a value in [0, 1]",
            s.warmup_start_factor);
  switch (s.type) {
    case ScheduleType::Constant:
      break;
    case ScheduleType::Step:
      CNN_CHECK(finite_positive(s.step_epochs), "schedule: step_epochs is {}, expected > 0",
                s.step_epochs);
      CNN_CHECK(finite_positive(s.gamma), "schedule: gamma is {}, expected > 0", s.gamma);
      break;
    case ScheduleType::Cosine:
    case ScheduleType::OneCycle:
      CNN_CHECK(std::isfinite(s.min_lr) && s.min_lr >= 0 && s.min_lr <= base_lr,
                "schedule: min_lr is {}, expected a value in [0, learning rate = {}]", s.min_lr,
                base_lr);
      if (s.type == ScheduleType::Cosine) {
        CNN_CHECK(s.warmup_epochs < total_epochs,
                  "schedule: warmup_epochs is {}, expected less than the {} total epochs, so "
                  "that the cosine has time to anneal",
                  s.warmup_epochs, total_epochs);
      }
      if (s.type == ScheduleType::OneCycle) {
        CNN_CHECK(std::isfinite(s.pct_start) && s.pct_start > 0 && s.pct_start < 1,
                  "schedule: pct_start is {}, expected a value in (0, 1)", s.pct_start);
      }
      break;
    default:
      CNN_FAIL("schedule: unknown type {}", static_cast<int>(s.type));
  }
}

double learning_rate(const ScheduleOptions& s, double base_lr, double epoch_progress,
                     double total_epochs) {
  check_schedule(s, base_lr, total_epochs);
  CNN_CHECK(!std::isnan(epoch_progress), "schedule: epoch progress is NaN");
  const double t = std::clamp(epoch_progress, 0.0, total_epochs);

  if (s.type == ScheduleType::OneCycle) {
    const double peak = s.pct_start * total_epochs;
    const double floor_lr = s.min_lr > 0 ? s.min_lr : base_lr / kOneCycleFloorDiv;
    if (t <= peak) return cos_anneal(base_lr / kOneCycleStartDiv, base_lr, t / peak);
    return cos_anneal(base_lr, floor_lr, (t - peak) / (total_epochs - peak));
  }

  const double w = s.warmup_epochs;
  if (t < w) return base_lr * (s.warmup_start_factor + (1.0 - s.warmup_start_factor) * t / w);
  const double u = t - w;
  switch (s.type) {
    case ScheduleType::Step:
      return base_lr * std::pow(s.gamma, std::floor(u / s.step_epochs + kBoundarySlack));
    case ScheduleType::Cosine: {
      // check_schedule guarantees W < T, so the span is positive.
      return cos_anneal(base_lr, s.min_lr, u / (total_epochs - w));
    }
    default:
      return base_lr;
  }
}

std::vector<double> epoch_lr_table(const ScheduleOptions& s, double base_lr, int64_t first_step,
                                   int64_t steps_per_epoch, double total_epochs) {
  CNN_CHECK(steps_per_epoch > 0, "lr table: {} steps per epoch", steps_per_epoch);
  std::vector<double> t(static_cast<size_t>(steps_per_epoch));
  for (int64_t k = 0; k < steps_per_epoch; ++k)
    t[size_t(k)] =
        learning_rate(s, base_lr, double(first_step + k) / double(steps_per_epoch), total_epochs);
  return t;
}

}  // namespace cnn
