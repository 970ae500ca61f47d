// ReLU dispatch: checks the arguments once, then runs the CPU reference or the CUDA launcher.
#include "kernels/pointwise/relu.h"

#include "kernels/pointwise/relu_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {
namespace {

void check_args(const char* what, int64_t count, const void* a, const void* b, const void* c) {
  CNN_CHECK(count >= 0, "{}: element count must be >= 0, got {}", what, count);
  CNN_CHECK(count == 0 || (a && b && c), "{}: null pointer for {} elements", what, count);
}

}  // namespace

void relu_forward(int64_t count, const float* x, float* y, const Exec& ex) {
  check_args("relu_forward", count, x, y, y);
  if (count == 0) return;
  if (ex.device == Device::CPU) return relu_forward_cpu(count, x, y);
  CNN_CUDA_BRANCH("relu_forward", relu_forward_cuda(count, x, y, ex.stream));
}

void relu_backward(int64_t count, const float* y, const float* dy, float* dx, const Exec& ex) {
  check_args("relu_backward", count, y, dy, dx);
  if (count == 0) return;
  if (ex.device == Device::CPU) return relu_backward_cpu(count, y, dy, dx);
  CNN_CUDA_BRANCH("relu_backward", relu_backward_cuda(count, y, dy, dx, ex.stream));
}

}  // namespace cnn
