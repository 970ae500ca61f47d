// CPU reference of the 2-D convolution: plain loops over the definition, accumulation in double.
// This is the ground truth the CUDA variants are tested against, so it stays obviously correct
// rather than fast. Float and double share one template; the shape is assumed already checked.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/conv/conv2d.h"

namespace cnn {
namespace {

// Flat offset of element (i0, i1, i2, i3) in a dense 4-D array of dims (d0, d1, d2, d3).
inline int64_t at4(int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t d1, int64_t d2,
                   int64_t d3) {
  return ((i0 * d1 + i1) * d2 + i2) * d3 + i3;
}

template <class T>
void forward_ref(const Conv2dShape& s, const T* x, const T* w, const T* b, T* y, bool relu) {
  const int oh = s.oh(), ow = s.ow();
  for (int n = 0; n < s.n; ++n)
    for (int oc = 0; oc < s.oc; ++oc)
      for (int oy = 0; oy < oh; ++oy)
        for (int ox = 0; ox < ow; ++ox) {
          double acc = b ? static_cast<double>(b[oc]) : 0.0;
          const int c0 = oc / s.ocg() * s.cg();  // the group's first input channel
          for (int c = 0; c < s.cg(); ++c)
            for (int ky = 0; ky < s.kh; ++ky)
              for (int kx = 0; kx < s.kw; ++kx) {
                const int iy = oy * s.stride_h - s.pad_h + ky * s.dil_h;
                const int ix = ox * s.stride_w - s.pad_w + kx * s.dil_w;
                if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;  // zero padding
                acc += static_cast<double>(x[at4(n, c0 + c, iy, ix, s.c, s.h, s.w)]) *
                       static_cast<double>(w[at4(oc, c, ky, kx, s.cg(), s.kh, s.kw)]);
              }
          if (relu) acc = std::max(acc, 0.0);
          y[at4(n, oc, oy, ox, s.oc, oh, ow)] = static_cast<T>(acc);
        }
}

// Scatter form: walks exactly the forward loops and sends each dy back along the tap that
// produced it, into a double buffer, so that it mirrors forward_ref line for line.
template <class T>
void backward_data_ref(const Conv2dShape& s, const T* dy, const T* w, T* dx) {
  const int oh = s.oh(), ow = s.ow();
  std::vector<double> acc(static_cast<size_t>(s.n) * s.c * s.h * s.w, 0.0);  // (N, C, H, W)
  for (int n = 0; n < s.n; ++n)
    for (int oc = 0; oc < s.oc; ++oc)
      for (int oy = 0; oy < oh; ++oy)
        for (int ox = 0; ox < ow; ++ox) {
          const double g = dy[at4(n, oc, oy, ox, s.oc, oh, ow)];
          const int c0 = oc / s.ocg() * s.cg();
          for (int c = 0; c < s.cg(); ++c)
            for (int ky = 0; ky < s.kh; ++ky)
              for (int kx = 0; kx < s.kw; ++kx) {
                const int iy = oy * s.stride_h - s.pad_h + ky * s.dil_h;
                const int ix = ox * s.stride_w - s.pad_w + kx * s.dil_w;
                if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                acc[at4(n, c0 + c, iy, ix, s.c, s.h, s.w)] +=
                    g * static_cast<double>(w[at4(oc, c, ky, kx, s.cg(), s.kh, s.kw)]);
              }
        }
  for (size_t i = 0; i < acc.size(); ++i) dx[i] = static_cast<T>(acc[i]);
}

template <class T>
void backward_weight_ref(const Conv2dShape& s, const T* x, const T* dy, T* dw, T* db) {
  const int oh = s.oh(), ow = s.ow();
  for (int oc = 0; oc < s.oc; ++oc)
    for (int c = 0; c < s.cg(); ++c)
      for (int ky = 0; ky < s.kh; ++ky)
        for (int kx = 0; kx < s.kw; ++kx) {
          const int cx = oc / s.ocg() * s.cg() + c;  // the input channel of weight column c
          double acc = 0.0;
          for (int n = 0; n < s.n; ++n)
            for (int oy = 0; oy < oh; ++oy)
              for (int ox = 0; ox < ow; ++ox) {
                const int iy = oy * s.stride_h - s.pad_h + ky * s.dil_h;
                const int ix = ox * s.stride_w - s.pad_w + kx * s.dil_w;
                if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                acc += static_cast<double>(x[at4(n, cx, iy, ix, s.c, s.h, s.w)]) *
                       static_cast<double>(dy[at4(n, oc, oy, ox, s.oc, oh, ow)]);
              }
          T& dst = dw[at4(oc, c, ky, kx, s.cg(), s.kh, s.kw)];
          dst = static_cast<T>(static_cast<double>(dst) + acc);  // accumulate, never overwrite
        }
  if (!db) return;
  for (int oc = 0; oc < s.oc; ++oc) {
    double acc = 0.0;
    for (int n = 0; n < s.n; ++n)
      for (int oy = 0; oy < oh; ++oy)
        for (int ox = 0; ox < ow; ++ox) acc += dy[at4(n, oc, oy, ox, s.oc, oh, ow)];
    db[oc] = static_cast<T>(static_cast<double>(db[oc]) + acc);
  }
}

}  // namespace

void conv2d_forward_cpu(const Conv2dShape& s, const float* x, const float* w, const float* b,
                        float* y, bool relu) {
  forward_ref(s, x, w, b, y, relu);
}
void conv2d_forward_cpu(const Conv2dShape& s, const double* x, const double* w, const double* b,
                        double* y, bool relu) {
  forward_ref(s, x, w, b, y, relu);
}

void conv2d_backward_data_cpu(const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  backward_data_ref(s, dy, w, dx);
}
void conv2d_backward_data_cpu(const Conv2dShape& s, const double* dy, const double* w, double* dx) {
  backward_data_ref(s, dy, w, dx);
}

void conv2d_backward_weight_cpu(const Conv2dShape& s, const float* x, const float* dy, float* dw,
                                float* db) {
  backward_weight_ref(s, x, dy, dw, db);
}
void conv2d_backward_weight_cpu(const Conv2dShape& s, const double* x, const double* dy, double* dw,
                                double* db) {
  backward_weight_ref(s, x, dy, dw, db);
}

// ---- Double forward through im2col (the gradient checker's many forward passes) ----

namespace {

// Output channels and pixels per register block of the product: 4 x 8 double accumulators.
constexpr int kBlockOc = 4, kBlockP = 8;

// col (K, P) of image x_n (C, H, W), zero where a tap falls in the padding.
void im2col_double(const Conv2dShape& s, const double* x, double* col) {
  const int oh = s.oh(), ow = s.ow();
  const int64_t p = int64_t(oh) * ow;
  for (int c = 0; c < s.c; ++c)
    for (int ky = 0; ky < s.kh; ++ky)
      for (int kx = 0; kx < s.kw; ++kx) {
        double* row = col + ((int64_t(c) * s.kh + ky) * s.kw + kx) * p;
        for (int oy = 0; oy < oh; ++oy) {
          const int iy = oy * s.stride_h - s.pad_h + ky;
          for (int ox = 0; ox < ow; ++ox) {
            const int ix = ox * s.stride_w - s.pad_w + kx;
            const bool inside = iy >= 0 && iy < s.h && ix >= 0 && ix < s.w;
            row[oy * ow + ox] = inside ? x[(int64_t(c) * s.h + iy) * s.w + ix] : 0.0;
          }
        }
      }
}

// y (OC, P) = b + w (OC, K) * col (K, P) for output channels [o0, o0 + no) and pixels
// [p0, p0 + np), no <= kBlockOc, np <= kBlockP: the accumulators stay in registers over all of K.
void product_block(const double* w, const double* col, const double* b, double* y, int64_t k,
                   int64_t p, int64_t o0, int no, int64_t p0, int np) {
  double acc[kBlockOc][kBlockP] = {};
  if (no == kBlockOc && np == kBlockP) {
    for (int64_t i = 0; i < k; ++i) {
      const double* c = col + i * p + p0;
      for (int o = 0; o < kBlockOc; ++o) {
        const double wv = w[(o0 + o) * k + i];
        for (int j = 0; j < kBlockP; ++j) acc[o][j] += wv * c[j];
      }
    }
  } else {
    for (int64_t i = 0; i < k; ++i)
      for (int o = 0; o < no; ++o)
        for (int j = 0; j < np; ++j) acc[o][j] += w[(o0 + o) * k + i] * col[i * p + p0 + j];
  }
  for (int o = 0; o < no; ++o)
    for (int j = 0; j < np; ++j) y[(o0 + o) * p + p0 + j] = (b ? b[o0 + o] : 0.0) + acc[o][j];
}

}  // namespace

void conv2d_forward_im2col_cpu(const Conv2dShape& s, const double* x, const double* w,
                               const double* b, double* y) {
  const int64_t k = int64_t(s.c) * s.kh * s.kw, p = int64_t(s.oh()) * s.ow();
  // One column matrix per thread, kept between calls: a fresh one would cost a page-faulting
  // allocation per layer per pass (MiBs for a VGG layer); im2col writes every element.
  thread_local std::vector<double> col;  // (K, P)
  if (col.size() < static_cast<size_t>(k * p)) col.resize(static_cast<size_t>(k * p));
  for (int n = 0; n < s.n; ++n) {
    im2col_double(s, x + int64_t(n) * s.c * s.h * s.w, col.data());
    double* yn = y + int64_t(n) * s.oc * p;  // (OC, P)
    for (int64_t o0 = 0; o0 < s.oc; o0 += kBlockOc)
      for (int64_t p0 = 0; p0 < p; p0 += kBlockP)
        product_block(w, col.data(), b, yn, k, p, o0, int(std::min<int64_t>(kBlockOc, s.oc - o0)),
                      p0, int(std::min<int64_t>(kBlockP, p - p0)));
  }
}

}  // namespace cnn
