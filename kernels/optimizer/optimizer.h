#pragma once
// Parameter updates over ONE flat parameter buffer (all layers' weights and biases laid end to
// end), so a single kernel updates every parameter. Gradients are zeroed by the same kernel
// after use, ready for the next step's accumulation, except in the ranges the caller names as
// overwritten by the next backward pass (KeptGrads): zeroing those would be a wasted write.
#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/exec.h"

namespace cnn {

struct SgdParams {
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;  // L2, added to the gradient (as torch.optim.SGD)
  bool nesterov = false;
};

struct AdamParams {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled = false;  // AdamW: decay the weights directly instead of via the gradient
  int64_t step = 1;        // 1-based step number after this update, for bias correction
};

// Ranges [begin[r], end[r]), r < count, of the gradient buffer (element indices) that an update
// leaves as they are instead of zeroing: gradients the next backward pass writes over rather than
// adds to (layers/network.h, NetworkOptions::overwrite_grads). Passed by value into the kernel (a
// range check per element moves no bytes, where a per-element mask would), so a captured CUDA
// graph holds the ranges it was captured with. Ranges may touch or overlap; empty: zero all.
struct KeptGrads {
  static constexpr int kMax = 8;
  int count = 0;
  int64_t begin[kMax] = {}, end[kMax] = {};
};
// The KeptGrads of `ranges` ([begin, end) pairs): checks first that they fit in its kMax slots
// (throws naming `what` if not); the update checks that they lie within the buffer.
KeptGrads kept_grads(const std::vector<std::pair<int64_t, int64_t>>& ranges, const char* what);
// The part of `kept` within [begin, end), as ranges of the slice (indices from begin): for an
// update of that slice alone (ParamOptimizer's early updates). Empty parts are dropped.
KeptGrads kept_grads_slice(const KeptGrads& kept, int64_t begin, int64_t end);

// grad_scale multiplies every gradient first (gradient clipping passes min(1, max_norm/norm)).
// decay_mask (may be null): per element 1 = apply weight decay, 0 = not (biases).
// w, g, m (momentum buffer): `count` floats. g is zeroed on return, except the ranges in
// `kept` (within [0, count)), which keep this update's gradient. m may be null when
// momentum is 0; a fresh m must start at zero (torch's first step sets buf = g).
// lr_device (may be null): the learning rate is read from *lr_device (memory of ex.device) when
// the update runs instead of p.lr, so that one captured CUDA graph serves every step.
void sgd_update(int64_t count, float* w, float* g, float* m, const uint8_t* decay_mask,
                const SgdParams& p, float grad_scale, const Exec& ex,
                const float* lr_device = nullptr, const KeptGrads& kept = {});
// m, v: first and second moment buffers. step_device (may be null), like lr_device: Adam's
// 1-based step number read from *step_device instead of p.step; the bias corrections are then
// computed where the update runs (on the GPU with CUDA's double pow, within an ulp of the host's).
void adam_update(int64_t count, float* w, float* g, float* m, float* v, const uint8_t* decay_mask,
                 const AdamParams& p, float grad_scale, const Exec& ex,
                 const float* lr_device = nullptr, const int64_t* step_device = nullptr,
                 const KeptGrads& kept = {});

// The per-step values a captured training step reads from memory of its device (the trainer's
// CUDA graph replays the same launches every step).
struct StepCounters {
  int64_t batch = 0;   // batch of the epoch this step takes (its offset in the epoch's order)
  int64_t update = 1;  // the optimizer's 1-based update number of this step (Adam)
  float lr = 0;        // this step's learning rate: lr_table[batch]
};
// The step's last launch: ++batch, ++update, and lr = lr_table[batch] while batch < table_len
// (lr_table: the epoch's learning rate per batch). counters and lr_table live on ex.device.
void advance_step_counters(StepCounters* counters, const float* lr_table, int64_t table_len,
                           const Exec& ex);
void advance_step_counters_cpu(StepCounters* counters, const float* lr_table, int64_t table_len);

// Sum of squares of g into *out (a device scalar on CUDA, host on CPU), fixed-order reduction.
// `scratch` holds sum_squares_scratch_doubles(count) doubles.
int64_t sum_squares_scratch_doubles(int64_t count);
void sum_squares(int64_t count, const float* g, double* out, double* scratch, const Exec& ex);

// Flags whether any value is NaN/Inf: *flag (device int on CUDA) is set to 1 if so, untouched if
// not. Used by the trainer's NaN watch at logging points.
void find_nonfinite(int64_t count, const float* x, int32_t* flag, const Exec& ex);

void sgd_update_cpu(int64_t count, float* w, float* g, float* m, const uint8_t* decay_mask,
                    const SgdParams& p, float grad_scale, const KeptGrads& kept = {});
void adam_update_cpu(int64_t count, float* w, float* g, float* m, float* v,
                     const uint8_t* decay_mask, const AdamParams& p, float grad_scale,
                     const KeptGrads& kept = {});
void sum_squares_cpu(int64_t count, const float* g, double* out);
void find_nonfinite_cpu(int64_t count, const float* x, int32_t* flag);

}  // namespace cnn
