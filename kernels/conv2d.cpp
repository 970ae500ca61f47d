// conv2d API: checks the shape once, then dispatches to the CPU reference or a CUDA launcher.
// The CPU path ignores `algo` for now (there is only the reference there).
#include "kernels/conv2d.h"

#include <cstdint>
#include <limits>

#include "kernels/conv2d_cuda.h"
#include "kernels/error.h"

namespace cnn {

void check_conv2d_shape(const Conv2dShape& s) {
  const struct {
    const char* name;
    int value;
  } positive[] = {{"n", s.n},
                  {"c", s.c},
                  {"h", s.h},
                  {"w", s.w},
                  {"oc", s.oc},
                  {"kh", s.kh},
                  {"kw", s.kw},
                  {"stride_h", s.stride_h},
                  {"stride_w", s.stride_w}};
  for (const auto& f : positive)
    CNN_CHECK(f.value > 0, "conv2d: {} = {} must be positive", f.name, f.value);
  CNN_CHECK(s.pad_h >= 0, "conv2d: pad_h = {} must be >= 0", s.pad_h);
  CNN_CHECK(s.pad_w >= 0, "conv2d: pad_w = {} must be >= 0", s.pad_w);
  // In int64 so that a huge pad cannot overflow the check itself.
  const int64_t padded_h = static_cast<int64_t>(s.h) + 2 * static_cast<int64_t>(s.pad_h);
  const int64_t padded_w = static_cast<int64_t>(s.w) + 2 * static_cast<int64_t>(s.pad_w);
  CNN_CHECK(padded_h >= s.kh, "conv2d: kh = {} exceeds the padded input height h + 2*pad_h = {}",
            s.kh, padded_h);
  CNN_CHECK(padded_w >= s.kw, "conv2d: kw = {} exceeds the padded input width w + 2*pad_w = {}",
            s.kw, padded_w);
  // oh()/ow() are computed in int; keep the padded extent within it.
  CNN_CHECK(padded_h <= std::numeric_limits<int>::max(), "conv2d: h + 2*pad_h = {} is too large",
            padded_h);
  CNN_CHECK(padded_w <= std::numeric_limits<int>::max(), "conv2d: w + 2*pad_w = {} is too large",
            padded_w);
}

#ifndef CNN_HAVE_CUDA
namespace {

[[noreturn]] void fail_without_cuda(const char* op) {
  CNN_FAIL("{}: device cuda requested, but this program was built without CUDA", op);
}

}  // namespace
#endif

void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y,
                    bool relu, Algo algo, const Exec& ex) {
  check_conv2d_shape(s);
  CNN_CHECK(x && w && y, "conv2d_forward: x, w and y must not be null");
  if (ex.device == Device::CPU) {
    conv2d_forward_cpu(s, x, w, b, y, relu);
    return;
  }
#ifdef CNN_HAVE_CUDA
  conv2d_forward_cuda(s, x, w, b, y, relu, algo, ex.stream);
#else
  (void)algo;
  fail_without_cuda("conv2d_forward");
#endif
}

void conv2d_backward_data(const Conv2dShape& s, const float* dy, const float* w, float* dx,
                          Algo algo, const Exec& ex) {
  check_conv2d_shape(s);
  CNN_CHECK(dy && w && dx, "conv2d_backward_data: dy, w and dx must not be null");
  if (ex.device == Device::CPU) {
    conv2d_backward_data_cpu(s, dy, w, dx);
    return;
  }
#ifdef CNN_HAVE_CUDA
  conv2d_backward_data_cuda(s, dy, w, dx, algo, ex.stream);
#else
  (void)algo;
  fail_without_cuda("conv2d_backward_data");
#endif
}

std::size_t conv2d_backward_weight_scratch_floats(const Conv2dShape& s, const Exec& ex) {
  check_conv2d_shape(s);
  if (ex.device == Device::CPU) return 0;
  return conv2d_backward_weight_scratch_floats_cuda(s, ex.deterministic);
}

void conv2d_backward_weight(const Conv2dShape& s, const float* x, const float* dy, float* dw,
                            float* db, float* scratch, Algo algo, const Exec& ex) {
  check_conv2d_shape(s);
  CNN_CHECK(x && dy && dw, "conv2d_backward_weight: x, dy and dw must not be null");
  if (ex.device == Device::CPU) {
    conv2d_backward_weight_cpu(s, x, dy, dw, db);
    return;
  }
#ifdef CNN_HAVE_CUDA
  CNN_CHECK(scratch || conv2d_backward_weight_scratch_floats_cuda(s, ex.deterministic) == 0,
            "conv2d_backward_weight: deterministic mode needs a scratch buffer of {} floats "
            "(conv2d_backward_weight_scratch_floats), got null",
            conv2d_backward_weight_scratch_floats_cuda(s, ex.deterministic));
  conv2d_backward_weight_cuda(s, x, dy, dw, db, scratch, algo, ex.deterministic, ex.stream);
#else
  (void)scratch;
  (void)algo;
  fail_without_cuda("conv2d_backward_weight");
#endif
}

}  // namespace cnn
