// Int8 convolution on tensor cores: an implicit GEMM with mma.sync m16n8k32 (s8 x s8 -> s32).
//   GEMM rows    conv outputs, grouped by pool window: row m of a block is window element
//                m % WIN of pooled position P0 + m / WIN (WIN = pool_kh * pool_kw, 1 without a
//                pool), so that every window lies inside one block and the max-pool stays fused
//                (overlapping windows recompute their shared outputs, as the direct kernel does)
//   GEMM columns output channels
//   reduction    k = (r, q, ci), ci fastest: the order of the activations' NHWC layout, so four
//                consecutive k are one aligned 4-byte word of x (channels are padded to 4), and
//                sixteen are one 16-byte chunk when CGP and CP are multiples of 16
// Block tile 128 x 64 x 64 bytes, 8 warps of 32 x 32, a 3-stage cp.async pipeline; shared memory
// rows of 64 bytes with their 16-byte chunks XOR-swizzled by (row / 2) % 4, so the fragment loads
// of a warp hit 32 different banks. The epilogue is the one of qconv.h, with the intrinsics whose
// rounding the CPU twin reproduces (__int2float_rn, __fmaf_rn, __float2int_rn): the per-output
// values go through shared memory, then each output takes the max over its window's rows in the
// CPU twin's order.
// Split-K (qconv.h): launched in clusters of (1, 1, splits), block z of a cluster runs k-tiles
// [z T / splits, (z + 1) T / splits) of the T, writes its int32 partial tile to its own shared
// memory, and after a cluster barrier sums, for a band of the tile's pooled positions, every
// block's partials in rank order through distributed shared memory before the same epilogue.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>
#include <map>
#include <mutex>

#include "kernels/common/ptx.cuh"
#include "kernels/gemm/wgmma_ptx.cuh"
#include "kernels/quant/qconv_cuda.h"
#include "kernels/quant/qconv_epilogue.cuh"
#include "kernels/quant/qconv_mma_tile.cuh"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kBM = kQIgemmTileM, kBN = kQIgemmTileN, kBK = kQIgemmTileK;
constexpr int kStages = 3, kThreads = 256;
constexpr int kStageA = kBM * kBK, kStageB = kBN * kBK;  // bytes
constexpr int kSmemPipe = kStages * (kStageA + kStageB);
constexpr int kSmemEpilogue = kBM * kBN * 4;  // float values at most
// The int32 partial tile of a split: rows padded by 8 words, so that the accumulator stores of
// a warp (8 rows x 4 column pairs) fill two wavefronts instead of eight.
constexpr int kSplitLd = kBN + 8;
constexpr int kSmemSplit = kBM * kSplitLd * 4;
constexpr int kSmemMax = kSmemPipe > kSmemEpilogue ? kSmemPipe : kSmemEpilogue;
constexpr int kSmem = kSmemMax > kSmemSplit ? kSmemMax : kSmemSplit;
static_assert(kBK == 64 && kBN == 64 && kBM == 128, "the thread mappings below assume these");

struct Dims {
  int npp;  // pooled positions N * PH * PW
  int win;  // pool window elements
  int ppb;  // pooled positions per block: kBM / win
  int k;    // KH * KW * CGP
  int kp;   // k rounded up to kBK: the packed weights' row length
  int oh, ow, ph, pw;
  ptx::FastDiv div_win, div_pkw, div_pw, div_ph, div_cgp, div_kw;
};

using qmma::cp_async16;
using qmma::cp_async4;
using qmma::mma_s8;
using qmma::swizzle;
static_assert(kBK == qmma::kRowBytes, "the shared swizzle is for 64-byte rows");

using qepilogue::lowest;

// Where block row m reads its input: false for rows past the block's pooled positions and for
// window elements in the pool's padding.
__device__ __forceinline__ bool decode_row(const QConvShape& s, const Dims& d, int pp0, int m,
                                           int& base, int& iy0, int& ix0) {
  const int p = d.div_win.div(m);
  const int wi = m - p * d.win;
  const int pp = pp0 + p;
  if (p >= d.ppb || pp >= d.npp) return false;
  const int t = d.div_pw.div(pp);
  const int px = pp - t * d.pw;
  const int img = d.div_ph.div(t);
  const int py = t - img * d.ph;
  const int r = d.div_pkw.div(wi);
  const int q = wi - r * s.pool_kw;
  const int y = py * s.pool_sh - s.pool_ph + r;
  const int xo = px * s.pool_sw - s.pool_pw + q;
  if (y < 0 || y >= d.oh || xo < 0 || xo >= d.ow) return false;
  base = img * s.h * s.w * s.cp;
  iy0 = y * s.stride_h - s.pad_h;
  ix0 = xo * s.stride_w - s.pad_w;
  return true;
}

