// Int8 linear layers on tensor cores: y (M, N) = x (M, K) . w (N, K)^T with mma.sync m16n8k32
// (s8 x s8 -> s32), for the layers of few rows whose 128 x 64 implicit-GEMM tiles (qconv_igemm.cu)
// cover few SMs: LeNet's fc1 at batch 256 is 2 x 16 such tiles. A linear layer needs no im2col
// gather (x's rows are the reduction, contiguous), so this kernel loads whole 16-byte chunks
// (4-byte words where K is not a multiple of 16), and offers smaller or wider tiles
// (QIgemmTile: 64x64, 64x128, 128x128) with deeper cp.async pipelines than the conv kernel's 3
// stages, so that more blocks run and each keeps more loads in flight. The weights are the ones
// qconv_pack_igemm_weights repacked ((OCT, KP), zero padded to 64 rows and 64-byte k-tiles; a
// 128-wide tile reads rows past OCT as zeros).
// Block: 8 warps, 2 (rows) x 4 (columns), each a (BM / 2) x (BN / 4) warp tile of 16 x 8 mma
// tiles; shared memory rows of 64 bytes with their 16-byte chunks XOR-swizzled by (row / 2) % 4
// (the conv kernel's layout: the fragment loads of a warp hit 32 different banks).
// Split-K as in qconv_igemm.cu: clusters of (1, 1, splits), block z sums k-tiles
// [z T / splits, (z + 1) T / splits), writes its int32 partial tile to its shared memory, and
// after a cluster barrier sums a band of the tile's rows over every block in rank order through
// distributed shared memory (exact: the bits do not depend on the split) before the epilogue of
// qconv.h (qconv_epilogue.cuh).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/gemm/wgmma_ptx.cuh"
#include "kernels/quant/qconv_cuda.h"
#include "kernels/quant/qconv_epilogue.cuh"
#include "kernels/quant/qconv_mma_tile.cuh"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kBK = kQIgemmTileK, kThreads = 256;
static_assert(kBK == 64, "64-byte shared memory rows: the swizzle below assumes them");

// Per tile: pipeline stages (deeper for the smaller tiles, whose stages are smaller) and shared
// memory: the pipeline, or a split's int32 partial tile (rows padded by 8 words so that a warp's
// accumulator stores fill two wavefronts instead of eight), whichever is larger.
//   64x64:   6 stages x 8 KB = 48 KB (partials 18 KB)
//   64x128:  5 stages x 12 KB = 60 KB (partials 34 KB)
//   128x128: 4 stages x 16 KB = 64 KB (partials 68 KB)
template <int BM, int BN>
struct Tile {
  static constexpr int kStages = BM + BN <= 128 ? 6 : (BM + BN <= 192 ? 5 : 4);
  static constexpr int kStageA = BM * kBK, kStageB = BN * kBK;
  static constexpr int kPartLd = BN + 8;
  static constexpr int kSmemPipe = kStages * (kStageA + kStageB);
  static constexpr int kSmemPart = BM * kPartLd * 4;
  static constexpr int kSmem = kSmemPipe > kSmemPart ? kSmemPipe : kSmemPart;
  // With a fused classifier: the tile's int8 outputs after the above (rows padded by 4 bytes so
  // that the threads of a warp, reading words of different rows, spread over the banks), then
  // the classifier's weights of the tile's columns, (kQLinearDp4aMaxCols, BN) bytes, staged at
  // the start so that the classifier's dot products read only shared memory.
  static constexpr int kOutLd = BN + 4;
  static constexpr int kSmemFused = kSmem + BM * kOutLd + kQLinearDp4aMaxCols * BN;
  static constexpr int kMi = BM / 32, kNi = BN / 32;  // mma tiles of a warp: rows, columns
  // Two blocks an SM where their registers (at most 128 a thread) and shared memory allow it.
  static constexpr int kMinBlocks = BM * BN <= 64 * 128 ? 2 : 1;
};

struct MmaDims {
  int m, n;        // rows (images), columns (output channels)
  int k, kp;       // reduction, and its length rounded up to kBK (the packed rows' length)
  int oct;         // the packed weights' rows
  int out_stride;  // y's row stride: OCP (int8) or OC (float)
};

