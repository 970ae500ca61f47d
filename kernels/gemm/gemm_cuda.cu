// Dense GEMM on the GPU (see gemm_cuda.h): dispatch between
//   the 16-byte tile path (gemm_tile_vec.cuh): 64x64 tiles, BK 32, 16-byte cp.async into
//     operand-major shared tiles, FP32 FFMA 8x4 micro-tiles, TF32 / BF16 mma.sync or FP32 as
//     3xTF32 mma.sync (Fp32Math::Tf32x3), cluster split-K; on the tensor cores also 128x128
//     tiles (VecTileWide) for BF16 outputs of many tiles;
//   the strided tile path (gemm_tile.cuh's main loop with plain strided 4-byte loaders):
//     _simt: FP32 FFMA, 8x4 register micro-tile per thread (64x64 or 128x32 block tiles)
//     _tf32: mma.sync m16n8k8 TF32, 32x32 warp tiles (same block tiles);
//   the small-shape kernels of gemm_small.h (one dimension tiny: fc2's n = 10).
// Small m*n: k is split across the blocks of a thread-block cluster (sm_90), whose partial tiles
// are summed through distributed shared memory in a fixed order before the epilogue.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/gemm/gemm_cuda.h"
#include "kernels/gemm/gemm_small.h"
#include "kernels/gemm/gemm_tile.cuh"
#include "kernels/gemm/gemm_tile_vec.cuh"
#include "kernels/gemm/gemm_wgmma.h"
#include "runtime/cuda_check.h"
#include "runtime/env_switches.h"
#include "runtime/math_util.h"

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

using igemm::Mma;
template <Mma kMma>
using CfgSquare = igemm::Cfg<64, 64, 16, 128, 3, kMma>;  // the general tile
template <Mma kMma>
using CfgNarrow = igemm::Cfg<128, 32, 16, 128, 3, kMma>;  // n <= 32 (fc2's n = 10)

constexpr const char* mma_tag(Mma m, const char* simt, const char* tf32, const char* bf16,
                              const char* tf32x3 = "") {
  return m == Mma::Tf32 ? tf32 : m == Mma::Bf16 ? bf16 : m == Mma::Tf32x3 ? tf32x3 : simt;
}

template <Mma kMma>
void run_gemm(const GemmProblem& p, cudaStream_t stream) {
  const igemm::DeviceInfo dev = igemm::device_info();
  // Enough blocks for ~2 per SM; split k (cluster, <= 8 ways) when the tile grid alone is short.
  const int64_t target = 2 * static_cast<int64_t>(dev.sms);
  if (p.N <= 32) {
    using C = CfgNarrow<kMma>;
    const int64_t tiles = ceil_div<int64_t>(p.M, C::BM) * ceil_div<int64_t>(p.N, C::BN);
    const int splits =
        dev.clusters ? igemm::pick_splits(tiles, ceil_div(p.K, C::BK), target, 8, 4) : 1;
    igemm::launch<C>(p, splits, stream,
                     mma_tag(kMma, "gemm_simt_narrow", "gemm_tf32_narrow", "gemm_bf16_narrow"));
  } else {
    using C = CfgSquare<kMma>;
    const int64_t tiles = ceil_div<int64_t>(p.M, C::BM) * ceil_div<int64_t>(p.N, C::BN);
    const int splits =
        dev.clusters ? igemm::pick_splits(tiles, ceil_div(p.K, C::BK), target, 8, 4) : 1;
    igemm::launch<C>(p, splits, stream, mma_tag(kMma, "gemm_simt", "gemm_tf32", "gemm_bf16"));
  }
}

// The 16-byte path: both operands' base 16-byte aligned and leading dimensions multiples of 4.
bool vec_ok(const float* a, int lda, const float* b, int ldb) {
  auto aligned = [](const float* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; };
  return aligned(a) && aligned(b) && lda % 4 == 0 && ldb % 4 == 0;
}