// Thread mapping: block (bx, by) computes the outputs of pooled positions [bx * ppb, +ppb) and
// channels [by * 64, +64) (with split-K, block z of the cluster its k-tiles of them, and in the
// epilogue thread i the 4 channels 4 (i % 16) of the band's positions i / 16 + 16 j); warp w owns
// GEMM rows 32 (w / 2) .. +31 and columns 32 (w % 2) .. +31 of the block tile (2 x 4 mma tiles); in
// the epilogue, thread i writes the outputs (position, channel) = divmod(i + 256 j, 64) of the
// block, the channel fastest. Loads: A (the im2col gather) by 4-byte words, thread i owning word i
// % 16 of rows i / 16 + 16 j (kVec16: 16-byte chunk i % 4 of rows i / 4 + 64 j); B by one 16-byte
// chunk per thread. Two blocks an SM: at most 128 registers a thread, which ptxas reaches without
// spilling (left free, it chose 64 and spilled in the 16-byte variant).
template <class T, bool kVec16>
__global__ void __launch_bounds__(kThreads, 2)
    qconv_igemm(QConvShape s, Dims d, const int8_t* __restrict__ d_x,
                const int8_t* __restrict__ d_w, const float* __restrict__ d_mult,
                const float* __restrict__ d_add, bool relu, int out_stride, T* __restrict__ d_y) {
  ptx::griddep_enter();
  __shared__ __align__(128) uint8_t smem[kSmem];
  __shared__ bool row_ok[kBM];
  uint8_t* const sa = smem;                      // kStages x (kBM, kBK)
  uint8_t* const sb = smem + kStages * kStageA;  // kStages x (kBN, kBK)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tg = lane & 3;
  const int pp0 = blockIdx.x * d.ppb;
  const int n0 = blockIdx.y * kBN;
#if __CUDA_ARCH__ >= 900
  const int rank = int(ptx::cluster_rank()), nsplit = int(ptx::cluster_size());
#else
  constexpr int rank = 0, nsplit = 1;
#endif
  const int kt_begin = int(int64_t(d.kp / kBK) * rank / nsplit);
  const int kt_end = int(int64_t(d.kp / kBK) * (rank + 1) / nsplit);

  constexpr int kRows = kVec16 ? kBM * 4 / kThreads : kBM * 16 / kThreads;  // 2 or 8
  constexpr int kRowStep = kThreads / (kVec16 ? 4 : 16);
  const int col = kVec16 ? tid & 3 : tid & 15;  // chunk or word of the rows this thread loads
  const int row0 = kVec16 ? tid >> 2 : tid >> 4;
  int base[kRows], iy0[kRows], ix0[kRows];
  bool ok[kRows];
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    base[j] = 0, iy0[j] = 0, ix0[j] = 0;
    ok[j] = decode_row(s, d, pp0, row0 + j * kRowStep, base[j], iy0[j], ix0[j]);
  }
  if (tid < kBM) {
    int b, y, x;
    row_ok[tid] = decode_row(s, d, pp0, tid, b, y, x);
  }

  const int8_t* const wrow = d_w + int64_t(n0 + (tid >> 2)) * d.kp + (tid & 3) * 16;
  auto load_stage = [&](int slot, int k0) {
    // A: the gather of this thread's rows at reduction index k.
    const int k = k0 + col * (kVec16 ? 16 : 4);
    const bool k_ok = k < d.k;
    const int rq = d.div_cgp.div(k);
    const int c = k - rq * s.cgp;
    const int r = d.div_kw.div(rq);
    const int dy = r * s.dil_h, dx = (rq - r * s.kw) * s.dil_w;
    uint8_t* const a = sa + slot * kStageA;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int m = row0 + j * kRowStep;
      const int iy = iy0[j] + dy, ix = ix0[j] + dx;
      const bool valid = k_ok && ok[j] && iy >= 0 && iy < s.h && ix >= 0 && ix < s.w;
      const int8_t* src = valid ? d_x + base[j] + (iy * s.w + ix) * s.cp + c : d_x;
      if (kVec16)
        cp_async16(a + swizzle(m, col * 4), src, valid);
      else
        cp_async4(a + swizzle(m, col), src, valid);
    }
    // B: the packed weights are zero padded to whole tiles.
    const int n = tid >> 2;
    cp_async16(sb + slot * kStageB + swizzle(n, (tid & 3) * 4), wrow + k0, true);
  };

  int32_t acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0;

  const int kt_count = kt_end - kt_begin;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < kt_count) load_stage(st, (kt_begin + st) * kBK);
    ptx::cp_async_commit();
  }
  const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
  for (int kt = 0; kt < kt_count; ++kt) {
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt landed for all; stage kt - 1 is no longer read
    const int next = kt + kStages - 1;
    if (next < kt_count) load_stage(next % kStages, (kt_begin + next) * kBK);
    ptx::cp_async_commit();
    const uint8_t* const a = sa + (kt % kStages) * kStageA;
    const uint8_t* const b = sb + (kt % kStages) * kStageB;
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      uint32_t af[2][4], bf[4][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = wm + i * 16 + g;
        af[i][0] = *reinterpret_cast<const uint32_t*>(a + swizzle(row, kk * 8 + tg));
        af[i][1] = *reinterpret_cast<const uint32_t*>(a + swizzle(row + 8, kk * 8 + tg));
        af[i][2] = *reinterpret_cast<const uint32_t*>(a + swizzle(row, kk * 8 + tg + 4));
        af[i][3] = *reinterpret_cast<const uint32_t*>(a + swizzle(row + 8, kk * 8 + tg + 4));
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = wn + j * 8 + g;
        bf[j][0] = *reinterpret_cast<const uint32_t*>(b + swizzle(n, kk * 8 + tg));
        bf[j][1] = *reinterpret_cast<const uint32_t*>(b + swizzle(n, kk * 8 + tg + 4));
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_s8(acc[i][j], af[i], bf[j]);
    }
  }
  ptx::cp_async_wait<0>();
  __syncthreads();  // the pipeline's buffers become the epilogue's

