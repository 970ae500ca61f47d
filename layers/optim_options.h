#pragma once
// What the config's `optimizer:` and `schedule:` sections say, as plain values.
#include <string>

namespace cnn {

enum class OptimizerType { Sgd, Adam, AdamW };

struct OptimizerOptions {
  OptimizerType type = OptimizerType::Sgd;
  double lr = 0.05;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0;
  bool decay_biases = false;  // weight decay on biases too (PyTorch's default would be true)
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double clip_grad_norm = 0;  // 0 = off
};

enum class ScheduleType { Constant, Step, Cosine, OneCycle };

struct ScheduleOptions {
  ScheduleType type = ScheduleType::Constant;
  double warmup_epochs = 0;  // linear warm-up from lr*warmup_start_factor to lr
  double warmup_start_factor = 0.1;
  double step_epochs = 1;    // step: multiply by gamma every step_epochs
  double gamma = 0.1;
  double min_lr = 0;         // cosine / onecycle floor
  double pct_start = 0.3;    // onecycle: fraction of training spent rising to lr
};

}  // namespace cnn
