// Max pooling on the GPU. Forward: one thread per output. Backward: gather form (one thread per
// input-gradient element), so overlapping windows need no atomics and the sum order is fixed.
// Windows that tile the input exactly (2x2, stride 2) take their own kernels: up to four outputs
// a thread with 16-byte accesses, and a scatter backward with no overlap at all.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>

#include "kernels/common/ptx.cuh"
#include "kernels/pool/maxpool_cuda.h"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;  // grid-stride beyond this; any count works

// Index is int32_t when every flat index fits (no 64-bit divisions, which the GPU emulates in
// software), int64_t otherwise; positions inside one plane are always 32-bit. kK = 2 compiles the
// common 2x2 / stride 2 / no padding pool with constant geometry (divisions become shifts, the
// window loops unroll); kK = 0 reads the geometry from the shape.
template <int kK>
struct Geometry {
  int kh, kw, sh, sw, ph, pw;
  __device__ explicit Geometry(const MaxPoolShape& s)
      : kh(kK ? kK : s.kh),
        kw(kK ? kK : s.kw),
        sh(kK ? kK : s.stride_h),
        sw(kK ? kK : s.stride_w),
        ph(kK ? 0 : s.pad_h),
        pw(kK ? 0 : s.pad_w) {}
};

// Thread mapping: each thread owns output elements o = (n, c, i, j) flattened, grid-stride;
// it writes y[o] and argmax[o] from the window of input plane (n, c).
template <class Index, int kK>
__global__ void maxpool_forward_naive(MaxPoolShape s, int oh, int ow, Index total,
                                      const float* __restrict__ d_x, float* __restrict__ d_y,
                                      int32_t* __restrict__ d_argmax) {
  ptx::griddep_enter();
  const Geometry<kK> k(s);
  const Index stride = Index(gridDim.x) * blockDim.x;
  const int plane_out = oh * ow;
  for (Index o = Index(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const Index p = o / plane_out;
    const int r = int(o - p * plane_out);
    const int i = r / ow, j = r - i * ow;
    const float* xp = d_x + int64_t(p) * s.h * s.w;  // (H, W)
    const int h0 = i * k.sh - k.ph, w0 = j * k.sw - k.pw;
    const int a_lo = max(0, -h0), a_hi = min(k.kh, s.h - h0);  // rows of the window in range
    const int b_lo = max(0, -w0), b_hi = min(k.kw, s.w - w0);
    float best = 0.f;
    int32_t best_idx = -1;  // padding never wins: the first real element is always taken
    for (int a = a_lo; a < a_hi; ++a) {
      for (int b = b_lo; b < b_hi; ++b) {
        const int idx = (h0 + a) * s.w + (w0 + b);
        const float v = __ldg(xp + idx);
        // Strictly greater keeps the first of equal maxima; the first NaN wins and stays.
        if (best_idx < 0 || (!isnan(best) && (v > best || isnan(v)))) {
          best = v;
          best_idx = idx;
        }
      }
    }
    d_y[o] = best;
    d_argmax[o] = best_idx;
  }
}

// Thread mapping: each thread owns input-gradient elements e = (n, c, ih, iw) flattened,
// grid-stride; it visits the windows that contain (ih, iw) in row-major order and sums the dy
// of those whose argmax is (ih, iw) -- in double and in the CPU reference's order, so the result
// equals the reference bit for bit.
template <class Index, int kK>
__global__ void maxpool_backward_gather(MaxPoolShape s, int oh, int ow, Index total,
                                        const float* __restrict__ d_dy,
                                        const int32_t* __restrict__ d_argmax,
                                        const float* __restrict__ d_relu_y,
                                        float* __restrict__ d_dx) {
  ptx::griddep_enter();
  const Geometry<kK> k(s);
  const Index stride = Index(gridDim.x) * blockDim.x;
  const int plane_in = s.h * s.w;
  for (Index e = Index(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const Index p = e / plane_in;
    const int me = int(e - p * plane_in);  // h*W + w inside the plane, as argmax stores it
    const int ih = me / s.w, iw = me - ih * s.w;
    // Window i covers rows [i*stride - pad, i*stride - pad + kh).
    const int th = ih + k.ph - k.kh + 1, tw = iw + k.pw - k.kw + 1;
    const int i_lo = th <= 0 ? 0 : (th + k.sh - 1) / k.sh;
    const int j_lo = tw <= 0 ? 0 : (tw + k.sw - 1) / k.sw;
    const int i_hi = min((ih + k.ph) / k.sh, oh - 1);
    const int j_hi = min((iw + k.pw) / k.sw, ow - 1);
    const float* dyp = d_dy + int64_t(p) * oh * ow;        // (OH, OW)
    const int32_t* amp = d_argmax + int64_t(p) * oh * ow;  // (OH, OW)
    const float* ryp = d_relu_y ? d_relu_y + int64_t(p) * oh * ow : nullptr;
    double acc = 0;
    for (int i = i_lo; i <= i_hi; ++i) {
      for (int j = j_lo; j <= j_hi; ++j) {
        if (__ldg(amp + i * ow + j) == me && (!ryp || __ldg(ryp + i * ow + j) > 0.f))
          acc += __ldg(dyp + i * ow + j);
      }
    }
    d_dx[e] = float(acc);
  }
}

// The 2x2 / stride 2 / unpadded pool whose windows tile the input exactly (H = 2*OH, W = 2*OW,
// the network's case). Windows do not overlap, so the forward reads each input once and the
// backward writes each input-gradient element exactly once (no memset, no gather loop).
// Thread mapping, both passes: one thread per kOut consecutive outputs o0 .. o0 + kOut - 1 of one
// output row (o0 = q * kOut, q grid-stride; OW is a multiple of kOut, so they never straddle a
// row). Their windows' two input rows are 2 * kOut consecutive floats each, moved with 16-byte
// accesses for kOut = 4 and 2 (two float4, one float4) and 8-byte ones for kOut = 1; the kOut
// outputs (and argmax, dy, the ReLU mask) with one kOut-wide access. kOut = 4 gives each thread
// 64 bytes of loads in flight, which is what keeps HBM busy; the launcher takes the widest kOut
// that divides OW and whose accesses the pointers' alignment allows (exact_2x2_width). 32-bit
// indices: the launcher checks the size.

// The flat index of output o's window's top-left input element, and that index inside its plane
// (what argmax stores).
struct WindowCorner {
  int flat, in_plane;
};
__device__ __forceinline__ WindowCorner window_corner(int o, int oh, int ow) {
  const int plane_out = oh * ow;
  const int p = o / plane_out;
  const int r = o - p * plane_out;
  const int i = r / ow, j = r - i * ow;
  const int in_plane = (2 * i) * (2 * ow) + 2 * j;
  return {p * (4 * plane_out) + in_plane, in_plane};
}

// n = 2, 4 or 8 consecutive floats at p (8-byte aligned for n = 2, else 16-byte).
template <int n>
__device__ __forceinline__ void load_floats(const float* __restrict__ p, float (&v)[n]) {
  static_assert(n == 2 || n == 4 || n == 8, "float2, float4 or two float4");
  if constexpr (n == 2) {
    const float2 a = __ldg(reinterpret_cast<const float2*>(p));
    v[0] = a.x, v[1] = a.y;
  } else {
#pragma unroll
    for (int k = 0; k < n / 4; ++k) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(p) + k);
      v[4 * k] = a.x, v[4 * k + 1] = a.y, v[4 * k + 2] = a.z, v[4 * k + 3] = a.w;
    }
  }
}

