// Hopper wgmma GEMM (see gemm_wgmma.h). One block computes a 128 x 128 tile of C over a range of
// k-tiles of 32; 384 threads in three warpgroups:
//   warpgroup 0, the producer: fills a ring of kStages shared-memory stages, each holding the A
//     tile (128 rows x 32 k) and the B^T tile (128 columns x 32 k), both K-major in the 128-byte
//     swizzled layout that wgmma's descriptors name (row r at r * 128 bytes, its 16-byte chunk c
//     stored at chunk c ^ (r % 8); 8-row groups 1024 bytes apart). TMA writes that layout itself
//     (CU_TENSOR_MAP_SWIZZLE_128B, zero fill past the edges); the gather path writes it with
//     st.shared and fence.proxy.async. A stage is announced on its `full` mbarrier (TMA bytes
//     and/or 128 producer arrivals) and reused once its `empty` mbarrier has seen the 8 consumer
//     warps release it.
//   With WgmmaMnLoad::Tma, an M/N-contiguous operand (TMA-aligned) is not gathered: thread 0
//     loads it by TMA as it lies, four 32 (rows) x 32 (k) boxes in the 128-byte swizzle, into a
//     staging ring (kStages - 1 k-tiles ahead, on the `staged` mbarriers), and the 128 producer
//     threads transpose each staged tile shared -> shared into the K-major stage with 16-byte
//     loads and stores (fence.proxy.async, then the `full` arrive). The gather's serial
//     load-then-store per stage became asynchronous copies that stay in flight.
//   BF16 (kBf16): a k-tile is 64 k, the stage tiles hold BF16 (still 128-byte rows, the same
//     swizzle and descriptors), and every operand passes through the producer's registers to be
//     rounded: TMA brings the FP32 tile into the staging ring (two 128 x 32 boxes when
//     K-contiguous, four 32 x 64 when M/N-contiguous), and the producer threads convert it into
//     the stage (convert_staged_k), transposing too when M/N-contiguous (transpose_staged_bf16);
//     the gather (misaligned operands) converts as it stores. The TMA of a k-tile is issued as
//     soon as its staging slot is free, kStages (2) k-tiles ahead.
//   3xTF32 (FP32): every operand arrives by TMA; the producer threads split the landed B^T tile
//     into TF32(v) in place and TF32(v - TF32(v)) in the stage's small-part slot; each consumer
//     thread loads its A fragments unrounded, splits them in registers, and a k-step is three
//     wgmma with A from registers (small_A big_B, big_A small_B, big_A big_B).
//   warpgroups 1 and 2, the consumers: warpgroup w multiplies rows [64 (w - 1), +64) of the tile,
//     4 wgmma.m64n128k8 TF32 (k16 BF16; 12 in 3xTF32) per stage, one stage's group kept in
//     flight while the next is issued.
// Epilogue: the consumers write their accumulators to shared memory (reusing the stage ring);
// the blocks of the cluster (the k splits of one tile, blockIdx.z = cluster rank) then each sum
// a band of 128 / splits rows over all ranks' partial tiles, read through distributed shared
// memory in rank order (so any split count gives bitwise repeatable results), and apply alpha,
// beta, bias and ReLU on the way to global memory. With split groups (Params::work), k is split
// across groups x splits blocks, each cluster's band sums go raw to its group's workspace plane,
// and split_k_reduce adds the planes in group order and applies the epilogue.
// <cuda.h> gives CUtensorMap and its enums only: the encoder comes from the runtime's driver
// entry point, so nothing links libcuda.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_wgmma_tile.cuh"
#include "kernels/gemm/gemm_cuda.h"
#include "kernels/gemm/gemm_wgmma.h"
#include "kernels/gemm/split_k_reduce.h"
#include "kernels/gemm/wgmma_ptx.cuh"
#include "runtime/cuda_check.h"
#include "runtime/env_switches.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

using namespace wgmma;

constexpr int kBM = 128, kBN = 128;          // block tile
static_assert(kBM == kGemmWorkRowStep, "callers step workspace sizes by the tile's rows");
constexpr int kThreads = 384;                // producer + 2 consumer warpgroups
constexpr int kTileBytes = kBM * 128;        // 16 KB, A or B^T tile of one stage (128-byte rows)
constexpr int kStageBytes = 2 * kTileBytes;  // A then B^T
// k of one k-tile: one 128-byte swizzle row of operands, 32 TF32 (FP32 storage) or 64 BF16.
constexpr int k_tile(bool bf16) {
  return bf16 ? 64 : 32;
}
// The fewest k-tiles a picked split keeps: 128 k, four TF32 k-tiles. Counted in k, not k-tiles,
// because the producer stages FP32 either way, so a BF16 k-tile (64 k) brings twice the bytes of
// a TF32 one (VGG's BF16 fc1 input gradient, k = 512: 2 groups of 2 splits of 2 k-tiles took
// 12.5 us on an H100, 2 splits of 4 k-tiles 14.7).
constexpr int min_split_ktiles(bool bf16) {
  return 128 / k_tile(bf16);
}
constexpr int kFloatBoxK = 32;      // k of a TMA box of FP32 (128 bytes, the swizzle's limit)
constexpr int kEpiPitch = kBN + 4;  // floats; rows stay 16-byte aligned
static_assert(kBM == kBN, "the gather maps one producer thread per tile row");
// The picker stays within the portable cluster size; 16 splits (a non-portable cluster, placed
// where a GPC has 16 free SMs, else fewer: placeable_splits) run only when asked for.
constexpr int kMaxPickedSplits = 8;
constexpr int kMaxGroups = 16;  // split groups (clusters a tile's k is split across), at most

// How the producer fills an operand's K-major tile:
//   kTmaK:   TMA straight into the swizzled K-major tile (K-contiguous operand);
//   kGather: ordinary loads, written transposed/swizzled by the producer threads;
//   kTmaMN:  TMA of the tile as it lies (M/N-contiguous: four 32 x 32 boxes, 128-byte swizzle)
//            into a staging buffer, then transposed shared -> shared by the producer threads.
enum Load { kTmaK, kGather, kTmaMN };

