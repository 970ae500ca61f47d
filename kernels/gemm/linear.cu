// Fully connected layer on the GPU. All three products (forward, input gradient, weight
// gradient) are one GEMM, C (M, N) [+]= op(A) (M, K) * op(B) (K, N), with transpose flags as
// template parameters, an optional accumulate into C, and a bias + ReLU epilogue:
//   forward          y  (n, out) = x (n, in) * w^T          A = x,    B = w^T (w is (out, in))
//   backward_data    dx (n, in)  = dy (n, out) * w          A = dy,   B = w
//   backward_weight  dw (out, in) += dy^T * x               A = dy^T, B = x, accumulate
//                    (or = dy^T * x, not accumulating, where the caller overwrites dw)
// The weight gradient is a plain GEMM over the batch, so it needs no atomics and is
// deterministic. Only db (column sums of dy) has a reduction mode switch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "runtime/cuda_check.h"
#include "kernels/gemm/linear_cuda.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

struct GemmArgs {
  int m, n, k;
  const float* a;  // (M, K) row-major with lda = K, or (K, M) with lda = M when transposed
  int lda;
  const float* b;  // (K, N) row-major with ldb = N, or (N, K) with ldb = K when transposed
  int ldb;
  float* c;  // (M, N) row-major, ldc = N
  int ldc;
  const float* bias;  // (N) or null
  bool relu;
  bool accumulate;  // C = C + A*B instead of C = A*B
};

template <bool kTransA>
__device__ __forceinline__ float load_a(const GemmArgs& g, int m, int k) {
  return kTransA ? __ldg(g.a + int64_t(k) * g.lda + m) : __ldg(g.a + int64_t(m) * g.lda + k);
}
template <bool kTransB>
__device__ __forceinline__ float load_b(const GemmArgs& g, int k, int n) {
  return kTransB ? __ldg(g.b + int64_t(n) * g.ldb + k) : __ldg(g.b + int64_t(k) * g.ldb + n);
}

// The same epilogue for both variants, so naive and tiled differ only in the summation.
__device__ __forceinline__ void store_c(const GemmArgs& g, int m, int n, float acc) {
  float* p = g.c + int64_t(m) * g.ldc + n;
  float v = g.accumulate ? *p + acc : acc;
  if (g.bias) v += __ldg(g.bias + n);
  if (g.relu) v = (v <= 0.f) ? 0.f : v;  // NaN passes, as in relu_forward
  *p = v;
}

// Thread mapping: each thread owns output elements C(m, n), o = m*N + n, grid-stride; it sums
// over k in order.
template <bool kTransA, bool kTransB>
__global__ void gemm_naive(GemmArgs g) {
  ptx::griddep_enter();
  const int64_t total = int64_t(g.m) * g.n;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const int m = int(o / g.n), n = int(o % g.n);
    float acc = 0.f;
    for (int k = 0; k < g.k; ++k)
      acc = fmaf(load_a<kTransA>(g, m, k), load_b<kTransB>(g, k, n), acc);
    store_c(g, m, n, acc);
  }
}

