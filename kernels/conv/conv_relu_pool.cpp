// conv_relu_pool API: checks the shape once, then runs the CPU twin or the CUDA launcher.
#include "kernels/conv/conv_relu_pool.h"

#include <cstdint>

#include "kernels/conv/conv_relu_pool_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {

bool conv_relu_pool_applicable(const Conv2dShape& s) {
  const int64_t pad_h = s.pad_h, pad_w = s.pad_w;
  if (s.n < 1 || s.c != 1 || s.h < 1 || s.w < 1 || s.oc < 1) return false;
  if (s.stride_h != 1 || s.stride_w != 1 || s.kh != s.kw) return false;
  if (s.kh != 1 && s.kh != 3 && s.kh != 5 && s.kh != 7) return false;
  if (pad_h < 0 || pad_w < 0 || s.h + 2 * pad_h < s.kh || s.w + 2 * pad_w < s.kw) return false;
  if (s.h + 2 * pad_h > (1 << 20) || s.w + 2 * pad_w > (1 << 20)) return false;
  const int64_t oh = s.oh(), ow = s.ow();
  if (oh % 2 != 0 || ow % 2 != 0) return false;
  return int64_t{s.n} * s.oc * oh * ow < (int64_t{1} << 31) &&
         int64_t{s.n} * s.h * s.w < (int64_t{1} << 31);
}

MaxPoolShape conv_relu_pool_pool_shape(const Conv2dShape& s) {
  MaxPoolShape p;
  p.n = s.n;
  p.c = s.oc;
  p.h = s.oh();
  p.w = s.ow();
  p.kh = p.kw = 2;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 0;
  return p;
}

namespace {

void check(const Conv2dShape& s, const char* op) {
  check_conv2d_shape(s);
  CNN_CHECK(conv_relu_pool_applicable(s),
            "{}: needs one input channel, stride 1, a square 1/3/5/7 kernel and an even conv "
            "output, got c={} kernel {}x{} stride {}x{} output {}x{}",
            op, s.c, s.kh, s.kw, s.stride_h, s.stride_w, s.oh(), s.ow());
}

}  // namespace

void conv_relu_pool_forward(const Conv2dShape& s, const float* x, const float* w, const float* b,
                            float* y, int32_t* argmax, const Exec& ex) {
  check(s, "conv_relu_pool_forward");
  CNN_CHECK(x && w && y && argmax, "conv_relu_pool_forward: x, w, y and argmax must not be null");
  if (ex.device == Device::CPU) return conv_relu_pool_forward_cpu(s, x, w, b, y, argmax);
  CNN_CUDA_BRANCH("conv_relu_pool_forward", conv_relu_pool_forward_cuda(s, x, w, b, y, argmax, ex));
}

std::size_t conv_relu_pool_backward_weight_scratch_floats(const Conv2dShape& s, const Exec& ex) {
  if (ex.device == Device::CPU || !conv_relu_pool_applicable(s)) return 0;
  return CNN_CUDA_VALUE(conv_relu_pool_backward_weight_scratch_floats_cuda(s, ex), std::size_t(0));
}

void conv_relu_pool_backward_weight(const Conv2dShape& s, const float* x, const float* y,
                                    const float* dy, const int32_t* argmax, float* dw, float* db,
                                    float* scratch, const Exec& ex) {
  check(s, "conv_relu_pool_backward_weight");
  CNN_CHECK(x && y && dy && argmax && dw,
            "conv_relu_pool_backward_weight: x, y, dy, argmax and dw must not be null");
  if (ex.device == Device::CPU)
    return conv_relu_pool_backward_weight_cpu(s, x, y, dy, argmax, dw, db);
  CNN_CUDA_BRANCH("conv_relu_pool_backward_weight", {
    CNN_CHECK(scratch || conv_relu_pool_backward_weight_scratch_floats(s, ex) == 0,
              "conv_relu_pool_backward_weight: deterministic mode needs {} floats of scratch, got "
              "null",
              conv_relu_pool_backward_weight_scratch_floats(s, ex));
    conv_relu_pool_backward_weight_cuda(s, x, y, dy, argmax, dw, db, scratch, ex);
  });
}

}  // namespace cnn