// The classifier fused after the layer (qconv_fused_classifier.h): y2 (M, oc) = the layer's
// int8 outputs (M, N) . w (oc, k)^T through its own epilogue, k = the layer's OCP.
struct Classifier {
  const int8_t* w;  // (oc, k), k a multiple of 4
  int oc, k;
  const float* mult;
  const float* add;
  bool relu;
  int32_t* acc;        // (M, oc), zero between calls
  uint32_t* arrivals;  // (row tiles), zero between calls
  float* y;            // (M, oc) logits
};

// fence.acq_rel.gpu: orders this thread's (and, after a bar.sync, its block's) memory
// operations before and after it at GPU scope; lighter than __threadfence's fence.sc.
__device__ __forceinline__ void fence_acq_rel_gpu() {
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
}

// ld.relaxed.gpu: a strong load at GPU scope (never a stale L1 line), ordered after the
// block's acquire (thread 0's fence, then bar.sync) without an acquire of its own per element.
__device__ __forceinline__ int32_t ld_relaxed_gpu(const int32_t* p) {
  int32_t v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The classifier's weights of the tile's columns [n0, n0 + BN) into shared memory, (oc, BN)
// bytes: 4-byte cp.asyncs of the caller's current group (columns past the layer's OCP are not
// loaded and never read).
template <int BN>
__device__ __forceinline__ void stage_classifier_weights(const Classifier& cls, uint8_t* sw,
                                                         int n0) {
  const int words = min(BN, cls.k - n0) / 4;
  for (int i = threadIdx.x; i < cls.oc * (BN / 4); i += kThreads) {
    const int o = i / (BN / 4), q = i % (BN / 4);
    if (q < words)
      qmma::cp_async4(sw + o * BN + q * 4, cls.w + int64_t(o) * cls.k + n0 + q * 4, true);
  }
}

// The fused classifier's part of a block of the layer, once the block's int8 outputs of rows
// [r_lo, r_hi) of its tile are in `out` (row stride kOutLd; columns past the layer's OCP
// unwritten, never read) and the classifier's weights of its columns in `sw` (rows of BN
// bytes, stage_classifier_weights). Thread i computes the dot products (rows r_lo + i / oc,
// output o = i % oc, then + 256 / oc rows) over the tile's BN columns with dp4a, from shared
// memory only, and adds them to cls.acc with reductions (int32 sums: exact and
// order-independent, so the bits do not depend on scheduling). Then the block arrives on its
// row tile's counter; the last of the row tile's arrivals (every column tile, every split rank)
// applies the classifier's epilogue to the row tile's sums, writes the logits and zeroes the
// sums and the counter for the next call.
template <int BM, int BN>
__device__ __forceinline__ void classify_tile(const MmaDims& d, const Classifier& cls,
                                              const uint8_t* out, const uint8_t* sw, int m0, int n0,
                                              int r_lo, int r_hi, int expected) {
  using P = Tile<BM, BN>;
  const int tid = threadIdx.x;
  __syncthreads();  // `out` complete
  const int pairs = (r_hi - r_lo) * cls.oc;
  // Words of the tile's columns that exist in the classifier's reduction (k = the layer's OCP).
  const int words = min(BN, cls.k - n0) / 4;
  for (int p = tid; p < pairs; p += kThreads) {
    const int r = r_lo + p / cls.oc, o = p % cls.oc;
    if (m0 + r >= d.m) continue;
    const int* const xr = reinterpret_cast<const int*>(out + r * P::kOutLd);
    const int* const wr = reinterpret_cast<const int*>(sw + o * BN);
    int32_t sum = 0;
#pragma unroll 4
    for (int q = 0; q < words; ++q) sum = __dp4a(xr[q], wr[q], sum);
    atomicAdd(cls.acc + int64_t(m0 + r) * cls.oc + o, sum);
  }
  // Release: every thread's reductions precede (bar.sync) thread 0's fence and arrival, so a
  // block that sees the arrival count sees the sums (the fence is cumulative).
  __syncthreads();
  __shared__ int last;
  if (tid == 0) {
    fence_acq_rel_gpu();
    const uint32_t before = atomicAdd(cls.arrivals + blockIdx.x, 1u);
    last = before + 1 == uint32_t(expected);
    if (last) fence_acq_rel_gpu();  // acquire: the sums read below are the arrivals' sums
  }
  __syncthreads();
  if (!last) return;
  const int rows = min(BM, d.m - m0);
  for (int p = tid; p < rows * cls.oc; p += kThreads) {
    const int o = p % cls.oc;
    int32_t* const a = cls.acc + int64_t(m0) * cls.oc + p;
    const int32_t sum = ld_relaxed_gpu(a);
    cls.y[int64_t(m0) * cls.oc + p] =
        qepilogue::value<float>(sum, __ldg(cls.mult + o), __ldg(cls.add + o), cls.relu);
    *a = 0;  // the next call's start (ordered before it by the stream)
  }
  if (tid == 0) cls.arrivals[blockIdx.x] = 0;
}

using qmma::cp_async16;
using qmma::cp_async4;
using qmma::mma_s8;
using qmma::swizzle;
static_assert(kBK == qmma::kRowBytes, "the shared swizzle is for 64-byte rows");

// Thread mapping: block (bx, by, z) computes y's rows [bx BM, +BM) and columns [by BN, +BN)
// (with split-K, block z of the cluster its k-tiles of them); warp w owns tile rows
// (w / 4) BM / 2 .. +BM / 2 and columns (w % 4) BN / 4 .. +BN / 4, and writes its outputs from
// its accumulators (without split-K); with split-K thread i sums 4 columns 4 (i % (BN / 4)) of
// rows i / (BN / 4) + 256 / (BN / 4) j of the block's band. Loads: A by 16-byte chunk i % 4 of
// rows i / 4 + 64 j (kVec16) or 4-byte word i % 16 of rows i / 16 + 16 j; B by 16-byte chunk
// i % 4 of rows i / 4 + 64 j.
// ptxas -v (sm_90, 16-byte / 4-byte loads), no spills: 64x64 79 / 80 registers, 64x128 105 /
// 112 (both at most 128: two blocks an SM), 128x128 141 / 177 (one block an SM); dynamic shared
// memory 48 / 60 / 68 KB (Tile::kSmem). With the classifier fused: 72 / 75, 112 / 117, 153 /
// 163 registers, no spills; shared memory + BM x (BN + 4) + 16 x BN bytes (Tile::kSmemFused).
// kFuse (T int8 only): the classifier after the layer as well (classify_tile), from the block's
// int8 outputs, which it also keeps in shared memory after the pipeline (Tile::kSmemFused).
template <class T, int BM, int BN, bool kVec16, bool kFuse>
__global__ void __launch_bounds__(kThreads, Tile<BM, BN>::kMinBlocks)
    qconv_linear_mma(MmaDims d, const int8_t* __restrict__ d_x, const int8_t* __restrict__ d_w,
                     const float* __restrict__ d_mult, const float* __restrict__ d_add, bool relu,
                     T* __restrict__ d_y, Classifier cls) {
  ptx::griddep_enter();
  static_assert(!kFuse || sizeof(T) == 1, "the fused classifier reads the layer's int8 outputs");
  using P = Tile<BM, BN>;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* const sa = smem;                            // kStages x (BM, kBK)
  uint8_t* const sb = smem + P::kStages * P::kStageA;  // kStages x (BN, kBK)
  uint8_t* const sout = smem + P::kSmem;               // kFuse: (BM, kOutLd) int8 outputs
  uint8_t* const sw2 = sout + BM * P::kOutLd;          // kFuse: the classifier's weights
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tg = lane & 3;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
#if __CUDA_ARCH__ >= 900
  const int rank = int(ptx::cluster_rank()), nsplit = int(ptx::cluster_size());
#else
  constexpr int rank = 0, nsplit = 1;
#endif
  const int kt_begin = int(int64_t(d.kp / kBK) * rank / nsplit);
  const int kt_end = int(int64_t(d.kp / kBK) * (rank + 1) / nsplit);

  // A: this thread's rows of x (row pointers clamped to x itself past M, never read there).
  constexpr int kARows = kVec16 ? BM * 4 / kThreads : BM * 16 / kThreads;
  constexpr int kARowStep = kThreads / (kVec16 ? 4 : 16);
  const int acol = kVec16 ? tid & 3 : tid & 15;  // chunk or word of the rows this thread loads
  const int arow0 = kVec16 ? tid >> 2 : tid >> 4;
  const int8_t* arow[kARows];
#pragma unroll
  for (int j = 0; j < kARows; ++j) {
    const int m = m0 + arow0 + j * kARowStep;
    arow[j] = m < d.m ? d_x + int64_t(m) * d.k + acol * (kVec16 ? 16 : 4) : nullptr;
  }
  // B: this thread's rows of the packed weights (zero padded in k; rows past OCT read as zeros).
  constexpr int kBRows = BN * 4 / kThreads;
  const int8_t* brow[kBRows];
#pragma unroll
  for (int j = 0; j < kBRows; ++j) {
    const int n = n0 + (tid >> 2) + j * 64;
    brow[j] = n < d.oct ? d_w + int64_t(n) * d.kp + (tid & 3) * 16 : nullptr;
  }

  auto load_stage = [&](int slot, int k0) {
    uint8_t* const a = sa + slot * P::kStageA;
    const bool k_ok = k0 + acol * (kVec16 ? 16 : 4) < d.k;  // K % 16 == 0 with kVec16
#pragma unroll
    for (int j = 0; j < kARows; ++j) {
      const bool valid = k_ok && arow[j];
      const int8_t* src = valid ? arow[j] + k0 : d_x;
      const int m = arow0 + j * kARowStep;
      if (kVec16)
        cp_async16(a + swizzle(m, acol * 4), src, valid);
      else
        cp_async4(a + swizzle(m, acol), src, valid);
    }
    uint8_t* const b = sb + slot * P::kStageB;
#pragma unroll
    for (int j = 0; j < kBRows; ++j) {
      const int8_t* src = brow[j] ? brow[j] + k0 : d_w;
      cp_async16(b + swizzle((tid >> 2) + j * 64, (tid & 3) * 4), src, brow[j] != nullptr);
    }
  };

  int32_t acc[P::kMi][P::kNi][4];
#pragma unroll
  for (int i = 0; i < P::kMi; ++i)
#pragma unroll
    for (int j = 0; j < P::kNi; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0;

  const int kt_count = kt_end - kt_begin;
  // In the first cp.async group, complete before the first k-tile is read (or at the final wait).
  if constexpr (kFuse) stage_classifier_weights<BN>(cls, sw2, n0);
#pragma unroll
  for (int st = 0; st < P::kStages - 1; ++st) {
    if (st < kt_count) load_stage(st, (kt_begin + st) * kBK);
    ptx::cp_async_commit();
  }
  const int wm = (warp >> 2) * (BM / 2), wn = (warp & 3) * (BN / 4);
  for (int kt = 0; kt < kt_count; ++kt) {
    ptx::cp_async_wait<P::kStages - 2>();
    __syncthreads();  // stage kt landed for all; stage kt - 1 is no longer read
    const int next = kt + P::kStages - 1;
    if (next < kt_count) load_stage(next % P::kStages, (kt_begin + next) * kBK);
    ptx::cp_async_commit();
    const uint8_t* const a = sa + (kt % P::kStages) * P::kStageA;
    const uint8_t* const b = sb + (kt % P::kStages) * P::kStageB;
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      uint32_t af[P::kMi][4], bf[P::kNi][2];
#pragma unroll
      for (int i = 0; i < P::kMi; ++i) {
        const int row = wm + i * 16 + g;
        af[i][0] = *reinterpret_cast<const uint32_t*>(a + swizzle(row, kk * 8 + tg));
        af[i][1] = *reinterpret_cast<const uint32_t*>(a + swizzle(row + 8, kk * 8 + tg));
        af[i][2] = *reinterpret_cast<const uint32_t*>(a + swizzle(row, kk * 8 + tg + 4));
        af[i][3] = *reinterpret_cast<const uint32_t*>(a + swizzle(row + 8, kk * 8 + tg + 4));
      }
#pragma unroll
      for (int j = 0; j < P::kNi; ++j) {
        const int n = wn + j * 8 + g;
        bf[j][0] = *reinterpret_cast<const uint32_t*>(b + swizzle(n, kk * 8 + tg));
        bf[j][1] = *reinterpret_cast<const uint32_t*>(b + swizzle(n, kk * 8 + tg + 4));
      }
#pragma unroll
      for (int i = 0; i < P::kMi; ++i)
#pragma unroll
        for (int j = 0; j < P::kNi; ++j) mma_s8(acc[i][j], af[i], bf[j]);
    }
  }
  ptx::cp_async_wait<0>();
  // A classifier launched overlapped after this layer (QConvPath::overlap_launch) may start now:
  // its blocks load their weights during this epilogue and wait for this grid's completion
  // before reading its output.
  ptx::griddep_launch_dependents();

#if __CUDA_ARCH__ >= 900
  if (nsplit > 1) {
    __syncthreads();  // the pipeline's buffers become the partial tile
    int32_t* const part = reinterpret_cast<int32_t*>(smem);  // (BM, kPartLd)
#pragma unroll
    for (int i = 0; i < P::kMi; ++i)
#pragma unroll
      for (int j = 0; j < P::kNi; ++j)
#pragma unroll
        for (int v2 = 0; v2 < 2; ++v2) {
          const int row = wm + i * 16 + g + v2 * 8, cl = wn + j * 8 + tg * 2;
          *reinterpret_cast<int2*>(part + row * P::kPartLd + cl) =
              make_int2(acc[i][j][v2 * 2], acc[i][j][v2 * 2 + 1]);
        }
    ptx::cluster_sync();  // every block's partial tile is complete
    const int r_lo = BM * rank / nsplit, r_hi = BM * (rank + 1) / nsplit;
    for (int idx = tid; idx < (r_hi - r_lo) * (BN / 4); idx += kThreads) {
      const int r = r_lo + idx / (BN / 4), c4 = (idx % (BN / 4)) * 4;
      const int row = m0 + r, o0 = n0 + c4;
      if (row >= d.m || o0 >= d.out_stride) continue;
      const uint32_t local = ptx::smem_u32(part + r * P::kPartLd + c4);
      int4 sum = ptx::ld_cluster_s32x4(ptx::map_rank(local, 0));
      for (int q = 1; q < nsplit; ++q) {
        const int4 v = ptx::ld_cluster_s32x4(ptx::map_rank(local, uint32_t(q)));
        sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
      }
      const int32_t sums[4] = {sum.x, sum.y, sum.z, sum.w};
      T* const out = d_y + int64_t(row) * d.out_stride;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int o = o0 + c;
        if (o >= d.out_stride) continue;
        const T v = o < d.n
                        ? qepilogue::value<T>(sums[c], __ldg(d_mult + o), __ldg(d_add + o), relu)
                        : T(0);
        out[o] = v;
        if constexpr (kFuse) sout[r * P::kOutLd + c4 + c] = uint8_t(v);
      }
    }
    ptx::cluster_sync();  // no block leaves while another still reads its partial tile
    if constexpr (kFuse)
      classify_tile<BM, BN>(d, cls, sout, sw2, m0, n0, r_lo, r_hi, int(gridDim.y) * nsplit);
    return;
  }
#endif

  // One block a tile: each thread writes its own accumulators.
#pragma unroll
  for (int j = 0; j < P::kNi; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int o = n0 + wn + j * 8 + tg * 2 + h;
      if (o >= d.out_stride) continue;
      const bool live = o < d.n;
      const float m = live ? __ldg(d_mult + o) : 0.f, ad = live ? __ldg(d_add + o) : 0.f;
#pragma unroll
      for (int i = 0; i < P::kMi; ++i)
#pragma unroll
        for (int v2 = 0; v2 < 2; ++v2) {
          const int row = m0 + wm + i * 16 + g + v2 * 8;
          if (row < d.m) {
            const T v = live ? qepilogue::value<T>(acc[i][j][v2 * 2 + h], m, ad, relu) : T(0);
            d_y[int64_t(row) * d.out_stride + o] = v;
            if constexpr (kFuse) sout[(row - m0) * P::kOutLd + o - n0] = uint8_t(v);
          }
        }
    }
  if constexpr (kFuse)
    classify_tile<BM, BN>(d, cls, sout, sw2, m0, n0, 0, BM, int(gridDim.y) * nsplit);
}

