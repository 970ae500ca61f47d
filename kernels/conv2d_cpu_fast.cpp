// Fast CPU convolution through im2col + gemm_cpu. Per image n, with K = C*KH*KW, P = OH*OW:
//   forward          y_n (OC, P)  = w (OC, K) * col_n (K, P)           (+ bias, ReLU)
//   backward data    col (K, P)   = w^T (K, OC) * dy_n (OC, P), then col2im into dx_n
//   backward weight  dw (OC, K)  += dy_n (OC, P) * col_n^T (P, K)
// A 1x1 stride-1 unpadded convolution skips im2col: col_n is x_n itself.
#include "kernels/conv2d_cpu_fast.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/gemm_cpu.h"
#include "kernels/thread_pool.h"

namespace cnn {
namespace {

// Images per weight-gradient partial sum are n / kWeightGroups (rounded): a fixed number of
// groups, so the summation order does not depend on the thread count. 16 keeps up to 16 threads
// busy while the partials (16 * OC * K floats) stay a few MiB for the usual layers.
constexpr int64_t kWeightGroups = 16;

struct Dims {
  int64_t k, p;  // GEMM inner size C*KH*KW, output pixels OH*OW
  bool direct;   // 1x1, stride 1, no padding: the column matrix is the image itself
};

Dims dims_of(const Conv2dShape& s) {
  const bool direct =
      s.kh == 1 && s.kw == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 0 && s.pad_w == 0;
  return {int64_t(s.c) * s.kh * s.kw, int64_t(s.oh()) * s.ow(), direct};
}

// Output columns ox whose input column ox*stride - pad + kx lies in [0, w): [lo, hi).
void valid_range(int out, int stride, int pad, int k, int in, int& lo, int& hi) {
  // ix >= 0  <=>  ox >= ceil((pad - k) / stride);  ix < in  <=>  ox <= (in - 1 + pad - k) / stride.
  const int first = pad - k;
  lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  const int last = in - 1 + pad - k;
  hi = last < 0 ? 0 : std::min(out, last / stride + 1);
  lo = std::min(lo, hi);
}

// col (K, P) from one image x (C, H, W); padding reads as zero.
void im2col(const Conv2dShape& s, const float* x, float* col) {
  const int oh = s.oh(), ow = s.ow();
  const int64_t p = int64_t(oh) * ow;
  for (int c = 0; c < s.c; ++c)
    for (int ky = 0; ky < s.kh; ++ky)
      for (int kx = 0; kx < s.kw; ++kx) {
        float* row = col + ((int64_t(c) * s.kh + ky) * s.kw + kx) * p;
        int lo, hi;
        valid_range(ow, s.stride_w, s.pad_w, kx, s.w, lo, hi);
        for (int oy = 0; oy < oh; ++oy) {
          float* dst = row + int64_t(oy) * ow;
          const int iy = oy * s.stride_h - s.pad_h + ky;
          if (iy < 0 || iy >= s.h) {
            std::fill(dst, dst + ow, 0.f);
            continue;
          }
          // Input column of output column ox: base + ox * stride (in range for ox in [lo, hi)).
          const int64_t base = (int64_t(c) * s.h + iy) * s.w - s.pad_w + kx;
          std::fill(dst, dst + lo, 0.f);
          if (s.stride_w == 1)
            std::memcpy(dst + lo, x + (base + lo), sizeof(float) * (hi - lo));
          else
            for (int ox = lo; ox < hi; ++ox) dst[ox] = x[base + int64_t(ox) * s.stride_w];
          std::fill(dst + hi, dst + ow, 0.f);
        }
      }
}

// dx (C, H, W) = sum of col (K, P) scattered back along the taps; overwrites dx. The fixed loop
// order makes the float sums repeatable.
void col2im(const Conv2dShape& s, const float* col, float* dx) {
  const int oh = s.oh(), ow = s.ow();
  const int64_t p = int64_t(oh) * ow;
  std::fill(dx, dx + int64_t(s.c) * s.h * s.w, 0.f);
  for (int c = 0; c < s.c; ++c)
    for (int ky = 0; ky < s.kh; ++ky)
      for (int kx = 0; kx < s.kw; ++kx) {
        const float* row = col + ((int64_t(c) * s.kh + ky) * s.kw + kx) * p;
        int lo, hi;
        valid_range(ow, s.stride_w, s.pad_w, kx, s.w, lo, hi);
        for (int oy = 0; oy < oh; ++oy) {
          const int iy = oy * s.stride_h - s.pad_h + ky;
          if (iy < 0 || iy >= s.h) continue;
          const float* src = row + int64_t(oy) * ow;
          const int64_t base = (int64_t(c) * s.h + iy) * s.w - s.pad_w + kx;
          for (int ox = lo; ox < hi; ++ox) dx[base + int64_t(ox) * s.stride_w] += src[ox];
        }
      }
}

// Per-thread column matrix, grown on demand. Scratch only: every use writes it before reading.
float* col_buffer(int64_t floats) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(static_cast<size_t>(floats));
  return buf.data();
}

GemmOptions serial() {
  GemmOptions o;
  o.parallel = false;  // the images are already spread over the pool
  return o;
}

}  // namespace