template <int n>
__device__ __forceinline__ void store_floats(float* __restrict__ p, const float (&v)[n]) {
  static_assert(n == 1 || n == 2 || n == 4 || n == 8, "a float, float2, float4 or two float4");
  if constexpr (n == 1) {
    *p = v[0];
  } else if constexpr (n == 2) {
    *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
  } else {
#pragma unroll
    for (int k = 0; k < n / 4; ++k)
      reinterpret_cast<float4*>(p)[k] =
          make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
  }
}

// kOut = 1, 2 or 4 values of the output arrays (y, dy, the mask: float; argmax: int32).
template <int kOut>
__device__ __forceinline__ void load_outputs(const float* __restrict__ p, float (&v)[kOut]) {
  if constexpr (kOut == 1) {
    v[0] = __ldg(p);
  } else {
    load_floats<kOut>(p, v);
  }
}

template <int kOut>
__device__ __forceinline__ void load_outputs(const int32_t* __restrict__ p, int (&v)[kOut]) {
  if constexpr (kOut == 1) {
    v[0] = __ldg(p);
  } else if constexpr (kOut == 2) {
    const int2 a = __ldg(reinterpret_cast<const int2*>(p));
    v[0] = a.x, v[1] = a.y;
  } else {
    const int4 a = __ldg(reinterpret_cast<const int4*>(p));
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  }
}