// Thread mapping: block b (1-D grid, b = tile_row * tiles_n + tile_col) owns the C tile rows
// [tile_row*BM, +BM) x cols [tile_col*BN, +BN). Its threads form KS groups; thread (ty, tx) of
// group q owns the TM x TN register micro-tile at rows tile_row*BM + ty*TM, cols
// tile_col*BN + tx*TN, summed over the BK-deep K slices q, q + KS, q + 2 KS, ... (KS > 1 splits K
// inside the block, for shapes with too few tiles to fill the GPU; the groups' partial tiles are
// added in group order at the end, so the result is deterministic). Slices are staged in shared
// memory, zero-filled past the edges so any M, N, K works, and the next slice is fetched into
// registers while the current one is multiplied. Loads are mapped so that consecutive threads
// read consecutive addresses of whichever dimension is contiguous in global memory.
template <int BM, int BN, int BK, int TM, int TN, int KS, bool kTransA, bool kTransB>
__global__ void __launch_bounds__((BM / TM) * (BN / TN) * KS) gemm_tiled(GemmArgs g) {
  ptx::griddep_enter();
  constexpr int kGroup = (BM / TM) * (BN / TN);  // threads per K group
  constexpr int kLoadsA = BM * BK / kGroup, kLoadsB = BN * BK / kGroup;
  static_assert(BM * BK % kGroup == 0 && BN * BK % kGroup == 0, "tile not divisible");
  constexpr int kPad = 4;  // keeps rows 16-byte aligned while spreading stores over banks
  __shared__ __align__(16) float as[KS][BK][BM + kPad];  // A slices, k-major: as[q][k][m]
  __shared__ __align__(16) float bs[KS][BK][BN + kPad];  // B slices: bs[q][k][n]

  const int q = threadIdx.x / kGroup, gt = threadIdx.x % kGroup;
  const int tx = gt % (BN / TN), ty = gt / (BN / TN);
  const int tiles_n = (g.n + BN - 1) / BN;
  const int m0 = int(blockIdx.x / tiles_n) * BM, n0 = int(blockIdx.x % tiles_n) * BN;

  float ra[kLoadsA], rb[kLoadsB];  // the next slice, in flight while the current one is used
  auto fetch = [&](int k0) {
#pragma unroll
    for (int e = 0; e < kLoadsA; ++e) {
      const int idx = gt + e * kGroup;
      const int mm = kTransA ? idx % BM : idx / BK, kk = kTransA ? idx / BM : idx % BK;
      const int m = m0 + mm, k = k0 + kk;
      ra[e] = (m < g.m && k < g.k) ? load_a<kTransA>(g, m, k) : 0.f;
    }
#pragma unroll
    for (int e = 0; e < kLoadsB; ++e) {
      const int idx = gt + e * kGroup;
      const int nn = kTransB ? idx / BK : idx % BN, kk = kTransB ? idx % BK : idx / BN;
      const int n = n0 + nn, k = k0 + kk;
      rb[e] = (n < g.n && k < g.k) ? load_b<kTransB>(g, k, n) : 0.f;
    }
  };
  auto stash = [&] {
#pragma unroll
    for (int e = 0; e < kLoadsA; ++e) {
      const int idx = gt + e * kGroup;
      as[q][kTransA ? idx / BM : idx % BK][kTransA ? idx % BM : idx / BK] = ra[e];
    }
#pragma unroll
    for (int e = 0; e < kLoadsB; ++e) {
      const int idx = gt + e * kGroup;
      bs[q][kTransB ? idx % BK : idx / BN][kTransB ? idx / BK : idx % BN] = rb[e];
    }
  };

  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

  // Every group runs the same number of rounds (slices past K are zeros), so the block-wide
  // barriers below are reached by all threads.
  const int rounds = (g.k + BK * KS - 1) / (BK * KS);
  fetch(q * BK);
  stash();
  __syncthreads();
  for (int r = 0; r < rounds; ++r) {
    const bool more = r + 1 < rounds;
    if (more) fetch(((r + 1) * KS + q) * BK);
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[TM], b[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = as[q][kk][ty * TM + i];
#pragma unroll
      for (int j = 0; j < TN; ++j) b[j] = bs[q][kk][tx * TN + j];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();  // everyone is done reading the slice before it is overwritten
    if (more) {
      stash();
      __syncthreads();
    }
  }

  if constexpr (KS > 1) {
    __shared__ float partial[KS - 1][BM][BN];  // groups 1.. hand their tiles to group 0
    if (q > 0) {
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) partial[q - 1][ty * TM + i][tx * TN + j] = acc[i][j];
    }
    __syncthreads();
    if (q > 0) return;
    for (int p = 0; p < KS - 1; ++p)
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += partial[p][ty * TM + i][tx * TN + j];
  }

#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int m = m0 + ty * TM + i;
    if (m >= g.m) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int n = n0 + tx * TN + j;
      if (n < g.n) store_c(g, m, n, acc[i][j]);
    }
  }
}