template <Mma kMma, bool kAK, bool kBK, bool kWide>
void run_vec(const vgemm::Problem& p, cudaStream_t stream) {
  using C = std::conditional_t<kWide, vgemm::Cfg<128, 128, 32, 3, kMma, kAK, kBK, 256>,
                               vgemm::Cfg<64, 64, 32, 4, kMma, kAK, kBK>>;
  const igemm::DeviceInfo dev = igemm::device_info();
  const int64_t tiles = ceil_div<int64_t>(p.M, C::BM) * ceil_div<int64_t>(p.N, C::BN);
  // Split k (cluster, <= 8 ways, >= 2 k-tiles of 32 each) until ~2 blocks per SM; the wide tile
  // only until one block per SM: its 2 splits of fc1's weight gradient in BF16 (200 tiles, k =
  // 128) took 31.1 us on the H200 against 18.0 unsplit.
  const int64_t target = (kWide ? 1 : 2) * static_cast<int64_t>(dev.sms);
  const int splits =
      dev.clusters ? igemm::pick_splits(tiles, ceil_div(p.K, C::BK), target, 8, 2) : 1;
  if constexpr (kWide)
    vgemm::launch<C>(
        p, splits, stream,
        mma_tag(kMma, "", "gemm_vec_wide_tf32", "gemm_vec_wide_bf16", "gemm_vec_wide_3xtf32"));
  else
    vgemm::launch<C>(
        p, splits, stream,
        mma_tag(kMma, "gemm_vec_simt", "gemm_vec_tf32", "gemm_vec_bf16", "gemm_vec_3xtf32"));
}

template <Mma kMma, bool kWide = false>
void run_vec_layout(const vgemm::Problem& p, bool a_mcontig, bool b_ncontig, cudaStream_t stream) {
  if (a_mcontig) {
    if (b_ncontig)
      run_vec<kMma, true, true, kWide>(p, stream);
    else
      run_vec<kMma, true, false, kWide>(p, stream);
  } else {
    if (b_ncontig)
      run_vec<kMma, false, true, kWide>(p, stream);
    else
      run_vec<kMma, false, false, kWide>(p, stream);
  }
}

// Auto's wide tile: BF16 outputs of at least 4 blocks of 64 x 64 an SM (so that its 128 x 128
// blocks still fill every SM at least once). H200, fc1's weight gradient (1024 x 3136, k = 128):
// BF16 18.0 us against 19.4 on the 64 x 64 tile, the LeNet step 164.2 against 167.8; in TF32
// the step took 187.8 against 186.8, so TF32 stays on the 64 x 64 tile.
bool vec_wide_fits(int m, int n, Precision precision) {
  if (precision != Precision::BF16) return false;
  const int64_t tiles64 = ceil_div<int64_t>(m, 64) * ceil_div<int64_t>(n, 64);
  return tiles64 >= 4 * static_cast<int64_t>(igemm::device_info().sms);
}

}  // namespace

const char* gemm_path_name(GemmPath path) {
  switch (path) {
    case GemmPath::Auto:
      return "auto";
    case GemmPath::StridedTile:
      return "strided";
    case GemmPath::VecTile:
      return "vec";
    case GemmPath::SmallDot:
      return "small_dot";
    case GemmPath::SmallM:
      return "small_m";
    case GemmPath::SmallK:
      return "small_k";
    case GemmPath::Wgmma:
      return "wgmma";
    case GemmPath::VecTileWide:
      return "vec_wide";
  }
  return "?";
}

