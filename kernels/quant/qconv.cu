// Int8 convolution on the GPU: direct convolution with int32 accumulation, 4 channels per __dp4a
// where the layout allows it (groups == 1, whose channels are zero padded to 4, or C/groups a
// multiple of 4), and the epilogue of qconv.h (requantize or dequantize, ReLU, max-pool) in the
// same thread. The arithmetic after the sum is spelled with the intrinsics whose rounding the CPU
// twin reproduces: __int2float_rn, __fmaf_rn, __float2int_rn.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/quant/qconv_cuda.h"
#include "kernels/quant/qconv_epilogue.cuh"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;

using qepilogue::lowest;
using qepilogue::requantize;

// The shape's derived sizes, computed on the host (QConvShape's methods are host code).
struct Dims {
  int oh, ow, ph, pw, cg, ocg;
};

// The int32 sum of one conv output (image img, row y, column xo, channel o).
template <bool kDp4a>
__device__ __forceinline__ int32_t conv_sum(const QConvShape& s, const Dims& d,
                                            const int8_t* __restrict__ xi,
                                            const int8_t* __restrict__ w, int y, int xo, int o) {
  const int cg = d.cg;
  const int g = o / d.ocg;
  const int reduce = kDp4a ? s.cgp : cg;  // groups == 1: the zero padding adds nothing
  int32_t sum = 0;
  for (int r = 0; r < s.kh; ++r) {
    const int iy = y * s.stride_h - s.pad_h + r * s.dil_h;
    if (iy < 0 || iy >= s.h) continue;
    for (int q = 0; q < s.kw; ++q) {
      const int ix = xo * s.stride_w - s.pad_w + q * s.dil_w;
      if (ix < 0 || ix >= s.w) continue;
      const int8_t* xp = xi + (int64_t(iy) * s.w + ix) * s.cp + g * cg;
      const int8_t* wp = w + ((int64_t(o) * s.kh + r) * s.kw + q) * s.cgp;
      if (kDp4a) {
        const int* x4 = reinterpret_cast<const int*>(xp);
        const int* w4 = reinterpret_cast<const int*>(wp);
        for (int k = 0; k < reduce / 4; ++k) sum = __dp4a(x4[k], __ldg(w4 + k), sum);
      } else {
        for (int ci = 0; ci < reduce; ++ci) sum += int32_t(xp[ci]) * int32_t(__ldg(wp + ci));
      }
    }
  }
  return sum;
}

// Thread mapping: one thread per output element (img, py, px, o) of y (N, PH, PW, stride), the
// channel fastest; it computes the conv outputs of its pool window and keeps their maximum.
// Channels o in [OC, stride) of an int8 output are written as zero.
template <class T, bool kDp4a>
__global__ void qconv_direct(QConvShape s, Dims d, const int8_t* __restrict__ d_x,
                             const int8_t* __restrict__ d_w, const float* __restrict__ d_mult,
                             const float* __restrict__ d_add, bool relu, int stride, T* d_y) {
  ptx::griddep_enter();
  const int ph = d.ph, pw = d.pw, oh = d.oh, ow = d.ow;
  const int64_t total = int64_t(s.n) * ph * pw * stride;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int o = int(idx % stride);
  int64_t rest = idx / stride;
  const int px = int(rest % pw);
  rest /= pw;
  const int py = int(rest % ph);
  const int img = int(rest / ph);
  if (o >= s.oc) {
    d_y[idx] = T(0);
    return;
  }
  const int8_t* xi = d_x + int64_t(img) * s.h * s.w * s.cp;
  const float m = d_mult[o], a = d_add[o];
  T best = lowest<T>();
  for (int r = 0; r < s.pool_kh; ++r) {
    const int y = py * s.pool_sh - s.pool_ph + r;
    if (y < 0 || y >= oh) continue;
    for (int q = 0; q < s.pool_kw; ++q) {
      const int xo = px * s.pool_sw - s.pool_pw + q;
      if (xo < 0 || xo >= ow) continue;
      const T t = qepilogue::value<T>(conv_sum<kDp4a>(s, d, xi, d_w, y, xo, o), m, a, relu);
      best = t > best ? t : best;
    }
  }
  d_y[idx] = best;
}

template <class T>
void launch(const QConvShape& s, const int8_t* d_x, const int8_t* d_w, const QEpilogue& ep,
            int stride, T* d_y, cudaStream_t stream) {
  const int64_t total = int64_t(s.n) * s.ph() * s.pw() * stride;
  const unsigned blocks = unsigned(ceil_div<int64_t>(total, kThreads));
  const bool dp4a = s.groups == 1 || s.cg() % 4 == 0;
  const Dims d{s.oh(), s.ow(), s.ph(), s.pw(), s.cg(), s.ocg()};
  if (dp4a)
    qconv_direct<T, true>
        <<<blocks, kThreads, 0, stream>>>(s, d, d_x, d_w, ep.mult, ep.add, ep.relu, stride, d_y);
  else
    qconv_direct<T, false>
        <<<blocks, kThreads, 0, stream>>>(s, d, d_x, d_w, ep.mult, ep.add, ep.relu, stride, d_y);
  CNN_CUDA_CHECK(cudaGetLastError());
}

// Thread mapping: one thread per output element (img, r, q, c) of y (N, H, W, CP).
__global__ void quantize_kernel(QuantizeShape s, const float* __restrict__ d_x, float inv_scale,
                                int8_t* __restrict__ d_y) {
  ptx::griddep_enter();
  const int64_t total = int64_t(s.n) * s.h * s.w * s.cp;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int c = int(idx % s.cp);
  int64_t rest = idx / s.cp;
  const int q = int(rest % s.w);
  rest /= s.w;
  const int r = int(rest % s.h);
  const int64_t i = rest / s.h;
  d_y[idx] = c < s.c ? requantize(__fmul_rn(d_x[((i * s.c + c) * s.h + r) * s.w + q], inv_scale))
                     : int8_t(0);
}

}  // namespace

void qconv_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w,
                        const QEpilogue& ep, int8_t* d_y, cudaStream_t stream) {
  launch<int8_t>(s, d_x, d_w, ep, s.ocp, d_y, stream);
}

void qconv_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w,
                        const QEpilogue& ep, float* d_y, cudaStream_t stream) {
  launch<float>(s, d_x, d_w, ep, s.oc, d_y, stream);
}

void quantize_nchw_to_nhwc_cuda(const QuantizeShape& s, const float* d_x, float inv_scale,
                                int8_t* d_y, cudaStream_t stream) {
  const int64_t total = int64_t(s.n) * s.h * s.w * s.cp;
  quantize_kernel<<<unsigned(ceil_div<int64_t>(total, kThreads)), kThreads, 0, stream>>>(
      s, d_x, inv_scale, d_y);
  CNN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cnn
