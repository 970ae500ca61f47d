#pragma once
// The halo-tile instance of the channels-last wgmma convolution (conv2d_wgmma_nhwc.cu launches
// it; the geometry, and why: conv2d_halo_layout.h). Same 384 threads as the im2col instance:
//   warpgroup 0, the producer: thread 0 alone. Per channel chunk of its k range (k ordered
//     (chunk, tap) here, so that one box serves every tap) it fills one of two halo slots with
//     ONE 4-D tiled TMA box of the (N, H, W, Cp) copy, {kBK channels, wp columns, box_h rows, 1
//     image} at {c0, -pad_w, oy0 - pad_h, n}, zero outside the image, on the slot's `halo_full`
//     barrier; per k-tile (chunk, tap) it fills a ring stage with the tap's BN x 128-byte weight
//     tile (the packed (rows, taps * Cp) map, column (tap chunks + chunk) kBK), as the im2col
//     instance does. A slot is refilled once the consumers release it (`halo_empty`).
//   warpgroups 1 and 2, the consumers: rows [64 kSub (wg - 1), +64 kSub) of the 128 kSub-row
//     tile, kSub 64-row wgmma blocks on one B tile (kSub 2, the 256-row tile: a ring stage and
//     a k-tile's bookkeeping serve twice the multiplies); for tap (ky, kx) the A descriptor
//     starts ky wp + kx rows into the slot. The slot is 1024-byte
//     aligned and the 128-byte swizzle (chunk c of row r at c ^ (r % 8)) is a function of the
//     absolute address, both where TMA writes and where wgmma reads (wgmma_ptx.cuh, sw128_desc),
//     so a descriptor may start at any row. A consumer releases the previous k-tile's ring stage
//     after committing the next (as consume_stages), and at that point also the previous
//     chunk's slot when that k-tile was the chunk's last tap.
//   Epilogue: conv2d_wgmma_tile.cuh's, tile row r stored at halo_row_pixel (the rows past the
//     tile's output rows or past OW are dropped), split-K summed over the cluster.
#include <cuda.h>

#include <cstdint>

#include "kernels/conv/conv2d_halo_layout.h"
#include "kernels/conv/conv2d_wgmma_tile.cuh"
#include "kernels/gemm/wgmma_ptx.cuh"

namespace cnn {
namespace wgmma {

// The weight ring's stages for a tile width and 64-row blocks a consumer (sub), and the blocks an
// SM each is compiled for: 128-row tiles sized so that two 27 KB slots (LeNet's 5x5 conv2: 208
// rows) and the ring fit three blocks of 32 columns, two of 64, one of 128; 256-row tiles (32 or
// 64 columns) run one block an SM with a deeper ring.
constexpr int halo_ring_stages(int bn, int sub) {
  return sub == 2 ? 8 : bn == 32 ? 4 : 6;
}
constexpr int halo_blocks_per_sm(int bn, int sub) {
  return sub == 2 ? 1 : bn == 32 ? 3 : bn == 64 ? 2 : 1;
}

// A block's shared memory: [slot 0][slot 1][ring][barriers: full, empty (ring), halo_full[2],
// halo_empty[2]], from a 1024-byte aligned base (up to 1024 bytes of the allocation skipped).
struct HaloSmem {
  uint32_t slot_bytes;  // slot_rows x 128
  int bn, sub;
  __host__ __device__ uint32_t stage_bytes() const { return uint32_t(bn) * 128; }
  __host__ __device__ uint32_t ring_offset() const { return 2 * slot_bytes; }
  __host__ __device__ uint32_t barrier_offset() const {
    return ring_offset() + uint32_t(halo_ring_stages(bn, sub)) * stage_bytes();
  }
  __host__ __device__ uint32_t bytes() const {
    return 1024 + barrier_offset() + 8 * uint32_t(2 * halo_ring_stages(bn, sub) + 4);
  }
};

// C (M, N) of the implicit GEMM, stored NCHW, and the halo geometry (HaloGeometry).
struct HaloParams {
  const float* bias;  // (N) or null
  float* y;           // (N_img, N, oh, ow)
  int relu;
  int M, N, oh, ow;
  int taps, chunks, kw, ktiles;  // ktiles = chunks x taps
  int wp, rows, tiles_per_image, lower_w, lower_h;
  uint32_t slot_bytes, box_bytes;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Where a loop over k-tiles stands: chunk, tap = (ky, kx), the tap's row shift ky wp + kx in
// the slot, and the ring stage with its phase, stepped without divisions (the loops run a
// k-tile in a few hundred cycles; a division by a runtime value costs about 20 instructions).
struct HaloCursor {
  int chunk, tap, ky, kx, shift;
  int stage = 0, phase = 0;
  __device__ __forceinline__ HaloCursor(int kt, const HaloParams& p) {
    chunk = kt / p.taps;
    tap = kt - chunk * p.taps;
    ky = tap / p.kw;
    kx = tap - ky * p.kw;
    shift = ky * p.wp + kx;
  }
  template <int kStages>
  __device__ __forceinline__ void next(const HaloParams& p) {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
    ++tap;
    ++shift;
    if (++kx == p.kw) {
      kx = 0;
      ++ky;
      shift += p.wp - p.kw;
    }
    if (tap == p.taps) {
      tap = ky = kx = shift = 0;
      ++chunk;
    }
  }
};

// Grid (tiles x tiles_n, 1, splits), cluster (1, 1, splits): block x owns tile x / tiles_n (image
// t / tiles_per_image, output rows from (t % tiles_per_image) rows) x columns [BN (x % tiles_n),
// +BN); split z its k-tiles [z T / splits, (z + 1) T / splits) in (chunk, tap) order.
template <int BN, bool kBf16, int kSub>
__device__ __forceinline__ void conv_halo_body(const CUtensorMap& map_a, const CUtensorMap& map_b,
                                               const HaloParams& p) {
  static_assert(kSub == 1 || (kSub == 2 && BN <= 64), "128-row tiles, or 256 of 32 or 64 columns");
  constexpr int kStages = halo_ring_stages(BN, kSub);
  constexpr int kBK = kBf16 ? 64 : 32;  // channels a 128-byte row
  constexpr uint32_t kStageBytes = BN * 128;
  // A slot holds at least the tile's rows, 128 kSub of 128 bytes.
  static_assert(128 * kSub * (BN + 4) * 4 <= kStages * kStageBytes + 2 * 128 * kSub * 128,
                "the epilogue's tile fits the slots and the ring");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const HaloSmem plan{p.slot_bytes, BN, kSub};
  const uint32_t ring = base + plan.ring_offset(), bars = base + plan.barrier_offset();
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (kStages + s); };
  auto halo_full = [&](int h) { return bars + 8u * (2 * kStages + h); };
  auto halo_empty = [&](int h) { return bars + 8u * (2 * kStages + 2 + h); };
  auto slot = [&](int h) { return base + uint32_t(h) * p.slot_bytes; };
  auto tile_b = [&](int s) { return ring + uint32_t(s) * kStageBytes; };