GemmPath gemm_cuda_resolve(GemmPath path, bool trans_a, bool trans_b, int m, int n, int k,
                           const float* d_a, int lda, const float* d_b, int ldb,
                           Precision precision, Fp32Math fp32) {
  // Wgmma runs where it can (TF32 or BF16; FP32 as 3xTF32 when asked for and both operands are
  // TMA-aligned; k > 0, an sm_90a build on a cc 9.0 device); elsewhere the call goes the way
  // Auto without the environment's wgmma would.
  auto wgmma_ok = [&] {
    if (k <= 0 || !gemm_wgmma_available()) return false;
    if (precision == Precision::FP32)
      return fp32 == Fp32Math::Tf32x3 && vec_ok(d_a, lda, d_b, ldb);
    return true;
  };
  if (path == GemmPath::Wgmma) {
    if (wgmma_ok()) return path;
    path = GemmPath::Auto;
  } else if (path == GemmPath::Auto && process_env_switches().gemm_path == GemmPathSwitch::Wgmma &&
             wgmma_ok()) {
    return GemmPath::Wgmma;
  }
  if (path == GemmPath::Auto) {
    const GemmPathSwitch env = process_env_switches().gemm_path;
    if (env == GemmPathSwitch::Strided) return GemmPath::StridedTile;
    const bool a_kcontig = !trans_a, b_kcontig = trans_b;
    if (env == GemmPathSwitch::Auto && k > 0) {
      if (a_kcontig && b_kcontig && int64_t(m) * n <= 16384 && k >= 32) return GemmPath::SmallDot;
      if (!b_kcontig && m <= 16 && k <= 512) return GemmPath::SmallM;
      if (!b_kcontig && k <= 16) return GemmPath::SmallK;
      // The wgmma kernel is faster where A is K-contiguous (H200, TF32, fc1 at batch 128:
      // forward 12.9 us against 22.0 for the mma.sync tile, input gradient with B staged by TMA
      // 13.2 against 21.7); the weight gradient (A = dy^T, M-contiguous) stays on the tile,
      // 24.6 us against 31.0. CNN_WGMMA_MN=gather turns the staging off, and then only the
      // all-K-contiguous forward is worth it. BF16 takes the same choice (its mma.sync tile
      // ran fc1 at 22.8 / 24.9 / 22.8 us, cuBLAS at 13.0 / 12.6 / 16.3), and so does FP32 as
      // 3xTF32 (Fp32Math::Tf32x3; the FFMA tile ran fc1's forward and input gradient at 44.0 and
      // 40.9 us).
      if (!trans_a && vec_ok(d_a, lda, d_b, ldb) && wgmma_ok() &&
          (b_kcontig || process_env_switches().wgmma_mn_tma))
        return GemmPath::Wgmma;
    }
    path = vec_wide_fits(m, n, precision) ? GemmPath::VecTileWide : GemmPath::VecTile;
  }
  if ((path == GemmPath::VecTile || path == GemmPath::VecTileWide) &&
      !(k > 0 && vec_ok(d_a, lda, d_b, ldb)))
    return GemmPath::StridedTile;
  if (path == GemmPath::VecTileWide && precision == Precision::FP32 && fp32 != Fp32Math::Tf32x3)
    return GemmPath::VecTile;  // FFMA has no wide tile
  return path;
}