// Shared-memory plan of one instantiation: the K-major stage ring, then a staging ring of the
// same depth for the operands that arrive by TMA as FP32 and are rewritten by the producer, then
// the mbarriers full, empty, staged.
//   TF32: only kTmaMN operands are staged (16 KB a k-tile); two staged operands leave room for
//     3 stages (192 KB), one for 4 (192 KB), none for 6 (192 KB: the TMA of a k-tile is issued
//     when the stage 6 k-tiles back is consumed, which hides more of the load latency of a short
//     k loop such as fc1's forward, 12 k-tiles a block).
//   BF16: every TMA operand is staged, K-contiguous ones too (they need the conversion), 32 KB
//     of FP32 for a k-tile of 64 k, into 16 KB of BF16: 2 stages (192 KB) with both staged;
//     gathered operands (written as BF16 straight into the stage) need no staging: 4 (128 KB).
//   3xTF32 (kSplit, FP32 accuracy): staged as TF32, plus the small part of each stage's B^T
//     tile (16 KB): 4 stages with no staged operand (192 KB), 3 with one (192 KB), 2 with two
//     (160 KB).
template <bool kBf16, bool kSplit, int kLA, int kLB>
struct Plan {
  static_assert(!(kBf16 && kSplit), "3xTF32 splits FP32 operands");
  static_assert(!kSplit || (kLA != kGather && kLB != kGather),
                "3xTF32 takes TMA-aligned operands only");
  static constexpr bool kAStaged = kBf16 ? kLA != kGather : kLA == kTmaMN;
  static constexpr bool kBStaged = kBf16 ? kLB != kGather : kLB == kTmaMN;
  static constexpr int kStagedOps = int(kAStaged) + int(kBStaged);
  // The producer threads rewrite each stage after its TMA has landed (transpose, convert to BF16
  // or split for 3xTF32), then announce it on `full`.
  static constexpr bool kStaged = kStagedOps > 0 || kSplit;
  static constexpr bool kMN = kLA == kTmaMN || kLB == kTmaMN;                // a transposed operand
  static constexpr int kStagingBytes = kBf16 ? 2 * kTileBytes : kTileBytes;  // one operand
  static constexpr int kStages = kBf16    ? (kStagedOps == 2   ? 2
                                             : kStagedOps == 1 ? 3
                                                               : 4)
                                 : kSplit ? 4 - kStagedOps
                                          : (kStagedOps == 2   ? 3
                                             : kStagedOps == 1 ? 4
                                                               : 6);
  static constexpr int kStagingOffset = kStages * kStageBytes;
  static constexpr int kSmallOffset = kStagingOffset + kStages * kStagedOps * kStagingBytes;
  static constexpr int kSmallSlots = kSplit ? kStages : 0;  // small B^T, one a stage
  static constexpr int kBarrierOffset = kSmallOffset + kSmallSlots * kTileBytes;
  static constexpr int kSmemBytes = 1024 + kBarrierOffset + 3 * kStages * 8;  // + alignment
  // The partial tile of the epilogue reuses the rings (stages and staging: every copy has
  // landed by then).
  static_assert(kBM * kEpiPitch * 4 <= kBarrierOffset, "epilogue tile must fit the rings");
  static_assert(kSmemBytes <= 227 * 1024, "over the per-block shared-memory limit");
};

// Operand (r, k) of the A tile is op(A)[m0 + r][k]; of the B^T tile, op(B)[k][n0 + r]. Stored at
// ptr[r * ld + k] when kcontig, else ptr[k * ld + r] (row index global).
struct Operand {
  const float* ptr;
  int64_t ld;
  int rows;  // m for A, n for B
  bool kcontig;
};

struct Params {
  Operand a, b;
  int M, N, K;
  int ktiles;  // ceil(K / kBK)
  float* c;
  int64_t ldc;
  float alpha, beta;
  const float* bias;  // (N) or null
  bool relu;
  bool vec_c;  // C 16-byte aligned with ldc a multiple of 4: the epilogue moves float4s
  // Split groups (WgmmaOptions::groups > 1): (groups, M, ldw) partial sums, one plane a cluster,
  // ldw = N rounded up to 4; null: the epilogue writes C.
  float* work;
  int64_t ldw;
  int groups;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CNN_WGMMA_DEVICE_CODE 1

// Producer thread t (0..127) fills its part of one 128 x 32 operand tile at `dst` from global
// memory, zeros outside rows x K; in two halves of 16 loads, each issued before its stores
// (all 32 at once leave too few registers for the consumers' accumulators: ptxas spilled).
//   M/N-contiguous source: thread t owns tile row t, eight 4-k chunks; a warp reads 32
//     consecutive floats of one k row per load (coalesced).
//   K-contiguous source (misaligned for TMA): thread t owns chunk t % 8 of rows t / 8 + 16 j;
//     8 lanes cover one row's 32 k.
__device__ __forceinline__ void gather_tile(uint32_t dst, const Operand& op, int row0, int k0,
                                            int K, int t) {
  float v[4][4];
  if (!op.kcontig) {
    const int row = row0 + t;
    const bool row_ok = row < op.rows;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int k = k0 + 16 * half + 4 * c + e;
          v[c][e] = (row_ok && k < K) ? __ldg(op.ptr + int64_t(k) * op.ld + row) : 0.f;
        }
#pragma unroll
      for (int c = 0; c < 4; ++c)
        st_shared_v4(dst + sw128_offset(t, 4 * half + c), v[c][0], v[c][1], v[c][2], v[c][3]);
    }
  } else {
    const int c = t & 7, rb = t >> 3;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int row = row0 + rb + 16 * (4 * half + j);
        const float* src = op.ptr + int64_t(row) * op.ld;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int k = k0 + 4 * c + e;
          v[j][e] = (row < op.rows && k < K) ? __ldg(src + k) : 0.f;
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j)
        st_shared_v4(dst + sw128_offset(rb + 16 * (4 * half + j), c), v[j][0], v[j][1], v[j][2],
                     v[j][3]);
    }
  }
}

// Four FP32 values split for 3xTF32 (ptx::split_tf32): TF32(v) as a 16-byte chunk at `big`,
// TF32(v - TF32(v)) at `small`. Both are exact TF32 values, so the tensor cores read them as
// they are, whether they would truncate or round the raw FP32 bits.
__device__ __forceinline__ void st_split(uint32_t big, uint32_t small, float4 v) {
  const ptx::Tf32Split x = ptx::split_tf32(v.x), y = ptx::split_tf32(v.y), z = ptx::split_tf32(v.z),
                       w = ptx::split_tf32(v.w);
  st_shared_v4(big, __uint_as_float(x.big), __uint_as_float(y.big), __uint_as_float(z.big),
               __uint_as_float(w.big));
  st_shared_v4(small, __uint_as_float(x.small), __uint_as_float(y.small), __uint_as_float(z.small),
               __uint_as_float(w.small));
}

