// The CPU twins of the input gradient's explicit copies and col2im gather
// (conv2d_dgrad_col2im.h, steps 1 and 3).
#include <cstdint>

#include "kernels/conv/conv2d_dgrad_col2im.h"

namespace cnn {

int64_t conv2d_dgrad_col2im_ld_oc(const Conv2dShape& s) {
  return (int64_t{s.oc} + 3) / 4 * 4;
}

int64_t conv2d_dgrad_col2im_ld_pix(const Conv2dShape& s) {
  return (int64_t{s.n} * s.oh() * s.ow() + 3) / 4 * 4;
}

void conv2d_dgrad_col2im_copies_cpu(const Conv2dShape& s, const float* dy, const float* w,
                                    float* dyt, float* wt) {
  const int64_t ld = conv2d_dgrad_col2im_ld_oc(s), ohw = int64_t{s.oh()} * s.ow();
  const int64_t ckk = int64_t{s.c} * s.kh * s.kw;
  for (int n = 0; n < s.n; ++n)
    for (int oc = 0; oc < s.oc; ++oc)
      for (int64_t p = 0; p < ohw; ++p)
        dyt[(n * ohw + p) * ld + oc] = dy[(int64_t{n} * s.oc + oc) * ohw + p];
  for (int oc = 0; oc < s.oc; ++oc)
    for (int64_t r = 0; r < ckk; ++r) wt[r * ld + oc] = w[oc * ckk + r];
}

void conv2d_dgrad_col2im_gather_cpu(const Conv2dShape& s, const float* cols, float* dx) {
  const int64_t ld = conv2d_dgrad_col2im_ld_pix(s);
  const int oh = s.oh(), ow = s.ow();
  for (int n = 0; n < s.n; ++n)
    for (int c = 0; c < s.c; ++c)
      for (int iy = 0; iy < s.h; ++iy)
        for (int ix = 0; ix < s.w; ++ix) {
          float sum = 0.f;
          for (int kh = 0; kh < s.kh; ++kh) {
            const int ty = iy + s.pad_h - kh;
            if (ty < 0 || ty % s.stride_h || ty / s.stride_h >= oh) continue;
            for (int kw = 0; kw < s.kw; ++kw) {
              const int tx = ix + s.pad_w - kw;
              if (tx < 0 || tx % s.stride_w || tx / s.stride_w >= ow) continue;
              const int64_t row = (int64_t{c} * s.kh + kh) * s.kw + kw;
              sum += cols[row * ld + (int64_t{n} * oh + ty / s.stride_h) * ow + tx / s.stride_w];
            }
          }
          dx[((int64_t{n} * s.c + c) * s.h + iy) * s.w + ix] = sum;
        }
}

}  // namespace cnn
