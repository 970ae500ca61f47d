// Fused linear-head backward dispatch: checks the arguments once, then runs the CPU twin or the
// CUDA launcher; and the two choices the layer and the launcher make (whether the fused kernel
// applies, how many row splits it takes), which need no GPU to compute.
#include "kernels/gemm/linear_head.h"

#include <algorithm>
#include <cstdint>

#include "kernels/gemm/linear_head_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/env_switches.h"
#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {

bool linear_head_backward_applies(const LinearShape& s, Device dev) {
  return CNN_CUDA_VALUE(true, false) && dev == Device::CUDA && s.out <= kLinearHeadMaxOut &&
         process_env_switches().linear_head;
}

int linear_head_pick_row_splits(const LinearShape& s, bool deterministic, int sms) {
  if (deterministic) return 1;
  const int64_t column_blocks = ceil_div<int64_t>(s.in, kLinearHeadColumns);
  const int64_t fill = ceil_div<int64_t>(std::max(sms, 1), column_blocks);
  const int64_t most =
      ceil_div<int64_t>(s.n, int64_t(kLinearHeadWarps) * kLinearHeadMinRowsPerWarp);
  return static_cast<int>(std::clamp<int64_t>(std::min(fill, most), 1, 65535));
}

void linear_head_backward(const LinearShape& s, const float* x, const float* dy, const float* w,
                          float* dw, float* db, float* dx, bool mask_input_relu, float* input_db,
                          const Exec& ex) {
  check_linear_shape(s);
  CNN_CHECK(s.out <= kLinearHeadMaxOut,
            "linear_head_backward: {} outputs; the fused kernel takes at most {}", s.out,
            kLinearHeadMaxOut);
  CNN_CHECK(x && dy && dw, "linear_head_backward: x, dy and dw must not be null");
  CNN_CHECK(!dx || w, "linear_head_backward: w must not be null when dx is asked for");
  CNN_CHECK(!input_db || (dx && mask_input_relu),
            "linear_head_backward: input_db needs dx and the input ReLU mask");
  if (ex.device == Device::CPU)
    return linear_head_backward_cpu(s, x, dy, w, dw, db, dx, mask_input_relu, input_db);
  CNN_CUDA_BRANCH("linear_head_backward",
                  linear_head_backward_cuda(s, x, dy, w, dw, db, dx, mask_input_relu, input_db,
                                            ex.deterministic, ex.stream));
}

}  // namespace cnn