#if __CUDA_ARCH__ >= 900
  if (nsplit > 1) {
    int32_t* const part = reinterpret_cast<int32_t*>(smem);  // (kBM, kSplitLd)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int v2 = 0; v2 < 2; ++v2) {
          const int row = wm + i * 16 + g + v2 * 8, cl = wn + j * 8 + tg * 2;
          *reinterpret_cast<int2*>(part + row * kSplitLd + cl) =
              make_int2(acc[i][j][v2 * 2], acc[i][j][v2 * 2 + 1]);
        }
    ptx::cluster_sync();  // every block's partial tile is complete
    // This block's band of pooled positions; a thread owns 4 channels of one position.
    const int p_lo = d.ppb * rank / nsplit, p_hi = d.ppb * (rank + 1) / nsplit;
    for (int idx = tid; idx < (p_hi - p_lo) * (kBN / 4); idx += kThreads) {
      const int p = p_lo + idx / (kBN / 4), c4 = (idx % (kBN / 4)) * 4;
      const int pp = pp0 + p, o0 = n0 + c4;
      if (pp >= d.npp || o0 >= out_stride) continue;
      float m[4], ad[4];
      T best[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const bool live = o0 + c < s.oc;
        m[c] = live ? __ldg(d_mult + o0 + c) : 0.f, ad[c] = live ? __ldg(d_add + o0 + c) : 0.f;
        best[c] = lowest<T>();
      }
      for (int wi = 0; wi < d.win; ++wi) {
        const int row = p * d.win + wi;
        if (!row_ok[row]) continue;
        const uint32_t local = ptx::smem_u32(part + row * kSplitLd + c4);
        int4 sum = ptx::ld_cluster_s32x4(ptx::map_rank(local, 0));
        for (int q = 1; q < nsplit; ++q) {
          const int4 v = ptx::ld_cluster_s32x4(ptx::map_rank(local, uint32_t(q)));
          sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
        }
        const int32_t sums[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const T t = qepilogue::value<T>(sums[c], m[c], ad[c], relu);
          best[c] = t > best[c] ? t : best[c];
        }
      }
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (o0 + c < out_stride)
          d_y[int64_t(pp) * out_stride + o0 + c] = o0 + c < s.oc ? best[c] : T(0);
    }
    ptx::cluster_sync();  // no block leaves while another still reads its partial tile
    return;
  }
#endif

  T* const e = reinterpret_cast<T*>(smem);  // (kBM, kBN) epilogue values
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int cl = wn + j * 8 + tg * 2 + h;
      const int o = n0 + cl;
      const bool live = o < s.oc;
      const float m = live ? __ldg(d_mult + o) : 0.f, ad = live ? __ldg(d_add + o) : 0.f;
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int v2 = 0; v2 < 2; ++v2) {
          const int row = wm + i * 16 + g + v2 * 8;
          const T t = qepilogue::value<T>(acc[i][j][v2 * 2 + h], m, ad, relu);
          e[row * kBN + cl] = t;
        }
    }
  __syncthreads();

  for (int idx = tid; idx < d.ppb * kBN; idx += kThreads) {
    const int p = idx / kBN, cl = idx % kBN;
    const int pp = pp0 + p, o = n0 + cl;
    if (pp >= d.npp || o >= out_stride) continue;
    T best = lowest<T>();
    for (int wi = 0; wi < d.win; ++wi) {
      const int m = p * d.win + wi;
      if (!row_ok[m]) continue;
      const T t = e[m * kBN + cl];
      best = t > best ? t : best;
    }
    d_y[int64_t(pp) * out_stride + o] = o < s.oc ? best : T(0);
  }
}

