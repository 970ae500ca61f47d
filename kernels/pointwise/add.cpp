// Add dispatch: checks the arguments once, then runs the CPU reference or the CUDA launcher.
#include "kernels/pointwise/add.h"

#include "runtime/error.h"
#ifdef CNN_HAVE_CUDA
#include "kernels/pointwise/add_cuda.h"
#endif

namespace cnn {

void add_forward(int64_t count, const float* a, const float* b, float* y, const Exec& ex) {
  CNN_CHECK(count >= 0, "add_forward: element count must be >= 0, got {}", count);
  CNN_CHECK(count == 0 || (a && b && y), "add_forward: null pointer for {} elements", count);
  if (count == 0) return;
  if (ex.device == Device::CPU) return add_forward_cpu(count, a, b, y);
#ifdef CNN_HAVE_CUDA
  add_forward_cuda(count, a, b, y, ex.stream);
#else
  CNN_FAIL("add_forward on cuda: built without CUDA");
#endif
}

}  // namespace cnn
