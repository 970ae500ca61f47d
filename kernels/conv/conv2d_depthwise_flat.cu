// The flat depthwise kernels, stride S = 1 or 2: forward and input gradient
// (conv2d_depthwise_flat.h). (plane, position) is one index walked by a grid-stride loop.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_depthwise_flat.h"
#include "kernels/conv/direct_conv_common.cuh"
#include "runtime/cuda_check.h"
#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

struct DwDims {
  int c, h, w;  // input channels and size
  int oc, m;    // output channels, channel multiplier (OC / C)
  int oh, ow;   // output size
  int ph, pw;   // padding
};

DwDims dims_of(const Conv2dGroupedShape& s) {
  return DwDims{s.c, s.h, s.w, s.oc, s.oc / s.c, s.oh(), s.ow(), s.pad_h, s.pad_w};
}

// Thread mapping: one thread per output y[plane, oy, ox], plane = n * OC + oc, positions of a
// plane consecutive (coalesced stores; the input rows a warp reads, S floats apart per output,
// shared between neighbours through L1).
template <int K, int S>
__global__ void __launch_bounds__(kBlock)
    depthwise_flat_forward(DwDims d, int64_t total, const float* __restrict__ d_x,
                           const float* __restrict__ d_w, const float* __restrict__ d_b,
                           float* __restrict__ d_y, bool relu) {
  ptx::griddep_enter();
  const int positions = d.oh * d.ow;
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * kBlock) {
    const int64_t plane = i / positions;
    const int pos = int(i - plane * positions);
    const int oy = pos / d.ow, ox = pos - oy * d.ow;
    const int oc = int(plane % d.oc);
    const int64_t n = plane / d.oc;
    const float* __restrict__ xp = d_x + (n * d.c + oc / d.m) * int64_t(d.h) * d.w;
    const float* __restrict__ wp = d_w + int64_t(oc) * K * K;
    const int iy0 = S * oy - d.ph, ix0 = S * ox - d.pw;
    float acc = 0.f;
#pragma unroll
    for (int ky = 0; ky < K; ++ky) {
      const int iy = iy0 + ky;
      if (iy < 0 || iy >= d.h) continue;
      const float* __restrict__ row = xp + int64_t(iy) * d.w;
#pragma unroll
      for (int kx = 0; kx < K; ++kx) {
        const int ix = ix0 + kx;
        if (ix >= 0 && ix < d.w) acc = fmaf(__ldg(row + ix), __ldg(wp + ky * K + kx), acc);
      }
    }
    if (d_b) acc += __ldg(d_b + oc);
    d_y[i] = relu ? relu_keep_nan(acc) : acc;
  }
}

// Thread mapping: one thread per S x S block of dx[plane, S a + ry, S b + rx] (plane = n * C + c;
// blocks of a plane consecutive, b fastest). dx(iy, ix) gathers dy(oy, ox) * w(ky, kx) over the
// taps with iy + pad_h - ky = S oy and ix + pad_w - kx = S ox: for block row ry those are the ky
// with ry + pad_h - ky a multiple of S, at oy = a + (ry + pad_h - ky) / S (exact), and the same
// along x. The tests depend on the padding only: the same branch in every thread.
template <int K, int S>
__global__ void __launch_bounds__(kBlock)
    depthwise_flat_backward_data(DwDims d, int64_t total, const float* __restrict__ d_dy,
                                 const float* __restrict__ d_w, float* __restrict__ d_dx) {
  ptx::griddep_enter();
  const int qh = (d.h + S - 1) / S, qw = (d.w + S - 1) / S, cells = qh * qw;
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * kBlock) {
    const int64_t plane = i / cells;
    const int q = int(i - plane * cells);
    const int a = q / qw, b = q - a * qw;
    const int c = int(plane % d.c);
    const int64_t n = plane / d.c;
    float acc[S][S] = {};
    for (int j = 0; j < d.m; ++j) {
      const int oc = c * d.m + j;
      const float* __restrict__ dyp = d_dy + (n * d.oc + oc) * int64_t(d.oh) * d.ow;
      const float* __restrict__ wp = d_w + int64_t(oc) * K * K;
#pragma unroll
      for (int ry = 0; ry < S; ++ry)
#pragma unroll
        for (int ky = 0; ky < K; ++ky) {
          const int dyo = ry + d.ph - ky;
          if (dyo % S != 0) continue;
          const int oy = a + dyo / S;
          if (oy < 0 || oy >= d.oh) continue;
          const float* __restrict__ row = dyp + int64_t(oy) * d.ow;
#pragma unroll
          for (int rx = 0; rx < S; ++rx)
#pragma unroll
            for (int kx = 0; kx < K; ++kx) {
              const int dxo = rx + d.pw - kx;
              if (dxo % S != 0) continue;
              const int ox = b + dxo / S;
              if (ox < 0 || ox >= d.ow) continue;
              acc[ry][rx] = fmaf(__ldg(row + ox), __ldg(wp + ky * K + kx), acc[ry][rx]);
            }
        }
    }
    float* __restrict__ out = d_dx + plane * int64_t(d.h) * d.w;
#pragma unroll
    for (int ry = 0; ry < S; ++ry) {
      const int iy = S * a + ry;
      if (iy >= d.h) continue;
#pragma unroll
      for (int rx = 0; rx < S; ++rx) {
        const int ix = S * b + rx;
        if (ix < d.w) out[int64_t(iy) * d.w + ix] = acc[ry][rx];
      }
    }
  }
}

