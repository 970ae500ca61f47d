#pragma once
// Small-shape kernels of the dense GEMM (kernels/gemm_small.cu), internal to gemm_cuda.cu.
// Same contract as gemm_cuda.h (row-major C = relu(alpha op(A) op(B) + beta C + bias[col])),
// with op(A), op(B) given by element strides, any values. Each kernel is correct for every
// shape; gemm_cuda picks one only where its shape makes it fast (one small dimension):
//   dot:     one warp per output, k across the lanes (small m*n, long k: fc2 forward)
//   small_m: one block per 32 columns x 16 rows, k across the 8 warps (m <= 16: fc2 dw)
//   small_k: one thread per output, k in a loop (k <= 16: fc2 dx)
// All sums run in a fixed order (no atomics): bitwise repeatable. Arithmetic is FP32 whatever
// the requested precision (these shapes are bound by memory and latency, not by FFMA).
#include <cstdint>

#include "runtime/stream.h"

namespace cnn::gemm_small {

struct Args {
  int m, n, k;
  const float* a;  // op(A)(i, l) = a[i*a_sm + l*a_sk]
  int64_t a_sm, a_sk;
  const float* b;  // op(B)(l, j) = b[l*b_sk + j*b_sn]
  int64_t b_sk, b_sn;
  float* c;  // C(i, j) = c[i*ldc + j]
  int64_t ldc;
  float alpha, beta;
  const float* bias;  // (n) or null
  bool relu;
};

void launch_dot(const Args& p, cudaStream_t stream);
void launch_small_m(const Args& p, cudaStream_t stream);
void launch_small_k(const Args& p, cudaStream_t stream);

}  // namespace cnn::gemm_small
