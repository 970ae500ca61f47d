#pragma once
// SGD (momentum, Nesterov, weight decay) and Adam/AdamW over the network's flat parameter
// buffer: one update kernel per step for every parameter, which also zeroes the gradients, except
// those the network's backward writes instead of adding to (Network::overwritten_grad_ranges()).
#include <string>
#include <utility>
#include <vector>

#include "kernels/optimizer/optimizer.h"
#include "layers/network.h"
#include "layers/optim_options.h"
#include "runtime/memory.h"

namespace cnn {

// "sgd", "adam", "adamw": the names the config uses.
const char* optimizer_name(OptimizerType type);

class ParamOptimizer {
 public:
  ParamOptimizer(const OptimizerOptions& opt, Network& net);

  // One update with this step's learning rate. With clip_grad_norm > 0 the global gradient norm
  // is read back to the host first (the only host sync in a step, and only when clipping).
  void step(double lr);
  // The same update with the learning rate and Adam's 1-based step number read from memory of
  // the network's device (*d_lr, *d_update) when it runs, so that a captured CUDA graph replays
  // it every step. The caller keeps the step count (its device counter); the host count that
  // step() advances is left as it was. Syncs the host only when clipping (see syncs_host()).
  void step_from(const float* d_lr, const int64_t* d_update);
  // True when a step reads the gradient norm back to the host (clip_grad_norm > 0): such a step
  // cannot be captured into a CUDA graph.
  bool syncs_host() const { return opt_.clip_grad_norm > 0; }

  // Optimizer state as named tensors for checkpoints ("optimizer.momentum", "optimizer.adam_m",
  // "optimizer.adam_v"), and the reverse.
  std::vector<std::pair<std::string, std::vector<float>>> state_to_host() const;
  void state_from_host(const std::vector<std::pair<std::string, std::vector<float>>>& state,
                       int64_t steps_taken);
  double last_grad_norm() const { return last_norm_; }  // only when clipping

 private:
  float clip_scale();  // gradient clipping's factor (1 without clipping); syncs when clipping
  void update(float lr, int64_t step, const float* d_lr, const int64_t* d_step, float scale);

  OptimizerOptions opt_;
  Network& net_;
  int64_t steps_ = 0;
  double last_norm_ = 0;
  Buffer<float> m_, v_;  // momentum / Adam moments, like the parameters
  Buffer<uint8_t> decay_mask_;
  KeptGrads kept_;  // the network's overwritten gradient ranges, left unzeroed by the update
  Buffer<double> norm_, norm_scratch_;
};

}  // namespace cnn
