#pragma once
// What both grad-overwrite tests share (test_grad_overwrite.cpp on the CPU,
// gpu_grad_overwrite.cpp on CUDA): a small network, and the check they run: the same training
// with and without NetworkOptions::overwrite_grads.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "layers/network.h"
#include "layers/param_optimizer.h"
#include "tests/test_util.h"

namespace cnn::test {

// conv1 -> relu -> pool -> conv2 -> relu -> pool -> fc1 -> relu -> fc2 (10 classes), of the given
// widths (conv_net_specs' 5 x 5 filters, padding 2).
inline std::vector<LayerSpec> small_net(int conv1, int conv2, int fc1) {
  ConvNetSizes s;
  s.conv1 = conv1;
  s.conv2 = conv2;
  s.fc1 = fc1;
  return conv_net_specs(s);
}

// Trains `steps` steps (test::train_steps) without and with overwrite_grads. tolerance 0: the
// same bits (parameters after every step, gradients before the last update); else the
// parameters within that error relative to max(|value|, 1e-3). After the last update, all
// gradients are zero without the option; with it, zero outside the written ranges and the last
// batch's inside them. Returns the written parameters' names.
inline std::vector<std::string> expect_same_training(const std::vector<LayerSpec>& specs,
                                                     const Shape& chw, const Exec& ex,
                                                     NetworkOptions o, const OptimizerOptions& opt,
                                                     int steps, double tolerance = 0) {
  o.overwrite_grads = false;
  const TrainRun off = train_steps(specs, chw, ex, o, opt, steps);
  o.overwrite_grads = true;
  const TrainRun on = train_steps(specs, chw, ex, o, opt, steps);
  EXPECT_TRUE(off.overwritten.empty());
  EXPECT_FALSE(on.overwritten.empty());
  EXPECT_EQ(on.params.size(), off.params.size());
  for (size_t s = 0; s < on.params.size() && s < off.params.size(); ++s) {
    if (tolerance == 0) {
      EXPECT_EQ(on.params[s], off.params[s]) << "parameters after step " << s + 1;
    } else {
      EXPECT_LT(max_rel_error(on.params[s], off.params[s]), tolerance) << "step " << s + 1;
    }
  }
  if (tolerance == 0) {
    EXPECT_EQ(on.grads_before_update, off.grads_before_update);
  }
  const size_t n = off.grads_after_update.size();
  EXPECT_EQ(off.grads_after_update, std::vector<float>(n, 0.f));
  std::vector<float> want(n, 0.f);
  for (const auto& [begin, end] : on.overwritten)
    for (int64_t i = begin; i < end; ++i) want[size_t(i)] = on.grads_before_update[size_t(i)];
  EXPECT_EQ(on.grads_after_update, want);
  return on.overwritten_names;
}

}  // namespace cnn::test
