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
  ~ParamOptimizer();
  ParamOptimizer(const ParamOptimizer&) = delete;
  ParamOptimizer& operator=(const ParamOptimizer&) = delete;

  // Early updates. Once enabled, a step announced by begin_step / begin_step_from (before the
  // network's forward_backward) updates each range of parameters as soon as backward has
  // finished its gradients (Network's grads-ready hook), once the finished and not yet updated
  // parameters number at least `min_elems`; step / step_from then update the rest. On CUDA the
  // early updates run on the network's side stream (Network::side_stream()) beside the rest of
  // backward, which forward_backward joins back before it returns. The update rule is
  // elementwise, so the bits are those of one update after backward. A step not announced
  // updates every parameter at step / step_from.
  // Returns "" when enabled, else why not (clipping needs every gradient before any update; a
  // data-parallel run's hook sums the gradients first), leaving it off.
  static constexpr int64_t kEarlyUpdateMinElems = int64_t(1) << 18;
  std::string enable_early_updates(int64_t min_elems = kEarlyUpdateMinElems);
  bool early_updates() const { return early_; }
  // Announce a step: its learning rate (and Adam's step number) as step(lr) / step_from will
  // use them (the same values must follow there).
  void begin_step(double lr);
  void begin_step_from(const float* d_lr, const int64_t* d_update);

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
  // Updates parameters [begin, end) on ex's stream.
  void update(int64_t begin, int64_t end, float lr, int64_t step, const float* d_lr,
              const int64_t* d_step, float scale, const Exec& ex);
  void on_grads_ready(int64_t final_from);  // an early update of what backward has finished
  // Updates what the early updates left, [0, pending_end_), on the network's stream.
  void finish(float lr, int64_t step, const float* d_lr, const int64_t* d_step, float scale);

  OptimizerOptions opt_;
  Network& net_;
  int64_t steps_ = 0;
  double last_norm_ = 0;
  Buffer<float> m_, v_;  // momentum / Adam moments, like the parameters
  Buffer<uint8_t> decay_mask_;
  KeptGrads kept_;  // the network's overwritten gradient ranges, left unzeroed by the update
  Buffer<double> norm_, norm_scratch_;
  // Early updates: on, the smallest range worth a launch, and the announced step's values.
  bool early_ = false;
  int64_t early_min_ = 0;
  bool announced_ = false;   // begin_step* called, step* not yet
  int64_t pending_end_ = 0;  // parameters [pending_end_, n) are updated this step
  float step_lr_ = 0;
  int64_t step_no_ = 1;
  const float* step_d_lr_ = nullptr;
  const int64_t* step_d_update_ = nullptr;
};

}  // namespace cnn