  const int tid = threadIdx.x;
  const int tiles_n = (p.N + BN - 1) / BN;
  const int tile = int(blockIdx.x / tiles_n), n0 = int(blockIdx.x % tiles_n) * BN;
  const int img = tile / p.tiles_per_image, oy0 = (tile - img * p.tiles_per_image) * p.rows;
  const uint32_t rank = cluster_rank(), nsplit = cluster_size();
  const int kt_begin = int(int64_t(p.ktiles) * rank / nsplit);
  const int kt_end = int(int64_t(p.ktiles) * (rank + 1) / nsplit);
  const int nk = kt_end - kt_begin;

  // full, halo_full: the producer's arrive.expect_tx; empty, halo_empty: lane 0 of each consumer
  // warp.
  if (tid == 0) {
    for (int h = 0; h < 2; ++h) {
      mbar_init(halo_full(h), 1);
      mbar_init(halo_empty(h), 8);
    }
    mbar_init_ring(bars, kStages, 1, 8);  // and the fence that publishes all of them
  }
  __syncthreads();

  const int wg = tid / 128;
  if (tid == 0) {
    int uses = 0;  // slots filled so far: slot uses % 2, phase uses / 2
    HaloCursor c(kt_begin, p);
    for (int i = 0; i < nk; ++i, c.next<kStages>(p)) {
      if (i == 0 || c.tap == 0) {
        const int h = uses & 1;
        if (uses >= 2) mbar_wait(halo_empty(h), ((uses >> 1) - 1) & 1);
        mbar_arrive_expect_tx(halo_full(h), p.box_bytes);
        tma_load_4d(slot(h), &map_a, c.chunk * kBK, p.lower_w, oy0 + p.lower_h, img, halo_full(h));
        ++uses;
      }
      if (i >= kStages) mbar_wait(empty(c.stage), c.phase ^ 1);
      mbar_arrive_expect_tx(full(c.stage), kStageBytes);
      tma_load_2d(tile_b(c.stage), &map_b, (c.tap * p.chunks + c.chunk) * kBK, n0, full(c.stage));
    }
  }

  float acc[kSub][BN / 2];
  zero_acc(acc);
  if (wg > 0) {
    const int lane = tid & 31;
    const uint32_t a_off = uint32_t(wg - 1) * kSub * 64 * 128;
    auto fence_all = [&] {
#pragma unroll
      for (int h = 0; h < kSub; ++h) fence_acc(acc[h]);
    };
    int uses = 0, h = 0, prev_h = 0, prev_stage = 0;
    bool prev_last = false;  // k-tile i - 1 was its chunk's last tap
    HaloCursor c(kt_begin, p);
    for (int i = 0; i < nk; ++i, c.next<kStages>(p)) {
      if (i == 0 || c.tap == 0) {
        h = uses & 1;
        mbar_wait(halo_full(h), (uses >> 1) & 1);
        ++uses;
      }
      mbar_wait(full(c.stage), c.phase);
      const uint64_t da = sw128_desc(slot(h) + a_off + uint32_t(c.shift) * 128);
      const uint64_t db = sw128_desc(tile_b(c.stage));
      wgmma_fence();
      fence_all();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int b = 0; b < kSub; ++b)  // block b: 64 rows (8 KB, 512 descriptor units) further
          wgmma_ss<BN, kBf16>(acc[b], da + uint64_t(b) * 512 + 2 * kk, db + 2 * kk);
      commit_and_release_previous(fence_all, i > 0 && lane == 0, empty(prev_stage));
      if (prev_last && lane == 0) mbar_arrive(halo_empty(prev_h));
      prev_last = c.tap == p.taps - 1;
      prev_h = h;
      prev_stage = c.stage;
    }
    wgmma_wait<0>();
    fence_all();
  }
  const int pix0 = img * p.oh * p.ow;
  store_conv_tile_rows<BN, BN + 4, kSub>(
      acc, base, n0, ConvTileStore{p.y, p.bias, p.relu, p.M, p.N, p.oh * p.ow, p.N}, [&](int r) {
        const int q = halo_row_pixel(p.wp, p.rows, p.oh, p.ow, oy0, r);
        return q < 0 ? -1 : pix0 + q;
      });
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace wgmma
}  // namespace cnn