template <int kOut>
__device__ __forceinline__ void store_outputs(int32_t* __restrict__ p, const int (&v)[kOut]) {
  if constexpr (kOut == 1) {
    *p = v[0];
  } else if constexpr (kOut == 2) {
    *reinterpret_cast<int2*>(p) = make_int2(v[0], v[1]);
  } else {
    *reinterpret_cast<int4*>(p) = make_int4(v[0], v[1], v[2], v[3]);
  }
}

template <int kOut>
__global__ void maxpool2x2_forward_exact(int oh, int ow, int total, const float* __restrict__ d_x,
                                         float* __restrict__ d_y, int32_t* __restrict__ d_argmax) {
  ptx::griddep_enter();
  const int w = 2 * ow;
  const int quads = total / kOut;  // groups of kOut outputs
  for (int q = blockIdx.x * blockDim.x + threadIdx.x; q < quads; q += gridDim.x * blockDim.x) {
    const int o0 = q * kOut;
    const WindowCorner corner = window_corner(o0, oh, ow);
    float top[2 * kOut], bot[2 * kOut];
    load_floats<2 * kOut>(d_x + corner.flat, top);
    load_floats<2 * kOut>(d_x + corner.flat + w, bot);
    float best[kOut];
    int best_idx[kOut];
#pragma unroll
    for (int t = 0; t < kOut; ++t) {
      // Row-major window order with the reference's rule: strictly greater replaces, so the
      // first of equal maxima stays; the first NaN wins and stays.
      const int c = corner.in_plane + 2 * t;  // argmax is an index inside the plane
      const float v[4] = {top[2 * t], top[2 * t + 1], bot[2 * t], bot[2 * t + 1]};
      const int idx[4] = {c, c + 1, c + w, c + w + 1};
      best[t] = v[0];
      best_idx[t] = idx[0];
#pragma unroll
      for (int k = 1; k < 4; ++k) {
        if (!isnan(best[t]) && (v[k] > best[t] || isnan(v[k]))) {
          best[t] = v[k];
          best_idx[t] = idx[k];
        }
      }
    }
    store_floats<kOut>(d_y + o0, best);
    store_outputs<kOut>(d_argmax + o0, best_idx);
  }
}