template <class T, int BM, int BN, bool kFuse>
void launch_tile(const QConvShape& s, const int8_t* d_x, const int8_t* d_w, const QEpilogue& ep,
                 int out_stride, T* d_y, int splits, const Classifier& cls, cudaStream_t stream) {
  using P = Tile<BM, BN>;
  MmaDims d;
  d.m = s.n, d.n = s.oc, d.out_stride = out_stride;
  d.k = s.h * s.w * s.cp;
  d.kp = ceil_div(d.k, kBK) * kBK;
  d.oct = ceil_div(s.ocp, kQIgemmTileN) * kQIgemmTileN;
  const bool vec16 = d.k % 16 == 0 && reinterpret_cast<uintptr_t>(d_x) % 16 == 0;
  const auto kernel =
      vec16 ? qconv_linear_mma<T, BM, BN, true, kFuse> : qconv_linear_mma<T, BM, BN, false, kFuse>;
  const int smem = kFuse ? P::kSmemFused : P::kSmem;
  const dim3 tiles(unsigned(ceil_div(s.n, BM)), unsigned(ceil_div(out_stride, BN)));
  if (splits > 1) {
    wgmma::launch_split_k_clusters(kernel, tiles, splits, kThreads, smem, stream,
                                   "qconv_linear_mma", d, d_x, d_w, ep.mult, ep.add, ep.relu, d_y,
                                   cls);
    return;
  }
  CNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<tiles, kThreads, smem, stream>>>(d, d_x, d_w, ep.mult, ep.add, ep.relu, d_y, cls);
  CNN_LAUNCH_CHECK("qconv_linear_mma");
}

