// CPU reference of the grouped, dilated 2-D convolution: plain loops over the definition,
// accumulation in double. The ground truth of the CUDA variants, so obviously correct rather than
// fast. Float and double share one template; the shape is assumed already checked.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/conv/conv2d_grouped.h"

namespace cnn {
namespace {

inline int64_t at4(int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t d1, int64_t d2,
                   int64_t d3) {
  return ((i0 * d1 + i1) * d2 + i2) * d3 + i3;
}

// Calls f(ci, c, iy, ix, ky, kx) for every input tap of output (oc, oy, ox) inside the image:
// ci is the channel within the group (the weight's second index), c the input channel.
template <class F>
inline void for_each_tap(const Conv2dGroupedShape& s, int oc, int oy, int ox, F&& f) {
  const int cg = s.cg(), g = oc / s.ocg();
  for (int ci = 0; ci < cg; ++ci)
    for (int ky = 0; ky < s.kh; ++ky)
      for (int kx = 0; kx < s.kw; ++kx) {
        const int iy = oy * s.stride_h - s.pad_h + ky * s.dil_h;
        const int ix = ox * s.stride_w - s.pad_w + kx * s.dil_w;
        if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;  // zero padding
        f(ci, g * cg + ci, iy, ix, ky, kx);
      }
}

template <class T>
void forward_ref(const Conv2dGroupedShape& s, const T* x, const T* w, const T* b, T* y, bool relu) {
  const int oh = s.oh(), ow = s.ow(), cg = s.cg();
  for (int n = 0; n < s.n; ++n)
    for (int oc = 0; oc < s.oc; ++oc)
      for (int oy = 0; oy < oh; ++oy)
        for (int ox = 0; ox < ow; ++ox) {
          double acc = b ? static_cast<double>(b[oc]) : 0.0;
          for_each_tap(s, oc, oy, ox, [&](int ci, int c, int iy, int ix, int ky, int kx) {
            acc += static_cast<double>(x[at4(n, c, iy, ix, s.c, s.h, s.w)]) *
                   static_cast<double>(w[at4(oc, ci, ky, kx, cg, s.kh, s.kw)]);
          });
          if (relu) acc = std::max(acc, 0.0);
          y[at4(n, oc, oy, ox, s.oc, oh, ow)] = static_cast<T>(acc);
        }
}

// Scatter form: walks the forward loops and sends each dy back along the tap that produced it.
template <class T>
void backward_data_ref(const Conv2dGroupedShape& s, const T* dy, const T* w, T* dx) {
  const int oh = s.oh(), ow = s.ow(), cg = s.cg();
  std::vector<double> acc(static_cast<size_t>(s.n) * s.c * s.h * s.w, 0.0);  // (N, C, H, W)
  for (int n = 0; n < s.n; ++n)
    for (int oc = 0; oc < s.oc; ++oc)
      for (int oy = 0; oy < oh; ++oy)
        for (int ox = 0; ox < ow; ++ox) {
          const double g = dy[at4(n, oc, oy, ox, s.oc, oh, ow)];
          for_each_tap(s, oc, oy, ox, [&](int ci, int c, int iy, int ix, int ky, int kx) {
            acc[at4(n, c, iy, ix, s.c, s.h, s.w)] +=
                g * static_cast<double>(w[at4(oc, ci, ky, kx, cg, s.kh, s.kw)]);
          });
        }
  for (size_t i = 0; i < acc.size(); ++i) dx[i] = static_cast<T>(acc[i]);
}

template <class T>
void backward_weight_ref(const Conv2dGroupedShape& s, const T* x, const T* dy, T* dw, T* db) {
  const int oh = s.oh(), ow = s.ow(), cg = s.cg();
  std::vector<double> acc(static_cast<size_t>(s.oc) * cg * s.kh * s.kw, 0.0);  // dw's layout
  for (int n = 0; n < s.n; ++n)
    for (int oc = 0; oc < s.oc; ++oc)
      for (int oy = 0; oy < oh; ++oy)
        for (int ox = 0; ox < ow; ++ox) {
          const double g = dy[at4(n, oc, oy, ox, s.oc, oh, ow)];
          for_each_tap(s, oc, oy, ox, [&](int ci, int c, int iy, int ix, int ky, int kx) {
            acc[at4(oc, ci, ky, kx, cg, s.kh, s.kw)] +=
                g * static_cast<double>(x[at4(n, c, iy, ix, s.c, s.h, s.w)]);
          });
        }
  for (size_t i = 0; i < acc.size(); ++i)
    dw[i] = static_cast<T>(static_cast<double>(dw[i]) + acc[i]);  // accumulate, never overwrite
  if (!db) return;
  for (int oc = 0; oc < s.oc; ++oc) {
    double sum = 0.0;
    for (int n = 0; n < s.n; ++n)
      for (int oy = 0; oy < oh; ++oy)
        for (int ox = 0; ox < ow; ++ox) sum += dy[at4(n, oc, oy, ox, s.oc, oh, ow)];
    db[oc] = static_cast<T>(static_cast<double>(db[oc]) + sum);
  }
}

}  // namespace

void conv2d_grouped_forward_cpu(const Conv2dGroupedShape& s, const float* x, const float* w,
                                const float* b, float* y, bool relu) {
  forward_ref(s, x, w, b, y, relu);
}
void conv2d_grouped_forward_cpu(const Conv2dGroupedShape& s, const double* x, const double* w,
                                const double* b, double* y, bool relu) {
  forward_ref(s, x, w, b, y, relu);
}
void conv2d_grouped_backward_data_cpu(const Conv2dGroupedShape& s, const float* dy, const float* w,
                                      float* dx) {
  backward_data_ref(s, dy, w, dx);
}
void conv2d_grouped_backward_data_cpu(const Conv2dGroupedShape& s, const double* dy,
                                      const double* w, double* dx) {
  backward_data_ref(s, dy, w, dx);
}
void conv2d_grouped_backward_weight_cpu(const Conv2dGroupedShape& s, const float* x,
                                        const float* dy, float* dw, float* db) {
  backward_weight_ref(s, x, dy, dw, db);
}
void conv2d_grouped_backward_weight_cpu(const Conv2dGroupedShape& s, const double* x,
                                        const double* dy, double* dw, double* db) {
  backward_weight_ref(s, x, dy, dw, db);
}

}  // namespace cnn
