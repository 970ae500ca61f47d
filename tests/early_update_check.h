#pragma once
// What the early-update tests share (test_early_update.cpp on the CPU, gpu_early_update.cpp on
// CUDA): training with ParamOptimizer's early updates and the weight gradients run beside
// backward (NetworkOptions::weight_grads_beside) against one update after backward on one
// stream, and a config whose hidden linear layer is large enough for the trainer's default
// threshold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "layers/network.h"
#include "layers/param_optimizer.h"
#include "runtime/memory.h"
#include "tests/test_util.h"

namespace cnn::test {

struct EarlyRun {
  std::vector<std::vector<float>> params;  // after every step
  std::vector<float> grads_after_update;
  std::vector<float> momentum;  // the optimizer's first state tensor after the last step
};

// `steps` steps as test::train_steps takes them (every third batch partial). min_elems > 0: early
// updates with that threshold, else one update after backward. from_device: the learning rate
// and Adam's step number are read from memory of ex.device (the trainer's captured step).
inline EarlyRun train_early(const std::vector<LayerSpec>& specs, const Shape& chw, const Exec& ex,
                            const NetworkOptions& o, const OptimizerOptions& opt, int steps,
                            int64_t min_elems, bool from_device) {
  Network net(specs, chw, o, ex);
  ParamOptimizer optimizer(opt, net);
  if (min_elems > 0) {
    EXPECT_EQ(optimizer.enable_early_updates(min_elems), "");
  }
  Buffer<float> d_lr(1, ex.device);
  Buffer<int64_t> d_update(1, ex.device);
  const float lr = static_cast<float>(opt.lr);
  d_lr.copy_from(&lr, Device::CPU, 1);
  EarlyRun r;
  for (int s = 0; s < steps; ++s) {
    const StepBatch b = step_batch(chw, net.num_classes(), o, s, ex.device);
    const int64_t update = s + 1;
    d_update.copy_from(&update, Device::CPU, 1);
    if (from_device)
      optimizer.begin_step_from(d_lr.data(), d_update.data());
    else
      optimizer.begin_step(opt.lr);
    net.forward_backward(b.n, b.x.data(), b.labels.data(), 1.0f / float(b.n));
    if (from_device)
      optimizer.step_from(d_lr.data(), d_update.data());
    else
      optimizer.step(opt.lr);
    r.params.push_back(net.params_to_host());
  }
  r.grads_after_update = net.grads_to_host();
  r.momentum = optimizer.state_to_host().front().second;
  return r;
}

// Early updates at each threshold (0: none), with o's weight_grads_beside, give bitwise the
// parameters (every step), the gradients left after the last update and the optimizer state of
// one update after backward on one stream; with tolerance > 0 (atomic reductions, whose order
// varies from run to run anyway) the parameters within that error relative to
// max(|value|, 1e-3) instead.
inline void expect_early_updates_keep_the_bits(const std::vector<LayerSpec>& specs,
                                               const Shape& chw, const Exec& ex,
                                               const NetworkOptions& o, const OptimizerOptions& opt,
                                               int steps, const std::vector<int64_t>& thresholds,
                                               double tolerance = 0) {
  for (bool from_device : {false, true}) {
    SCOPED_TRACE(from_device ? "lr from device memory" : "lr by value");
    NetworkOptions plain = o;
    plain.weight_grads_beside = false;
    const EarlyRun off = train_early(specs, chw, ex, plain, opt, steps, 0, from_device);
    for (int64_t min_elems : thresholds) {
      SCOPED_TRACE("min_elems " + std::to_string(min_elems));
      const EarlyRun on = train_early(specs, chw, ex, o, opt, steps, min_elems, from_device);
      ASSERT_EQ(on.params.size(), off.params.size());
      if (tolerance > 0) {
        for (size_t s = 0; s < on.params.size(); ++s)
          EXPECT_LT(max_rel_error(on.params[s], off.params[s]), tolerance) << "step " << s + 1;
        continue;
      }
      for (size_t s = 0; s < on.params.size(); ++s)
        EXPECT_EQ(on.params[s], off.params[s]) << "parameters after step " << s + 1;
      EXPECT_EQ(on.grads_after_update, off.grads_after_update);
      EXPECT_EQ(on.momentum, off.momentum);
    }
  }
}

// configs/tiny.yaml with a hidden linear layer of 600 (307,800 parameters, more than
// ParamOptimizer::kEarlyUpdateMinElems): the trainer's early update then launches once a step,
// after the hidden layer's backward.
inline std::string tiny_wide_yaml() {
  std::string text = slurp(source_dir() + "/configs/tiny.yaml");
  const std::string head = "- linear: {out_features: 4}";
  const size_t at = text.find(head);
  EXPECT_NE(at, std::string::npos) << "configs/tiny.yaml has no '" << head << "'";
  if (at != std::string::npos)
    text.replace(at, head.size(),
                 "- linear: {out_features: 600}\n    - relu\n    - linear: {out_features: 4}");
  return text;
}

}  // namespace cnn::test
