// The CPU twin of the weight gradient's explicit copies (conv2d_wgrad_im2col.h, step 1).
#include <cstdint>

#include "kernels/conv/conv2d_wgrad_im2col.h"

namespace cnn {

int64_t conv2d_wgrad_im2col_ld(const Conv2dShape& s) {
  const int64_t k = int64_t{s.n} * s.oh() * s.ow();
  return (k + 3) / 4 * 4;
}

void conv2d_wgrad_im2col_copies_cpu(const Conv2dShape& s, const float* x, const float* dy,
                                    float* cols, float* dyk) {
  const int64_t ld = conv2d_wgrad_im2col_ld(s), ohw = int64_t{s.oh()} * s.ow();
  for (int c = 0; c < s.c; ++c)
    for (int kh = 0; kh < s.kh; ++kh)
      for (int kw = 0; kw < s.kw; ++kw) {
        float* row = cols + ((int64_t{c} * s.kh + kh) * s.kw + kw) * ld;
        for (int n = 0; n < s.n; ++n)
          for (int oh = 0; oh < s.oh(); ++oh)
            for (int ow = 0; ow < s.ow(); ++ow) {
              const int ih = oh * s.stride_h - s.pad_h + kh, iw = ow * s.stride_w - s.pad_w + kw;
              const bool in = ih >= 0 && ih < s.h && iw >= 0 && iw < s.w;
              row[n * ohw + oh * s.ow() + ow] =
                  in ? x[((int64_t{n} * s.c + c) * s.h + ih) * s.w + iw] : 0.f;
            }
      }
  for (int oc = 0; oc < s.oc; ++oc)
    for (int n = 0; n < s.n; ++n)
      for (int64_t p = 0; p < ohw; ++p)
        dyk[oc * ld + n * ohw + p] = dy[(int64_t{n} * s.oc + oc) * ohw + p];
}

}  // namespace cnn