template <int kOut, bool kMask>
__global__ void maxpool2x2_backward_exact(int oh, int ow, int total, const float* __restrict__ d_dy,
                                          const int32_t* __restrict__ d_argmax,
                                          const float* __restrict__ d_relu_y,
                                          float* __restrict__ d_dx) {
  ptx::griddep_enter();
  const int w = 2 * ow;
  const int quads = total / kOut;
  for (int q = blockIdx.x * blockDim.x + threadIdx.x; q < quads; q += gridDim.x * blockDim.x) {
    const int o0 = q * kOut;
    const WindowCorner corner = window_corner(o0, oh, ow);
    float g[kOut];
    int am[kOut];
    load_outputs<kOut>(d_dy + o0, g);
    load_outputs<kOut>(d_argmax + o0, am);
    if constexpr (kMask) {
      float m[kOut];
      load_outputs<kOut>(d_relu_y + o0, m);
#pragma unroll
      for (int t = 0; t < kOut; ++t)
        if (!(m[t] > 0.f)) g[t] = 0.f;
    }
    float top[2 * kOut], bot[2 * kOut];
#pragma unroll
    for (int t = 0; t < kOut; ++t) {
      const int win = am[t] - (corner.in_plane + 2 * t);  // 0, 1, w or w + 1
      top[2 * t] = win == 0 ? g[t] : 0.f;
      top[2 * t + 1] = win == 1 ? g[t] : 0.f;
      bot[2 * t] = win == w ? g[t] : 0.f;
      bot[2 * t + 1] = win == w + 1 ? g[t] : 0.f;
    }
    store_floats<2 * kOut>(d_dx + corner.flat, top);
    store_floats<2 * kOut>(d_dx + corner.flat + w, bot);
  }
}

bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// The outputs a thread of the 2x2 kernels above takes (4, 2 or 1), or 0 where they do not apply.
// They apply when the windows tile the input exactly and every flat index fits 32 bits. kOut
// outputs a thread need OW a multiple of kOut, the input-side pointers (x, dx) aligned to the
// 8 * kOut-byte rows segment's access (16 bytes for kOut 2 and 4, 8 for kOut 1) and the
// output-side ones (y, argmax, dy, the mask) to 4 * kOut bytes. Null pointers count as aligned.
int exact_2x2_width(const MaxPoolShape& s, const void* in_side,
                    std::initializer_list<const void*> out_side) {
  if (!(s.kh == 2 && s.kw == 2 && s.stride_h == 2 && s.stride_w == 2 && s.pad_h == 0 &&
        s.pad_w == 0 && s.h % 2 == 0 && s.w % 2 == 0 &&
        int64_t(s.n) * s.c * s.h * s.w <= INT32_MAX))
    return 0;
  const int ow = s.w / 2;
  for (int k : {4, 2, 1}) {
    if (ow % k != 0 || !aligned(in_side, k == 1 ? 8 : 16)) continue;
    bool ok = true;
    for (const void* p : out_side) ok = ok && aligned(p, uintptr_t(4 * k));
    if (ok) return k;
  }
  return 0;
}

bool is_2x2_stride_2(const MaxPoolShape& s) {
  return s.kh == 2 && s.kw == 2 && s.stride_h == 2 && s.stride_w == 2 && s.pad_h == 0 &&
         s.pad_w == 0;
}

unsigned grid_for(int64_t work) {
  return static_cast<unsigned>(
      std::clamp<int64_t>(ceil_div<int64_t>(work, kThreads), 1, kMaxBlocks));
}

// The exact 2x2 forward with kOut outputs a thread.
template <int kOut>
void launch_forward_exact(unsigned grid, cudaStream_t stream, int oh, int ow, int outputs,
                          const float* d_x, float* d_y, int32_t* d_argmax) {
  maxpool2x2_forward_exact<kOut>
      <<<grid, kThreads, 0, stream>>>(oh, ow, outputs, d_x, d_y, d_argmax);
}

// The exact 2x2 backward with kOut outputs a thread, with or without the fused ReLU mask.
template <int kOut>
void launch_backward_exact(unsigned grid, cudaStream_t stream, int oh, int ow, int outputs,
                           const float* d_dy, const int32_t* d_argmax, const float* d_relu_y,
                           float* d_dx) {
  if (d_relu_y)
    maxpool2x2_backward_exact<kOut, true>
        <<<grid, kThreads, 0, stream>>>(oh, ow, outputs, d_dy, d_argmax, d_relu_y, d_dx);
  else
    maxpool2x2_backward_exact<kOut, false>
        <<<grid, kThreads, 0, stream>>>(oh, ow, outputs, d_dy, d_argmax, nullptr, d_dx);
}

}  // namespace