// Producer thread t (0..127) transposes its part of one staged M/N-major tile `src` into the
// K-major swizzled tile `dst`. src holds four TMA boxes of 32 rows x 32 k, box q the rows
// [32 q, +32): k row kk at q * 4096 + kk * 128, the 16-byte chunk of rows 4 c .. 4 c + 3 at chunk
// c ^ (kk % 8). The tile is 32 x 8 blocks of 4 rows x 4 k; thread t owns two: it reads the 4 k
// rows of a block (4 x 16-byte loads), and writes its 4 tile rows (4 x 16-byte stores), the 4 x 4
// transpose happening in registers. Lane i = t % 8 of each quarter warp takes row chunk
// mc = i + 8 mhi and k chunk kc = ((i / 2) ^ u) + 4 h ((mhi, u, h) from t / 8 and the repeat),
// which gives the 8 lanes 8 distinct 16-byte bank groups on both sides of the swizzle: loads
// (i ^ 4 (kc % 2) ^ e) and stores (kc ^ 4 (i % 2) ^ j) conflict-free.
// kSplit (3xTF32): each value is written split instead, TF32(v) into dst and TF32(v - TF32(v))
// into `small` at the same offset (st_split).
template <bool kSplit>
__device__ __forceinline__ void transpose_staged(uint32_t dst, uint32_t src, int t,
                                                 uint32_t small) {
  auto store = [&](uint32_t off, float x, float y, float z, float w) {
    if constexpr (kSplit)
      st_split(dst + off, small + off, make_float4(x, y, z, w));
    else
      st_shared_v4(dst + off, x, y, z, w);
  };
  const int i = t & 7, g = t >> 3;
#pragma unroll
  for (int rep = 0; rep < 2; ++rep) {
    const int combo = 2 * g + rep;  // 0..31
    const int mc = i + 8 * (combo & 3);
    const int kc = ((i >> 1) ^ ((combo >> 2) & 3)) + 4 * (combo >> 4);
    float4 v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int kk = 4 * kc + e;
      v[e] =
          ld_shared_v4(src + uint32_t((mc >> 3) * 4096 + kk * 128 + (((mc & 7) ^ (kk & 7)) << 4)));
    }
    store(sw128_offset(4 * mc + 0, kc), v[0].x, v[1].x, v[2].x, v[3].x);
    store(sw128_offset(4 * mc + 1, kc), v[0].y, v[1].y, v[2].y, v[3].y);
    store(sw128_offset(4 * mc + 2, kc), v[0].z, v[1].z, v[2].z, v[3].z);
    store(sw128_offset(4 * mc + 3, kc), v[0].w, v[1].w, v[2].w, v[3].w);
  }
}

// Producer thread t (0..127) splits one landed 128 x 32 FP32 tile in place for 3xTF32: each
// value v becomes TF32(v) (nearest), and TF32(v - TF32(v)) goes to the same offset in `small`.
// Element-wise, so the swizzle does not matter: thread t takes the 16-byte chunks t + 128 j
// (a warp's 32 chunks are 512 consecutive bytes: no bank conflicts), all loads before the
// stores.
__device__ __forceinline__ void split_tile(uint32_t tile, uint32_t small, int t) {
  constexpr int kChunks = kTileBytes / 16 / 128;  // 8 a thread
  float4 v[kChunks];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) v[j] = ld_shared_v4(tile + uint32_t(t + 128 * j) * 16);
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const uint32_t off = uint32_t(t + 128 * j) * 16;
    st_split(tile + off, small + off, v[j]);
  }
}

// ---- BF16: the K-major tile holds 64 k a row (8 chunks of 8 bf16), written by the producer ----

// Eight FP32 values of one row, k ascending, rounded to BF16 and stored as one 16-byte chunk.
__device__ __forceinline__ void st_bf16_chunk(uint32_t addr, float4 lo, float4 hi) {
  st_shared_s32x4(addr, make_int4(int(cvt_bf16x2(lo.x, lo.y)), int(cvt_bf16x2(lo.z, lo.w)),
                                  int(cvt_bf16x2(hi.x, hi.y)), int(cvt_bf16x2(hi.z, hi.w))));
}

// Producer thread t (0..127) fills its part of one 128 x 64 BF16 tile at `dst` from global FP32,
// rounding each value, zeros outside rows x K; in batches of 16 loads issued before their stores
// (as gather_tile, for the consumers' registers).
//   M/N-contiguous source: thread t owns tile row t, four batches of 16 k (two chunks each); a
//     warp reads 32 consecutive floats of one k row per load.
//   K-contiguous source: thread t owns chunk t % 8 (8 k) of rows t / 8 + 16 j, two rows a batch;
//     8 lanes cover one row's 64 k.
// Either way the 8 lanes of a quarter warp store 8 distinct chunk columns: no bank conflicts.
__device__ __forceinline__ void gather_tile_bf16(uint32_t dst, const Operand& op, int row0, int k0,
                                                 int K, int t) {
  float v[2][8];
  if (!op.kcontig) {
    const int row = row0 + t;
    const bool row_ok = row < op.rows;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int k = k0 + 16 * q + 8 * h + e;
          v[h][e] = (row_ok && k < K) ? __ldg(op.ptr + int64_t(k) * op.ld + row) : 0.f;
        }
#pragma unroll
      for (int h = 0; h < 2; ++h)
        st_bf16_chunk(dst + sw128_offset(t, 2 * q + h),
                      make_float4(v[h][0], v[h][1], v[h][2], v[h][3]),
                      make_float4(v[h][4], v[h][5], v[h][6], v[h][7]));
    }
  } else {
    const int c = t & 7, rb = t >> 3;
#pragma unroll
    for (int pair = 0; pair < 4; ++pair) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + rb + 16 * (2 * pair + h);
        const float* src = op.ptr + int64_t(row) * op.ld;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int k = k0 + 8 * c + e;
          v[h][e] = (row < op.rows && k < K) ? __ldg(src + k) : 0.f;
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h)
        st_bf16_chunk(dst + sw128_offset(rb + 16 * (2 * pair + h), c),
                      make_float4(v[h][0], v[h][1], v[h][2], v[h][3]),
                      make_float4(v[h][4], v[h][5], v[h][6], v[h][7]));
    }
  }
}

// Producer thread t (0..127) converts its part of one staged K-contiguous FP32 tile `src` into
// the K-major BF16 tile `dst`. src holds two TMA boxes of 128 rows x 32 k (k [0, 32) then
// [32, 64), kTileBytes apart), row r at r * 128, its FP32 chunk f (4 k) at chunk f ^ (r % 8).
// BF16 chunk c (k 8 c .. 8 c + 7) of row r is FP32 chunks 2 (c % 4) and + 1 of box c / 4. Lane
// i = t % 8 of a quarter warp takes chunk c = i of row 2 p + ((i / 4) ^ u) (pair p, u the
// repeat's parity): lanes 0-3 and 4-7 sit in the two rows of a pair, whose swizzles differ in
// bit 0, so the loads (bank group (2 (i % 4) + e) ^ (r % 8)) split by parity and the stores
// (i ^ (r % 8)) by bit 2: 8 distinct 16-byte bank groups on both sides.
__device__ __forceinline__ void convert_staged_k(uint32_t dst, uint32_t src, int t) {
  const int i = t & 7, g = t >> 3;
#pragma unroll
  for (int it = 0; it < 8; ++it) {
    const int r = 2 * (g + 16 * (it >> 1)) + ((i >> 2) ^ (it & 1));
    const uint32_t row = src + uint32_t((i >> 2) * kTileBytes + r * 128);
    const int f = 2 * (i & 3);
    const float4 lo = ld_shared_v4(row + uint32_t((f ^ (r & 7)) << 4));
    const float4 hi = ld_shared_v4(row + uint32_t(((f + 1) ^ (r & 7)) << 4));
    st_bf16_chunk(dst + sw128_offset(r, i), lo, hi);
  }
}

