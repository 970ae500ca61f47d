#pragma once
// The consumer side of the Hopper wgmma convolution kernels (conv2d_wgmma.cu, the NCHW gather;
// conv2d_wgmma_nhwc.cu, TMA im2col on a channels-last copy), shared by both: the two consumer
// warpgroups' wgmma loop over the ring of stages, and the epilogue that sums the K splits of a
// thread-block cluster through distributed shared memory, adds bias, applies ReLU and stores the
// 128 x BN (or 256 x BN) tile into the NCHW output. Both kernels run 384 threads: warpgroup 0
// produces, warpgroups 1 and 2 consume rows [64 (wg - 1), +64) of the tile (of a 256-row tile,
// [128 (wg - 1), +128)). Stage s holds the A tile (128 or 256 rows x 32 k) and the B^T tile (BN
// rows x 32 k), K-major in the 128-byte swizzled layout (64 k each for the BF16 instance of the
// channels-last kernel: still 128 bytes a row). The 3xTF32 consumer also serves the wgmma GEMM
// (kernels/gemm/gemm_wgmma.cu), whose stages have the same layout.
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/gemm/wgmma_ptx.cuh"

namespace cnn {
namespace wgmma {

// Where an image's output pixel q lands in y's channel planes. By default at q, planes of
// pix_per_img pixels; a phase of a strided input gradient (conv2d_nhwc_layout.h,
// NhwcDgradPhase) stores its pixel q = qy phase_w + qx at origin + qy step_y + qx step_x of
// planes of `plane` pixels.
struct PixelStore {
  int plane = 0;    // y's pixels a channel; 0: pix_per_img
  int phase_w = 0;  // > 0: the phase's pixels a row, and the mapping above
  int step_y = 0, step_x = 0, origin = 0;
  __host__ __device__ int plane_of(int pix_per_img) const {
    return plane > 0 ? plane : pix_per_img;
  }
  __host__ __device__ int pixel(int q) const {
    if (phase_w == 0) return q;
    const int qy = q / phase_w;
    return origin + qy * step_y + (q - qy * phase_w) * step_x;
  }
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr int kConvThreads = 384;  // producer + 2 consumer warpgroups

// Zeroes a consumer's accumulators (kSub 64-row blocks of BN / 2 a thread).
template <int kSub, int kAcc>
__device__ __forceinline__ void zero_acc(float (&acc)[kSub][kAcc]) {
#pragma unroll
  for (int h = 0; h < kSub; ++h)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[h][i] = 0.f;
}

// One wgmma of a k step with both operands in shared memory: m64nBNk8 TF32, or m64nBNk16 BF16
// (kBf16), into d (BN 32, 64 or 128).
template <int BN, bool kBf16>
__device__ __forceinline__ void wgmma_ss(float (&d)[BN / 2], uint64_t da, uint64_t db) {
  if constexpr (kBf16 && BN == 128)
    wgmma_m64n128k16_bf16(d, da, db);
  else if constexpr (kBf16 && BN == 32)
    wgmma_m64n32k16_bf16(d, da, db);
  else if constexpr (kBf16)
    wgmma_m64n64k16_bf16(d, da, db);
  else if constexpr (BN == 128)
    wgmma_m64n128k8_tf32(d, da, db);
  else if constexpr (BN == 32)
    wgmma_m64n32k8_tf32(d, da, db);
  else
    wgmma_m64n64k8_tf32(d, da, db);
}

// Consumer warpgroup wg (1 or 2): for each of the nk stages in ring order, waits for `full`,
// multiplies 4 k steps (wgmma.m64nBNk8 TF32 or m64nBNk16 BF16) per 64-row block into acc (BN 32,
// 64 or 128), keeps one stage's group in flight and releases the previous stage on its `empty`
// barrier (lane 0 of each of the 8 consumer warps arrives: init the empty barriers with 8).
// kSub: the 64-row blocks a warpgroup owns, 1 (a 128-row tile: rows [64 (wg - 1), +64)) or 2 (a
// 256-row tile: rows [128 (wg - 1), +128), acc[h] the block at + 64 h); the blocks of one k step
// share its B descriptor. fence_generic: the stage was written by generic-proxy copies
// (cp.async), so each consumer thread fences before its async-proxy wgmma reads (see
// conv2d_wgmma.cu); TMA-written stages need no fence. kBf16: the stages hold bf16 (64 k per
// 128-byte row) and the 4 steps are wgmma k16 BF16 instead of k8 TF32: either way a step is 32
// bytes of the row, 2 in the descriptor. k3xTf32 (FP32 accuracy, both operands split ahead of
// it: two blocks an SM, where consume_stages_3xtf32's A registers do not fit): tile_a(s) and
// tile_b(s) hold the operands' TF32 parts, tile_a_small(s) and tile_b_small(s) their TF32
// residuals, and each k step multiplies small_A big_B + big_A small_B + big_A big_B (small_A
// small_B, about 2^-22 of the product, left out); otherwise the small tiles are not read.
template <int BN, int kStages, bool kBf16 = false, int kSub = 1, bool k3xTf32 = false, class Full,
          class Empty, class TileA, class TileASmall, class TileB, class TileBSmall>
__device__ __forceinline__ void consume_stages(float (&acc)[kSub][BN / 2], int nk, int wg,
                                               bool fence_generic, Full full, Empty empty,
                                               TileA tile_a, TileASmall tile_a_small, TileB tile_b,
                                               TileBSmall tile_b_small) {
  static_assert(kSub == 1 || kSub == 2, "64 or 128 rows a consumer warpgroup");
  static_assert(!k3xTf32 || !kBf16, "3xTF32 splits FP32 operands");
  const int lane = threadIdx.x & 31;
  const uint32_t a_off = uint32_t(wg - 1) * kSub * 64 * 128;  // 64 kSub rows of 128 bytes
  auto fence_all = [&] {
#pragma unroll
    for (int h = 0; h < kSub; ++h) fence_acc(acc[h]);
  };
  for (int i = 0; i < nk; ++i) {
    const int s = i % kStages;
    mbar_wait(full(s), (i / kStages) & 1);
    if (fence_generic) fence_proxy_async();
    const uint64_t da = sw128_desc(tile_a(s) + a_off), db = sw128_desc(tile_b(s));
    uint64_t das = 0, dbs = 0;
    if constexpr (k3xTf32) {
      das = sw128_desc(tile_a_small(s) + a_off);
      dbs = sw128_desc(tile_b_small(s));
    }
    wgmma_fence();
    fence_all();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int h = 0; h < kSub; ++h) {  // block h: 64 rows = 8 KB further (+ 512 in 16-byte units)
        const uint64_t a_k = uint64_t(h) * 512 + 2 * kk;
        if constexpr (k3xTf32) {
          wgmma_ss<BN, false>(acc[h], das + a_k, db + 2 * kk);
          wgmma_ss<BN, false>(acc[h], da + a_k, dbs + 2 * kk);
        }
        wgmma_ss<BN, kBf16>(acc[h], da + a_k, db + 2 * kk);
      }
    commit_and_release_previous(fence_all, i > 0 && lane == 0, empty((i + kStages - 1) % kStages));
  }
  wgmma_wait<0>();
  fence_all();
}

// The 3xTF32 consumer (FP32 accuracy on the tensor cores): the same ring, but a stage holds A
// unrounded and B twice, tile_b its TF32 part and tile_b_small its TF32 residual. Each thread loads
// its 16 A values of the stage (4 k steps x the m16n8k8 fragment: rows 16 w + g and + 8, columns
// t and t + 4 of each 8) from the swizzled tile, splits each into big = TF32(a) and small =
// TF32(a - big) in registers, and multiplies, per k step,
//   small_A big_B + big_A small_B + big_A big_B
// with three wgmmas taking A from registers (small_A small_B, about 2^-22 of the product, is left
// out). A's registers are read asynchronously, so two stages' sets alternate (the loop is unrolled
// by two): a set is reused only after the group that read it has been waited for.
template <int BN, int kStages, class Full, class Empty, class TileA, class TileB, class TileBSmall>
__device__ __forceinline__ void consume_stages_3xtf32(float (&acc)[BN / 2], int nk, int wg,
                                                      Full full, Empty empty, TileA tile_a,
                                                      TileB tile_b, TileBSmall tile_b_small) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) & 3;
  const int g = lane >> 2, t = lane & 3;
  // Row 64 (wg - 1) + 16 w + g (and + 8, the same row mod 8 for the swizzle): byte offsets of
  // the fragment's values in the 128-byte-swizzled K-major tile, k step kk, register j: row + 8
  // (j & 1), column 8 kk + t + 4 (j >> 1), i.e. 16-byte chunk 2 kk + (j >> 1) XOR the row mod 8.
  const uint32_t row_off = uint32_t((wg - 1) * 64 + w * 16 + g) * 128 + uint32_t(t) * 4;
  uint32_t off[4][4];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      off[kk][j] = row_off + uint32_t(j & 1) * 8 * 128 + (uint32_t((2 * kk + (j >> 1)) ^ g) << 4);

