// Hopper wgmma convolution on a channels-last copy, A by TMA im2col (see conv2d_wgmma_nhwc.h).
// One block computes a 128 x BN tile of the implicit GEMM (rows: output pixels m = (n, oy, ox);
// columns: output channels) over a range of k-tiles, k-tile kt = (tap, channel chunk) with
// tap = kt / chunks; a chunk is one 128-byte swizzle row of operands: 32 channels of TF32 (float
// storage), or 64 of BF16 (the kernel's element type T, OperandOf<T>). The numbers below are
// TF32's; the BF16 instance moves the same bytes (64-channel boxes) and issues k16 wgmmas.
// 384 threads in three warpgroups:
//   warpgroup 0, the producer: thread 0 alone fills a ring of kStages shared-memory stages. For
//     stage i it waits for the stage to be free (`empty`), announces the stage's bytes on its
//     `full` barrier (arrive.expect_tx, A 16 KB + B BN x 128 B: a TMA counts the whole box, zero
//     filled parts included) and issues two copies completing on that barrier:
//       A: cp.async.bulk.tensor.4d im2col from the (N, H, W, Cp) copy, coordinates {c0, x0, y0,
//          n0} = channel chunk and the tile's first pixel's top-left input pixel (im2col_start),
//          offsets {kx, ky}: 128 pixels x 32 channels, row r = output pixel m0 + r (the traversal
//          follows output-pixel order, conv2d_nhwc_layout.h), zero outside the image;
//       B: the 2-D tiled TMA of the (rows, taps * Cp) packed weights, box {32, BN} at (kt * 32,
//          n0), zero past the last row.
//     Both land K-major in the 128-byte swizzle layout (row r at r * 128 bytes, 16-byte chunk c
//     at c ^ (r % 8); stages are 1024-byte aligned), which is what the wgmma descriptors name.
//   warpgroups 1 and 2, the consumers, and the epilogue: conv2d_wgmma_tile.cuh (TMA writes are
//     async-proxy: no proxy fence before the wgmma reads).
// The FP32 instance (kSplit, 3xTF32): the weights come as two packs (their TF32 part and TF32
// residual, a third copy a stage, map_b_small); at one block an SM the copy is unrounded and the
// consumers split A into TF32 parts in registers (consume_stages_3xtf32), at two the pre-pass
// splits it into two copies (map_a, map_a_small) and every operand is read from shared memory
// (consume_stages with k3xTf32); three wgmmas a k step either way.
// The halo instance (NhwcALoad::Halo, stride 1, TF32 and BF16) replaces the im2col copies by one
// tiled TMA box of the tile's input rows per channel chunk: conv2d_wgmma_halo.cuh; it shares the
// pre-pass, the weight map and the epilogue.
// Every mbarrier wait is bounded (wgmma_ptx.cuh: a trap after 10 s), so a wrong byte count fails
// the launch instead of hanging the device.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_halo_layout.h"
#include "kernels/conv/conv2d_nhwc_layout.h"
#include "kernels/conv/conv2d_nhwc_prepass.h"
#include "kernels/conv/conv2d_nhwc_scratch.h"
#include "kernels/conv/conv2d_wgmma.h"
#include "kernels/conv/conv2d_wgmma_halo.cuh"
#include "kernels/conv/conv2d_wgmma_nhwc.h"
#include "kernels/conv/conv2d_wgmma_tile.cuh"
#include "kernels/conv/im2col_tma.cuh"
#include "kernels/gemm/wgmma_ptx.cuh"
#include "runtime/cuda_check.h"
#include "runtime/env_switches.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

using namespace wgmma;

constexpr int kBM = 128, kRowBytes = 128;  // rows of one im2col copy; a k-tile row: 128 bytes
constexpr int kThreads = 384;
constexpr int kMaxSplits = 8;  // portable cluster size

// The operand element type of one instance: what the pre-passes write, the TMA maps read and
// the wgmmas multiply. kBlock elements fill one 128-byte row (a k-tile's channels).
template <class T>
struct OperandOf;
template <>
struct OperandOf<float> {  // TF32 in float storage
  static constexpr int kBlock = kNhwcChannelBlock;
  static constexpr bool kBf16 = false;
  static constexpr Precision kPrecision = Precision::TF32;
  static constexpr CUtensorMapDataType kTmaType = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
};
template <>
struct OperandOf<__nv_bfloat16> {  // BF16, rounded to nearest even by the pre-pass
  static constexpr int kBlock = kNhwcChannelBlockBf16;
  static constexpr bool kBf16 = true;
  static constexpr Precision kPrecision = Precision::BF16;
  static constexpr CUtensorMapDataType kTmaType = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
};
static_assert(OperandOf<float>::kBlock * 4 == kRowBytes, "a TF32 chunk is one swizzle row");
static_assert(OperandOf<__nv_bfloat16>::kBlock * 2 == kRowBytes, "a BF16 chunk is one row");

// Shared-memory plan of one tile width and residency (the same bytes for both element types): the
// stage ring, then the mbarriers full[kStages], empty[kStages]. The epilogue's partial tile
// reuses the ring. One thread keeps the ring full, so the stages are limited by shared memory
// only: one block an SM takes a 192-200 KB ring (10 stages of BN 32, 8 of BN 64, 6 of BN 128); two
// blocks an SM (BN 32 and 64: see run()) take half each (5 or 4 stages), so that a grid of up to
// 2 x 132 blocks runs in one wave instead of one and a half (LeNet's conv2 forward: 196 tiles) and
// one block's epilogue overlaps the other's main loop. Three blocks an SM (BN 32 only: a 20 KB
// stage) take 3 stages each: narrow layers have many tiles of few k-tiles (a 32-channel 3x3 layer
// at 28x28, batch 128: 784 tiles of 9 k-tiles), where the waves and the epilogues cost more than
// the ring's depth.
//
// kSplit, the 3xTF32 instance (FP32 accuracy): at one block an SM a stage holds the unrounded A
// tile and two B tiles, the weights' TF32 part and their TF32 residual (its consumers hold A's
// split parts of two stages in registers, 64 more a thread), 8, 6 or 4 stages. Two blocks an SM
// (BN 32 and 64) leave no room for those registers: there the pre-pass splits A as well (two
// copies, map_a and map_a_small) and a stage holds both A parts and both B parts (40 or 48 KB),
// a ring of 2 (kSplitA).
//
// kSub 2, the tall tile (256 x 128, TF32 and BF16, one block an SM): each consumer warpgroup
// multiplies two 64-row blocks against the same B tile, so a stage's 48 KB feed twice the
// multiplies of the 128-row tile's 32 KB, and each stage's barrier round trip, copies and
// wgmma group cover twice the work. On VGG's 16x16 128-channel forward it took the kernel from
// 56.8 to 42.3 us (ncu: SM throughput 35% -> 46%; L2 throughput 38% -> 40%, so L2 bandwidth was
// not the limit). The producer fills A with two im2col copies (rows m0 and m0 + 128). A ring of
// 4 stages.
constexpr int nhwc_ring_stages(int bn, int per_sm, bool split, int sub) {
  if (sub == 2) return 4;
  if (split && per_sm == 2) return 2;
  if (split) return bn == 32 ? 8 : bn == 64 ? 6 : 4;
  return (bn == 32 ? 10 : bn == 64 ? 8 : 6) / per_sm;
}
template <int BN, int kPerSm, bool kSplit = false, int kSub = 1>
struct NhwcPlan {
  static_assert(BN == 32 || BN == 64 || BN == 128, "tile widths 32, 64 and 128");
  static_assert(kPerSm == 1 || kPerSm == 2 || (kPerSm == 3 && BN == 32),
                "one or two blocks an SM, three of BN 32");
  static_assert(!kSplit || kPerSm == 1 || (kPerSm == 2 && BN <= 64),
                "the 3xTF32 instance runs one block an SM, or two of BN 32 or 64");
  static_assert(kSub == 1 || (kSub == 2 && kPerSm == 1 && !kSplit && BN == 128),
                "the 256-row tile: TF32 or BF16, BN 128, one block an SM");
  static constexpr bool kSplitA = kSplit && kPerSm > 1;  // A split by the pre-pass, 2 tiles
  static constexpr int kRows = kBM * kSub;               // tile rows (output pixels)
  static constexpr int kATileBytes = kRows * kRowBytes;
  static constexpr int kBTileBytes = BN * kRowBytes;
  static constexpr int kBOffset = (kSplitA ? 2 : 1) * kATileBytes;  // B's tiles in a stage
  static constexpr int kStageBytes = kBOffset + (kSplit ? 2 : 1) * kBTileBytes;
  static constexpr int kStages = nhwc_ring_stages(BN, kPerSm, kSplit, kSub);
  static constexpr int kEpiPitch = BN + 4;  // floats; rows stay 16-byte aligned
  static constexpr int kBarrierOffset = kStages * kStageBytes;
  static constexpr int kSmemBytes = 1024 + kBarrierOffset + 2 * kStages * 8;  // + alignment
  static_assert(kRows * kEpiPitch * 4 <= kStages * kStageBytes, "epilogue tile must fit the ring");
  // 228 KB an SM, 1 KB of it reserved per resident block.
  static_assert(kPerSm * (kSmemBytes + 1024) <= 228 * 1024, "over the per-SM shared memory");
  static_assert(kStageBytes % 1024 == 0 && kATileBytes % 1024 == 0, "tiles 1024-byte aligned");
};
constexpr int kATileBytes = kBM * kRowBytes;  // one im2col copy

