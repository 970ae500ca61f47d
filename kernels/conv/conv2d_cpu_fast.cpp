// Fast CPU convolution through im2col + gemm_cpu. Per image n, with K = C*KH*KW, P = OH*OW:
//   forward          y_n (OC, P)  = w (OC, K) * col_n (K, P)           (+ bias, ReLU)
//   backward data    col (K, P)   = w^T (K, OC) * dy_n (OC, P), then col2im into dx_n
//   backward weight  dw (OC, K)  += dy_n (OC, P) * col_n^T (P, K)
// A 1x1 stride-1 unpadded convolution skips im2col: col_n is x_n itself.
#include "kernels/conv/conv2d_cpu_fast.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/gemm/gemm_cpu.h"
#include "runtime/thread_pool.h"

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

// ---- Row copies: im2col and col2im are many short rows (OW floats each), so each row must be a
// couple of vector instructions, not a memcpy call. Masked loads do not fault past the row. ----

// dst[r * dst_ld + i] = src[r * src_ld + i] (copy) or += (add), for r < rows, i < n.
using RowsFn = void (*)(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int rows,
                        int n);

template <bool kAdd>
void rows_portable(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int rows, int n) {
  for (int r = 0; r < rows; ++r) {
    float* d = dst + r * dst_ld;
    const float* s = src + r * src_ld;
    for (int i = 0; i < n; ++i) d[i] = kAdd ? d[i] + s[i] : s[i];
  }
}

template <bool kAdd>
__attribute__((target("avx512f"))) void rows_avx512(float* dst, int64_t dst_ld, const float* src,
                                                    int64_t src_ld, int rows, int n) {
  const __mmask16 tail = static_cast<__mmask16>((1u << (n % 16)) - 1u);
  for (int r = 0; r < rows; ++r) {
    float* d = dst + r * dst_ld;
    const float* s = src + r * src_ld;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
      __m512 v = _mm512_loadu_ps(s + i);
      if (kAdd) v = _mm512_add_ps(v, _mm512_loadu_ps(d + i));
      _mm512_storeu_ps(d + i, v);
    }
    if (tail != 0) {
      __m512 v = _mm512_maskz_loadu_ps(tail, s + i);
      if (kAdd) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(tail, d + i));
      _mm512_mask_storeu_ps(d + i, tail, v);
    }
  }
}

template <bool kAdd>
__attribute__((target("avx2"))) void rows_avx2(float* dst, int64_t dst_ld, const float* src,
                                               int64_t src_ld, int rows, int n) {
  const __m256i tail =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(n % 8), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  for (int r = 0; r < rows; ++r) {
    float* d = dst + r * dst_ld;
    const float* s = src + r * src_ld;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
      __m256 v = _mm256_loadu_ps(s + i);
      if (kAdd) v = _mm256_add_ps(v, _mm256_loadu_ps(d + i));
      _mm256_storeu_ps(d + i, v);
    }
    if (n % 8 != 0) {
      __m256 v = _mm256_maskload_ps(s + i, tail);
      if (kAdd) v = _mm256_add_ps(v, _mm256_maskload_ps(d + i, tail));
      _mm256_maskstore_ps(d + i, tail, v);
    }
  }
}

struct RowOps {
  RowsFn copy, add;
};

// Copies and additions are exact, so the instruction set changes speed, never results.
RowOps row_ops() {
  if (cpu_isa_supported(CpuIsa::Avx512)) return {rows_avx512<false>, rows_avx512<true>};
  if (cpu_isa_supported(CpuIsa::Avx2)) return {rows_avx2<false>, rows_avx2<true>};
  return {rows_portable<false>, rows_portable<true>};
}

// Per-thread scratch, grown on demand; every use writes before it reads, so nothing carries
// over between calls.
struct Scratch {
  std::vector<float> col;     // (K, P) column matrix
  std::vector<float> padded;  // (C, H + 2*pad_h, W + 2*pad_w) zero-bordered image
};

float* grown(std::vector<float>& v, int64_t floats) {
  if (static_cast<int64_t>(v.size()) < floats) v.resize(static_cast<size_t>(floats));
  return v.data();
}

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// The image as seen through the padding: x itself when there is none, else a zero-bordered copy
// in `buf`, so that im2col reads whole rows without bounds checks.
const float* padded_image(const Conv2dShape& s, const RowOps& ops, const float* x,
                          std::vector<float>& buf) {
  if (s.pad_h == 0 && s.pad_w == 0) return x;
  const int64_t hp = s.h + 2 * s.pad_h, wp = s.w + 2 * s.pad_w;
  float* xp = grown(buf, s.c * hp * wp);  // (C, HP, WP)
  std::fill(xp, xp + s.c * hp * wp, 0.f);
  for (int c = 0; c < s.c; ++c)
    ops.copy(xp + (c * hp + s.pad_h) * wp + s.pad_w, wp, x + int64_t(c) * s.h * s.w, s.w, s.h, s.w);
  return xp;
}

