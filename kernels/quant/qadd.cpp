// Int8 residual add dispatch: checks the shape once, then runs the CPU twin or the CUDA kernel.
#include "kernels/quant/qadd.h"

#include <cmath>

#include "kernels/quant/qconv_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {

void qadd_forward(const QAddShape& s, const int8_t* a, const int8_t* b, const QAddScales& k,
                  int8_t* y, const Exec& ex) {
  CNN_CHECK(s.n >= 1 && s.h >= 1 && s.w >= 1 && s.c >= 1 && s.cp >= s.c && s.cp % 4 == 0,
            "qadd: bad shape n={} h={} w={} c={} cp={}", s.n, s.h, s.w, s.c, s.cp);
  CNN_CHECK(std::isfinite(k.mult_a) && std::isfinite(k.mult_b),
            "qadd: multipliers {} and {} must be finite", k.mult_a, k.mult_b);
  CNN_CHECK(a && b && y, "qadd: null pointer");
  if (ex.device == Device::CPU) return qadd_forward_cpu(s, a, b, k, y);
  CNN_CUDA_BRANCH("qadd_forward", qadd_forward_cuda(s, a, b, k, y, ex.stream));
}

}  // namespace cnn