// The implicit GEMM: C (M, N) = A (M, ktiles * 32) B, stored NCHW; the geometry that locates a
// tile's first pixel in the im2col box (Im2colGeometry).
struct NhwcParams {
  const float* bias;  // (N) or null
  float* y;           // (N_img, N, oh, ow)
  int relu;
  int M, N, ktiles, chunks, kw;
  int oh, ow, stride_h, stride_w, lower_h, lower_w;
  int dil_h, dil_w;  // the im2col offsets of tap (ky, kx): (dil_w kx, dil_h ky)
  // Groups (conv2d_nhwc_layout.h): block x runs tile x % group_tiles of group x / group_tiles,
  // whose walk starts group_images images into the group-major copy, whose weights are rows
  // [g N, g N + N) of the pack, and whose N columns are y's channels [g N, g N + N) of ldc.
  int group_tiles, group_images, ldc;
  // B's tap of tap (ky, kx): b_tap0 + ky b_kw + kx of the pack (b_kw = kw, b_tap0 = 0 but for a
  // phase of a strided input gradient, which reads its run of the phase-ordered pack).
  int b_tap0, b_kw;
  PixelStore store;  // where the output pixels land (a phase's at the stride)
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CNN_WGMMA_NHWC_DEVICE_CODE 1

// Thread mapping: see the file comment. Grid (tiles_m * tiles_n, 1, splits), cluster (1, 1,
// splits); block x (`block`: blockIdx.x, or its index within its phase's tiles when phases are
// stacked) owns C rows [R (x / tiles_n), +R) x columns [BN (x % tiles_n), +BN), R = 128 kSub,
// split z its k-tiles [z T / splits, (z + 1) T / splits).
// kSplit: the 3xTF32 instance (T float): a stage's B tiles are map_b's (the weights' TF32 part)
// then map_b_small's (their residual); the consumers split A themselves, or at two blocks an SM
// (kSplitA) A comes as two tiles too, map_a's (its TF32 part) then map_a_small's (residual).
template <int BN, class T, int kPerSm, bool kSplit, int kSub>
__device__ __forceinline__ void conv_nhwc_body(const CUtensorMap& map_a,
                                               const CUtensorMap& map_a_small,
                                               const CUtensorMap& map_b,
                                               const CUtensorMap& map_b_small, const NhwcParams& p,
                                               int block) {
  using P = NhwcPlan<BN, kPerSm, kSplit, kSub>;
  constexpr int kStages = P::kStages;
  constexpr int kBK = OperandOf<T>::kBlock;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t bars = base + P::kBarrierOffset;
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (kStages + s); };
  auto tile_a = [&](int s) { return base + uint32_t(s) * P::kStageBytes; };
  auto tile_a_small = [&](int s) { return tile_a(s) + P::kATileBytes; };  // kSplitA
  auto tile_b = [&](int s) { return base + uint32_t(s) * P::kStageBytes + P::kBOffset; };
  auto tile_b_small = [&](int s) { return tile_b(s) + P::kBTileBytes; };

  const int tid = threadIdx.x;
  const int tiles_n = (p.N + BN - 1) / BN;
  const int grp = block / p.group_tiles, tile = block - grp * p.group_tiles;
  const int m0 = (tile / tiles_n) * P::kRows, n0 = (tile % tiles_n) * BN;
  const int b_row = grp * p.N + n0;  // the group's weight rows in the pack
  const uint32_t rank = cluster_rank(), nsplit = cluster_size();
  const int kt_begin = int(int64_t(p.ktiles) * rank / nsplit);
  const int kt_end = int(int64_t(p.ktiles) * (rank + 1) / nsplit);
  const int nk = kt_end - kt_begin;

  // full: the producer's arrive.expect_tx (the copies complete the bytes); empty: lane 0 of each
  // consumer warp.
  if (tid == 0) mbar_init_ring(bars, kStages, 1, 8);
  __syncthreads();

  const int wg = tid / 128;
  if (tid == 0) {
    Im2colCorner at = im2col_corner(m0, p.oh, p.ow, p.stride_h, p.stride_w, p.lower_h, p.lower_w);
    at.n += grp * p.group_images;
    // The tall tile's second copy (rows m0 + 128 ..): left out where those rows are all past M
    // (their products are never stored, and a row of the product reads only its row of A).
    const bool second = kSub == 2 && m0 + kBM < p.M;
    Im2colCorner at2 = at;
    if (second) {
      at2 = im2col_corner(m0 + kBM, p.oh, p.ow, p.stride_h, p.stride_w, p.lower_h, p.lower_w);
      at2.n += grp * p.group_images;
    }
    const uint32_t stage_bytes = P::kStageBytes - (kSub == 2 && !second ? kATileBytes : 0);
    for (int i = 0; i < nk; ++i) {
      const int s = i % kStages;
      if (i >= kStages) mbar_wait(empty(s), ((i / kStages) - 1) & 1);
      const int kt = kt_begin + i;
      const int tap = kt / p.chunks, chunk = kt - tap * p.chunks, c0 = chunk * kBK;
      const int ky = tap / p.kw, kx = tap - ky * p.kw;
      const int b_k = ((p.b_tap0 + ky * p.b_kw + kx) * p.chunks + chunk) * kBK;
      const uint16_t off_x = uint16_t(kx * p.dil_w), off_y = uint16_t(ky * p.dil_h);
      mbar_arrive_expect_tx(full(s), stage_bytes);
      tma_load_im2col_4d(tile_a(s), &map_a, c0, at.x, at.y, at.n, off_x, off_y, full(s));
      if constexpr (P::kSplitA)
        tma_load_im2col_4d(tile_a_small(s), &map_a_small, c0, at.x, at.y, at.n, off_x, off_y,
                           full(s));
      if (second)
        tma_load_im2col_4d(tile_a(s) + kATileBytes, &map_a, c0, at2.x, at2.y, at2.n, off_x, off_y,
                           full(s));
      tma_load_2d(tile_b(s), &map_b, b_k, b_row, full(s));
      if constexpr (kSplit) tma_load_2d(tile_b_small(s), &map_b_small, b_k, b_row, full(s));
    }
  }

