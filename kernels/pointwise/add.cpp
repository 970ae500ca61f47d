// Add dispatch: checks the arguments once, then runs the CPU reference or the CUDA launcher.
#include "kernels/pointwise/add.h"

#include "kernels/pointwise/add_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {

void add_forward(int64_t count, const float* a, const float* b, float* y, const Exec& ex) {
  CNN_CHECK(count >= 0, "add_forward: element count must be >= 0, got {}", count);
  CNN_CHECK(count == 0 || (a && b && y), "add_forward: null pointer for {} elements", count);
  if (count == 0) return;
  if (ex.device == Device::CPU) return add_forward_cpu(count, a, b, y);
  CNN_CUDA_BRANCH("add_forward", add_forward_cuda(count, a, b, y, ex.stream));
}

}  // namespace cnn