void conv2d_forward_cpu_fast(const Conv2dShape& s, const float* x, const float* w, const float* b,
                             float* y, bool relu) {
  const Dims d = dims_of(s);
  const int64_t x_img = int64_t(s.c) * s.h * s.w;  // floats per input image
  const int64_t y_img = int64_t(s.oc) * d.p;       // floats per output image
  parallel_tasks(s.n, [&](int64_t n) {
    const float* xn = x + n * x_img;  // (C, H, W)
    float* yn = y + n * y_img;        // (OC, P)
    const float* col = xn;            // (K, P)
    if (!d.direct) {
      float* buf = col_buffer(d.k * d.p);
      im2col(s, xn, buf);
      col = buf;
    }
    gemm_cpu(false, false, s.oc, d.p, d.k, 1.f, w, d.k, col, d.p, 0.f, yn, d.p, serial());
    if (b == nullptr && !relu) return;
    for (int oc = 0; oc < s.oc; ++oc) {
      float* row = yn + oc * d.p;
      const float bias = b ? b[oc] : 0.f;
      for (int64_t i = 0; i < d.p; ++i) {
        const float v = row[i] + bias;
        row[i] = relu && v <= 0.f ? 0.f : v;  // NaN passes, as in the reference
      }
    }
  });
}

void conv2d_backward_data_cpu_fast(const Conv2dShape& s, const float* dy, const float* w,
                                   float* dx) {
  const Dims d = dims_of(s);
  const int64_t x_img = int64_t(s.c) * s.h * s.w;
  const int64_t y_img = int64_t(s.oc) * d.p;
  parallel_tasks(s.n, [&](int64_t n) {
    const float* dyn = dy + n * y_img;  // (OC, P)
    float* dxn = dx + n * x_img;        // (C, H, W)
    if (d.direct) {                     // dx_n (C, P) is the column matrix itself
      gemm_cpu(true, false, d.k, d.p, s.oc, 1.f, w, d.k, dyn, d.p, 0.f, dxn, d.p, serial());
      return;
    }
    float* col = col_buffer(d.k * d.p);  // (K, P)
    gemm_cpu(true, false, d.k, d.p, s.oc, 1.f, w, d.k, dyn, d.p, 0.f, col, d.p, serial());
    col2im(s, col, dxn);
  });
}

void conv2d_backward_weight_cpu_fast(const Conv2dShape& s, const float* x, const float* dy,
                                     float* dw, float* db) {
  const Dims d = dims_of(s);
  const int64_t x_img = int64_t(s.c) * s.h * s.w;
  const int64_t y_img = int64_t(s.oc) * d.p;
  const int64_t wsize = int64_t(s.oc) * d.k;
  const int64_t groups = std::min<int64_t>(s.n, kWeightGroups);
  std::vector<float> dw_part(static_cast<size_t>(groups * wsize));  // (groups, OC, K)
  std::vector<double> db_part(static_cast<size_t>(groups * s.oc));  // (groups, OC)
  parallel_tasks(groups, [&](int64_t g) {
    float* dwg = dw_part.data() + g * wsize;
    double* dbg = db_part.data() + g * s.oc;
    std::fill(dbg, dbg + s.oc, 0.0);
    const int64_t n_lo = s.n * g / groups, n_hi = s.n * (g + 1) / groups;
    for (int64_t n = n_lo; n < n_hi; ++n) {
      const float* xn = x + n * x_img;
      const float* dyn = dy + n * y_img;  // (OC, P)
      const float* col = xn;              // (K, P)
      if (!d.direct) {
        float* buf = col_buffer(d.k * d.p);
        im2col(s, xn, buf);
        col = buf;
      }
      const float beta = n == n_lo ? 0.f : 1.f;  // the group's first image initializes dwg
      gemm_cpu(false, true, s.oc, d.k, d.p, 1.f, dyn, d.p, col, d.p, beta, dwg, d.k, serial());
      for (int oc = 0; oc < s.oc; ++oc) {
        const float* row = dyn + oc * d.p;
        double acc = 0.0;
        for (int64_t i = 0; i < d.p; ++i) acc += row[i];
        dbg[oc] += acc;
      }
    }
  });
  // Partials added in group order; elements are independent, so any split of them is fine.
  parallel_for(0, wsize, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float acc = dw_part[static_cast<size_t>(i)];
      for (int64_t g = 1; g < groups; ++g) acc += dw_part[static_cast<size_t>(g * wsize + i)];
      dw[i] += acc;
    }
  });
  if (db == nullptr) return;
  for (int oc = 0; oc < s.oc; ++oc) {
    double acc = 0.0;
    for (int64_t g = 0; g < groups; ++g) acc += db_part[static_cast<size_t>(g * s.oc + oc)];
    db[oc] = static_cast<float>(db[oc] + acc);
  }
}

}  // namespace cnn