// Thread mapping: each thread owns one (column o, chunk r of kLinearDbRowsPerChunk rows) and
// sums dy[i][o] over its rows in order. With one chunk it adds straight into db; otherwise it
// writes scratch[r][o] (deterministic) or atomically adds into db.
__global__ void db_partial(int n, int out, const float* __restrict__ d_dy, float* d_db,
                           float* d_scratch, int chunks, bool deterministic) {
  ptx::griddep_enter();
  const int64_t total = int64_t(out) * chunks;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += stride) {
    const int o = int(t % out), r = int(t / out);
    const int i_end = min(n, (r + 1) * kLinearDbRowsPerChunk);
    float sum = 0.f;
    for (int i = r * kLinearDbRowsPerChunk; i < i_end; ++i)
      sum += __ldg(d_dy + int64_t(i) * out + o);
    if (chunks == 1)
      d_db[o] += sum;
    else if (deterministic)
      d_scratch[int64_t(r) * out + o] = sum;
    else
      atomicAdd(d_db + o, sum);
  }
}

constexpr int kDbColsumWarps = 8;
// Batches up to this size take db_colsum (one launch, no scratch, no atomics); larger ones the
// chunked db_partial (+ db_combine), which spreads the rows over more blocks.
constexpr int kDbColsumMaxRows = 1024;

// Thread mapping: lane l of warp w owns column o = 32 blockIdx.x + l and sums rows w, w + 8, ...
// in order; warp 0 then adds the 8 partials in warp order and accumulates into db. The order is
// fixed, so atomic and deterministic modes give the same bits.
__global__ void __launch_bounds__(32 * kDbColsumWarps)
    db_colsum(int n, int out, const float* __restrict__ d_dy, float* __restrict__ d_db) {
  ptx::griddep_enter();
  __shared__ float part[kDbColsumWarps][32];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int o = blockIdx.x * 32 + lane;
  float sum = 0.f;
  if (o < out) {
#pragma unroll 4
    for (int i = w; i < n; i += kDbColsumWarps) sum += __ldg(d_dy + int64_t(i) * out + o);
  }
  part[w][lane] = sum;
  __syncthreads();
  if (w == 0 && o < out) {
    float total = 0.f;
#pragma unroll
    for (int q = 0; q < kDbColsumWarps; ++q) total += part[q][lane];
    d_db[o] += total;
  }
}

// Thread mapping: each thread owns one column o of db and adds the chunk partials in order.
__global__ void db_combine(int out, int chunks, const float* __restrict__ d_scratch,
                           float* __restrict__ d_db) {
  ptx::griddep_enter();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < out; o += stride) {
    float sum = 0.f;
    for (int r = 0; r < chunks; ++r) sum += d_scratch[int64_t(r) * out + o];
    d_db[o] += sum;
  }
}

constexpr int kThreads1d = 256;
constexpr int64_t kMaxBlocks1d = 65535;

unsigned grid_1d(int64_t work) {
  return static_cast<unsigned>(
      std::clamp<int64_t>(ceil_div<int64_t>(work, kThreads1d), 1, kMaxBlocks1d));
}

// 64x64 tiles when they give enough blocks to fill the GPU; otherwise 32x32 tiles with K split
// four ways inside the block (the batch-128 layers of the reference network have only 32 tiles
// of 64x64, and a long K: 3136).
constexpr int kBigTileBlocks = 256;