// Producer thread t (0..127) transposes and converts its part of one staged M/N-contiguous FP32
// tile `src` into the K-major BF16 tile `dst`. src holds four TMA boxes of 32 rows x 64 k, box q
// the rows [32 q, +32): k row kk at q * 8192 + kk * 128, the 16-byte chunk of rows 4 c .. 4 c + 3
// at chunk c ^ (kk % 8). The tile is 32 x 8 blocks of 4 rows x 8 k; thread t owns two: it reads
// the 8 k rows of a block (8 x 16-byte loads) and writes its 4 tile rows (4 x 16-byte chunks of
// 8 bf16), the transpose happening in registers. The lanes take the blocks as transpose_staged
// does (row chunk mc = i + 8 mhi, k chunk kc = ((i / 2) ^ u) + 4 h): loads hit bank group
// (mc % 8) ^ e, stores kc ^ 4 (i % 2) ^ j, distinct over the 8 lanes of a quarter warp.
__device__ __forceinline__ void transpose_staged_bf16(uint32_t dst, uint32_t src, int t) {
  const int i = t & 7, g = t >> 3;
#pragma unroll
  for (int rep = 0; rep < 2; ++rep) {
    const int combo = 2 * g + rep;  // 0..31
    const int mc = i + 8 * (combo & 3);
    const int kc = ((i >> 1) ^ ((combo >> 2) & 3)) + 4 * (combo >> 4);
    float4 v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int kk = 8 * kc + e;
      v[e] = ld_shared_v4(src + uint32_t((mc >> 3) * 8192 + kk * 128 + (((mc & 7) ^ e) << 4)));
    }
    st_bf16_chunk(dst + sw128_offset(4 * mc + 0, kc), make_float4(v[0].x, v[1].x, v[2].x, v[3].x),
                  make_float4(v[4].x, v[5].x, v[6].x, v[7].x));
    st_bf16_chunk(dst + sw128_offset(4 * mc + 1, kc), make_float4(v[0].y, v[1].y, v[2].y, v[3].y),
                  make_float4(v[4].y, v[5].y, v[6].y, v[7].y));
    st_bf16_chunk(dst + sw128_offset(4 * mc + 2, kc), make_float4(v[0].z, v[1].z, v[2].z, v[3].z),
                  make_float4(v[4].z, v[5].z, v[6].z, v[7].z));
    st_bf16_chunk(dst + sw128_offset(4 * mc + 3, kc), make_float4(v[0].w, v[1].w, v[2].w, v[3].w),
                  make_float4(v[4].w, v[5].w, v[6].w, v[7].w));
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Thread mapping: see the file comment. Grid (tiles_m * tiles_n, 1, groups * splits), cluster
// (1, 1, splits); block x owns C rows [128 (x / tiles_n), +128) x columns [128 (x % tiles_n),
// +128), split z its k-tiles [z T / Z, (z + 1) T / Z) of T = ceil(K / kBK), kBK = 32 (TF32) or 64
// (BF16), Z = groups * splits.
template <bool kBf16, bool kSplit, int kLA, int kLB>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_wgmma_kernel(const __grid_constant__ CUtensorMap map_a,
                      const __grid_constant__ CUtensorMap map_b, const Params p) {
  ptx::griddep_enter();
#ifdef CNN_WGMMA_DEVICE_CODE
  using P = Plan<kBf16, kSplit, kLA, kLB>;
  constexpr int kStages = P::kStages;
  constexpr int kBK = k_tile(kBf16);
  // TMA straight into the K-major stage (TF32's K-contiguous operands only).
  constexpr bool kATma = !kBf16 && kLA == kTmaK, kBTma = !kBf16 && kLB == kTmaK;
  static_assert(!P::kStaged || (kLA != kGather && kLB != kGather),
                "a staged operand goes with a TMA operand, not a gathered one");
  constexpr bool kAnyGather = kLA == kGather || kLB == kGather;
  constexpr uint32_t kTxBytes = (kATma ? kTileBytes : 0) + (kBTma ? kTileBytes : 0);
  // The bytes of one k-tile on its `staged` barrier: the staging boxes and the K-major TMA tiles.
  constexpr uint32_t kStagedTxBytes = kBf16 ? P::kStagedOps * P::kStagingBytes : 2 * kTileBytes;
  // TMA boxes of an M/N-contiguous operand: 32 rows x kBK k each, four to a staged tile.
  constexpr uint32_t kMnBoxBytes = 32 * kBK * 4;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t bars = base + P::kBarrierOffset;  // full[kStages], empty[kStages], staged[]
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (kStages + s); };
  auto staged = [&](int s) { return bars + 8u * (2 * kStages + s); };
  auto tile_a = [&](int s) { return base + uint32_t(s) * kStageBytes; };
  auto tile_b = [&](int s) { return base + uint32_t(s) * kStageBytes + kTileBytes; };
  // Staging of stage s: the A box set (if staged), then the B one.
  auto stage_a = [&](int s) {
    return base + uint32_t(P::kStagingOffset + s * P::kStagedOps * P::kStagingBytes);
  };
  auto stage_b = [&](int s) {
    return stage_a(s) + (P::kAStaged ? uint32_t(P::kStagingBytes) : 0u);
  };
  // 3xTF32: the small part of stage s's B^T tile.
  auto small_b = [&](int s) { return base + uint32_t(P::kSmallOffset) + uint32_t(s) * kTileBytes; };

  const int tid = threadIdx.x;
  const int tiles_n = (p.N + kBN - 1) / kBN;
  const int m0 = int(blockIdx.x / tiles_n) * kBM, n0 = int(blockIdx.x % tiles_n) * kBN;
  // The k split of this block: its rank in its cluster, its cluster's group outside (blockIdx.z
  // = group * nsplit + rank; one group unless p.work).
  const uint32_t rank = cluster_rank(), nsplit = cluster_size();
  const int split = int(blockIdx.z), nsplits_all = int(gridDim.z);
  const int kt_begin = int(int64_t(p.ktiles) * split / nsplits_all);
  const int kt_end = int(int64_t(p.ktiles) * (split + 1) / nsplits_all);
  const int nk = kt_end - kt_begin;

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full(s), (kAnyGather || P::kStaged) ? 128 : 1);
      mbar_init(empty(s), 8);  // lane 0 of each consumer warp
      mbar_init(staged(s), 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // BF16 with a transposed operand (the weight gradient's shape, dw += with beta = 1): the C
  // band this block's epilogue will read is asked into L2 now, so that its reads, which wait
  // one memory latency per batch, find it there after the short k loop (K = the batch: 2
  // k-tiles at 128). One prefetch per 128-byte line, 4 a row.
  if constexpr (kBf16 && P::kMN) {
    if (p.beta != 0.f && !p.work) {
      const int band = kBM / int(nsplit), r0 = int(rank) * band;
      for (int idx = tid; idx < band * (kBN / 32); idx += kThreads) {
        const int m = m0 + r0 + idx / (kBN / 32), n = n0 + 32 * (idx % (kBN / 32));
        if (m < p.M && n < p.N) prefetch_l2(p.c + int64_t(m) * p.ldc + n);
      }
    }
  }

  const int wg = tid / 128;
  if (wg == 0 && P::kStaged) {
    // Producer with staged operands. Thread 0 issues every TMA (staging boxes and K-major
    // tiles) for k-tile j on staged(j % kStages), kAhead k-tiles ahead; all 128 threads then
    // wait for k-tile i, transpose / convert its staged tiles into the K-major stage, fence and
    // arrive on full. The producer barrier after that frees k-tile i's staging for the TMA of
    // k-tile i + kAhead. TF32 runs kStages - 1 ahead (the same staging slot as k-tile i - 1,
    // free since the last iteration; a K-major TMA tile also waits for its stage in issue());
    // BF16, whose TMA all goes to staging, kStages ahead, into the slot just freed.
    constexpr int kAhead = kBf16 ? kStages : kStages - 1;
    auto issue = [&](int j) {
      const int s = j % kStages;
      // A K-major TMA tile overwrites the stage the consumers read for k-tile j - kStages.
      if (kTxBytes > 0 && j >= kStages) mbar_wait(empty(s), ((j / kStages) - 1) & 1);
      const int k0 = (kt_begin + j) * kBK;
      mbar_arrive_expect_tx(staged(s), kStagedTxBytes);
      if constexpr (kATma) tma_load_2d(tile_a(s), &map_a, k0, m0, staged(s));
      if constexpr (kBTma) tma_load_2d(tile_b(s), &map_b, k0, n0, staged(s));
      if constexpr (kBf16) {  // a K-contiguous operand's two boxes of 32 k
#pragma unroll
        for (int h = 0; h < kBK / kFloatBoxK; ++h) {
          if constexpr (kLA == kTmaK)
            tma_load_2d(stage_a(s) + h * kTileBytes, &map_a, k0 + kFloatBoxK * h, m0, staged(s));
          if constexpr (kLB == kTmaK)
            tma_load_2d(stage_b(s) + h * kTileBytes, &map_b, k0 + kFloatBoxK * h, n0, staged(s));
        }
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if constexpr (kLA == kTmaMN)
          tma_load_2d(stage_a(s) + q * kMnBoxBytes, &map_a, m0 + 32 * q, k0, staged(s));
        if constexpr (kLB == kTmaMN)
          tma_load_2d(stage_b(s) + q * kMnBoxBytes, &map_b, n0 + 32 * q, k0, staged(s));
      }
    };
    if (tid == 0)
      for (int j = 0; j < kAhead && j < nk; ++j) issue(j);
    for (int i = 0; i < nk; ++i) {
      const int s = i % kStages;
      mbar_wait(staged(s), (i / kStages) & 1);
      if (i >= kStages) mbar_wait(empty(s), ((i / kStages) - 1) & 1);
      if constexpr (kBf16) {
        if constexpr (kLA == kTmaK) convert_staged_k(tile_a(s), stage_a(s), tid);
        if constexpr (kLA == kTmaMN) transpose_staged_bf16(tile_a(s), stage_a(s), tid);
        if constexpr (kLB == kTmaK) convert_staged_k(tile_b(s), stage_b(s), tid);
        if constexpr (kLB == kTmaMN) transpose_staged_bf16(tile_b(s), stage_b(s), tid);
      } else {
        // 3xTF32: the producer splits B^T into the stage (TF32 part) and the stage's small-part
        // slot; the consumers load A unrounded and split it in registers.
        if constexpr (kLA == kTmaMN) transpose_staged<false>(tile_a(s), stage_a(s), tid, 0u);
        if constexpr (kLB == kTmaMN)
          transpose_staged<kSplit>(tile_b(s), stage_b(s), tid, small_b(s));
        if constexpr (kSplit && kLB == kTmaK) split_tile(tile_b(s), small_b(s), tid);
      }
      fence_proxy_async();
      mbar_arrive(full(s));
      producer_sync();
      if (tid == 0 && i + kAhead < nk) issue(i + kAhead);
    }
  } else if (wg == 0) {
    // Producer. With TMA for both operands one thread issues everything.
    if (kAnyGather || tid == 0) {
      for (int i = 0; i < nk; ++i) {
        const int s = i % kStages;
        if (i >= kStages) mbar_wait(empty(s), ((i / kStages) - 1) & 1);
        const int k0 = (kt_begin + i) * kBK;
        if constexpr (kBf16) {
          gather_tile_bf16(tile_a(s), p.a, m0, k0, p.K, tid);
          gather_tile_bf16(tile_b(s), p.b, n0, k0, p.K, tid);
        } else {
          if constexpr (!kATma) gather_tile(tile_a(s), p.a, m0, k0, p.K, tid);
          if constexpr (!kBTma) gather_tile(tile_b(s), p.b, n0, k0, p.K, tid);
        }
        if constexpr (kAnyGather) fence_proxy_async();
        if (tid == 0) {
          if constexpr (kTxBytes > 0) {
            mbar_arrive_expect_tx(full(s), kTxBytes);
            if constexpr (kATma) tma_load_2d(tile_a(s), &map_a, k0, m0, full(s));
            if constexpr (kBTma) tma_load_2d(tile_b(s), &map_b, k0, n0, full(s));
          } else {
            mbar_arrive(full(s));
          }
        } else {
          mbar_arrive(full(s));
        }
      }
    }
  }

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  const int lane = tid & 31;
  if (wg > 0) {
    if constexpr (kSplit) {
      // 3xTF32: A from registers, split there; B^T and its small part from the stage (the
      // convolutions' consumer: conv2d_wgmma_tile.cuh). Reading A once into registers instead of
      // three times from shared memory by wgmma, and not splitting it in shared memory, halves
      // the shared-memory traffic of a k-tile.
      consume_stages_3xtf32<kBN, kStages>(acc, nk, wg, full, empty, tile_a, tile_b, small_b);
    } else {
      // Consumer warpgroup wg - 1: tile rows [64 (wg - 1), +64).
      const uint32_t a_off = uint32_t(wg - 1) * 64 * 128;  // 64 rows of 128 bytes
      for (int i = 0; i < nk; ++i) {
        const int s = i % kStages;
        mbar_wait(full(s), (i / kStages) & 1);
        const uint64_t da = sw128_desc(tile_a(s) + a_off), db = sw128_desc(tile_b(s));
        wgmma_fence();
        fence_acc(acc);
        // Four k-steps of 32 bytes of the swizzle row (2 in the descriptor): k8 TF32 or k16 BF16.
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          if constexpr (kBf16)
            wgmma_m64n128k16_bf16(acc, da + 2 * kk, db + 2 * kk);
          else
            wgmma_m64n128k8_tf32(acc, da + 2 * kk, db + 2 * kk);
        }
        commit_and_release_previous([&] { fence_acc(acc); }, i > 0 && lane == 0,
                                    empty((i + kStages - 1) % kStages));
      }
      wgmma_wait<0>();
      fence_acc(acc);
    }
  }

  // Every stage has been consumed (so every TMA write has landed): reuse the ring for the
  // partial tile, (kBM, kEpiPitch) floats.
  __syncthreads();
  if (wg > 0) {
    const int w = (tid / 32) & 3, g = lane >> 2, t4 = lane & 3;
    const int row = (wg - 1) * 64 + w * 16 + g;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int col = 8 * j + 2 * t4;
      st_shared_v2(base + uint32_t(row * kEpiPitch + col) * 4, acc[4 * j], acc[4 * j + 1]);
      st_shared_v2(base + uint32_t((row + 8) * kEpiPitch + col) * 4, acc[4 * j + 2],
                   acc[4 * j + 3]);
    }
  }
  cluster_sync();

  // This block's band of rows, summed over the cluster's partial tiles in rank order.
  const int band = kBM / int(nsplit);
  const int r_begin = int(rank) * band;
  if (p.work) {
    // Split groups: the band's sums are this cluster's group's partial product, stored raw in
    // its workspace plane (a warp a row's 128 columns, float4s: ldw is a multiple of 4);
    // split_k_reduce adds the planes and applies the epilogue. Columns up to ldw past N hold the
    // sums of zero-filled operands, never read into C.
    float* plane = p.work + int64_t(blockIdx.z / nsplit) * p.M * p.ldw;
    for (int idx = tid; idx < band * (kBN / 4); idx += kThreads) {
      const int r = r_begin + idx / (kBN / 4), c4 = (idx % (kBN / 4)) * 4;
      const int m = m0 + r;
      if (m >= p.M || n0 + c4 >= p.N) continue;
      *reinterpret_cast<float4*>(plane + int64_t(m) * p.ldw + n0 + c4) =
          sum_over_ranks(base + uint32_t(r * kEpiPitch + c4) * 4, nsplit);
    }
  } else if constexpr (P::kMN) {
    // kBatch items per thread at a
    // time, their beta * C reads all issued before the first store: the weight gradient
    // (beta = 1) otherwise waits one memory latency per item, ~11 per thread and tile.
    constexpr int kBatch = 4;
    const int items = band * (kBN / 4);
    for (int idx0 = tid; idx0 < items; idx0 += kBatch * kThreads) {
      float vals[kBatch][4], old[kBatch][4];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int idx = idx0 + b * kThreads;
        const int r = r_begin + idx / (kBN / 4), c4 = (idx % (kBN / 4)) * 4;
        const int m = m0 + r;
        // Only items with a column to store load (see the relaxed barrier at the end).
        if (idx >= items || m >= p.M || n0 + c4 >= p.N) continue;
        const float4 sum = sum_over_ranks(base + uint32_t(r * kEpiPitch + c4) * 4, nsplit);
        vals[b][0] = sum.x;
        vals[b][1] = sum.y;
        vals[b][2] = sum.z;
        vals[b][3] = sum.w;
        const float* crow = p.c + int64_t(m) * p.ldc;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int n = n0 + c4 + e;
          old[b][e] = (p.beta != 0.f && n < p.N) ? crow[n] : 0.f;
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int idx = idx0 + b * kThreads;
        const int r = r_begin + idx / (kBN / 4), c4 = (idx % (kBN / 4)) * 4;
        const int m = m0 + r;
        if (idx >= items || m >= p.M || n0 + c4 >= p.N) continue;
        float* crow = p.c + int64_t(m) * p.ldc;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int n = n0 + c4 + e;
          if (n >= p.N) break;
          float v = p.alpha * vals[b][e];
          if (p.beta != 0.f) v = fmaf(p.beta, old[b][e], v);
          if (p.bias) v += __ldg(p.bias + n);
          if (p.relu) v = (v <= 0.f) ? 0.f : v;  // NaN passes, as in the CPU references
          crow[n] = v;
        }
      }
    }
  } else {
    for (int idx = tid; idx < band * (kBN / 4); idx += kThreads) {
      // A warp covers one row's 128 columns (coalesced).
      const int r = r_begin + idx / (kBN / 4);
      const int c4 = (idx % (kBN / 4)) * 4;
      const int m = m0 + r;
      // Only items with a column to store load: each load's value then reaches a store before
      // the relaxed barrier at the end.
      if (m >= p.M || n0 + c4 >= p.N) continue;
      const float4 sum = sum_over_ranks(base + uint32_t(r * kEpiPitch + c4) * 4, nsplit);
      const float vals[4] = {sum.x, sum.y, sum.z, sum.w};
      float* crow = p.c + int64_t(m) * p.ldc;
      if (p.vec_c && n0 + c4 + 3 < p.N) {
        // Four columns in one 16-byte store (and load of C): the operations of the scalar loop
        // below in the same order, a quarter of its L2 write requests.
        float4* at = reinterpret_cast<float4*>(crow + n0 + c4);
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = p.alpha * vals[e];
        if (p.beta != 0.f) {
          const float4 o = *at;
          v[0] = fmaf(p.beta, o.x, v[0]);
          v[1] = fmaf(p.beta, o.y, v[1]);
          v[2] = fmaf(p.beta, o.z, v[2]);
          v[3] = fmaf(p.beta, o.w, v[3]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (p.bias) v[e] += __ldg(p.bias + n0 + c4 + e);
          if (p.relu) v[e] = (v[e] <= 0.f) ? 0.f : v[e];  // NaN passes, as in the CPU references
        }
        *at = make_float4(v[0], v[1], v[2], v[3]);
        continue;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = n0 + c4 + e;
        if (n >= p.N) break;
        float v = p.alpha * vals[e];
        if (p.beta != 0.f) v = fmaf(p.beta, crow[n], v);
        if (p.bias) v += __ldg(p.bias + n);
        if (p.relu) v = (v <= 0.f) ? 0.f : v;  // NaN passes, as in the CPU references
        crow[n] = v;
      }
    }
  }
  // No block leaves while another still reads its partial tile. Only the shared memory's
  // lifetime is at stake, and a block's reads of the others' tiles have returned before it
  // arrives (every loaded sum feeds a store of C or of the workspace, which waits for it), so the
  // arrive needs no release, whose GPU-scope fence would also wait for the block's global stores
  // to complete (ncu, fc1's BF16 forward: 17% of the warp samples at this barrier).
  ptx::cluster_sync_relaxed();
#else
  (void)map_a;
  (void)map_b;
  (void)p;
#if defined(__CUDA_ARCH__)
  __trap();  // never dispatched: gemm_wgmma_available() is false without the sm_90a cubin
#endif
#endif
}

