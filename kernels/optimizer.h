#pragma once
// Parameter updates over ONE flat parameter buffer (all layers' weights and biases laid end to
// end), so a single kernel updates every parameter. Gradients are zeroed by the same kernel
// after use, ready for the next step's accumulation.
#include <cstdint>

#include "kernels/exec.h"

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

// grad_scale multiplies every gradient first (gradient clipping passes min(1, max_norm/norm)).
// decay_mask (may be null): per element 1 = apply weight decay, 0 = not (biases).
// w, g, m (momentum buffer): `count` floats. g is zeroed on return. m may be null when
// momentum is 0; a fresh m must start at zero (torch's first step sets buf = g).
void sgd_update(int64_t count, float* w, float* g, float* m, const uint8_t* decay_mask,
                const SgdParams& p, float grad_scale, const Exec& ex);
// m, v: first and second moment buffers.
void adam_update(int64_t count, float* w, float* g, float* m, float* v, const uint8_t* decay_mask,
                 const AdamParams& p, float grad_scale, const Exec& ex);

// Sum of squares of g into *out (a device scalar on CUDA, host on CPU), fixed-order reduction.
// `scratch` holds sum_squares_scratch_doubles(count) doubles.
int64_t sum_squares_scratch_doubles(int64_t count);
void sum_squares(int64_t count, const float* g, double* out, double* scratch, const Exec& ex);

// Flags whether any value is NaN/Inf: *flag (device int on CUDA) is set to 1 if so, untouched if
// not. Used by the trainer's NaN watch at logging points.
void find_nonfinite(int64_t count, const float* x, int32_t* flag, const Exec& ex);

void sgd_update_cpu(int64_t count, float* w, float* g, float* m, const uint8_t* decay_mask,
                    const SgdParams& p, float grad_scale);
void adam_update_cpu(int64_t count, float* w, float* g, float* m, float* v,
                     const uint8_t* decay_mask, const AdamParams& p, float grad_scale);
void sum_squares_cpu(int64_t count, const float* g, double* out);
void find_nonfinite_cpu(int64_t count, const float* x, int32_t* flag);

}  // namespace cnn