  float acc[kSub][BN / 2];
  zero_acc(acc);
  if (wg > 0) {
    if constexpr (P::kSplitA)
      consume_stages<BN, kStages, false, 1, true>(acc, nk, wg, false, full, empty, tile_a,
                                                  tile_a_small, tile_b, tile_b_small);
    else if constexpr (kSplit)
      consume_stages_3xtf32<BN, kStages>(acc[0], nk, wg, full, empty, tile_a, tile_b, tile_b_small);
    else
      consume_stages<BN, kStages, OperandOf<T>::kBf16, kSub>(acc, nk, wg, false, full, empty,
                                                             tile_a, tile_a, tile_b, tile_b);
  }
  // The group's channels of y and bias (group 0 without groups). B rows past the group's N
  // (the next group's weights, or TMA's zeros past the last) gave columns that are not stored.
  const int pix = p.oh * p.ow;
  store_conv_tile<BN, P::kEpiPitch, kSub>(
      acc, base, m0, n0,
      ConvTileStore{p.y + int64_t(grp) * p.N * p.store.plane_of(pix),
                    p.bias ? p.bias + grp * p.N : nullptr, p.relu, p.M, p.N, pix, p.ldc, p.store});
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <int BN, class T, int kPerSm, bool kSplit, int kSub>
__global__ void __launch_bounds__(kThreads, kPerSm)
    conv2d_wgmma_nhwc_kernel(const __grid_constant__ CUtensorMap map_a,
                             const __grid_constant__ CUtensorMap map_a_small,
                             const __grid_constant__ CUtensorMap map_b,
                             const __grid_constant__ CUtensorMap map_b_small, const NhwcParams p) {
  ptx::griddep_enter();
#ifdef CNN_WGMMA_NHWC_DEVICE_CODE
  conv_nhwc_body<BN, T, kPerSm, kSplit, kSub>(map_a, map_a_small, map_b, map_b_small, p,
                                              int(blockIdx.x));
#else
  (void)map_a;
  (void)map_a_small;
  (void)map_b;
  (void)map_b_small;
  (void)p;
#if defined(__CUDA_ARCH__)
  __trap();  // never dispatched: conv2d_wgmma_nhwc_available() is false without the sm_90a cubin
#endif
#endif
}

// Up to four phases of a strided input gradient in one grid: phase i's tiles are blocks
// [first_tile, next phase's first_tile), its A map its own im2col box, B the one phase-ordered
// pack (each phase's run from p.b_tap0). The TMA reads the maps where they lie, in the kernel's
// parameters (__grid_constant__), as it does a lone map.
constexpr int kMaxStackedPhases = 4;
struct NhwcStackedPhase {
  CUtensorMap map_a;
  NhwcParams p;
  int first_tile;
};
struct NhwcStack {
  NhwcStackedPhase phase[kMaxStackedPhases];
  int count;
};

// The main kernel over a stack of phases (TF32 or BF16, 128-row tiles): each block runs the tile
// of its phase that its index names there.
template <int BN, class T, int kPerSm>
__global__ void __launch_bounds__(kThreads, kPerSm)
    conv2d_wgmma_nhwc_stacked_kernel(const __grid_constant__ NhwcStack st,
                                     const __grid_constant__ CUtensorMap map_b) {
  ptx::griddep_enter();
#ifdef CNN_WGMMA_NHWC_DEVICE_CODE
  const int x = int(blockIdx.x);
  int i = 0;
  while (i + 1 < st.count && x >= st.phase[i + 1].first_tile) ++i;
  const NhwcStackedPhase& ph = st.phase[i];
  const NhwcParams p = ph.p;  // the fields in registers; the map stays where TMA reads it
  conv_nhwc_body<BN, T, kPerSm, false, 1>(ph.map_a, ph.map_a, map_b, map_b, p, x - ph.first_tile);
#else
  (void)st;
  (void)map_b;
#if defined(__CUDA_ARCH__)
  __trap();  // never dispatched: conv2d_wgmma_nhwc_available() is false without the sm_90a cubin
#endif
#endif
}

// The halo-tile instance (conv2d_wgmma_halo.cuh) of one tile width, element type and tile rows
// (128 kSub).
template <int BN, class T, int kSub>
__global__ void __launch_bounds__(kThreads, halo_blocks_per_sm(BN, kSub))
    conv2d_wgmma_halo_kernel(const __grid_constant__ CUtensorMap map_a,
                             const __grid_constant__ CUtensorMap map_b, const HaloParams p) {
  ptx::griddep_enter();
#ifdef CNN_WGMMA_NHWC_DEVICE_CODE
  conv_halo_body<BN, OperandOf<T>::kBf16, kSub>(map_a, map_b, p);
#else
  (void)map_a;
  (void)map_b;
  (void)p;
#if defined(__CUDA_ARCH__)
  __trap();  // never dispatched: conv2d_wgmma_nhwc_available() is false without the sm_90a cubin
#endif
#endif
}

// The (N, H, W, Cp) copy as an im2col map: 128 pixels x one 128-byte row of channels (32 fp32 or
// 64 bf16) per copy, 128-byte swizzle, zero fill outside the tensor; corners and traversal
// strides from `geo` (conv2d_nhwc_layout.h).
template <class T>
CUtensorMap make_im2col_map(const T* d_nhwc, const Conv2dShape& g, const Im2colGeometry& geo) {
  CUtensorMap map{};
  const cuuint64_t dims[4] = {cuuint64_t(geo.c_pad), cuuint64_t(g.w), cuuint64_t(g.h),
                              cuuint64_t(g.n) * cuuint64_t(g.groups)};  // group-major if grouped
  const cuuint64_t row = cuuint64_t(geo.c_pad) * sizeof(T);
  const cuuint64_t strides[3] = {row, row * cuuint64_t(g.w), row * cuuint64_t(g.w) * g.h};
  const int lower[2] = {geo.lower_w, geo.lower_h};
  const int upper[2] = {geo.upper_w, geo.upper_h};
  const cuuint32_t elem_strides[4] = {1, cuuint32_t(geo.stride_w), cuuint32_t(geo.stride_h), 1};
  const CUresult r =
      im2col_map_encoder()(&map, OperandOf<T>::kTmaType, 4, const_cast<T*>(d_nhwc), dims, strides,
                           lower, upper, OperandOf<T>::kBlock, kBM, elem_strides,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CNN_CHECK(r == CUDA_SUCCESS,
            "conv2d wgmma-nhwc: cuTensorMapEncodeIm2col failed (error {}) for N={} H={} W={} "
            "Cp={} corners ({}, {}) ({}, {}) strides {}x{}",
            int(r), g.n, g.h, g.w, geo.c_pad, geo.lower_w, geo.lower_h, geo.upper_w, geo.upper_h,
            geo.stride_h, geo.stride_w);
  return map;
}

// The (N, H, W, Cp) copy as a 4-D tiled map for the halo tile: boxes of {one 128-byte row of
// channels, wp columns, box_h rows, 1 image}, 128-byte swizzle, zero fill outside the tensor
// (conv2d_halo_layout.h).
template <class T>
CUtensorMap make_halo_map(const T* d_nhwc, const Conv2dShape& g, int c_pad, const HaloGeometry& h) {
  CUtensorMap map{};
  const cuuint64_t dims[4] = {cuuint64_t(c_pad), cuuint64_t(g.w), cuuint64_t(g.h), cuuint64_t(g.n)};
  const cuuint64_t row = cuuint64_t(c_pad) * sizeof(T);
  const cuuint64_t strides[3] = {row, row * cuuint64_t(g.w), row * cuuint64_t(g.w) * g.h};
  const cuuint32_t box[4] = {cuuint32_t(OperandOf<T>::kBlock), cuuint32_t(h.box_w),
                             cuuint32_t(h.box_h), 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, OperandOf<T>::kTmaType, 4, const_cast<T*>(d_nhwc), dims, strides, box, elem_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CNN_CHECK(r == CUDA_SUCCESS,
            "conv2d wgmma-nhwc: cuTensorMapEncodeTiled failed (error {}) for the halo box {}x{} "
            "of N={} H={} W={} Cp={}",
            int(r), h.box_h, h.box_w, g.n, g.h, g.w, c_pad);
  return map;
}

// The packed (rows, K') weights, K' = taps * Cp, as a 2-D map (k, row), one-row x BN boxes
// (32 fp32 or 64 bf16 k), 128-byte swizzle, zero fill past the last row: the K-major B^T tile.
template <class T>
CUtensorMap make_packed_weight_map(const T* d_w, int64_t k, int rows, int bn) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(k) * sizeof(T)};
  const cuuint32_t box[2] = {cuuint32_t(OperandOf<T>::kBlock), cuuint32_t(bn)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      tensor_map_encoder()(&map, OperandOf<T>::kTmaType, 2, const_cast<T*>(d_w), dims, strides, box,
                           elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CNN_CHECK(r == CUDA_SUCCESS,
            "conv2d wgmma-nhwc: cuTensorMapEncodeTiled failed (error {}) for ({}, {}) weights",
            int(r), rows, k);
  return map;
}

int pick_splits(int64_t tiles, int ktiles, int sms) {
  // One wave at one block per SM: double the splits while the doubled grid still fits on the
  // SMs and each split keeps >= 4 k-tiles (as conv2d_wgmma.cu).
  int s = 1;
  while (s * 2 <= kMaxSplits && tiles * s * 2 <= sms && ktiles / (s * 2) >= 4) s *= 2;
  return s;
}

// The main kernel of one tile shape, element type and residency on tiles x splits blocks.
// The maps: A (and at kSplitA its residual copy), B (and at kSplit its residual pack); the maps
// an instance does not read may be any map.
struct NhwcMaps {
  CUtensorMap a, a_small, b, b_small;
};
template <int BN, class T, int kPerSm, bool kSplit = false, int kSub = 1>
void launch_nhwc(int64_t tiles, int splits, cudaStream_t stream, const char* name,
                 const NhwcMaps& maps, const NhwcParams& p) {
  launch_split_k_clusters(conv2d_wgmma_nhwc_kernel<BN, T, kPerSm, kSplit, kSub>, tiles, splits,
                          kThreads, NhwcPlan<BN, kPerSm, kSplit, kSub>::kSmemBytes, stream, name,
                          maps.a, maps.a_small, maps.b, maps.b_small, p);
}

// Whether this call loads A as halo tiles (WgmmaNhwcOptions::a_load); refuses halo tiles asked
// for with settings they do not run (the shape is checked by halo_geometry after).
bool use_halo(const Conv2dShape& g, const WgmmaNhwcOptions& opt, bool split, const char* what) {
  if (opt.a_load == NhwcALoad::Im2col) return false;
  if (opt.a_load == NhwcALoad::Halo) {
    CNN_CHECK(!split,
              "{}: algo wgmma-nhwc loads halo tiles at precision tf32 or bf16 (got fp32, 3xTF32)",
              what);
    CNN_CHECK(opt.blocks_per_sm == 0,
              "{}: algo wgmma-nhwc with halo tiles runs a residency of its own (got "
              "blocks_per_sm={}; expected 0)",
              what, opt.blocks_per_sm);
    return true;
  }
  if (split || opt.block_m != 0 || opt.blocks_per_sm != 0) return false;
  const int env = process_env_switches().wgmma_nhwc_halo;
  if (env >= 0) return env == 1 && halo_refusal(g).empty();
  return conv2d_wgmma_nhwc_pick_halo(g, opt.precision);
}

// The halo-tile kernel (conv2d_wgmma_halo.cuh) of width bn on tiles x splits blocks; maps.a is
// make_halo_map's.
template <class T>
void launch_halo(const Conv2dShape& g, const Im2colGeometry& geo, const HaloGeometry& hg, int bn,
                 int64_t tiles, int splits, cudaStream_t stream, const NhwcMaps& maps,
                 const float* d_b, float* d_y, bool relu) {
  HaloParams p{};
  p.bias = d_b;
  p.y = d_y;
  p.relu = relu;
  p.oh = g.oh();
  p.ow = g.ow();
  p.M = g.n * p.oh * p.ow;
  p.N = g.oc;
  p.taps = geo.taps;
  p.chunks = geo.chunks;
  p.kw = g.kw;
  p.ktiles = geo.ktiles;
  p.wp = hg.wp;
  p.rows = hg.rows;
  p.tiles_per_image = hg.tiles_per_image;
  p.lower_w = hg.lower_w;
  p.lower_h = hg.lower_h;
  p.slot_bytes = uint32_t(hg.slot_rows) * kRowBytes;
  p.box_bytes = uint32_t(hg.box_w) * uint32_t(hg.box_h) * kRowBytes;
  const int sub = hg.tile_rows / 128;
  const int smem = int(HaloSmem{p.slot_bytes, bn, sub}.bytes());
  const char* name = OperandOf<T>::kBf16 ? "conv2d_wgmma_halo_bf16" : "conv2d_wgmma_halo";
  auto go = [&](auto kernel) {
    launch_split_k_clusters(kernel, tiles, splits, kThreads, smem, stream, name, maps.a, maps.b, p);
  };
  if (bn == 32 && sub == 2)
    go(conv2d_wgmma_halo_kernel<32, T, 2>);
  else if (bn == 64 && sub == 2)
    go(conv2d_wgmma_halo_kernel<64, T, 2>);
  else if (bn == 32)
    go(conv2d_wgmma_halo_kernel<32, T, 1>);
  else if (bn == 64)
    go(conv2d_wgmma_halo_kernel<64, T, 1>);
  else
    go(conv2d_wgmma_halo_kernel<128, T, 1>);
}

// One launch of the main kernel: the GEMM view it convolves (the call's copy is its input), its
// output pixels and im2col geometry, where its taps start in the pack, and where it stores. The
// forward and the stride-1 input gradient are one launch of g itself; a strided input gradient
// is one launch a phase (NhwcDgradPhase), each storing its pixels of dx.
struct NhwcLaunch {
  Conv2dShape g;
  Im2colGeometry geo;
  int oh = 0, ow = 0;
  int b_tap0 = 0, b_kw = 0;
  PixelStore store;
  int64_t m() const { return int64_t(g.n) * oh * ow; }
};

NhwcLaunch whole_launch(const Conv2dShape& g, int block, const char* what) {
  NhwcLaunch l;
  l.g = g;
  l.geo = im2col_geometry(g, what, block);
  l.oh = g.oh();
  l.ow = g.ow();
  l.b_kw = g.kw;
  return l;
}

// What one call launches: g itself, or a strided input gradient's phases with taps, after
// zeroing the first zero_floats floats of y (dx's size where a phase has pixels but no taps: its
// pixels of dx are zero, as a 1x1 kernel's odd phases at stride 2).
struct NhwcCall {
  std::vector<NhwcLaunch> launches;
  int64_t zero_floats = 0;
};

// The tiles of one launch: width, rows, residency, K splits, and (one whole launch only) halo.
struct NhwcTiles {
  int bn = 0, bm = 128, per_sm = 1, splits = 1;
  bool halo = false;
  HaloGeometry hg;
  int64_t group_tiles = 0, tiles = 0;
};

// The K splits of a grid of `tiles` over `ktiles`: the option's, else CNN_WGMMA_NHWC_SPLITS's,
// else the pick.
int grid_splits(const WgmmaNhwcOptions& opt, int64_t tiles, int ktiles, int sms) {
  const int env_splits = process_env_switches().wgmma_nhwc_splits;
  return opt.splits > 0 ? opt.splits : env_splits ? env_splits : pick_splits(tiles, ktiles, sms);
}

// Two blocks an SM only with 32- and 64-column tiles: a 128-column consumer (64 accumulators
// per thread) does not compile within the 80 registers that two 384-thread blocks leave it.
// Three (56 registers a thread) only with 32-column tiles (16 accumulators; a 64-column stage
// would leave a ring of two), and not at FP32 (3xTF32: four tiles a stage). The 256-row tile:
// one.
int max_blocks_per_sm(int bm, int bn, bool split) {
  return bm == 256 || bn == 128 ? 1 : split || bn == 64 ? 2 : 3;
}

// The picked residency of `blocks` blocks of width bn: CNN_WGMMA_NHWC_PER_SM's, else the pick,
// at most `max`.
int picked_blocks_per_sm(int64_t blocks, int sms, int bn, int max) {
  const int env_per_sm = process_env_switches().wgmma_nhwc_blocks_per_sm;
  return std::min(env_per_sm ? env_per_sm : conv2d_wgmma_nhwc_pick_blocks_per_sm(blocks, sms, bn),
                  max);
}

template <bool kSplit>
NhwcTiles plan_tiles(const NhwcLaunch& l, const WgmmaNhwcOptions& opt, bool may_halo, int sms,
                     const char* what) {
  const Conv2dShape& g = l.g;
  const int64_t m = l.m();
  NhwcTiles t;
  const int env_bn = process_env_switches().wgmma_conv_block_n;
  // CNN_WGMMA_NHWC_BN32=0 leaves the 32-column tile out of the pick (for comparisons).
  t.bn = opt.block_n                              ? opt.block_n
         : env_bn                                 ? env_bn
         : process_env_switches().wgmma_nhwc_bn32 ? conv2d_wgmma_nhwc_pick_block_n(m, g.ocg())
                                                  : conv2d_wgmma_pick_block_n(m, g.ocg());
  const int bn = t.bn;
  CNN_CHECK(may_halo || opt.a_load != NhwcALoad::Halo,
            "{}: algo wgmma-nhwc loads halo tiles at stride 1 only (got a strided input gradient)",
            what);
  t.halo = may_halo && use_halo(g, opt, kSplit, what);
  CNN_CHECK(!t.halo || opt.block_m == 0 || opt.block_m == 128 || (opt.block_m == 256 && bn <= 64),
            "{}: algo wgmma-nhwc with halo tiles: block_m={} with block_n={} (expected 0 or 128, "
            "or 256 with block_n 32 or 64)",
            what, opt.block_m, bn);
  if (t.halo)
    t.hg = halo_geometry(g, what,
                         opt.block_m ? opt.block_m : conv2d_wgmma_nhwc_pick_halo_rows(g, bn, sms));
  CNN_CHECK(t.halo || opt.block_m == 0 || opt.block_m == 128 ||
                (opt.block_m == 256 && !kSplit && bn == 128 && opt.blocks_per_sm <= 1),
            "{}: algo wgmma-nhwc block_m={} with block_n={}, blocks_per_sm={} (expected 0 or "
            "128, or 256 at precision tf32 or bf16 with block_n 128 and one block an SM)",
            what, opt.block_m, bn, opt.blocks_per_sm);
  const int env_bm = process_env_switches().wgmma_nhwc_block_m;
  if (!t.halo && !kSplit && bn == 128 && opt.blocks_per_sm <= 1)
    t.bm = opt.block_m ? opt.block_m
           : env_bm    ? env_bm
                       : conv2d_wgmma_nhwc_pick_block_m(m * g.groups, g.ocg(), bn, sms);

  // Grouped: every group's tiles (halo tiles refuse groups).
  t.group_tiles = ceil_div<int64_t>(m, t.bm) * ceil_div<int64_t>(g.ocg(), bn);
  t.tiles = t.halo ? int64_t(g.n) * t.hg.tiles_per_image * ceil_div<int64_t>(g.oc, bn)
                   : t.group_tiles * g.groups;
  t.splits = grid_splits(opt, t.tiles, l.geo.ktiles, sms);
  CNN_CHECK(t.splits == 1 || t.splits == 2 || t.splits == 4 || t.splits == 8,
            "{}: splits={} (expected 1, 2, 4 or 8)", what, t.splits);

  const int max_per_sm = max_blocks_per_sm(t.bm, bn, kSplit);
  t.per_sm = opt.blocks_per_sm;  // 0 with halo tiles: their own (halo_blocks_per_sm)
  if (t.per_sm == 0 && !t.halo)
    t.per_sm = picked_blocks_per_sm(t.tiles * t.splits, sms, bn, max_per_sm);
  CNN_CHECK(t.per_sm <= max_per_sm,
            "{}: algo wgmma-nhwc blocks_per_sm={} with block_n={} (expected 1, 2 with block_n 32 "
            "or 64, or 3 with block_n 32 at precision tf32 or bf16)",
            what, t.per_sm, bn);
  return t;
}

// The main kernel instance of t's tile shape and residency.
template <class T, bool kSplit>
void launch_tiles(const NhwcTiles& t, cudaStream_t stream, const NhwcMaps& maps,
                  const NhwcParams& p) {
  const char* name = kSplit                ? "conv2d_wgmma_nhwc_3xtf32"
                     : OperandOf<T>::kBf16 ? "conv2d_wgmma_nhwc_bf16"
                                           : "conv2d_wgmma_nhwc";
  const int bn = t.bn, per_sm = t.per_sm;
  const int64_t tiles = t.tiles;
  const int splits = t.splits;
  if constexpr (kSplit) {
    if (bn == 32 && per_sm == 2)
      launch_nhwc<32, T, 2, true>(tiles, splits, stream, name, maps, p);
    else if (bn == 32)
      launch_nhwc<32, T, 1, true>(tiles, splits, stream, name, maps, p);
    else if (bn == 64 && per_sm == 2)
      launch_nhwc<64, T, 2, true>(tiles, splits, stream, name, maps, p);
    else if (bn == 64)
      launch_nhwc<64, T, 1, true>(tiles, splits, stream, name, maps, p);
    else
      launch_nhwc<128, T, 1, true>(tiles, splits, stream, name, maps, p);
  } else if (t.bm == 256) {
    launch_nhwc<128, T, 1, false, 2>(tiles, splits, stream, name, maps, p);
  } else if (bn == 32 && per_sm == 3) {
    launch_nhwc<32, T, 3>(tiles, splits, stream, name, maps, p);
  } else if (bn == 32 && per_sm == 2) {
    launch_nhwc<32, T, 2>(tiles, splits, stream, name, maps, p);
  } else if (bn == 32) {
    launch_nhwc<32, T, 1>(tiles, splits, stream, name, maps, p);
  } else if (bn == 64 && per_sm == 2) {
    launch_nhwc<64, T, 2>(tiles, splits, stream, name, maps, p);
  } else if (bn == 64) {
    launch_nhwc<64, T, 1>(tiles, splits, stream, name, maps, p);
  } else {
    launch_nhwc<128, T, 1>(tiles, splits, stream, name, maps, p);
  }
}

// The main kernel's parameters for launch l on tiles of group_tiles a group.
NhwcParams launch_params(const NhwcLaunch& l, int64_t group_tiles, const float* d_b, float* d_y,
                         bool relu) {
  NhwcParams p{};
  p.bias = d_b;
  p.y = d_y;
  p.relu = relu;
  p.M = int(l.m());
  p.N = l.g.ocg();
  p.ldc = l.g.oc;
  p.group_tiles = int(group_tiles);
  p.group_images = l.g.n;
  p.ktiles = l.geo.ktiles;
  p.chunks = l.geo.chunks;
  p.kw = l.g.kw;
  p.oh = l.oh;
  p.ow = l.ow;
  p.stride_h = l.g.stride_h;
  p.stride_w = l.g.stride_w;
  p.lower_h = l.geo.lower_h;
  p.lower_w = l.geo.lower_w;
  p.dil_h = l.geo.dil_h;
  p.dil_w = l.geo.dil_w;
  p.b_tap0 = l.b_tap0;
  p.b_kw = l.b_kw;
  p.store = l.store;
  return p;
}

// A call's phases stacked into grids of at most kMaxStackedPhases (NhwcStack): each stack lists
// its launches, the most k-tiles first (their blocks start in the first wave, the short ones
// fill in behind), and the tiles it runs on: 128 rows, the phases' width, splits and residency
// picked for the stack's whole grid and its shortest k.
struct NhwcStackPlan {
  std::vector<size_t> launches;
  std::vector<int64_t> group_tiles;  // a launch's tiles a group, in `launches` order
  NhwcTiles t;
};

// Whether this call stacks its phases (NhwcPhaseLaunch): several launches (a strided input
// gradient), TF32 or BF16, 128-row tiles.
bool stacks_phases(const NhwcCall& call, const WgmmaNhwcOptions& opt, bool split,
                   const char* what) {
  CNN_CHECK(opt.phase_launch != NhwcPhaseLaunch::Stacked || (!split && opt.block_m != 256),
            "{}: algo wgmma-nhwc stacks phases at precision tf32 or bf16 on 128-row tiles (got "
            "{}, block_m={})",
            what, split ? "fp32 (3xTF32)" : "tf32 or bf16", opt.block_m);
  if (call.launches.size() < 2 || split || opt.block_m == 256) return false;
  if (opt.phase_launch != NhwcPhaseLaunch::Auto)
    return opt.phase_launch == NhwcPhaseLaunch::Stacked;
  return process_env_switches().wgmma_nhwc_stack;
}

std::vector<NhwcStackPlan> plan_stacks(const NhwcCall& call, const std::vector<NhwcTiles>& plans,
                                       const WgmmaNhwcOptions& opt, int sms) {
  std::vector<size_t> order(call.launches.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return call.launches[a].geo.ktiles > call.launches[b].geo.ktiles;
  });
  std::vector<NhwcStackPlan> out;
  for (size_t first = 0; first < order.size(); first += kMaxStackedPhases) {
    NhwcStackPlan sp;
    NhwcTiles& t = sp.t;
    t.bn = plans[order[first]].bn;  // every phase's: the same N, the same pick
    t.bm = 128;
    int min_ktiles = INT32_MAX;
    for (size_t j = first; j < std::min(order.size(), first + kMaxStackedPhases); ++j) {
      const NhwcLaunch& l = call.launches[order[j]];
      const int64_t gt = ceil_div<int64_t>(l.m(), t.bm) * ceil_div<int64_t>(l.g.ocg(), t.bn);
      sp.launches.push_back(order[j]);
      sp.group_tiles.push_back(gt);
      t.tiles += gt * l.g.groups;
      min_ktiles = std::min(min_ktiles, l.geo.ktiles);
    }
    t.splits = grid_splits(opt, t.tiles, min_ktiles, sms);
    const int max_per_sm = max_blocks_per_sm(t.bm, t.bn, false);
    t.per_sm = opt.blocks_per_sm ? std::min(opt.blocks_per_sm, max_per_sm)
                                 : picked_blocks_per_sm(t.tiles * t.splits, sms, t.bn, max_per_sm);
    out.push_back(sp);
  }
  return out;
}

// One stack's grid (its tiles' width and residency; 128 rows, TF32 or BF16).
template <class T>
void launch_stack(const NhwcTiles& t, cudaStream_t stream, const NhwcStack& st,
                  const CUtensorMap& map_b) {
  const char* name =
      OperandOf<T>::kBf16 ? "conv2d_wgmma_nhwc_stacked_bf16" : "conv2d_wgmma_nhwc_stacked";
  auto go = [&](auto kernel, int smem) {
    launch_split_k_clusters(kernel, t.tiles, t.splits, kThreads, smem, stream, name, st, map_b);
  };
  if (t.bn == 32 && t.per_sm == 3)
    go(conv2d_wgmma_nhwc_stacked_kernel<32, T, 3>, NhwcPlan<32, 3>::kSmemBytes);
  else if (t.bn == 32 && t.per_sm == 2)
    go(conv2d_wgmma_nhwc_stacked_kernel<32, T, 2>, NhwcPlan<32, 2>::kSmemBytes);
  else if (t.bn == 32)
    go(conv2d_wgmma_nhwc_stacked_kernel<32, T, 1>, NhwcPlan<32, 1>::kSmemBytes);
  else if (t.bn == 64 && t.per_sm == 2)
    go(conv2d_wgmma_nhwc_stacked_kernel<64, T, 2>, NhwcPlan<64, 2>::kSmemBytes);
  else if (t.bn == 64)
    go(conv2d_wgmma_nhwc_stacked_kernel<64, T, 1>, NhwcPlan<64, 1>::kSmemBytes);
  else
    go(conv2d_wgmma_nhwc_stacked_kernel<128, T, 1>, NhwcPlan<128, 1>::kSmemBytes);
}

// Runs conv(a, packed weights) of the GEMM view g (a: g's input, NCHW) into y, NCHW, with
// operands of type T: the pre-pass (weights and copy, one launch) into the scratch, then the main
// kernel once a launch of `call` (NhwcCall). kSplit (T float): 3xTF32,
// two weight packs, and the copy unrounded (one block an SM) or split into two copies (two an SM).
// d_ready_copy: the channels-last copy of d_a already written (the input gradient after the
// BF16 weight gradient: conv2d_backward_data_wgmma_nhwc_from_copy); the pre-pass then packs the
// weights only, at the start of d_scratch.
template <class T, bool kSplit = false>
void run(const Conv2dShape& g, const WeightPack& wp, const NhwcCall& call, const float* d_a,
         const float* d_w, const float* d_b, float* d_y, bool relu, float* d_scratch,
         cudaStream_t stream, const WgmmaNhwcOptions& opt, const char* what,
         const T* d_ready_copy = nullptr) {
  CNN_CHECK(conv2d_wgmma_nhwc_available(),
            "{}: algo wgmma-nhwc needs a compute capability 9.0 GPU and a build with CUDA "
            "architecture 90",
            what);
  CNN_CHECK(opt.block_n == 0 || opt.block_n == 32 || opt.block_n == 64 || opt.block_n == 128,
            "{}: algo wgmma-nhwc block_n={} (expected 0, 32, 64 or 128)", what, opt.block_n);
  CNN_CHECK(opt.blocks_per_sm == 0 || opt.blocks_per_sm == 1 ||
                (opt.blocks_per_sm == 2 && opt.block_n != 128) ||
                (opt.blocks_per_sm == 3 && (opt.block_n == 0 || opt.block_n == 32)),
            "{}: algo wgmma-nhwc blocks_per_sm={} with block_n={} (expected 0 or 1, 2 with "
            "block_n 0, 32 or 64, or 3 with block_n 0 or 32)",
            what, opt.blocks_per_sm, opt.block_n);
  CNN_CHECK(!kSplit || opt.blocks_per_sm <= 2,
            "{}: algo wgmma-nhwc at precision fp32 (3xTF32) runs one or two blocks an SM (got "
            "blocks_per_sm={})",
            what, opt.blocks_per_sm);
  const int sms = sm_count();  // a device query each call: asked once for the pickers below
  constexpr int kBlock = OperandOf<T>::kBlock;
  const int c_pad = (g.cg() + kBlock - 1) / kBlock * kBlock;  // a group's channels in the copy
  const int64_t a_elems = int64_t(g.n) * g.c * g.h * g.w;
  const int64_t copy_elems = int64_t(g.n) * g.groups * g.h * g.w * c_pad;
  const std::vector<NhwcLaunch>& launches = call.launches;
  int64_t y_elems = call.zero_floats;
  for (const NhwcLaunch& l : launches) y_elems = std::max(y_elems, l.m() * l.g.oc);
  CNN_CHECK(a_elems <= INT32_MAX && copy_elems <= INT32_MAX && y_elems <= INT32_MAX &&
                int64_t(wp.rows) * wp.taps * wp.k_pad <= INT32_MAX,
            "{}: algo wgmma-nhwc handles tensors of at most 2^31-1 elements", what);
  // Halo tiles run a whole stride-1 launch only (their epilogue stores no phase).
  const bool may_halo = launches.size() == 1 && launches[0].store.phase_w == 0;
  std::vector<NhwcTiles> plans;
  for (const NhwcLaunch& l : launches)
    plans.push_back(plan_tiles<kSplit>(l, opt, may_halo, sms, what));
  // At FP32 the residency decides the copy (split or not), which every launch reads: the
  // launches take the smallest of their picks (one an SM is open to every tile width).
  if (kSplit && plans.size() > 1) {
    int per_sm = 2;
    for (const NhwcTiles& t : plans) per_sm = std::min(per_sm, t.per_sm);
    for (NhwcTiles& t : plans) t.per_sm = per_sm;
  }
  std::vector<NhwcStackPlan> stacks;
  if (stacks_phases(call, opt, kSplit, what)) stacks = plan_stacks(call, plans, opt, sms);
  // Checked after the refusals above, so that a variant that cannot run says why, not that it
  // was given no scratch (autotune passes its scratch to every candidate alike).
  const NhwcScratchLayout layout = nhwc_scratch_layout(g, wp, opt.precision);
  CNN_CHECK(d_scratch,
            "{}: algo wgmma-nhwc needs a scratch of {} floats ({}_scratch_floats), got null", what,
            layout.floats(), what);
  CNN_CHECK((reinterpret_cast<uintptr_t>(d_scratch) & 15u) == 0,
            "{}: algo wgmma-nhwc needs a 16-byte aligned scratch", what);

  T* d_wpack = reinterpret_cast<T*>(d_scratch);  // (rows, taps, k_pad)
  T* d_wsmall = d_wpack + layout.pack_elems;     // kSplit: the residual pack
  T* d_nhwc = d_ready_copy ? const_cast<T*>(d_ready_copy)  // (N, H, W, c_pad)
                           : d_wpack + layout.weight_elems;
  T* d_nhwc_small = d_nhwc + layout.copy_elems;  // kSplit at two an SM: A's residual copy
  const bool split_a = kSplit && !plans.empty() && plans[0].per_sm > 1;
  // Both pre-passes in one launch (conv2d_nhwc_prepass.h: each alone cost about a launch's
  // latency).
  NhwcWeightJob weights;
  weights.wp = wp;
  weights.d_w = d_w;
  weights.d_out = d_wpack;
  NhwcCopyJob copy;
  copy.d_x = d_ready_copy ? nullptr : d_a;  // null: no copy job
  copy.n = g.n;
  copy.c = g.cg();
  copy.hw = int64_t(g.h) * g.w;
  copy.c_pad = c_pad;
  copy.d_out = d_nhwc;
  copy.groups = g.groups;
  if constexpr (kSplit) {
    weights.d_small = d_wsmall;
    if (split_a) copy.d_small = d_nhwc_small;  // else the copy stays unrounded
  }
  conv_nhwc_prepass_cuda(kSplit ? Precision::FP32 : OperandOf<T>::kPrecision, weights, copy,
                         stream);
  if (call.zero_floats > 0)
    CNN_CUDA_CHECK(cudaMemsetAsync(d_y, 0, size_t(call.zero_floats) * sizeof(float), stream));

  const int64_t packed_k = int64_t(wp.taps) * wp.k_pad;
  if constexpr (!kSplit) {
    for (const NhwcStackPlan& sp : stacks) {
      NhwcStack st{};
      st.count = int(sp.launches.size());
      int64_t first = 0;
      for (int j = 0; j < st.count; ++j) {
        const NhwcLaunch& l = launches[sp.launches[j]];
        st.phase[j].map_a = make_im2col_map(d_nhwc, l.g, l.geo);
        st.phase[j].p = launch_params(l, sp.group_tiles[j], d_b, d_y, relu);
        st.phase[j].first_tile = int(first);
        first += sp.group_tiles[j] * l.g.groups;
      }
      launch_stack<T>(sp.t, stream, st,
                      make_packed_weight_map(d_wpack, packed_k, wp.rows, sp.t.bn));
    }
    if (!stacks.empty()) return;
  }
  for (size_t i = 0; i < launches.size(); ++i) {
    const NhwcLaunch& l = launches[i];
    const NhwcTiles& t = plans[i];
    NhwcMaps maps;
    maps.a = t.halo ? make_halo_map(d_nhwc, l.g, l.geo.c_pad, t.hg)
                    : make_im2col_map(d_nhwc, l.g, l.geo);
    maps.a_small = split_a ? make_im2col_map(d_nhwc_small, l.g, l.geo) : maps.a;
    maps.b = make_packed_weight_map(d_wpack, packed_k, wp.rows, t.bn);
    maps.b_small = kSplit ? make_packed_weight_map(d_wsmall, packed_k, wp.rows, t.bn) : maps.b;
    if (t.halo) {
      launch_halo<T>(l.g, l.geo, t.hg, t.bn, t.tiles, t.splits, stream, maps, d_b, d_y, relu);
      continue;
    }
    launch_tiles<T, kSplit>(t, stream, maps, launch_params(l, t.group_tiles, d_b, d_y, relu));
  }
}

// The input gradient's shape: valid, and one it runs (nhwc_input_gradient_refusal).
void check_input_gradient_shape(const Conv2dShape& s, const char* what) {
  check_conv2d_shape_any(s);
  const std::string why = nhwc_input_gradient_refusal(s);
  CNN_CHECK(why.empty(), "{}: {}", what, why);
}

// The input gradient of s: the GEMM view itself at stride 1, else one launch a phase with taps.
NhwcCall backward_data_call(const Conv2dShape& s, int block, const char* what) {
  if (s.stride_h == 1 && s.stride_w == 1)
    return {{whole_launch(backward_data_as_forward(s), block, what)}, 0};
  NhwcCall call;
  for (const NhwcDgradPhase& ph : nhwc_dgrad_phases(s, what, block)) {
    if (ph.ty == 0 || ph.tx == 0) {
      call.zero_floats = int64_t(s.n) * s.c * s.h * s.w;
      continue;
    }
    NhwcLaunch l;
    l.g = ph.g;
    l.geo = ph.geo;
    l.oh = ph.oh;
    l.ow = ph.ow;
    l.b_tap0 = ph.tap_y0 * s.kw + ph.tap_x0;
    l.b_kw = s.kw;
    l.store = {s.h * s.w, ph.ow, s.stride_h * s.w, s.stride_w, ph.py * s.w + ph.px};
    call.launches.push_back(l);
  }
  return call;
}

// run() at the options' precision, on the caller's scratch. wp was packed for that precision's
// channel block.
void run_at_precision(const Conv2dShape& g, const WeightPack& wp, const NhwcCall& call,
                      const float* d_a, const float* d_w, const float* d_b, float* d_y, bool relu,
                      float* d_scratch, cudaStream_t stream, const WgmmaNhwcOptions& opt,
                      const char* what) {
  if (opt.precision == Precision::BF16)
    run<__nv_bfloat16>(g, wp, call, d_a, d_w, d_b, d_y, relu, d_scratch, stream, opt, what);
  else if (opt.precision == Precision::FP32)
    run<float, true>(g, wp, call, d_a, d_w, d_b, d_y, relu, d_scratch, stream, opt, what);
  else
    run<float>(g, wp, call, d_a, d_w, d_b, d_y, relu, d_scratch, stream, opt, what);
}

}  // namespace

int conv2d_wgmma_nhwc_pick_blocks_per_sm(int64_t blocks, int sms, int block_n) {
  // Two an SM when one an SM would take more than one wave (three with 32-column tiles when two
  // would); a grid that fits one wave keeps the deeper ring. 128-column tiles: one.
  if (block_n == 128) return 1;
  if (block_n == 32 && blocks > 2 * int64_t(sms)) return 3;
  return blocks > sms ? 2 : 1;
}

int conv2d_wgmma_nhwc_pick_block_m(int64_t m, int n, int block_n, int sms) {
  // The 256-row tile where its grid, split at most in two, covers 90% of the SMs: VGG's
  // 128-256-channel layers at 16x16 (128 tiles) and 8x8 (64 tiles of 256 channels) ran 1.1-1.34x
  // faster. Where it needs four splits (a 128-channel 8x8 input gradient: 32 tiles; ResNet's
  // 7x7 layers) the splits' smaller k ranges and wider reduction cost more than it saves
  // (0.6-0.85x). 64-column tiles keep 128 rows: there two blocks an SM of the 128-row tile
  // were as fast or faster (docs/performance.md).
  if (block_n != 128) return 128;
  const int64_t tall_tiles = ceil_div<int64_t>(m, 256) * ceil_div<int64_t>(n, block_n);
  return tall_tiles * 2 * 10 >= int64_t(sms) * 9 ? 256 : 128;
}

int conv2d_wgmma_nhwc_pick_halo_rows(const Conv2dShape& g, int block_n, int sms) {
  // 256 rows: each consumer warpgroup multiplies two 64-row blocks on a B tile, so a ring stage
  // and a k-tile's loop work serve twice the multiplies.
  if (block_n > 64 || !halo_refusal(g, 256).empty()) return 128;
  const HaloGeometry tall = halo_geometry(g, "conv2d_wgmma_nhwc_pick_halo_rows", 256);
  const HaloGeometry base = halo_geometry(g, "conv2d_wgmma_nhwc_pick_halo_rows", 128);
  const int64_t tiles = int64_t(g.n) * tall.tiles_per_image * ceil_div<int64_t>(g.oc, block_n);
  return tiles * 10 >= int64_t(sms) * 9 &&
                 halo_useful_fraction(g, tall) >= halo_useful_fraction(g, base) - 0.05
             ? 256
             : 128;
}

bool conv2d_wgmma_nhwc_pick_halo(const Conv2dShape& g, Precision precision) {
  // One TMA box of the tile's rows per chunk instead of one 128-pixel im2col copy per tap and
  // chunk; the price is the tile rows that are not output pixels (the row pitch's KW - 1 extra
  // columns, and what 128 / wp rows leave over), computed and dropped. Measured on the H200
  // (docs/performance.md): faster on LeNet's 5x5 conv2 (forward 25.0 -> 24.0 us, input gradient
  // 36.0 -> 29.8 in TF32), as fast on 14x14 3x3 layers, slower on 3x3 layers of 28x28 and up
  // (the im2col kernel's 256 x 128 tile, 48 us against 72 on VGG's conv4) and at 7x7: 16 taps
  // or more a box.
  if (precision == Precision::FP32 || g.kh * g.kw < 16 || !halo_refusal(g).empty()) return false;
  const HaloGeometry h = halo_geometry(g, "conv2d_wgmma_nhwc_pick_halo");
  return halo_useful_fraction(g, h) >= 0.5;
}

int conv2d_wgmma_nhwc_pick_block_n(int64_t m, int n) {
  // At most 32 columns: the 32-wide tile, whose wgmmas and weight boxes are half the 64-wide
  // one's and whose 20 KB stage fits three blocks an SM (LeNet's conv2 input gradient, 32
  // channels; ResNet's 32-channel layers). Wider: as the NCHW kernel.
  if (n <= 32) return 32;
  return conv2d_wgmma_pick_block_n(m, n);
}

bool conv2d_wgmma_nhwc_available() {
  return conv2d_wgmma_available();
}

void conv2d_forward_wgmma_nhwc(const Conv2dShape& s, const float* d_x, const float* d_w,
                               const float* d_b, float* d_y, bool relu, float* d_scratch,
                               cudaStream_t stream, const WgmmaNhwcOptions& opt) {
  const char* what = "conv2d_forward";
  check_conv2d_shape_any(s);
  CNN_CHECK(d_x && d_w && d_y, "{}: null tensor pointer", what);
  const int block = nhwc_channel_block(opt.precision, what);
  run_at_precision(s, forward_weight_pack(s, block), NhwcCall{{whole_launch(s, block, what)}, 0},
                   d_x, d_w, d_b, d_y, relu, d_scratch, stream, opt, what);
}

void conv2d_backward_data_wgmma_nhwc_from_copy(const Conv2dShape& s, const uint16_t* d_dy_copy,
                                               const float* d_w, float* d_dx, float* d_scratch,
                                               cudaStream_t stream, const WgmmaNhwcOptions& opt) {
  const char* what = "conv2d_backward_data";
  check_input_gradient_shape(s, what);
  CNN_CHECK(opt.precision == Precision::BF16,
            "{}: the input gradient from a channels-last dy copy runs at precision bf16 only "
            "(got {})",
            what, precision_name(opt.precision));
  CNN_CHECK(d_dy_copy && d_w && d_dx, "{}: null tensor pointer", what);
  CNN_CHECK((reinterpret_cast<uintptr_t>(d_dy_copy) & 15u) == 0,
            "{}: the channels-last dy copy must be 16-byte aligned", what);
  const int block = nhwc_channel_block(opt.precision, what);
  run<__nv_bfloat16>(backward_data_as_forward(s), backward_data_weight_pack(s, block),
                     backward_data_call(s, block, what), nullptr, d_w, nullptr, d_dx, false,
                     d_scratch, stream, opt, what,
                     reinterpret_cast<const __nv_bfloat16*>(d_dy_copy));
}

void conv2d_backward_data_wgmma_nhwc(const Conv2dShape& s, const float* d_dy, const float* d_w,
                                     float* d_dx, float* d_scratch, cudaStream_t stream,
                                     const WgmmaNhwcOptions& opt) {
  const char* what = "conv2d_backward_data";
  check_input_gradient_shape(s, what);
  CNN_CHECK(d_dy && d_w && d_dx, "{}: null tensor pointer", what);
  const int block = nhwc_channel_block(opt.precision, what);
  run_at_precision(backward_data_as_forward(s), backward_data_weight_pack(s, block),
                   backward_data_call(s, block, what), d_dy, d_w, nullptr, d_dx, false, d_scratch,
                   stream, opt, what);
}

}  // namespace cnn