// TMA takes an operand whose base is 16-byte aligned and whose row stride is a multiple of 16
// bytes; K-contiguous straight into the K-major tile, M/N-contiguous into staging.
bool tma_aligned(const Operand& op) {
  return (reinterpret_cast<uintptr_t>(op.ptr) & 15u) == 0 && op.ld % 4 == 0;
}
bool tma_ok(const Operand& op) {
  return op.kcontig && tma_aligned(op);
}

// The operand as a 2-D tensor map of FP32, 128-byte swizzle, zero fill outside. K-contiguous:
// dims (K, rows), 32 x 128 boxes (k, rows): TF32's K-major tile itself, half of BF16's staged
// tile. M/N-contiguous: dims (rows, K), 32 x k_tile boxes (rows, k), four of which make a staged
// tile.
CUtensorMap make_map(const Operand& op, int K, bool bf16) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(op.kcontig ? K : op.rows),
                              cuuint64_t(op.kcontig ? op.rows : K)};
  const cuuint64_t strides[1] = {cuuint64_t(op.ld) * 4};
  const cuuint32_t box[2] = {kFloatBoxK, op.kcontig ? cuuint32_t(kBM) : cuuint32_t(k_tile(bf16))};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<float*>(op.ptr), dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CNN_CHECK(r == CUDA_SUCCESS,
            "gemm_wgmma: cuTensorMapEncodeTiled failed (error {}) for a ({}, {}) {} operand with "
            "row stride {} floats",
            int(r), op.rows, K, op.kcontig ? "K-contiguous" : "M/N-contiguous", op.ld);
  return map;
}

