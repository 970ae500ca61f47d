// Average pooling on the GPU. Forward: one thread per output. Backward: gather form (one thread
// per input-gradient element summing the windows that hold it), so overlapping windows need no
// atomics and the order is fixed. Global average pooling: one warp per plane.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/pool/avgpool_cuda.h"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr int64_t kMaxBlocks = 65535 * 8;  // grid-stride beyond this

unsigned grid_for(int64_t total) {
  return unsigned(std::min<int64_t>(ceil_div<int64_t>(total, kThreads), kMaxBlocks));
}

// Thread mapping: each thread owns output elements o = (n, c, i, j) flattened, grid-stride; it
// sums the in-range part of its window (padding adds zeros) and divides by kh * kw.
template <class Index>
__global__ void avgpool_forward_naive(AvgPoolShape s, int oh, int ow, Index total,
                                      const float* __restrict__ d_x, float* __restrict__ d_y) {
  ptx::griddep_enter();
  const float inv = 1.f / float(s.kh * s.kw);
  for (Index o = Index(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += Index(gridDim.x) * blockDim.x) {
    const Index p = o / (oh * ow);
    const int r = int(o - p * (oh * ow));
    const int i = r / ow, j = r - i * ow;
    const float* xp = d_x + int64_t(p) * s.h * s.w;  // (H, W)
    const int h0 = i * s.stride_h - s.pad_h, w0 = j * s.stride_w - s.pad_w;
    const int a_lo = max(0, -h0), a_hi = min(s.kh, s.h - h0);
    const int b_lo = max(0, -w0), b_hi = min(s.kw, s.w - w0);
    float sum = 0.f;
    for (int a = a_lo; a < a_hi; ++a)
      for (int b = b_lo; b < b_hi; ++b) sum += __ldg(xp + (h0 + a) * s.w + (w0 + b));
    d_y[o] = sum * inv;
  }
}

// Thread mapping: each thread owns input-gradient elements e = (n, c, ih, iw) flattened,
// grid-stride; it sums dy over the windows (i, j) that contain (ih, iw), in row-major order.
template <class Index>
__global__ void avgpool_backward_gather(AvgPoolShape s, int oh, int ow, Index total,
                                        const float* __restrict__ d_dy, float* __restrict__ d_dx) {
  ptx::griddep_enter();
  const float inv = 1.f / float(s.kh * s.kw);
  for (Index e = Index(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += Index(gridDim.x) * blockDim.x) {
    const Index p = e / (s.h * s.w);
    const int r = int(e - p * (s.h * s.w));
    const int ih = r / s.w, iw = r - ih * s.w;
    // Window i covers rows [i*sh - ph, i*sh - ph + kh): i from ceil((ih + ph - kh + 1) / sh)
    // to floor((ih + ph) / sh), clipped to [0, oh).
    const int hp = ih + s.pad_h, wp = iw + s.pad_w;
    const int i_lo = hp < s.kh ? 0 : (hp - s.kh) / s.stride_h + 1;
    const int i_hi = min(oh - 1, hp / s.stride_h);
    const int j_lo = wp < s.kw ? 0 : (wp - s.kw) / s.stride_w + 1;
    const int j_hi = min(ow - 1, wp / s.stride_w);
    const float* dyp = d_dy + int64_t(p) * oh * ow;  // (OH, OW)
    float sum = 0.f;
    for (int i = i_lo; i <= i_hi; ++i)
      for (int j = j_lo; j <= j_hi; ++j) sum += __ldg(dyp + i * ow + j);
    d_dx[e] = sum * inv;
  }
}

// Thread mapping: warp w of the grid owns planes w, w + (all warps), ...; lane l sums the plane's
// values l, l+32, ... and the warp combines them by shuffles in a fixed order.
__global__ void global_avgpool_forward_warp(int64_t planes, int64_t plane,
                                            const float* __restrict__ d_x,
                                            float* __restrict__ d_y) {
  ptx::griddep_enter();
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t p = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; p < planes;
       p += warps) {
    const float* xp = d_x + p * plane;
    float sum = 0.f;
    for (int64_t k = lane; k < plane; k += kWarp) sum += __ldg(xp + k);
    for (int off = kWarp / 2; off > 0; off /= 2) sum += __shfl_down_sync(0xffffffffu, sum, off);
    if (lane == 0) d_y[p] = sum / float(plane);
  }
}

// Thread mapping: each thread owns input-gradient elements e = (p, k) flattened, grid-stride.
template <class Index>
__global__ void global_avgpool_backward_spread(Index total, Index plane,
                                               const float* __restrict__ d_dy,
                                               float* __restrict__ d_dx) {
  ptx::griddep_enter();
  const float inv = 1.f / float(plane);
  for (Index e = Index(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += Index(gridDim.x) * blockDim.x)
    d_dx[e] = __ldg(d_dy + e / plane) * inv;
}

}  // namespace

void avgpool_forward_cuda(const AvgPoolShape& s, const float* d_x, float* d_y,
                          cudaStream_t stream) {
  const int oh = s.oh(), ow = s.ow();
  const int64_t total = int64_t(s.n) * s.c * oh * ow;
  if (total <= INT_MAX && int64_t(s.n) * s.c * s.h * s.w <= INT_MAX)
    avgpool_forward_naive<int32_t>
        <<<grid_for(total), kThreads, 0, stream>>>(s, oh, ow, int32_t(total), d_x, d_y);
  else
    avgpool_forward_naive<int64_t>
        <<<grid_for(total), kThreads, 0, stream>>>(s, oh, ow, total, d_x, d_y);
  CNN_LAUNCH_CHECK("avgpool_forward_naive");
}

void avgpool_backward_cuda(const AvgPoolShape& s, const float* d_dy, float* d_dx,
                           cudaStream_t stream) {
  const int oh = s.oh(), ow = s.ow();
  const int64_t total = int64_t(s.n) * s.c * s.h * s.w;
  if (total <= INT_MAX && int64_t(s.n) * s.c * oh * ow <= INT_MAX)
    avgpool_backward_gather<int32_t>
        <<<grid_for(total), kThreads, 0, stream>>>(s, oh, ow, int32_t(total), d_dy, d_dx);
  else
    avgpool_backward_gather<int64_t>
        <<<grid_for(total), kThreads, 0, stream>>>(s, oh, ow, total, d_dy, d_dx);
  CNN_LAUNCH_CHECK("avgpool_backward_gather");
}

void global_avgpool_forward_cuda(int64_t planes, int64_t plane, const float* d_x, float* d_y,
                                 cudaStream_t stream) {
  const int64_t warps_per_block = kThreads / kWarp;
  const unsigned blocks =
      unsigned(std::min<int64_t>(ceil_div<int64_t>(planes, warps_per_block), kMaxBlocks));
  global_avgpool_forward_warp<<<blocks, kThreads, 0, stream>>>(planes, plane, d_x, d_y);
  CNN_LAUNCH_CHECK("global_avgpool_forward_warp");
}

void global_avgpool_backward_cuda(int64_t planes, int64_t plane, const float* d_dy, float* d_dx,
                                  cudaStream_t stream) {
  const int64_t total = planes * plane;
  if (total <= INT_MAX)
    global_avgpool_backward_spread<int32_t>
        <<<grid_for(total), kThreads, 0, stream>>>(int32_t(total), int32_t(plane), d_dy, d_dx);
  else
    global_avgpool_backward_spread<int64_t>
        <<<grid_for(total), kThreads, 0, stream>>>(total, plane, d_dy, d_dx);
  CNN_LAUNCH_CHECK("global_avgpool_backward_spread");
}

}  // namespace cnn
