// Max pooling on the GPU. Forward: one thread per output. Backward: gather form (one thread per
// input-gradient element), so overlapping windows need no atomics and the sum order is fixed;
// windows that tile the input exactly (2x2, stride 2) take a scatter form with no overlap at all.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "runtime/cuda_check.h"
#include "runtime/math_util.h"
#include "kernels/pool/maxpool_cuda.h"

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
// Thread mapping, both passes: one thread per output o = (plane p, i, j), grid-stride; a warp
// covers 32 consecutive j, so each of the window's two rows is 64 consecutive floats, moved with
// one float2 access per thread and row (W = 2*OW is even, a plane is 4*OH*OW floats; the launcher
// checks that the base pointers are 8-byte aligned). 32-bit indices: the launcher checks the size.
__device__ __forceinline__ void window_base(int o, int oh, int ow, int& base) {
  const int plane_out = oh * ow;
  const int p = o / plane_out;
  const int r = o - p * plane_out;
  const int i = r / ow, j = r - i * ow;
  base = p * (4 * plane_out) + (2 * i) * (2 * ow) + 2 * j;  // flat index of the window's corner
}

__global__ void maxpool2x2_forward_exact(int oh, int ow, int total, const float* __restrict__ d_x,
                                         float* __restrict__ d_y, int32_t* __restrict__ d_argmax) {
  const int w = 2 * ow, plane_in = 4 * oh * ow;
  for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < total; o += gridDim.x * blockDim.x) {
    int base;
    window_base(o, oh, ow, base);
    const float2 top = __ldg(reinterpret_cast<const float2*>(d_x + base));
    const float2 bot = __ldg(reinterpret_cast<const float2*>(d_x + base + w));
    const int in_plane = base % plane_in;  // argmax is an index inside the plane
    // Row-major window order with the reference's rule: strictly greater replaces, so the first
    // of equal maxima stays; the first NaN wins and stays.
    const float v[4] = {top.x, top.y, bot.x, bot.y};
    const int idx[4] = {in_plane, in_plane + 1, in_plane + w, in_plane + w + 1};
    float best = v[0];
    int best_idx = idx[0];
#pragma unroll
    for (int t = 1; t < 4; ++t) {
      if (!isnan(best) && (v[t] > best || isnan(v[t]))) {
        best = v[t];
        best_idx = idx[t];
      }
    }
    d_y[o] = best;
    d_argmax[o] = best_idx;
  }
}

template <bool kMask>
__global__ void maxpool2x2_backward_exact(int oh, int ow, int total, const float* __restrict__ d_dy,
                                          const int32_t* __restrict__ d_argmax,
                                          const float* __restrict__ d_relu_y,
                                          float* __restrict__ d_dx) {
  const int w = 2 * ow, plane_in = 4 * oh * ow;
  for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < total; o += gridDim.x * blockDim.x) {
    int base;
    window_base(o, oh, ow, base);
    float g = __ldg(d_dy + o);
    if (kMask && !(__ldg(d_relu_y + o) > 0.f)) g = 0.f;
    const int win = __ldg(d_argmax + o) - base % plane_in;  // 0, 1, w or w + 1
    *reinterpret_cast<float2*>(d_dx + base) = make_float2(win == 0 ? g : 0.f, win == 1 ? g : 0.f);
    *reinterpret_cast<float2*>(d_dx + base + w) =
        make_float2(win == w ? g : 0.f, win == w + 1 ? g : 0.f);
  }
}

// True when the 2x2 kernels above apply: windows tile the input exactly, 32-bit indices,
// float2-aligned bases.
bool exact_2x2(const MaxPoolShape& s, const void* a, const void* b) {
  return s.kh == 2 && s.kw == 2 && s.stride_h == 2 && s.stride_w == 2 && s.pad_h == 0 &&
         s.pad_w == 0 && s.h % 2 == 0 && s.w % 2 == 0 &&
         int64_t(s.n) * s.c * s.h * s.w <= INT32_MAX && reinterpret_cast<uintptr_t>(a) % 8 == 0 &&
         reinterpret_cast<uintptr_t>(b) % 8 == 0;
}

bool is_2x2_stride_2(const MaxPoolShape& s) {
  return s.kh == 2 && s.kw == 2 && s.stride_h == 2 && s.stride_w == 2 && s.pad_h == 0 &&
         s.pad_w == 0;
}

unsigned grid_for(int64_t work) {
  return static_cast<unsigned>(
      std::clamp<int64_t>(ceil_div<int64_t>(work, kThreads), 1, kMaxBlocks));
}

}  // namespace

void maxpool_forward_cuda(const MaxPoolShape& s, const float* d_x, float* d_y, int32_t* d_argmax,
                          cudaStream_t stream) {
  const int oh = s.oh(), ow = s.ow();
  const int64_t total = int64_t(s.n) * s.c * oh * ow;  // outputs (N, C, OH, OW)
  const unsigned grid = grid_for(total);
  const bool small = total <= INT32_MAX;
  if (exact_2x2(s, d_x, d_x)) {
    maxpool2x2_forward_exact<<<grid, kThreads, 0, stream>>>(oh, ow, int(total), d_x, d_y, d_argmax);
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
  if (exact_2x2(s, d_dx, d_dx)) {
    const int outputs = s.n * s.c * oh * ow;
    const unsigned g = grid_for(outputs);
    if (d_relu_y)
      maxpool2x2_backward_exact<true>
          <<<g, kThreads, 0, stream>>>(oh, ow, outputs, d_dy, d_argmax, d_relu_y, d_dx);
    else
      maxpool2x2_backward_exact<false>
          <<<g, kThreads, 0, stream>>>(oh, ow, outputs, d_dy, d_argmax, nullptr, d_dx);
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