template <bool kBf16, int kLA, int kLB, bool kSplit = false>
void launch(const Params& p, const CUtensorMap& map_a, const CUtensorMap& map_b, int splits,
            cudaStream_t stream) {
  const int64_t tiles = ceil_div<int64_t>(p.M, kBM) * ceil_div<int64_t>(p.N, kBN);
  CNN_CHECK(tiles <= 0x7fffffff, "gemm_wgmma: {} tiles exceed the grid limit", tiles);
  launch_split_k_cluster_groups(gemm_wgmma_kernel<kBf16, kSplit, kLA, kLB>,
                                dim3(static_cast<unsigned>(tiles)), splits, p.groups, kThreads,
                                Plan<kBf16, kSplit, kLA, kLB>::kSmemBytes, stream,
                                kBf16    ? "gemm_wgmma_bf16"
                                : kSplit ? "gemm_wgmma_3xtf32"
                                         : "gemm_wgmma",
                                map_a, map_b, p);
}

// BF16: both operands by TMA into staging (converted there, and transposed when M/N-contiguous)
// when both are TMA-aligned and no M/N-contiguous one is to be gathered; else both gathered
// (and converted on the way), never a mix: misaligned operands are rare, and a mixed
// instantiation would cost compile time and a third shared-memory plan for nothing.
void run_bf16(const Params& p, bool mn_tma, bool force_gather, int splits, cudaStream_t stream) {
  const bool staged = !force_gather && tma_aligned(p.a) && tma_aligned(p.b) &&
                      (mn_tma || (p.a.kcontig && p.b.kcontig));
  if (!staged) {
    launch<true, kGather, kGather>(p, CUtensorMap{}, CUtensorMap{}, splits, stream);
    return;
  }
  const CUtensorMap map_a = make_map(p.a, p.K, true), map_b = make_map(p.b, p.K, true);
  if (p.a.kcontig && p.b.kcontig)
    launch<true, kTmaK, kTmaK>(p, map_a, map_b, splits, stream);
  else if (p.a.kcontig)
    launch<true, kTmaK, kTmaMN>(p, map_a, map_b, splits, stream);
  else if (p.b.kcontig)
    launch<true, kTmaMN, kTmaK>(p, map_a, map_b, splits, stream);
  else
    launch<true, kTmaMN, kTmaMN>(p, map_a, map_b, splits, stream);
}

