// CPU reference for dropout: the same hash and threshold as the CUDA kernel, so both devices
// draw the same mask and give the same bits.
#include "runtime/hash_rng.h"  // header-only, no dependencies: the hash the data pipeline also uses
#include "kernels/pointwise/dropout.h"

namespace cnn {
namespace {

void apply(int64_t count, const float* in, float* out, const DropoutArgs& a) {
  const uint32_t threshold = dropout_threshold(a.p);
  const float scale = 1.0f / (1.0f - a.p);
  const uint64_t step = a.step ? uint64_t(*a.step) : 0;
  for (int64_t k = 0; k < count; ++k) {
    const uint32_t bits = uint32_t(hash3(a.seed, step, uint64_t(k)) >> 32);
    out[k] = bits >= threshold ? in[k] * scale : 0.0f;
  }
}

}  // namespace

void dropout_forward_cpu(int64_t count, const float* x, float* y, const DropoutArgs& a) {
  apply(count, x, y, a);
}

void dropout_backward_cpu(int64_t count, const float* dy, float* dx, const DropoutArgs& a) {
  apply(count, dy, dx, a);
}

}  // namespace cnn
