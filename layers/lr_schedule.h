#pragma once
// Learning-rate schedules as one pure function of the (fractional) epoch, so that a resumed run
// gets exactly the rate it would have had, and a test can check any point by hand.
//
// Notation: t = epoch_progress (step / steps_per_epoch, clamped to [0, T]), T = total_epochs,
// W = warmup_epochs, f = warmup_start_factor, base = base_lr, min = min_lr,
// cos_anneal(a, b, p) = b + (a - b) * (1 + cos(pi * p)) / 2   (a at p = 0, b at p = 1).
//
// Warm-up (constant, step, cosine): for t < W, lr = base * (f + (1 - f) * t / W), a straight line
// from base*f to base. The main schedule then runs on the shifted clock u = t - W, so it starts
// at base exactly where the warm-up ends and the rate never jumps:
//   constant:  lr = base
//   step:      lr = base * gamma^floor(u / step_epochs)   (drops at W + k*step_epochs)
//   cosine:    lr = cos_anneal(base, min, u / (T - W))    (needs W < T; base at t = W, min at t =
//   T,
//                                                          (base + min) / 2 half-way)
//   onecycle:  peak at P = pct_start * T, floor = min > 0 ? min : base / 1e4,
//              t <= P: lr = cos_anneal(base / 25, base, t / P)
//              t >  P: lr = cos_anneal(base, floor, (t - P) / (T - P))
//              Both halves are cosine, as PyTorch's OneCycleLR does by default. onecycle
//              ignores warmup_epochs: its rise from base/25 is the warm-up.
// Past the end (t > T) every schedule holds its value at T.
//
// This file is the whole schedule: the names the config uses, the check, the formula, and the
// per-batch table the trainer uploads for an epoch (which the step's last launch walks on the
// device, kernels/optimizer advance_step_counters).
#include <cstdint>
#include <string>
#include <vector>

#include "layers/optim_options.h"

namespace cnn {

// Checks the options against the run (positive finite base_lr and total_epochs, warmup_epochs >= 0,
// warmup_start_factor in [0, 1], step_epochs > 0, gamma > 0, 0 <= min_lr <= base_lr,
// pct_start in (0, 1)); throws cnn::Error naming the field, its value and the valid range.
void check_schedule(const ScheduleOptions& s, double base_lr, double total_epochs);

// The learning rate at fractional epoch `epoch_progress` (formulas above). Checks its arguments
// with check_schedule, so a config mistake is reported at the first step rather than as a NaN.
double learning_rate(const ScheduleOptions& s, double base_lr, double epoch_progress,
                     double total_epochs);

// The learning rate of each batch of an epoch whose batch 0 sits at schedule step `first_step`
// (epoch * steps_per_epoch): batch k runs at learning_rate((first_step + k) / steps_per_epoch).
std::vector<double> epoch_lr_table(const ScheduleOptions& s, double base_lr, int64_t first_step,
                                   int64_t steps_per_epoch, double total_epochs);

// "constant", "step", "cosine", "onecycle": the names the config uses.
const char* schedule_name(ScheduleType type);
const std::vector<std::string>& schedule_names();
// The type a name stands for; throws cnn::Error listing the names for any other.
ScheduleType schedule_type(const std::string& name);

}  // namespace cnn
