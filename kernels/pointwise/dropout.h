#pragma once
// Inverted dropout: in training each element is kept with probability 1 - p and scaled by
// 1 / (1 - p), else zeroed. The mask is never stored: element k's coin is a counter-based hash of
// (seed, step, k) (data/hash_rng.h's hash3), so forward and backward draw the same mask, every
// device draws the same bits, and a run is bitwise repeatable. The step is read from memory of
// the op's device when the kernel runs, so a captured CUDA graph draws a new mask every replay.
#include <cstdint>

#include "runtime/exec.h"

namespace cnn {

struct DropoutArgs {
  float p = 0.5f;                 // in [0, 1)
  uint64_t seed = 0;              // run seed mixed with the layer's identity
  const int64_t* step = nullptr;  // (1) on the op's device; null reads as step 0
};

// Keep threshold on the hash's top 32 bits: an element is kept when bits >= threshold.
uint32_t dropout_threshold(float p);

// y (count) = x * mask / (1 - p). y may alias x.
void dropout_forward(int64_t count, const float* x, float* y, const DropoutArgs& a, const Exec& ex);
// dx (count) = dy * mask / (1 - p) with the same mask. dx may alias dy.
void dropout_backward(int64_t count, const float* dy, float* dx, const DropoutArgs& a,
                      const Exec& ex);

void dropout_forward_cpu(int64_t count, const float* x, float* y, const DropoutArgs& a);
void dropout_backward_cpu(int64_t count, const float* dy, float* dx, const DropoutArgs& a);

}  // namespace cnn