template <bool kTransA, bool kTransB>
void launch_gemm(const GemmArgs& g, bool tiled, cudaStream_t stream) {
  if (!tiled) {
    gemm_naive<kTransA, kTransB><<<grid_1d(int64_t(g.m) * g.n), kThreads1d, 0, stream>>>(g);
    CNN_LAUNCH_CHECK("gemm_naive");
    return;
  }
  // A 1-D grid of tiles (x allows 2^31-1 blocks); check_linear_shape bounds M*N by 2^31-1.
  const int64_t big_blocks = ceil_div<int64_t>(g.m, 64) * ceil_div<int64_t>(g.n, 64);
  if (big_blocks >= kBigTileBlocks) {
    gemm_tiled<64, 64, 16, 4, 4, 1, kTransA, kTransB><<<unsigned(big_blocks), 256, 0, stream>>>(g);
    CNN_LAUNCH_CHECK("gemm_tiled<64x64>");
  } else {
    const int64_t blocks = ceil_div<int64_t>(g.m, 32) * ceil_div<int64_t>(g.n, 32);
    gemm_tiled<32, 32, 16, 4, 4, 4, kTransA, kTransB><<<unsigned(blocks), 256, 0, stream>>>(g);
    CNN_LAUNCH_CHECK("gemm_tiled<32x32 split-k 4>");
  }
}

}  // namespace

std::size_t linear_db_scratch_floats(const LinearShape& s) {
  if (s.n <= kDbColsumMaxRows) return 0;
  const int chunks = ceil_div(s.n, kLinearDbRowsPerChunk);
  return chunks > 1 ? std::size_t(chunks) * s.out : 0;
}

void linear_forward_cuda(const LinearShape& s, const float* d_x, const float* d_w, const float* d_b,
                         float* d_y, bool relu, bool tiled, cudaStream_t stream) {
  // y (n, out) = x (n, in) * w^T, w (out, in) read as B^T.
  GemmArgs g{s.n, s.out, s.in, d_x, s.in, d_w, s.in, d_y, s.out, d_b, relu, false};
  launch_gemm<false, true>(g, tiled, stream);
}

void linear_backward_data_cuda(const LinearShape& s, const float* d_dy, const float* d_w,
                               float* d_dx, bool tiled, cudaStream_t stream) {
  // dx (n, in) = dy (n, out) * w (out, in).
  GemmArgs g{s.n, s.in, s.out, d_dy, s.out, d_w, s.in, d_dx, s.in, nullptr, false, false};
  launch_gemm<false, false>(g, tiled, stream);
}

void linear_backward_weight_cuda(const LinearShape& s, const float* d_x, const float* d_dy,
                                 float* d_dw, float* d_db, float* d_scratch, bool tiled,
                                 bool deterministic, bool overwrite_dw, cudaStream_t stream) {
  // dw (out, in) += dy^T (out, n) * x (n, in); dy (n, out) read as A^T. Both kernels store each
  // element once (the tiled one's K groups add up in shared memory first), so either may write.
  GemmArgs g{s.out, s.in, s.n, d_dy, s.out, d_x, s.in, d_dw, s.in, nullptr, false, !overwrite_dw};
  launch_gemm<true, false>(g, tiled, stream);
  if (d_db) linear_bias_grad_cuda(s, d_dy, d_db, d_scratch, deterministic, stream);
}

void linear_bias_grad_cuda(const LinearShape& s, const float* d_dy, float* d_db, float* d_scratch,
                           bool deterministic, cudaStream_t stream) {
  if (s.n <= kDbColsumMaxRows) {
    db_colsum<<<static_cast<unsigned>(ceil_div(s.out, 32)), 32 * kDbColsumWarps, 0, stream>>>(
        s.n, s.out, d_dy, d_db);
    CNN_LAUNCH_CHECK("db_colsum");
    return;
  }
  const int chunks = ceil_div(s.n, kLinearDbRowsPerChunk);
  db_partial<<<grid_1d(int64_t(s.out) * chunks), kThreads1d, 0, stream>>>(
      s.n, s.out, d_dy, d_db, d_scratch, chunks, deterministic);
  CNN_LAUNCH_CHECK("db_partial");
  if (chunks > 1 && deterministic) {
    db_combine<<<grid_1d(s.out), kThreads1d, 0, stream>>>(s.out, chunks, d_scratch, d_db);
    CNN_LAUNCH_CHECK("db_combine");
  }
}

}  // namespace cnn
