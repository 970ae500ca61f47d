// Max-pool dispatch: checks the shape once, then runs the CPU reference or the CUDA launcher.
#include "kernels/pool/maxpool.h"

#include <cstdint>

#include "kernels/pool/maxpool_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {

void check_maxpool_shape(const MaxPoolShape& s) {
  CNN_CHECK(s.n >= 1 && s.c >= 1 && s.h >= 1 && s.w >= 1,
            "maxpool: input (N, C, H, W) = ({}, {}, {}, {}) must be positive", s.n, s.c, s.h, s.w);
  CNN_CHECK(s.kh >= 1 && s.kw >= 1, "maxpool: kernel {}x{} must be at least 1x1", s.kh, s.kw);
  CNN_CHECK(s.stride_h >= 1 && s.stride_w >= 1, "maxpool: stride {}x{} must be at least 1x1",
            s.stride_h, s.stride_w);
  CNN_CHECK(s.pad_h >= 0 && s.pad_w >= 0 && s.pad_h <= s.kh / 2 && s.pad_w <= s.kw / 2,
            "maxpool: padding {}x{} must be between 0 and half the kernel {}x{}", s.pad_h, s.pad_w,
            s.kh, s.kw);
  CNN_CHECK(s.h + 2 * s.pad_h >= s.kh && s.w + 2 * s.pad_w >= s.kw,
            "maxpool: kernel {}x{} is larger than the padded input {}x{}", s.kh, s.kw,
            s.h + 2 * s.pad_h, s.w + 2 * s.pad_w);
  CNN_CHECK(int64_t(s.h) * s.w <= INT32_MAX,
            "maxpool: input plane {}x{} too large for int32 argmax", s.h, s.w);
}

void maxpool_forward(const MaxPoolShape& s, const float* x, float* y, int32_t* argmax,
                     const Exec& ex) {
  check_maxpool_shape(s);
  CNN_CHECK(x && y && argmax, "maxpool_forward: x, y and argmax must not be null");
  if (ex.device == Device::CPU) return maxpool_forward_cpu(s, x, y, argmax);
  CNN_CUDA_BRANCH("maxpool_forward", maxpool_forward_cuda(s, x, y, argmax, ex.stream));
}

void maxpool_backward(const MaxPoolShape& s, const float* dy, const int32_t* argmax, float* dx,
                      const Exec& ex, const float* relu_y) {
  check_maxpool_shape(s);
  CNN_CHECK(dy && argmax && dx, "maxpool_backward: dy, argmax and dx must not be null");
  if (ex.device == Device::CPU) return maxpool_backward_cpu(s, dy, argmax, dx, relu_y);
  CNN_CUDA_BRANCH("maxpool_backward", maxpool_backward_cuda(s, dy, argmax, relu_y, dx, ex.stream));
}

}  // namespace cnn
