#include "kernels/conv/conv_window_check.h"

#include <cstdint>
#include <limits>

#include "runtime/error.h"

namespace cnn {

void check_conv_window(const ConvWindow& s) {
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
                  {"stride_w", s.stride_w},
                  {"dil_h", s.dil_h},
                  {"dil_w", s.dil_w}};
  for (const auto& f : positive)
    CNN_CHECK(f.value > 0, "conv2d: {} = {} must be positive", f.name, f.value);
  CNN_CHECK(s.pad_h >= 0, "conv2d: pad_h = {} must be >= 0", s.pad_h);
  CNN_CHECK(s.pad_w >= 0, "conv2d: pad_w = {} must be >= 0", s.pad_w);
  // In int64 so that a huge pad or dilation cannot overflow the check itself.
  const int64_t padded_h = int64_t(s.h) + 2 * int64_t(s.pad_h);
  const int64_t padded_w = int64_t(s.w) + 2 * int64_t(s.pad_w);
  const int64_t span_h = int64_t(s.dil_h) * (s.kh - 1) + 1;
  const int64_t span_w = int64_t(s.dil_w) * (s.kw - 1) + 1;
  CNN_CHECK(
      padded_h >= span_h,
      "conv2d: kh = {} (dil_h = {}: {} rows) exceeds the padded input height h + 2*pad_h = {}",
      s.kh, s.dil_h, span_h, padded_h);
  CNN_CHECK(padded_w >= span_w,
            "conv2d: kw = {} (dil_w = {}: {} columns) exceeds the padded input width w + 2*pad_w "
            "= {}",
            s.kw, s.dil_w, span_w, padded_w);
  CNN_CHECK(padded_h <= std::numeric_limits<int>::max(), "conv2d: h + 2*pad_h = {} is too large",
            padded_h);
  CNN_CHECK(padded_w <= std::numeric_limits<int>::max(), "conv2d: w + 2*pad_w = {} is too large",
            padded_w);
}

}  // namespace cnn