  auto mma = [&](const uint32_t(&a)[4], uint64_t db) {
    if constexpr (BN == 128)
      wgmma_m64n128k8_tf32_rs(acc, a, db);
    else if constexpr (BN == 32)
      wgmma_m64n32k8_tf32_rs(acc, a, db);
    else
      wgmma_m64n64k8_tf32_rs(acc, a, db);
  };
  // Stage i into the register set (hi, lo); (hi_prev, lo_prev) was stage i - 1's.
  auto stage = [&](int i, uint32_t(&hi)[4][4], uint32_t(&lo)[4][4], uint32_t(&hi_prev)[4][4],
                   uint32_t(&lo_prev)[4][4]) {
    const int s = i % kStages;
    mbar_wait(full(s), (i / kStages) & 1);
    const uint32_t a = tile_a(s);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const ptx::Tf32Split v = ptx::split_tf32(ld_shared_f32(a + off[kk][j]));
        hi[kk][j] = v.big;
        lo[kk][j] = v.small;
      }
    const uint64_t db = sw128_desc(tile_b(s)), dbs = sw128_desc(tile_b_small(s));
    wgmma_fence();
    fence_acc(acc);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      mma(lo[kk], db + 2 * kk);
      mma(hi[kk], dbs + 2 * kk);
      mma(hi[kk], db + 2 * kk);
    }
    wgmma_commit();
    fence_acc(acc);
    wgmma_wait<1>();  // the previous stage's products are done: its registers and stage are free
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      fence_regs(hi_prev[kk]);
      fence_regs(lo_prev[kk]);
    }
    fence_acc(acc);
    if (i > 0 && lane == 0) mbar_arrive(empty((i - 1) % kStages));
  };
  uint32_t hi0[4][4], lo0[4][4], hi1[4][4] = {}, lo1[4][4] = {};  // set 1 is "previous" at i = 0
  for (int i = 0; i < nk; i += 2) {
    stage(i, hi0, lo0, hi1, lo1);
    if (i + 1 < nk) stage(i + 1, hi1, lo1, hi0, lo0);
  }
  wgmma_wait<0>();
  fence_acc(acc);
}