template <class T, bool kFuse>
void launch(const QConvShape& s, const int8_t* d_x, const int8_t* d_w, const QEpilogue& ep,
            int out_stride, T* d_y, QIgemmTile tile, int splits, const Classifier& cls,
            cudaStream_t stream) {
  CNN_CHECK(qconv_is_linear(s), "qconv_linear_mma: the shape is not a linear layer");
  CNN_CHECK(splits == 1 || splits == 2 || splits == 4 || splits == 8,
            "qconv_linear_mma: splits={} (expected 1, 2, 4 or 8)", splits);
  switch (tile) {
    case QIgemmTile::Linear64x64:
      return launch_tile<T, 64, 64, kFuse>(s, d_x, d_w, ep, out_stride, d_y, splits, cls, stream);
    case QIgemmTile::Linear64x128:
      return launch_tile<T, 64, 128, kFuse>(s, d_x, d_w, ep, out_stride, d_y, splits, cls, stream);
    case QIgemmTile::Linear128x128:
      return launch_tile<T, 128, 128, kFuse>(s, d_x, d_w, ep, out_stride, d_y, splits, cls, stream);
    case QIgemmTile::Auto:
    case QIgemmTile::Conv128x64:
      break;
  }
  CNN_FAIL("qconv_linear_mma: tile {} is not a linear tile", qigemm_tile_name(tile));
}

}  // namespace

