// Dense GEMM on the GPU (see gemm_cuda.h): the shared tiled main loop of gemm_tile.cuh with
// plain strided operand loaders and a bias/ReLU epilogue.
//   _simt: FP32 FFMA, 8x4 register micro-tile per thread (64x64 or 128x32 block tiles)
//   _tf32: mma.sync m16n8k8 TF32, 32x32 warp tiles (same block tiles)
// Small m*n: k is split across the blocks of a thread-block cluster (sm_90), whose partial tiles
// are summed through distributed shared memory in a fixed order before the epilogue.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_check.h"
#include "kernels/gemm_cuda.h"
#include "kernels/gemm_tile.cuh"
#include "kernels/math_util.h"

namespace cnn {
namespace {

// C (M, N) row-major; A element (m, k) at a[m*lda + k] (a_kcontig) or a[k*lda + m]; B element
// (k, n) at b[n*ldb + k] (b_kcontig) or b[k*ldb + n].
struct GemmProblem {
  int M, N, K;
  const float* a;
  int64_t lda;
  bool a_kcontig;
  const float* b;
  int64_t ldb;
  bool b_kcontig;
  float* c;
  int64_t ldc;
  float alpha, beta;
  const float* bias;  // (N) or null
  bool relu;

  static constexpr bool kMFastOut = false;  // row-major C: n runs contiguous
  static constexpr bool kClusterSplit = true;
  static constexpr bool kHasTable = false;

  template <class C>
  struct ALoader : igemm::StridedLoader<C, C::BM> {
    __device__ __forceinline__ ALoader(const GemmProblem& p, int m0, int tid, const int*)
        : igemm::StridedLoader<C, C::BM>(p.a, p.lda, p.a_kcontig, p.M, p.K, m0, tid) {}
  };
  template <class C>
  struct BLoader : igemm::StridedLoader<C, C::BN> {
    __device__ __forceinline__ BLoader(const GemmProblem& p, int n0, int tid, const int*)
        : igemm::StridedLoader<C, C::BN>(p.b, p.ldb, p.b_kcontig, p.N, p.K, n0, tid) {}
  };

  __device__ __forceinline__ void apply(int m, int n, float v, int /*split*/) const {
    float* dst = c + m * ldc + n;
    v *= alpha;
    if (beta != 0.f) v = fmaf(beta, *dst, v);
    if (bias) v += bias[n];
    if (relu) v = (v <= 0.f) ? 0.f : v;  // NaN passes, as in the CPU references
    *dst = v;
  }
};

template <bool kTf32>
using CfgSquare = igemm::Cfg<64, 64, 16, 128, 3, kTf32>;  // the general tile
template <bool kTf32>
using CfgNarrow = igemm::Cfg<128, 32, 16, 128, 3, kTf32>;  // n <= 32 (fc2's n = 10)

template <bool kTf32>
void run_gemm(const GemmProblem& p, cudaStream_t stream) {
  const igemm::DeviceInfo dev = igemm::device_info();
  // Enough blocks for ~2 per SM; split k (cluster, <= 8 ways) when the tile grid alone is short.
  const int64_t target = 2 * static_cast<int64_t>(dev.sms);
  if (p.N <= 32) {
    using C = CfgNarrow<kTf32>;
    const int64_t tiles = ceil_div<int64_t>(p.M, C::BM) * ceil_div<int64_t>(p.N, C::BN);
    const int splits =
        dev.clusters ? igemm::pick_splits(tiles, ceil_div(p.K, C::BK), target, 8, 4) : 1;
    igemm::launch<C>(p, splits, stream, kTf32 ? "gemm_tf32_narrow" : "gemm_simt_narrow");
  } else {
    using C = CfgSquare<kTf32>;
    const int64_t tiles = ceil_div<int64_t>(p.M, C::BM) * ceil_div<int64_t>(p.N, C::BN);
    const int splits =
        dev.clusters ? igemm::pick_splits(tiles, ceil_div(p.K, C::BK), target, 8, 4) : 1;
    igemm::launch<C>(p, splits, stream, kTf32 ? "gemm_tf32" : "gemm_simt");
  }
}

}  // namespace

void gemm_cuda(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* d_a,
               int lda, const float* d_b, int ldb, float beta, float* d_c, int ldc,
               const float* d_bias, bool relu, Precision precision, cudaStream_t stream) {
  CNN_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm_cuda: negative size m={} n={} k={}", m, n, k);
  if (m == 0 || n == 0) return;
  CNN_CHECK(ldc >= n, "gemm_cuda: ldc={} < n={}", ldc, n);
  CNN_CHECK(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n),
            "gemm_cuda: lda={} / ldb={} too small for m={} n={} k={} (trans {} {})", lda, ldb, m, n,
            k, trans_a, trans_b);
  CNN_CHECK(d_c && (k == 0 || (d_a && d_b)), "gemm_cuda: null matrix pointer");
  GemmProblem p{m,       n,   k,   d_a,   lda,  !trans_a, d_b, ldb,
                trans_b, d_c, ldc, alpha, beta, d_bias,   relu};
  if (precision == Precision::TF32)
    run_gemm<true>(p, stream);
  else
    run_gemm<false>(p, stream);
}

}  // namespace cnn