// col (K, P) from the padded image xp (C, HP, WP).
void im2col(const Conv2dShape& s, const RowOps& ops, const float* xp, float* col) {
  const int oh = s.oh(), ow = s.ow();
  const int64_t hp = s.h + 2 * s.pad_h, wp = s.w + 2 * s.pad_w, p = int64_t(oh) * ow;
  for (int c = 0; c < s.c; ++c)
    for (int ky = 0; ky < s.kh; ++ky)
      for (int kx = 0; kx < s.kw; ++kx) {
        float* row = col + ((int64_t(c) * s.kh + ky) * s.kw + kx) * p;  // (OH, OW)
        const float* src = xp + (c * hp + ky) * wp + kx;  // tap (ky, kx) of output (0, 0)
        if (s.stride_w == 1) {
          ops.copy(row, ow, src, s.stride_h * wp, oh, ow);
          continue;
        }
        for (int oy = 0; oy < oh; ++oy)
          for (int ox = 0; ox < ow; ++ox)
            row[oy * ow + ox] = src[oy * s.stride_h * wp + int64_t(ox) * s.stride_w];
      }
}

// dx (C, H, W) = col (K, P) scattered back along the taps; overwrites dx. Sums into a padded
// buffer (dropping what lands in the padding at the end) in a fixed order, so results repeat.
void col2im(const Conv2dShape& s, const RowOps& ops, const float* col, float* dx,
            std::vector<float>& buf) {
  const int oh = s.oh(), ow = s.ow();
  const int64_t hp = s.h + 2 * s.pad_h, wp = s.w + 2 * s.pad_w, p = int64_t(oh) * ow;
  const bool padded = s.pad_h != 0 || s.pad_w != 0;
  float* dxp = padded ? grown(buf, s.c * hp * wp) : dx;  // (C, HP, WP)
  std::fill(dxp, dxp + s.c * hp * wp, 0.f);
  for (int c = 0; c < s.c; ++c)
    for (int ky = 0; ky < s.kh; ++ky)
      for (int kx = 0; kx < s.kw; ++kx) {
        const float* row = col + ((int64_t(c) * s.kh + ky) * s.kw + kx) * p;
        float* dst = dxp + (c * hp + ky) * wp + kx;
        if (s.stride_w == 1) {
          ops.add(dst, s.stride_h * wp, row, ow, oh, ow);
          continue;
        }
        for (int oy = 0; oy < oh; ++oy)
          for (int ox = 0; ox < ow; ++ox)
            dst[oy * s.stride_h * wp + int64_t(ox) * s.stride_w] += row[oy * ow + ox];
      }
  if (!padded) return;
  for (int c = 0; c < s.c; ++c)
    ops.copy(dx + int64_t(c) * s.h * s.w, s.w, dxp + (c * hp + s.pad_h) * wp + s.pad_w, wp, s.h,
             s.w);
}

// Sum of v[0, n): 16 interleaved float partial sums (vectorizable, no serial add chain), added
// in a fixed order in double.
double row_sum(const float* v, int64_t n) {
  constexpr int kLanes = 16;
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += v[i + l];
  double acc = 0.0;
  for (; i < n; ++i) acc += v[i];
  for (int l = 0; l < kLanes; ++l) acc += lane[l];
  return acc;
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
  const RowOps ops = row_ops();
  const int64_t x_img = int64_t(s.c) * s.h * s.w;  // floats per input image
  const int64_t y_img = int64_t(s.oc) * d.p;       // floats per output image
  parallel_tasks(s.n, [&](int64_t n) {
    const float* xn = x + n * x_img;  // (C, H, W)
    float* yn = y + n * y_img;        // (OC, P)
    const float* col = xn;            // (K, P)
    if (!d.direct) {
      Scratch& sc = scratch();
      float* buf = grown(sc.col, d.k * d.p);
      im2col(s, ops, padded_image(s, ops, xn, sc.padded), buf);
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
  const RowOps ops = row_ops();
  const int64_t x_img = int64_t(s.c) * s.h * s.w;
  const int64_t y_img = int64_t(s.oc) * d.p;
  parallel_tasks(s.n, [&](int64_t n) {
    const float* dyn = dy + n * y_img;  // (OC, P)
    float* dxn = dx + n * x_img;        // (C, H, W)
    if (d.direct) {                     // dx_n (C, P) is the column matrix itself
      gemm_cpu(true, false, d.k, d.p, s.oc, 1.f, w, d.k, dyn, d.p, 0.f, dxn, d.p, serial());
      return;
    }
    Scratch& sc = scratch();
    float* col = grown(sc.col, d.k * d.p);  // (K, P)
    gemm_cpu(true, false, d.k, d.p, s.oc, 1.f, w, d.k, dyn, d.p, 0.f, col, d.p, serial());
    col2im(s, ops, col, dxn, sc.padded);
  });
}

void conv2d_backward_weight_cpu_fast(const Conv2dShape& s, const float* x, const float* dy,
                                     float* dw, float* db) {
  const Dims d = dims_of(s);
  const RowOps ops = row_ops();
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
        Scratch& sc = scratch();
        float* buf = grown(sc.col, d.k * d.p);
        im2col(s, ops, padded_image(s, ops, xn, sc.padded), buf);
        col = buf;
      }
      const float beta = n == n_lo ? 0.f : 1.f;  // the group's first image initializes dwg
      gemm_cpu(false, true, s.oc, d.k, d.p, 1.f, dyn, d.p, col, d.p, beta, dwg, d.k, serial());
      for (int oc = 0; oc < s.oc; ++oc) {
        const float* row = dyn + oc * d.p;
        dbg[oc] += row_sum(row, d.p);
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