void gemm_cuda_path(GemmPath path, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                    const float* d_a, int lda, const float* d_b, int ldb, float beta, float* d_c,
                    int ldc, const float* d_bias, bool relu, Precision precision,
                    cudaStream_t stream, Fp32Math fp32, GemmWorkspace work) {
  CNN_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm_cuda: negative size m={} n={} k={}", m, n, k);
  if (m == 0 || n == 0) return;
  CNN_CHECK(ldc >= n, "gemm_cuda: ldc={} < n={}", ldc, n);
  CNN_CHECK(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n),
            "gemm_cuda: lda={} / ldb={} too small for m={} n={} k={} (trans {} {})", lda, ldb, m, n,
            k, trans_a, trans_b);
  CNN_CHECK(d_c && (k == 0 || (d_a && d_b)), "gemm_cuda: null matrix pointer");
  const GemmPath use =
      gemm_cuda_resolve(path, trans_a, trans_b, m, n, k, d_a, lda, d_b, ldb, precision, fp32);
  switch (use) {
    case GemmPath::Wgmma: {
      WgmmaOptions opt;
      opt.precision = precision;
      // gemm_wgmma picks the split groups, where the workspace given holds them.
      opt.work = work.ptr;
      opt.work_floats = work.ptr ? work.floats : 0;
      gemm_wgmma(trans_a, trans_b, m, n, k, alpha, d_a, lda, d_b, ldb, beta, d_c, ldc, d_bias, relu,
                 stream, opt);
      return;
    }
    case GemmPath::SmallDot:
    case GemmPath::SmallM:
    case GemmPath::SmallK: {
      gemm_small::Args p{m,
                         n,
                         k,
                         d_a,
                         trans_a ? 1 : int64_t(lda),
                         trans_a ? int64_t(lda) : 1,
                         d_b,
                         trans_b ? 1 : int64_t(ldb),
                         trans_b ? int64_t(ldb) : 1,
                         d_c,
                         ldc,
                         alpha,
                         beta,
                         d_bias,
                         relu};
      if (use == GemmPath::SmallDot)
        gemm_small::launch_dot(p, stream);
      else if (use == GemmPath::SmallM)
        gemm_small::launch_small_m(p, stream);
      else
        gemm_small::launch_small_k(p, stream);
      return;
    }
    case GemmPath::VecTile:
    case GemmPath::VecTileWide: {  // resolved: the wide tile only on the tensor cores
      const bool c_vec = (reinterpret_cast<uintptr_t>(d_c) & 15u) == 0 && ldc % 4 == 0;
      vgemm::Problem p{m, n, k, d_a, lda, d_b, ldb, d_c, ldc, alpha, beta, d_bias, relu, c_vec};
      const bool wide = use == GemmPath::VecTileWide;
      if (precision == Precision::TF32)
        wide ? run_vec_layout<Mma::Tf32, true>(p, trans_a, !trans_b, stream)
             : run_vec_layout<Mma::Tf32>(p, trans_a, !trans_b, stream);
      else if (precision == Precision::BF16)
        wide ? run_vec_layout<Mma::Bf16, true>(p, trans_a, !trans_b, stream)
             : run_vec_layout<Mma::Bf16>(p, trans_a, !trans_b, stream);
      else if (fp32 == Fp32Math::Tf32x3)
        wide ? run_vec_layout<Mma::Tf32x3, true>(p, trans_a, !trans_b, stream)
             : run_vec_layout<Mma::Tf32x3>(p, trans_a, !trans_b, stream);
      else
        run_vec_layout<Mma::Simt>(p, trans_a, !trans_b, stream);
      return;
    }
    default: {
      GemmProblem p{m,       n,   k,   d_a,   lda,  !trans_a, d_b, ldb,
                    trans_b, d_c, ldc, alpha, beta, d_bias,   relu};
      if (precision == Precision::TF32)
        run_gemm<Mma::Tf32>(p, stream);
      else if (precision == Precision::BF16)
        run_gemm<Mma::Bf16>(p, stream);
      else
        run_gemm<Mma::Simt>(p, stream);
    }
  }
}

void gemm_cuda(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* d_a,
               int lda, const float* d_b, int ldb, float beta, float* d_c, int ldc,
               const float* d_bias, bool relu, Precision precision, cudaStream_t stream,
               Fp32Math fp32, GemmWorkspace work) {
  gemm_cuda_path(GemmPath::Auto, trans_a, trans_b, m, n, k, alpha, d_a, lda, d_b, ldb, beta, d_c,
                 ldc, d_bias, relu, precision, stream, fp32, work);
}

std::size_t gemm_cuda_work_floats(int m, int n, int k, Precision precision) {
  if (m <= 0 || n <= 0 || k <= 0 || !gemm_wgmma_available()) return 0;
  return gemm_wgmma_work_floats(m, n, gemm_wgmma_pick_groups(m, n, k, precision));
}

}  // namespace cnn
