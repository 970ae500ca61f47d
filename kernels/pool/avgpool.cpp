// Average-pool dispatch: checks the shape once, then runs the CPU reference or the CUDA launcher.
#include "kernels/pool/avgpool.h"

#include "kernels/pool/avgpool_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {

void check_avgpool_shape(const AvgPoolShape& s) {
  CNN_CHECK(s.n >= 1 && s.c >= 1 && s.h >= 1 && s.w >= 1,
            "avgpool: input (N, C, H, W) = ({}, {}, {}, {}) must be positive", s.n, s.c, s.h, s.w);
  CNN_CHECK(s.kh >= 1 && s.kw >= 1, "avgpool: kernel {}x{} must be at least 1x1", s.kh, s.kw);
  CNN_CHECK(s.stride_h >= 1 && s.stride_w >= 1, "avgpool: stride {}x{} must be at least 1x1",
            s.stride_h, s.stride_w);
  CNN_CHECK(s.pad_h >= 0 && s.pad_w >= 0 && s.pad_h <= s.kh / 2 && s.pad_w <= s.kw / 2,
            "avgpool: padding {}x{} must be between 0 and half the kernel {}x{}", s.pad_h, s.pad_w,
            s.kh, s.kw);
  CNN_CHECK(s.h + 2 * s.pad_h >= s.kh && s.w + 2 * s.pad_w >= s.kw,
            "avgpool: kernel {}x{} is larger than the padded input {}x{}", s.kh, s.kw,
            s.h + 2 * s.pad_h, s.w + 2 * s.pad_w);
}

void avgpool_forward(const AvgPoolShape& s, const float* x, float* y, const Exec& ex) {
  check_avgpool_shape(s);
  CNN_CHECK(x && y, "avgpool_forward: x and y must not be null");
  if (ex.device == Device::CPU) return avgpool_forward_cpu(s, x, y);
  CNN_CUDA_BRANCH("avgpool_forward", avgpool_forward_cuda(s, x, y, ex.stream));
}

void avgpool_backward(const AvgPoolShape& s, const float* dy, float* dx, const Exec& ex) {
  check_avgpool_shape(s);
  CNN_CHECK(dy && dx, "avgpool_backward: dy and dx must not be null");
  if (ex.device == Device::CPU) return avgpool_backward_cpu(s, dy, dx);
  CNN_CUDA_BRANCH("avgpool_backward", avgpool_backward_cuda(s, dy, dx, ex.stream));
}

namespace {
void check_global(int64_t planes, int64_t plane, const void* a, const void* b) {
  CNN_CHECK(planes >= 1 && plane >= 1, "global_avgpool: {} planes of {} values must be positive",
            planes, plane);
  CNN_CHECK(a && b, "global_avgpool: null pointer");
}
}  // namespace

void global_avgpool_forward(int64_t planes, int64_t plane, const float* x, float* y,
                            const Exec& ex) {
  check_global(planes, plane, x, y);
  if (ex.device == Device::CPU) return global_avgpool_forward_cpu(planes, plane, x, y);
  CNN_CUDA_BRANCH("global_avgpool_forward",
                  global_avgpool_forward_cuda(planes, plane, x, y, ex.stream));
}

void global_avgpool_backward(int64_t planes, int64_t plane, const float* dy, float* dx,
                             const Exec& ex) {
  check_global(planes, plane, dy, dx);
  if (ex.device == Device::CPU) return global_avgpool_backward_cpu(planes, plane, dy, dx);
  CNN_CUDA_BRANCH("global_avgpool_backward",
                  global_avgpool_backward_cuda(planes, plane, dy, dx, ex.stream));
}

}  // namespace cnn