// FP32 as 3xTF32: both operands by TMA (checked by the caller), the M/N-contiguous ones staged
// and transposed in shared memory, every operand split by the producer threads.
void run_3xtf32(const Params& p, int splits, cudaStream_t stream) {
  const CUtensorMap map_a = make_map(p.a, p.K, false), map_b = make_map(p.b, p.K, false);
  if (p.a.kcontig && p.b.kcontig)
    launch<false, kTmaK, kTmaK, true>(p, map_a, map_b, splits, stream);
  else if (p.a.kcontig)
    launch<false, kTmaK, kTmaMN, true>(p, map_a, map_b, splits, stream);
  else if (p.b.kcontig)
    launch<false, kTmaMN, kTmaK, true>(p, map_a, map_b, splits, stream);
  else
    launch<false, kTmaMN, kTmaMN, true>(p, map_a, map_b, splits, stream);
}

// The GEMM kernel for p's precision and operand layouts.
void run_kernel(const Params& p, const WgmmaOptions& opt, int splits, cudaStream_t stream) {
  if (opt.precision == Precision::FP32) {
    CNN_CHECK(tma_aligned(p.a) && tma_aligned(p.b) && !opt.force_gather,
              "gemm_wgmma: FP32 (3xTF32) loads both operands by TMA: they need 16-byte aligned "
              "bases and leading dimensions that are multiples of 4 (lda={} ldb={}{})",
              p.a.ld, p.b.ld, opt.force_gather ? ", and no forced gather" : "");
    run_3xtf32(p, splits, stream);
    return;
  }
  const bool mn_tma = opt.mn_load == WgmmaMnLoad::Tma ||
                      (opt.mn_load == WgmmaMnLoad::Default && process_env_switches().wgmma_mn_tma);
  if (opt.precision == Precision::BF16) {
    run_bf16(p, mn_tma, opt.force_gather, splits, stream);
    return;
  }
  if (mn_tma && !opt.force_gather && (!p.a.kcontig || !p.b.kcontig) && tma_aligned(p.a) &&
      tma_aligned(p.b)) {
    // Both operands by TMA, the M/N-contiguous ones staged and transposed in shared memory.
    const CUtensorMap map_a = make_map(p.a, p.K, false), map_b = make_map(p.b, p.K, false);
    if (p.a.kcontig)
      launch<false, kTmaK, kTmaMN>(p, map_a, map_b, splits, stream);
    else if (p.b.kcontig)
      launch<false, kTmaMN, kTmaK>(p, map_a, map_b, splits, stream);
    else
      launch<false, kTmaMN, kTmaMN>(p, map_a, map_b, splits, stream);
    return;
  }
  const bool a_tma = !opt.force_gather && tma_ok(p.a);
  const bool b_tma = !opt.force_gather && tma_ok(p.b);
  const CUtensorMap map_a = a_tma ? make_map(p.a, p.K, false) : CUtensorMap{};
  const CUtensorMap map_b = b_tma ? make_map(p.b, p.K, false) : CUtensorMap{};
  if (a_tma && b_tma)
    launch<false, kTmaK, kTmaK>(p, map_a, map_b, splits, stream);
  else if (a_tma)
    launch<false, kTmaK, kGather>(p, map_a, map_b, splits, stream);
  else if (b_tma)
    launch<false, kGather, kTmaK>(p, map_a, map_b, splits, stream);
  else
    launch<false, kGather, kGather>(p, map_a, map_b, splits, stream);
}

// The largest cluster size c <= min(total, 8) at which the device holds all tiles * total / c
// clusters at once, so that the k splits run in one wave: a grid of clusters past what the GPCs
// hold waits for a second wave, which a smaller cluster (and more groups) avoids (VGG's fc1
// input gradient, 32 tiles of 4 splits: 18.1 us in clusters of 4, 12.0 in 2 groups of 2 on an
// H100). Every instantiation runs one block per SM (each takes over half an SM's shared
// memory), so the TMA forward kernel's answer stands for all of them.
int cluster_fit(int total, int64_t tiles, Precision precision) {
  const bool bf16 = precision == Precision::BF16;
  const void* kernel =
      bf16 ? reinterpret_cast<const void*>(gemm_wgmma_kernel<true, false, kTmaK, kTmaK>)
           : reinterpret_cast<const void*>(gemm_wgmma_kernel<false, false, kTmaK, kTmaK>);
  const int smem = bf16 ? Plan<true, false, kTmaK, kTmaK>::kSmemBytes
                        : Plan<false, false, kTmaK, kTmaK>::kSmemBytes;
  CNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int c = std::min(total, kMaxPickedSplits);
  while (c > 1 && max_active_clusters(kernel, c, kThreads, smem) < tiles * (total / c)) c /= 2;
  return c;
}

}  // namespace

