// Small-shape GEMM kernels (see gemm_small.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "runtime/cuda_check.h"
#include "kernels/gemm/gemm_small.h"
#include "runtime/math_util.h"

namespace cnn::gemm_small {
namespace {

__device__ __forceinline__ void store(const Args& p, int i, int j, float v) {
  float* dst = p.c + i * p.ldc + j;
  v *= p.alpha;
  if (p.beta != 0.f) v = fmaf(p.beta, *dst, v);
  if (p.bias) v += p.bias[j];
  if (p.relu) v = (v <= 0.f) ? 0.f : v;  // NaN passes, as in the CPU references
  *dst = v;
}

constexpr int kDotWarps = 4;

// Thread mapping: warp w of block b owns output o = b*kDotWarps + w, (i, j) = (o / n, o % n).
// Lane l sums k = 4l + 128 q (+0..3) with float4 reads when both operands run contiguous
// along k and are 16-byte aligned (vec), else k = l + 32 q; then a fixed butterfly over the
// lanes.
__global__ void __launch_bounds__(32 * kDotWarps)
    gemm_dot(const __grid_constant__ Args p, bool vec) {
  ptx::griddep_enter();
  const int lane = threadIdx.x % 32;
  const int64_t o = int64_t(blockIdx.x) * kDotWarps + threadIdx.x / 32;
  if (o >= int64_t(p.m) * p.n) return;  // whole warps leave together
  const int i = static_cast<int>(o / p.n), j = static_cast<int>(o % p.n);
  const float* a = p.a + i * p.a_sm;
  const float* b = p.b + j * p.b_sn;
  float s = 0.f;
  if (vec) {
    const int k4 = p.k / 4;
    for (int q = lane; q < k4; q += 32) {
      const float4 x = __ldg(reinterpret_cast<const float4*>(a) + q);
      const float4 y = __ldg(reinterpret_cast<const float4*>(b) + q);
      s = fmaf(x.x, y.x, s);
      s = fmaf(x.y, y.y, s);
      s = fmaf(x.z, y.z, s);
      s = fmaf(x.w, y.w, s);
    }
    const int l = 4 * k4 + lane;
    if (l < p.k) s = fmaf(__ldg(a + l), __ldg(b + l), s);
  } else {
#pragma unroll 4
    for (int l = lane; l < p.k; l += 32) s = fmaf(__ldg(a + l * p.a_sk), __ldg(b + l * p.b_sk), s);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (lane == 0) store(p, i, j, s);
}

constexpr int kSmallM = 16, kSmallMWarps = 8;

// Thread mapping: block (bx, by) owns rows [16 by, +16) x columns [32 bx, +32); lane l of warp
// w owns column 32 bx + l and sums k = w, w + 8, ... for all 16 rows (A read as broadcasts,
// B along the lanes); the 8 warps' partials are then added in warp order through shared memory
// by thread (row, column) = (t / 32 + 8 r, t % 32).
__global__ void __launch_bounds__(32 * kSmallMWarps) gemm_small_m(const __grid_constant__ Args p) {
  ptx::griddep_enter();
  __shared__ float red[kSmallMWarps][kSmallM][33];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int j = blockIdx.x * 32 + lane, i0 = blockIdx.y * kSmallM;
  const int mc = min(kSmallM, p.m - i0);
  float acc[kSmallM];
#pragma unroll
  for (int r = 0; r < kSmallM; ++r) acc[r] = 0.f;
  if (j < p.n) {
    const float* a = p.a + i0 * p.a_sm;
    const float* b = p.b + j * p.b_sn;
#pragma unroll 4
    for (int l = w; l < p.k; l += kSmallMWarps) {
      const float bv = __ldg(b + l * p.b_sk);
      const float* al = a + l * p.a_sk;
#pragma unroll
      for (int r = 0; r < kSmallM; ++r)
        if (r < mc) acc[r] = fmaf(__ldg(al + r * p.a_sm), bv, acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < kSmallM; ++r) red[w][r][lane] = acc[r];
  __syncthreads();
  for (int t = threadIdx.x; t < kSmallM * 32; t += blockDim.x) {
    const int r = t / 32, l = t % 32, jj = blockIdx.x * 32 + l;
    if (r >= mc || jj >= p.n) continue;
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < kSmallMWarps; ++q) s += red[q][r][l];  // fixed order
    store(p, i0 + r, jj, s);
  }
}

constexpr int kSmallKThreads = 256;

// Thread mapping: thread t of block b owns output o = b*256 + t, (i, j) = (o / n, o % n), and
// sums its k in order (consecutive lanes on consecutive columns).
__global__ void __launch_bounds__(kSmallKThreads) gemm_small_k(const __grid_constant__ Args p) {
  ptx::griddep_enter();
  const int64_t o = int64_t(blockIdx.x) * kSmallKThreads + threadIdx.x;
  if (o >= int64_t(p.m) * p.n) return;
  const int i = static_cast<int>(o / p.n), j = static_cast<int>(o % p.n);
  const float* a = p.a + i * p.a_sm;
  const float* b = p.b + j * p.b_sn;
  float s = 0.f;
#pragma unroll 4
  for (int l = 0; l < p.k; ++l) s = fmaf(__ldg(a + l * p.a_sk), __ldg(b + l * p.b_sk), s);
  store(p, i, j, s);
}

bool aligned16(const void* ptr) {
  return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0;
}

}  // namespace

void launch_dot(const Args& p, cudaStream_t stream) {
  const bool vec = p.k > 0 && p.a_sk == 1 && p.b_sk == 1 && p.a_sm % 4 == 0 && p.b_sn % 4 == 0 &&
                   aligned16(p.a) && aligned16(p.b);
  const int64_t blocks = ceil_div<int64_t>(int64_t(p.m) * p.n, kDotWarps);
  CNN_CHECK(blocks <= 0x7fffffff, "gemm_dot: {} x {} outputs is too many", p.m, p.n);
  gemm_dot<<<static_cast<unsigned>(blocks), 32 * kDotWarps, 0, stream>>>(p, vec);
  CNN_LAUNCH_CHECK("gemm_dot");
}

void launch_small_m(const Args& p, cudaStream_t stream) {
  const int64_t gx = ceil_div<int64_t>(p.n, 32), gy = ceil_div<int64_t>(p.m, kSmallM);
  CNN_CHECK(gx <= 0x7fffffff && gy <= 65535, "gemm_small_m: {} x {} outputs is too many", p.m, p.n);
  gemm_small_m<<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), 32 * kSmallMWarps, 0,
                 stream>>>(p);
  CNN_LAUNCH_CHECK("gemm_small_m");
}

void launch_small_k(const Args& p, cudaStream_t stream) {
  const int64_t blocks = ceil_div<int64_t>(int64_t(p.m) * p.n, kSmallKThreads);
  CNN_CHECK(blocks <= 0x7fffffff, "gemm_small_k: {} x {} outputs is too many", p.m, p.n);
  gemm_small_k<<<static_cast<unsigned>(blocks), kSmallKThreads, 0, stream>>>(p);
  CNN_LAUNCH_CHECK("gemm_small_k");
}

}  // namespace cnn::gemm_small