// Where the epilogue stores: C (M, N) of the implicit GEMM into y (N_img, ldc, OH, OW), row m =
// (image, pixel) with pix_per_img = OH * OW pixels per image, column n at channel n (ldc = N; a
// grouped convolution's group stores its N columns among ldc channels, y and bias moved to them),
// pixels where `at` puts them.
struct ConvTileStore {
  float* y;
  const float* bias;  // (N) or null
  int relu;
  int M, N, pix_per_img, ldc;
  PixelStore at = {};
};

// Every thread of the block calls it after its role's loop. The accumulators go to shared
// memory at `base` (the ring, reused: every stage has been consumed, so every copy has landed),
// (64 kSub 2, kPitch) floats (kSub: consume_stages'); then the blocks of the cluster (the K
// splits of one tile) each sum a band of rows over all ranks' partial tiles in rank order
// (bitwise repeatable), add bias, apply ReLU and store NCHW. A warp covers 32 rows (pixels,
// contiguous in y) of one group of 4 columns. row_pixel(r): the output pixel m of tile row r
// (image-major, < M), or -1 for a row that is not stored.
template <int BN, int kPitch, int kSub, class RowPixel>
__device__ __forceinline__ void store_conv_tile_rows(const float (&acc)[kSub][BN / 2],
                                                     uint32_t base, int n0, const ConvTileStore& p,
                                                     RowPixel row_pixel) {
  constexpr int kRows = 128 * kSub;
  static_assert(kSub == 1 || kSub == 2, "128 or 256 rows");
  const int tid = threadIdx.x, wg = tid / 128, lane = tid & 31;
  __syncthreads();
  if (wg > 0) {
    const int w = (tid / 32) & 3, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int h = 0; h < kSub; ++h) {
      const int row = (wg - 1) * 64 * kSub + h * 64 + w * 16 + g;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int col = 8 * j + 2 * t4;
        st_shared_v2(base + uint32_t(row * kPitch + col) * 4, acc[h][4 * j], acc[h][4 * j + 1]);
        st_shared_v2(base + uint32_t((row + 8) * kPitch + col) * 4, acc[h][4 * j + 2],
                     acc[h][4 * j + 3]);
      }
    }
  }
  // Without a K split (a cluster of one) a block barrier and plain shared loads do: the cluster
  // barriers and distributed-shared-memory loads cost about a tenth of a LeNet conv2 forward's
  // stall samples.
  const uint32_t rank = cluster_rank(), nsplit = cluster_size();
  if (nsplit > 1)
    cluster_sync();
  else
    __syncthreads();

  // band = kRows / nsplit rows a rank, nsplit a power of two (1 .. 8).
  const int log_split = __ffs(int(nsplit)) - 1, log_band = (kRows == 256 ? 8 : 7) - log_split;
  const int band = 1 << log_band;
  const int r_begin = int(rank) * band;
  for (int idx = tid; idx < band * (BN / 4); idx += kConvThreads) {
    const int r = r_begin + (idx & (band - 1)), c4 = (idx >> log_band) * 4;
    const int m = row_pixel(r);
    // Only items with a column to store load: each load's value then reaches a store before the
    // relaxed barrier at the end.
    if (m < 0 || n0 + c4 >= p.N) continue;
    const float4 sum = sum_over_ranks(base + uint32_t(r * kPitch + c4) * 4, nsplit);
    const float vals[4] = {sum.x, sum.y, sum.z, sum.w};
    const int img = m / p.pix_per_img;
    const int plane = p.at.plane_of(p.pix_per_img);
    float* crow = p.y + int64_t(img) * p.ldc * plane + p.at.pixel(m - img * p.pix_per_img);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int n = n0 + c4 + e;
      if (n >= p.N) break;
      float v = vals[e];
      if (p.bias) v += __ldg(p.bias + n);
      if (p.relu) v = (v <= 0.f) ? 0.f : v;  // NaN passes, as in the CPU references
      crow[int64_t(n) * plane] = v;
    }
  }
  // No block leaves while another still reads its partial tile: a relaxed arrive, as
  // gemm_wgmma.cu's (the loads have returned; a release would also wait for the y stores).
  if (nsplit > 1) ptx::cluster_sync_relaxed();
}

// The tile of rows m0 .. m0 + 128 kSub - 1 of C (those below M stored).
template <int BN, int kPitch, int kSub = 1>
__device__ __forceinline__ void store_conv_tile(const float (&acc)[kSub][BN / 2], uint32_t base,
                                                int m0, int n0, const ConvTileStore& p) {
  store_conv_tile_rows<BN, kPitch, kSub>(acc, base, n0, p, [&](int r) {
    const int m = m0 + r;
    return m < p.M ? m : -1;
  });
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace wgmma
}  // namespace cnn