bool gemm_wgmma_available() {
#ifdef CNN_WGMMA_SM90A
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
#else
  return false;
#endif
}

int gemm_wgmma_pick_splits(int m, int n, int k, Precision precision) {
  // One wave at one block per SM (the stage ring takes ~130 KB): double the splits while the
  // doubled grid still fits on the SMs and each split keeps min_split_ktiles.
  const int64_t tiles = ceil_div<int64_t>(m, kBM) * ceil_div<int64_t>(n, kBN);
  const int ktiles = ceil_div(k, k_tile(precision == Precision::BF16));
  const int64_t sms = sm_count();
  const int least = min_split_ktiles(precision == Precision::BF16);
  int s = 1;
  while (s * 2 <= kMaxPickedSplits && tiles * s * 2 <= sms && ktiles / (s * 2) >= least) s *= 2;
  return s;
}

int gemm_wgmma_pick_groups(int m, int n, int k, Precision precision) {
  const int forced = process_env_switches().wgmma_gemm_groups;
  const int env_splits = process_env_switches().wgmma_gemm_splits;
  if (forced == 1 || (forced == 0 && env_splits > 0)) return 1;
  if (forced == 0) return gemm_wgmma_pick_total_splits(m, n, k, precision);  // at most
  const int ktiles = ceil_div(k, k_tile(precision == Precision::BF16));
  const int splits = env_splits > 0 ? env_splits : gemm_wgmma_pick_splits(m, n, k, precision);
  int g = forced;
  while (g > 1 && ktiles / (splits * g) < 2) g /= 2;
  return g;
}

int gemm_wgmma_pick_total_splits(int m, int n, int k, Precision precision) {
  // Past one cluster's 8 splits only where the doubled grid still leaves half the SMs free (a
  // 4096 -> 512 layer at batch 128: 4 tiles, 8 -> 16 splits, 64 blocks; LeNet's 8 tiles stay at
  // 8) and each split keeps min_split_ktiles: at 128 blocks (16 x 8 tiles) the workspace sums
  // measured slower than 8 splits in one cluster.
  const int64_t tiles = ceil_div<int64_t>(m, kBM) * ceil_div<int64_t>(n, kBN);
  const int ktiles = ceil_div(k, k_tile(precision == Precision::BF16));
  const int64_t sms = sm_count();
  const int least = min_split_ktiles(precision == Precision::BF16);
  int s = gemm_wgmma_pick_splits(m, n, k, precision);
  while (s >= kMaxPickedSplits && s * 2 <= 2 * kMaxPickedSplits && tiles * s * 2 <= sms / 2 &&
         ktiles / (s * 2) >= least)
    s *= 2;
  return s;
}

std::size_t gemm_wgmma_work_floats(int m, int n, int groups) {
  return groups > 1 ? split_k_work_floats(groups, m, n) : 0;
}

void gemm_wgmma(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* d_a,
                int lda, const float* d_b, int ldb, float beta, float* d_c, int ldc,
                const float* d_bias, bool relu, cudaStream_t stream, const WgmmaOptions& opt) {
  CNN_CHECK(gemm_wgmma_available(),
            "gemm_wgmma: needs a compute capability 9.0 GPU and a build with CUDA architecture 90");
  CNN_CHECK(m > 0 && n > 0 && k > 0, "gemm_wgmma: sizes must be positive (m={} n={} k={})", m, n,
            k);
  CNN_CHECK(d_a && d_b && d_c, "gemm_wgmma: null matrix pointer");
  CNN_CHECK(ldc >= n && lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n),
            "gemm_wgmma: leading dimensions lda={} ldb={} ldc={} too small for m={} n={} k={}", lda,
            ldb, ldc, m, n, k);
  const bool bf16 = opt.precision == Precision::BF16;
  const int env_splits = process_env_switches().wgmma_gemm_splits;
  int splits = opt.splits > 0   ? opt.splits
               : env_splits > 0 ? env_splits
                                : gemm_wgmma_pick_splits(m, n, k, opt.precision);
  CNN_CHECK(splits == 1 || splits == 2 || splits == 4 || splits == 8 || splits == 16,
            "gemm_wgmma: splits={} (expected 1, 2, 4, 8 or 16)", splits);
  // A picked group count needs the caller's workspace; without one the GEMM runs as one group.
  // Automatic (CNN_WGMMA_GROUPS=auto, the splits picked too): the picked total of k splits,
  // in the largest clusters of which the device holds every tile's at once (cluster_fit).
  int groups = opt.groups;
  if (groups == 0) {
    const bool auto_plan =
        opt.splits == 0 && env_splits == 0 && process_env_switches().wgmma_gemm_groups == 0;
    if (auto_plan) {
      const int total = gemm_wgmma_pick_total_splits(m, n, k, opt.precision);
      const int64_t tiles = ceil_div<int64_t>(m, kBM) * ceil_div<int64_t>(n, kBN);
      const int cluster = cluster_fit(total, tiles, opt.precision);
      const bool room =
          opt.work && opt.work_floats >= gemm_wgmma_work_floats(m, n, total / cluster);
      groups = room ? total / cluster : 1;
      if (room) splits = cluster;
    } else {
      const int g = opt.work ? gemm_wgmma_pick_groups(m, n, k, opt.precision) : 1;
      groups = g > 1 && opt.work_floats >= gemm_wgmma_work_floats(m, n, g) ? g : 1;
    }
  }
  CNN_CHECK(groups >= 1 && groups <= kMaxGroups, "gemm_wgmma: groups={} (expected 1 to {})", groups,
            kMaxGroups);
  if (groups > 1) {
    const std::size_t need = gemm_wgmma_work_floats(m, n, groups);
    CNN_CHECK(
        opt.work && opt.work_floats >= need && (reinterpret_cast<uintptr_t>(opt.work) & 15u) == 0,
        "gemm_wgmma: {} split groups need a 16-byte aligned workspace of {} floats (got {} "
        "floats at {})",
        groups, need, opt.work_floats, static_cast<const void*>(opt.work));
  }

  Params p{};
  p.a = Operand{d_a, lda, m, !trans_a};
  p.b = Operand{d_b, ldb, n, trans_b};
  p.M = m;
  p.N = n;
  p.K = k;
  p.ktiles = ceil_div(k, k_tile(bf16));
  p.c = d_c;
  p.ldc = ldc;
  p.alpha = alpha;
  p.beta = beta;
  p.bias = d_bias;
  p.relu = relu;
  p.vec_c = (reinterpret_cast<uintptr_t>(d_c) & 15u) == 0 && ldc % 4 == 0;
  p.groups = 1;
  if (groups > 1) {
    p.work = opt.work;
    p.ldw = int64_t(n + 3) / 4 * 4;
    p.groups = groups;
  }
  run_kernel(p, opt, splits, stream);
  if (p.work) {
    GemmEpilogue e;
    e.alpha = alpha;
    e.beta = beta;
    e.bias = d_bias;
    e.relu = relu;
    split_k_reduce_cuda(SplitKReduceShape{groups, m, n, p.ldw, ldc}, p.work, e, d_c, stream);
  }
}

}  // namespace cnn