void check_flat(const Conv2dGroupedShape& s, const char* op) {
  CNN_CHECK(depthwise_flat_applicable(s),
            "{}: the flat depthwise kernels take C/G == 1, stride 1 or 2, square 3/5/7 kernels, "
            "padding below the kernel size and dilation 1",
            op);
  CNN_CHECK(int64_t(s.h) * s.w < INT_MAX && int64_t(s.oh()) * s.ow() < INT_MAX,
            "{}: a plane of {} x {} exceeds the 2^31 positions of the flat depthwise kernels", op,
            s.h, s.w);
}

// Runs f(K, S) with K and S as compile-time constants.
template <class F>
void with_k_s(const Conv2dGroupedShape& s, F f) {
  const bool s2 = s.stride_h == 2;
  switch (s.kh) {
    case 3:
      return s2 ? f(std::integral_constant<int, 3>{}, std::integral_constant<int, 2>{})
                : f(std::integral_constant<int, 3>{}, std::integral_constant<int, 1>{});
    case 5:
      return s2 ? f(std::integral_constant<int, 5>{}, std::integral_constant<int, 2>{})
                : f(std::integral_constant<int, 5>{}, std::integral_constant<int, 1>{});
    default:
      return s2 ? f(std::integral_constant<int, 7>{}, std::integral_constant<int, 2>{})
                : f(std::integral_constant<int, 7>{}, std::integral_constant<int, 1>{});
  }
}

}  // namespace

void depthwise_flat_forward_cuda(const Conv2dGroupedShape& s, const float* d_x, const float* d_w,
                                 const float* d_b, float* d_y, bool relu, cudaStream_t stream) {
  check_flat(s, "depthwise_flat_forward");
  const DwDims d = dims_of(s);
  const int64_t total = int64_t(s.n) * s.oc * s.oh() * s.ow();
  if (total == 0) return;
  with_k_s(s, [&](auto k, auto st) {
    depthwise_flat_forward<decltype(k)::value, decltype(st)::value>
        <<<grid_for_items(total), kBlock, 0, stream>>>(d, total, d_x, d_w, d_b, d_y, relu);
  });
  CNN_LAUNCH_CHECK("depthwise_flat_forward");
}

void depthwise_flat_backward_data_cuda(const Conv2dGroupedShape& s, const float* d_dy,
                                       const float* d_w, float* d_dx, cudaStream_t stream) {
  check_flat(s, "depthwise_flat_backward_data");
  const DwDims d = dims_of(s);
  const int st = s.stride_h;
  const int64_t total = int64_t(s.n) * s.c * ((s.h + st - 1) / st) * ((s.w + st - 1) / st);
  if (total == 0) return;
  with_k_s(s, [&](auto k, auto stc) {
    depthwise_flat_backward_data<decltype(k)::value, decltype(stc)::value>
        <<<grid_for_items(total), kBlock, 0, stream>>>(d, total, d_dy, d_w, d_dx);
  });
  CNN_LAUNCH_CHECK("depthwise_flat_backward_data");
}

}  // namespace cnn