void qconv_linear_mma_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w_packed,
                                   const QEpilogue& ep, int8_t* d_y, QIgemmTile tile, int splits,
                                   cudaStream_t stream) {
  launch<int8_t, false>(s, d_x, d_w_packed, ep, s.ocp, d_y, tile, splits, Classifier{}, stream);
}

void qconv_linear_mma_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w_packed,
                                   const QEpilogue& ep, float* d_y, QIgemmTile tile, int splits,
                                   cudaStream_t stream) {
  launch<float, false>(s, d_x, d_w_packed, ep, s.oc, d_y, tile, splits, Classifier{}, stream);
}

void qconv_linear_classifier_forward_cuda(const QConvShape& s, const int8_t* d_x,
                                          const int8_t* d_w_packed, const QEpilogue& ep,
                                          int8_t* d_y, const QClassifierFusion& c, QIgemmTile tile,
                                          int splits, cudaStream_t stream) {
  const Classifier cls{c.w,       c.shape.oc, c.shape.cgp, c.ep.mult, c.ep.add,
                       c.ep.relu, c.acc,      c.arrivals,  c.y};
  const bool clusters = qconv_clusters_available();
  const QIgemmPlan plan = qconv_igemm_plan(s, wgmma::sm_count(), tile, clusters ? splits : 1);
  launch<int8_t, true>(s, d_x, d_w_packed, ep, s.ocp, d_y, plan.tile, plan.splits, cls, stream);
}

}  // namespace cnn
