// Int8 average pool dispatch: checks the shape once, then runs the CPU twin or the CUDA kernel.
#include "kernels/quant/qavgpool.h"

#include <cmath>

#include "kernels/quant/qconv_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {

void check_qavgpool_shape(const QAvgPoolShape& s) {
  CNN_CHECK(s.n >= 1 && s.h >= 1 && s.w >= 1 && s.c >= 1 && s.cp >= s.c && s.cp % 4 == 0,
            "qavgpool: bad shape n={} h={} w={} c={} cp={}", s.n, s.h, s.w, s.c, s.cp);
  CNN_CHECK(s.kh >= 1 && s.kw >= 1 && int64_t(s.kh) * s.kw <= (1 << 16) && s.stride_h >= 1 &&
                s.stride_w >= 1 && s.pad_h >= 0 && s.pad_w >= 0 && 2 * s.pad_h <= s.kh &&
                2 * s.pad_w <= s.kw,
            "qavgpool: bad window {}x{} stride {}x{} padding {}x{} (padding at most half the "
            "window, at most 65536 elements)",
            s.kh, s.kw, s.stride_h, s.stride_w, s.pad_h, s.pad_w);
  CNN_CHECK(s.oh() >= 1 && s.ow() >= 1, "qavgpool: the {}x{} window does not fit {}x{}", s.kh, s.kw,
            s.h, s.w);
}

void qavgpool_forward(const QAvgPoolShape& s, const int8_t* x, float mult, bool relu, int8_t* y,
                      const Exec& ex) {
  check_qavgpool_shape(s);
  CNN_CHECK(std::isfinite(mult), "qavgpool: multiplier {} must be finite", mult);
  CNN_CHECK(x && y, "qavgpool: null pointer");
  if (ex.device == Device::CPU) return qavgpool_forward_cpu(s, x, mult, relu, y);
  CNN_CUDA_BRANCH("qavgpool_forward", qavgpool_forward_cuda(s, x, mult, relu, y, ex.stream));
}

}  // namespace cnn