// Thread-block clusters: a device of compute capability 9.0 or later, and a kernel compiled for
// one (the cluster code of the kernel exists from sm_90 on). Asked once per device and kept
// (cudaFuncGetAttributes costs host time on every call); thread-safe.
bool clusters_available() {
  int dev = 0;
  CNN_CUDA_CHECK(cudaGetDevice(&dev));
  static std::mutex mu;
  static std::map<int, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(dev);
  if (it != known.end()) return it->second;
  int major = 0;
  CNN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  cudaFuncAttributes fa{};
  CNN_CUDA_CHECK(cudaFuncGetAttributes(&fa, qconv_igemm<int8_t, true>));
  return known[dev] = major >= 9 && fa.ptxVersion >= 90;
}

// The split-K launch is wgmma::launch_split_k_clusters' (grid (tiles x, tiles y, splits), the
// splits halved until the device can place a cluster, that answer cached per device); without
// splits a plain launch, so that GPUs without clusters run the kernel too.
template <class T>
void launch(const QConvShape& s, const int8_t* d_x, const int8_t* d_w, const QEpilogue& ep,
            int out_stride, T* d_y, int splits, cudaStream_t stream) {
  Dims d;
  d.oh = s.oh(), d.ow = s.ow(), d.ph = s.ph(), d.pw = s.pw();
  d.npp = s.n * d.ph * d.pw;
  d.win = s.pool_kh * s.pool_kw;
  d.ppb = kBM / d.win;
  d.k = s.kh * s.kw * s.cgp;
  d.kp = ceil_div(d.k, kBK) * kBK;
  d.div_win = ptx::FastDiv(d.win), d.div_pkw = ptx::FastDiv(s.pool_kw);
  d.div_pw = ptx::FastDiv(d.pw), d.div_ph = ptx::FastDiv(d.ph);
  d.div_cgp = ptx::FastDiv(s.cgp), d.div_kw = ptx::FastDiv(s.kw);
  const bool vec16 =
      s.cgp % 16 == 0 && s.cp % 16 == 0 && reinterpret_cast<uintptr_t>(d_x) % 16 == 0;
  const auto kernel = vec16 ? qconv_igemm<T, true> : qconv_igemm<T, false>;
  const dim3 tiles(unsigned(ceil_div(d.npp, d.ppb)), unsigned(ceil_div(out_stride, kBN)));
  if (splits > 1) {
    wgmma::launch_split_k_clusters(kernel, tiles, splits, kThreads, 0, stream, "qconv_igemm", s, d,
                                   d_x, d_w, ep.mult, ep.add, ep.relu, out_stride, d_y);
    return;
  }
  kernel<<<tiles, kThreads, 0, stream>>>(s, d, d_x, d_w, ep.mult, ep.add, ep.relu, out_stride, d_y);
  CNN_LAUNCH_CHECK("qconv_igemm");
}

template <class T>
void forward(const QConvShape& s, const int8_t* d_x, const int8_t* d_w, const QEpilogue& ep,
             int out_stride, T* d_y, QIgemmTile tile, int splits, cudaStream_t stream) {
  const bool clusters = clusters_available();
  const QIgemmPlan plan = qconv_igemm_plan(s, wgmma::sm_count(), tile, clusters ? splits : 1);
  if (plan.tile == QIgemmTile::Conv128x64)
    launch<T>(s, d_x, d_w, ep, out_stride, d_y, plan.splits, stream);
  else
    qconv_linear_mma_forward_cuda(s, d_x, d_w, ep, d_y, plan.tile, plan.splits, stream);
}

}  // namespace

bool qconv_clusters_available() {
  return clusters_available();
}

void qconv_igemm_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w_packed,
                              const QEpilogue& ep, int8_t* d_y, QIgemmTile tile, int splits,
                              cudaStream_t stream) {
  forward<int8_t>(s, d_x, d_w_packed, ep, s.ocp, d_y, tile, splits, stream);
}

void qconv_igemm_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w_packed,
                              const QEpilogue& ep, float* d_y, QIgemmTile tile, int splits,
                              cudaStream_t stream) {
  forward<float>(s, d_x, d_w_packed, ep, s.oc, d_y, tile, splits, stream);
}

}  // namespace cnn
