// GPU split-K reduction (split_k_reduce.h).
#include <cuda_runtime.h>

#include "kernels/common/ptx.cuh"
#include "kernels/gemm/split_k_reduce.h"
#include "runtime/cuda_check.h"
#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;

// Thread mapping: thread t of the grid owns C row t / q, columns 4 (t % q) .. +3 (q = ceil(n / 4)),
// so a warp reads and writes 32 consecutive float4s of a row. The workspace rows are padded to
// 4 floats (its columns past n hold finite values that are never stored). The products and sums
// are __fmul_rn / __fadd_rn so that nvcc contracts none of them into an FMA: the CPU twin's
// float operations, bit for bit.
__global__ void __launch_bounds__(kThreads)
    split_k_reduce_kernel(const float* work, SplitKReduceShape s, GemmEpilogue e, float* c,
                          bool vec_c) {
  ptx::griddep_enter();
  const int q = (s.n + 3) / 4;
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= int64_t(s.m) * q) return;
  const int i = int(t / q), j0 = int(t % q) * 4;
  const int64_t plane = int64_t(s.m) * s.ldw;
  const float* w = work + int64_t(i) * s.ldw + j0;
  float4 sum = *reinterpret_cast<const float4*>(w);
  for (int g = 1; g < s.groups; ++g) {
    const float4 v = *reinterpret_cast<const float4*>(w + g * plane);
    sum.x = __fadd_rn(sum.x, v.x);
    sum.y = __fadd_rn(sum.y, v.y);
    sum.z = __fadd_rn(sum.z, v.z);
    sum.w = __fadd_rn(sum.w, v.w);
  }
  const float sums[4] = {sum.x, sum.y, sum.z, sum.w};
  float* crow = c + int64_t(i) * s.ldc;
  const bool whole = vec_c && j0 + 3 < s.n;
  float old[4] = {0.f, 0.f, 0.f, 0.f};
  if (e.beta != 0.f) {
    if (whole) {
      const float4 o = *reinterpret_cast<const float4*>(crow + j0);
      old[0] = o.x;
      old[1] = o.y;
      old[2] = o.z;
      old[3] = o.w;
    } else {
      for (int k = 0; k < 4 && j0 + k < s.n; ++k) old[k] = crow[j0 + k];
    }
  }
  float v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[k] = __fmul_rn(e.alpha, sums[k]);
    if (e.beta != 0.f) v[k] = fmaf(e.beta, old[k], v[k]);
    if (e.bias && j0 + k < s.n) v[k] = __fadd_rn(v[k], e.bias[j0 + k]);
    if (e.relu) v[k] = (v[k] <= 0.f) ? 0.f : v[k];  // NaN passes, as in the CPU twin
  }
  if (whole) {
    *reinterpret_cast<float4*>(crow + j0) = make_float4(v[0], v[1], v[2], v[3]);
    return;
  }
  for (int k = 0; k < 4 && j0 + k < s.n; ++k) crow[j0 + k] = v[k];
}

}  // namespace

void split_k_reduce_cuda(const SplitKReduceShape& s, const float* d_work, const GemmEpilogue& e,
                         float* d_c, cudaStream_t stream) {
  CNN_CHECK(s.groups >= 1 && s.m >= 1 && s.n >= 1 && s.ldw >= s.n && s.ldc >= s.n,
            "split_k_reduce: groups={} m={} n={} ldw={} ldc={}", s.groups, s.m, s.n, s.ldw, s.ldc);
  CNN_CHECK(d_work && d_c, "split_k_reduce: null workspace or C");
  CNN_CHECK((reinterpret_cast<uintptr_t>(d_work) & 15u) == 0 && s.ldw % 4 == 0,
            "split_k_reduce: the workspace must be 16-byte aligned with ldw ({}) a multiple of 4",
            s.ldw);
  const int64_t threads = int64_t(s.m) * ((s.n + 3) / 4);
  const int64_t blocks = ceil_div<int64_t>(threads, kThreads);
  CNN_CHECK(blocks < (int64_t{1} << 31), "split_k_reduce: {} blocks", blocks);
  const bool vec_c = (reinterpret_cast<uintptr_t>(d_c) & 15u) == 0 && s.ldc % 4 == 0;
  split_k_reduce_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(d_work, s, e, d_c, vec_c);
  CNN_LAUNCH_CHECK("split_k_reduce");
}

}  // namespace cnn
