// Dropout dispatch: checks the arguments once, then runs the CPU reference or the CUDA launcher.
#include "kernels/pointwise/dropout.h"

#include <cmath>
#include <cstdint>

#include "kernels/pointwise/dropout_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {

uint32_t dropout_threshold(float p) {
  const double t = std::round(double(p) * 4294967296.0);
  return t >= 4294967295.0 ? UINT32_MAX : static_cast<uint32_t>(t);
}

namespace {

void check(int64_t count, const void* in, const void* out, const DropoutArgs& a, const char* op) {
  CNN_CHECK(count >= 0, "{}: element count {} must be >= 0", op, count);
  CNN_CHECK(count == 0 || (in && out), "{}: null pointer", op);
  CNN_CHECK(a.p >= 0.f && a.p < 1.f, "{}: p = {} must be in [0, 1)", op, a.p);
}

void apply(int64_t count, const float* in, float* out, const DropoutArgs& a, const Exec& ex,
           bool forward) {
  if (count == 0) return;
  if (ex.device == Device::CPU)
    return forward ? dropout_forward_cpu(count, in, out, a)
                   : dropout_backward_cpu(count, in, out, a);
  CNN_CUDA_BRANCH("dropout", dropout_apply_cuda(count, in, out, dropout_threshold(a.p),
                                                1.0f / (1.0f - a.p), a.seed, a.step, ex.stream));
}

}  // namespace

void dropout_forward(int64_t count, const float* x, float* y, const DropoutArgs& a,
                     const Exec& ex) {
  check(count, x, y, a, "dropout_forward");
  apply(count, x, y, a, ex, true);
}

void dropout_backward(int64_t count, const float* dy, float* dx, const DropoutArgs& a,
                      const Exec& ex) {
  check(count, dy, dx, a, "dropout_backward");
  apply(count, dy, dx, a, ex, false);
}

}  // namespace cnn
