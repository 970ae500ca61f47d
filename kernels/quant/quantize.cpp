// Input quantization dispatch.
#include "kernels/quant/quantize.h"

#include "kernels/quant/qconv_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {

void quantize_nchw_to_nhwc(const QuantizeShape& s, const float* x, float inv_scale, int8_t* y,
                           const Exec& ex) {
  CNN_CHECK(s.n >= 1 && s.c >= 1 && s.h >= 1 && s.w >= 1 && s.cp >= s.c && s.cp % 4 == 0,
            "quantize: bad shape n={} c={} h={} w={} cp={}", s.n, s.c, s.h, s.w, s.cp);
  CNN_CHECK(x && y, "quantize: null pointer");
  if (ex.device == Device::CPU) return quantize_nchw_to_nhwc_cpu(s, x, inv_scale, y);
  CNN_CUDA_BRANCH("quantize", quantize_nchw_to_nhwc_cuda(s, x, inv_scale, y, ex.stream));
}

}  // namespace cnn
