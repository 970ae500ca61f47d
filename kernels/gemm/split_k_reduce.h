#pragma once
// The second stage of a GEMM whose k is split beyond one thread-block cluster (gemm_wgmma.h,
// WgmmaOptions::groups): each group of splits has written its partial product W[g] (m, n), row
// stride ldw, into a workspace; this sums them in group order g = 0, 1, ..., groups - 1 (so the
// result is bitwise repeatable) and applies the GEMM epilogue of gemm_cuda.h in the order of
// gemm_wgmma's own epilogue:
//   v = alpha * sum; v = fma(beta, C, v) (beta == 0 reads no C); v += bias[col]; ReLU (NaN passes).
// The CPU twin does the same float operations in the same order: the two agree bitwise.
#include <cstddef>
#include <cstdint>

#include "runtime/stream.h"

namespace cnn {

struct SplitKReduceShape {
  int groups, m, n;  // groups >= 1, m, n >= 1
  int64_t ldw;       // the workspace's row stride: >= n; a multiple of 4 on the GPU
  int64_t ldc;       // >= n
};

struct GemmEpilogue {
  float alpha = 1.f, beta = 0.f;
  const float* bias = nullptr;  // (n) or null
  bool relu = false;
};

// Floats a workspace of `groups` partial products of (m, n) takes: rows padded to 4 floats, so
// that every row starts 16-byte aligned.
std::size_t split_k_work_floats(int groups, int m, int n);

// work: (groups, m, ldw); c: (m, ldc).
void split_k_reduce_cpu(const SplitKReduceShape& s, const float* work, const GemmEpilogue& e,
                        float* c);

// The same on the GPU, asynchronous on `stream`. d_work 16-byte aligned, ldw a multiple of 4.
void split_k_reduce_cuda(const SplitKReduceShape& s, const float* d_work, const GemmEpilogue& e,
                         float* d_c, cudaStream_t stream);

}  // namespace cnn