void maxpool_forward_cuda(const MaxPoolShape& s, const float* d_x, float* d_y, int32_t* d_argmax,
                          cudaStream_t stream) {
  const int oh = s.oh(), ow = s.ow();
  const int64_t total = int64_t(s.n) * s.c * oh * ow;  // outputs (N, C, OH, OW)
  const unsigned grid = grid_for(total);
  const bool small = total <= INT32_MAX;
  const int width = exact_2x2_width(s, d_x, {d_y, d_argmax});
  if (width) {
    const int outputs = int(total);  // exact_2x2_width checked that it fits
    const unsigned g = grid_for(outputs / width);
    if (width == 4)
      launch_forward_exact<4>(g, stream, oh, ow, outputs, d_x, d_y, d_argmax);
    else if (width == 2)
      launch_forward_exact<2>(g, stream, oh, ow, outputs, d_x, d_y, d_argmax);
    else
      launch_forward_exact<1>(g, stream, oh, ow, outputs, d_x, d_y, d_argmax);
    CNN_LAUNCH_CHECK("maxpool2x2_forward_exact");
    return;
  }
  if (is_2x2_stride_2(s) && small)
    maxpool_forward_naive<int32_t, 2>
        <<<grid, kThreads, 0, stream>>>(s, oh, ow, int32_t(total), d_x, d_y, d_argmax);
  else if (small)
    maxpool_forward_naive<int32_t, 0>
        <<<grid, kThreads, 0, stream>>>(s, oh, ow, int32_t(total), d_x, d_y, d_argmax);
  else
    maxpool_forward_naive<int64_t, 0>
        <<<grid, kThreads, 0, stream>>>(s, oh, ow, total, d_x, d_y, d_argmax);
  CNN_LAUNCH_CHECK("maxpool_forward_naive");
}

void maxpool_backward_cuda(const MaxPoolShape& s, const float* d_dy, const int32_t* d_argmax,
                           const float* d_relu_y, float* d_dx, cudaStream_t stream) {
  const int oh = s.oh(), ow = s.ow();
  const int width = exact_2x2_width(s, d_dx, {d_dy, d_argmax, d_relu_y});
  if (width) {
    const int outputs = s.n * s.c * oh * ow;
    const unsigned g = grid_for(outputs / width);
    if (width == 4)
      launch_backward_exact<4>(g, stream, oh, ow, outputs, d_dy, d_argmax, d_relu_y, d_dx);
    else if (width == 2)
      launch_backward_exact<2>(g, stream, oh, ow, outputs, d_dy, d_argmax, d_relu_y, d_dx);
    else
      launch_backward_exact<1>(g, stream, oh, ow, outputs, d_dy, d_argmax, d_relu_y, d_dx);
    CNN_LAUNCH_CHECK("maxpool2x2_backward_exact");
    return;
  }
  const int64_t total = int64_t(s.n) * s.c * s.h * s.w;  // input gradients (N, C, H, W)
  const unsigned grid = grid_for(total);
  const bool small = total <= INT32_MAX;
  if (is_2x2_stride_2(s) && small)
    maxpool_backward_gather<int32_t, 2>
        <<<grid, kThreads, 0, stream>>>(s, oh, ow, int32_t(total), d_dy, d_argmax, d_relu_y, d_dx);
  else if (small)
    maxpool_backward_gather<int32_t, 0>
        <<<grid, kThreads, 0, stream>>>(s, oh, ow, int32_t(total), d_dy, d_argmax, d_relu_y, d_dx);
  else
    maxpool_backward_gather<int64_t, 0>
        <<<grid, kThreads, 0, stream>>>(s, oh, ow, total, d_dy, d_argmax, d_relu_y, d_dx);
  CNN_LAUNCH_CHECK("maxpool_backward_gather");
}

}  // namespace cnn
