// Int8 residual add on the GPU (qadd.h): the formula with the intrinsics whose rounding the CPU
// twin reproduces (__int2float_rn, __fmul_rn, __fmaf_rn, __float2int_rn), so both agree bit for
// bit. Memory bound: four channels (one 4-byte word of each input) per thread.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/quant/qconv_cuda.h"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int8_t qadd_one(int8_t a, int8_t b, float ma, float mb, bool relu) {
  const float sb = __fmul_rn(__int2float_rn(b), mb);
  float v = __fmaf_rn(__int2float_rn(a), ma, sb);
  if (relu) v = v > 0.f ? v : 0.f;
  v = fminf(fmaxf(v, -127.f), 127.f);
  return static_cast<int8_t>(__float2int_rn(v));
}

// Thread mapping: one thread per 4-channel word (img, r, q, c4) of y (N, H, W, CP); channels
// C..CP-1 are written as zero. CP is a multiple of 4, so words never straddle a pixel.
__global__ void qadd_kernel(int64_t words, int cp4, int c, const char4* __restrict__ d_a,
                            const char4* __restrict__ d_b, float ma, float mb, bool relu,
                            char4* __restrict__ d_y) {
  ptx::griddep_enter();
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= words) return;
  const int c0 = int(idx % cp4) * 4;
  const char4 a = d_a[idx], b = d_b[idx];
  char4 y;
  y.x = c0 + 0 < c ? qadd_one(a.x, b.x, ma, mb, relu) : int8_t(0);
  y.y = c0 + 1 < c ? qadd_one(a.y, b.y, ma, mb, relu) : int8_t(0);
  y.z = c0 + 2 < c ? qadd_one(a.z, b.z, ma, mb, relu) : int8_t(0);
  y.w = c0 + 3 < c ? qadd_one(a.w, b.w, ma, mb, relu) : int8_t(0);
  d_y[idx] = y;
}

}  // namespace

void qadd_forward_cuda(const QAddShape& s, const int8_t* d_a, const int8_t* d_b,
                       const QAddScales& k, int8_t* d_y, cudaStream_t stream) {
  const int64_t words = int64_t(s.n) * s.h * s.w * (s.cp / 4);
  if (words == 0) return;
  qadd_kernel<<<unsigned(ceil_div<int64_t>(words, kThreads)), kThreads, 0, stream>>>(
      words, s.cp / 4, s.c, reinterpret_cast<const char4*>(d_a),
      reinterpret_cast<const char4*>(d_b), k.mult_a, k.mult_b, k.relu,
      reinterpret_cast<char4*>(d_y));
  CNN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cnn
