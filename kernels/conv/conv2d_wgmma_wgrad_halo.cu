// The halo instance of the BF16 channels-last weight gradient (see conv2d_wgmma_wgrad_halo.h and
// conv2d_wgrad_halo_layout.h for the k-tile). The GEMM dw (M = OC, N = (tap, C)) += A (M, K)
// B (K, N), K = output pixels on the halo pitch. A block owns 64 output channels x 64 input
// channels x one group of at most 8 taps (WgradHaloTaps) and a contiguous run of k-tiles (its
// split). 384 threads in three warpgroups, one block an SM:
//   warpgroup 0, the producer: thread 0 fills a ring of 2-8 stages, each a dy slot (the k-tile's
//     dy box, 64 output channels a 128-byte row: A^T, M-contiguous) and an x slot (the x box of
//     the same pixels with the halo, 64 input channels a row: B of tap (ky, kx) from row
//     ky wp + kx on, N-contiguous), both by 4-D tiled TMA in the 128-byte swizzle;
//   warpgroups 1 and 2, the consumers: each multiplies the 64 output channels by the 64 input
//     channels at up to 4 taps of the group (kWgradHaloTapsPerConsumer), a wgmma.m64n64k16 per
//     tap and 16 k rows, both operands MN-major; the tap's descriptor starts ky wp + kx rows into
//     the x slot (the swizzle is a function of the address, as TMA wrote it).
// The slots' rows past their boxes are zeroed once at the start (TMA never writes them): the k
// rows past a k-tile's last output pixel meet zeros, never stale shared memory.
// Epilogue: the consumers gather their FP32 tiles in the ring's shared memory as dw's layout runs
// (input channel, then tap) and add it to dw with atomics, consecutive threads on consecutive
// addresses (K is split across blocks, so it adds, as the im2col instance does).
// Every mbarrier wait is bounded (wgmma_ptx.cuh: a trap after 10 s).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/common/split_k.h"
#include "kernels/conv/conv2d_wgmma_wgrad_halo.h"
#include "kernels/conv/conv2d_wgrad_tile_add.cuh"
#include "kernels/gemm/wgmma_ptx.cuh"
#include "runtime/cuda_check.h"
#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

using namespace wgmma;

constexpr int kThreads = 384;
constexpr int kT = kWgradHaloTapsPerConsumer;
// The epilogue's gathered block tile: 64 rows (output channels) of group_count * 64 (input
// channel, tap) pairs, on a pitch 4 floats longer (rows 8 lanes apart then fall on different
// banks), at most 2 kT taps.
__host__ __device__ constexpr int tile_pitch(int group_count) {
  return 64 * group_count + 4;
}
constexpr int kTileFloats = 64 * tile_pitch(2 * kT);

struct WgradHaloParams {
  float* dw;             // (OC, C, KH, KW)
  int oc, c, kw, taps;   // taps = KH * KW
  int oc_tiles, chunks;  // ceil(OC / 64), c_pad / 64
  int tap_groups;        // WgradHaloTaps::groups
  int wp, pad_h, pad_w;
  int images, rows_dy, bands;
  int ktiles, ksteps;  // ksteps = k_rows / 16
  int stages;
  uint32_t dy_slot_bytes, stage_bytes, dy_box_bytes, x_box_bytes, barrier_offset;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CNN_WGRAD_HALO_DEVICE_CODE 1

template <int N>
__device__ __forceinline__ void fence_taps(float (&acc)[N][32]) {
#pragma unroll
  for (int t = 0; t < N; ++t) fence_acc(acc[t]);
}

// The ring: `stages` stages of a dy slot then an x slot at `base`, full[s] and empty[s] barriers
// at `bars`.
struct HaloRing {
  uint32_t base, bars, stage_bytes, dy_slot_bytes;
  int stages;
  __device__ uint32_t full(int s) const { return bars + 8u * s; }
  __device__ uint32_t empty(int s) const { return bars + 8u * (stages + s); }
  // Where the two consumers meet after their main loops (lane 0 of each of their 8 warps).
  __device__ uint32_t drained() const { return bars + 16u * stages; }
  __device__ uint32_t dy_slot(int s) const { return base + uint32_t(s) * stage_bytes; }
  __device__ uint32_t x_slot(int s) const { return dy_slot(s) + dy_slot_bytes; }
};

// One consumer warpgroup on kN taps (its count, a template argument so that no wgmma sits on a
// branch ptxas must treat as divergent, which serializes them): multiplies its nk stages, then
// writes its tile into the gathered block tile at `tile` (shared memory, as tile[oc][c][tap of
// the group]) once both consumers are done with the ring. shift[t]: tap t's first x row, bytes.
template <int kN>
__device__ __forceinline__ void consume_taps(const HaloRing& ring, int nk, int ksteps,
                                             const uint32_t (&shift)[kT], uint32_t tile,
                                             int group_count, int t_base) {
  const int tid = threadIdx.x, lane = tid & 31, v = (tid / 32) & 3;
  float acc[kN > 0 ? kN : 1][32];  // kN 0: a consumer without taps still turns the ring
#pragma unroll
  for (int t = 0; t < kN; ++t)
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[t][i] = 0.f;
  for (int i = 0; i < nk; ++i) {
    const int s = i % ring.stages;
    mbar_wait(ring.full(s), (i / ring.stages) & 1);
    wgmma_fence();
    fence_taps(acc);
    // A 64-wide operand is one atom along M or N: its M/N stride is never used (given the
    // k-group stride, as conv2d_wgmma_wgrad_nhwc.cu does). A k step of 16 rows is 2048 bytes:
    // 128 in the descriptor's start address field (which never carries: shared memory < 256 KB).
    const uint64_t da = sw128_mn_desc(ring.dy_slot(s), 1024);
    uint64_t db[kN > 0 ? kN : 1];
#pragma unroll
    for (int t = 0; t < kN; ++t) db[t] = sw128_mn_desc(ring.x_slot(s) + shift[t], 1024);
#pragma unroll 1
    for (int kk = 0; kk < ksteps; ++kk) {
#pragma unroll
      for (int t = 0; t < kN; ++t) wgmma_m64n64k16_bf16_mn(acc[t], da + 128 * kk, db[t] + 128 * kk);
    }
    commit_and_release_previous([&] { fence_taps(acc); }, i > 0 && lane == 0,
                                ring.empty((i + ring.stages - 1) % ring.stages));
  }
  wgmma_wait<0>();
  fence_taps(acc);
  // Every wgmma of both consumers is done reading the ring, and every copy landed (each consumer
  // waited for all nk stages): the ring is free for the tile. The consumers meet on an mbarrier,
  // not a named barrier: the two may run different instances of this function, and
  // compute-sanitizer's synccheck reports threads of a block meeting at different barrier
  // instructions.
  __syncwarp();
  if (lane == 0) mbar_arrive(ring.drained());
  mbar_wait(ring.drained(), 0);
#pragma unroll
  for (int t = 0; t < kN; ++t)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 16 * v + lane / 4 + 8 * (e >> 1), c = 8 * j + 2 * (lane & 3) + (e & 1);
        st_shared_f32(
            tile + 4u * uint32_t(r * tile_pitch(group_count) + c * group_count + t_base + t),
            acc[t][4 * j + e]);
      }
}

__device__ __forceinline__ void wgrad_halo_body(const CUtensorMap& map_dy, const CUtensorMap& map_x,
                                                const WgradHaloParams& p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const HaloRing ring{base, base + p.barrier_offset, p.stage_bytes, p.dy_slot_bytes, p.stages};
  const int stages = p.stages;
  const int tid = threadIdx.x;
  int tile = int(blockIdx.x);
  const int group = tile % p.tap_groups;
  tile /= p.tap_groups;
  const int chunk = tile % p.chunks, oc_tile = tile / p.chunks;
  const int oc0 = oc_tile * 64, c0 = chunk * 64;
  const int split = int(blockIdx.y), nsplit = int(gridDim.y);
  const int kt_begin = int(int64_t(p.ktiles) * split / nsplit);
  const int nk = int(int64_t(p.ktiles) * (split + 1) / nsplit) - kt_begin;

  // Zero the slots' rows past their boxes (16 bytes a thread a step), then make the zeros
  // visible to the async proxy the wgmmas read through.
  for (int s = 0; s < stages; ++s) {
    for (uint32_t o = p.dy_box_bytes + 16u * tid; o < p.dy_slot_bytes; o += 16u * kThreads)
      st_shared_v4(ring.dy_slot(s) + o, 0.f, 0.f, 0.f, 0.f);
    for (uint32_t o = p.x_box_bytes + 16u * tid; o < p.stage_bytes - p.dy_slot_bytes;
         o += 16u * kThreads)
      st_shared_v4(ring.x_slot(s) + o, 0.f, 0.f, 0.f, 0.f);
  }
  fence_proxy_async();
  // full: the producer's arrive.expect_tx (the copies complete the bytes); empty: lane 0 of each
  // consumer warp.
  if (tid == 0) {
    mbar_init(ring.drained(), 8);  // before the ring's: its init fence covers both
    mbar_init_ring(ring.bars, stages, 1, 8);
  }
  __syncthreads();

  const int wg = tid / 128;
  if (tid == 0) {
    const uint32_t bytes = p.dy_box_bytes + p.x_box_bytes;
    for (int i = 0; i < nk; ++i) {
      const int s = i % stages;
      if (i >= stages) mbar_wait(ring.empty(s), ((i / stages) - 1) & 1);
      const int kt = kt_begin + i;
      int n0, oy0;
      if (p.bands == 1) {
        n0 = kt * p.images;
        oy0 = 0;
      } else {
        n0 = kt / p.bands;
        oy0 = (kt - n0 * p.bands) * p.rows_dy;
      }
      mbar_arrive_expect_tx(ring.full(s), bytes);
      tma_load_4d(ring.dy_slot(s), &map_dy, oc0, 0, oy0, n0, ring.full(s));
      tma_load_4d(ring.x_slot(s), &map_x, c0, -p.pad_w, oy0 - p.pad_h, n0, ring.full(s));
    }
  }
  // Warp 0 whole again before any barrier: a barrier counts a warp's arrival for all its lanes,
  // so lanes arriving apart could release the block barrier below early.
  __syncwarp();
  // This consumer's taps: [tap0, tap0 + count) of the group's, the first consumer the larger
  // half; each tap's B starts ky wp + kx rows of 128 bytes into the x slot.
  const WgradHaloTaps groups{p.tap_groups};
  const int group_first = groups.first(group, p.taps), group_count = groups.count(group, p.taps);
  if (wg > 0) {
    const int w = wg - 1;
    const int half = (group_count + 1) / 2;
    const int tap0 = group_first + (w == 0 ? 0 : half);
    const int count = w == 0 ? half : group_count - half;
    uint32_t shift[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const int tap = min(tap0 + t, p.taps - 1), ky = tap / p.kw, kx = tap - ky * p.kw;
      shift[t] = uint32_t(ky * p.wp + kx) * 128u;
    }
    const int t_base = w == 0 ? 0 : half;
    static_assert(kT == 4, "one case a tap count");
    switch (count) {
      case 4:
        consume_taps<4>(ring, nk, p.ksteps, shift, base, group_count, t_base);
        break;
      case 3:
        consume_taps<3>(ring, nk, p.ksteps, shift, base, group_count, t_base);
        break;
      case 2:
        consume_taps<2>(ring, nk, p.ksteps, shift, base, group_count, t_base);
        break;
      case 1:
        consume_taps<1>(ring, nk, p.ksteps, shift, base, group_count, t_base);
        break;
      default:
        consume_taps<0>(ring, nk, p.ksteps, shift, base, group_count, t_base);
        break;
    }
  }

  // Add the gathered tile to dw with all three warpgroups (the producer's copies all landed: the
  // consumers waited for every stage before gathering).
  __syncthreads();
  add_wgrad_tile(base, tile_pitch(group_count),
                 {p.dw, p.oc, p.c, p.taps, oc0, c0, group_first, group_count}, tid, kThreads);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

__global__ void __launch_bounds__(kThreads, 1)
    wgrad_halo_kernel(const __grid_constant__ CUtensorMap map_dy,
                      const __grid_constant__ CUtensorMap map_x, const WgradHaloParams p) {
  ptx::griddep_enter();
#ifdef CNN_WGRAD_HALO_DEVICE_CODE
  wgrad_halo_body(map_dy, map_x, p);
#else
  (void)map_dy;
  (void)map_x;
  (void)p;
#if defined(__CUDA_ARCH__)
  __trap();  // never dispatched: conv2d_wgrad_wgmma_nhwc_available() is false without sm_90a
#endif
#endif
}

// A channels-last copy (N, rows, cols, c_pad) bf16 as a 4-D tiled map with boxes of {64
// channels, wp columns, box_rows rows, images}, 128-byte swizzle, zero fill outside the tensor.
CUtensorMap make_box_map(const uint16_t* d, int64_t n, int rows, int cols, int c_pad, int wp,
                         int box_rows, int images, const char* which) {
  CUtensorMap map{};
  const cuuint64_t dims[4] = {cuuint64_t(c_pad), cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(n)};
  const cuuint64_t row = cuuint64_t(c_pad) * 2;
  const cuuint64_t strides[3] = {row, row * cuuint64_t(cols), row * cuuint64_t(cols) * rows};
  const cuuint32_t box[4] = {64, cuuint32_t(wp), cuuint32_t(box_rows), cuuint32_t(images)};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<uint16_t*>(d), dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CNN_CHECK(r == CUDA_SUCCESS,
            "conv2d_backward_weight wgmma-nhwc: cuTensorMapEncodeTiled failed (error {}) for the "
            "{} halo box {}x{}x{} of N={} {}x{} Cp={}",
            int(r), which, images, box_rows, wp, n, rows, cols, c_pad);
  return map;
}

// The dynamic shared memory of a launch: the ring (or the gathered tile, if larger), its
// barriers (full and empty a stage, and the consumers' meeting), and the slack to align the ring
// to 1024 bytes.
int64_t ring_bytes(const WgradHaloGeometry& h) {
  return std::max<int64_t>(int64_t(h.stages) * h.stage_bytes(), 4 * kTileFloats);
}
int smem_bytes(const WgradHaloGeometry& h) {
  return int(1024 + ring_bytes(h) + 16 * h.stages + 8);
}

}  // namespace

int wgrad_halo_pick_splits(const Conv2dShape& s, const WgradHaloGeometry& h, int sms) {
  const int64_t tiles = ceil_div<int64_t>(s.oc, 64) * ceil_div<int64_t>(s.c, 64) *
                        wgrad_halo_taps(s.kh * s.kw).groups;
  // One block an SM (split_k.h); at least 3 k-tiles a split.
  return int(split_k_one_wave(tiles, h.ktiles, sms, 3));
}

void conv2d_wgrad_halo_launch(const Conv2dShape& s, const WgradHaloGeometry& h,
                              const uint16_t* d_xc, int c_pad, const uint16_t* d_dyc, int oc_pad,
                              float* d_dw, int splits, cudaStream_t stream) {
  const CUtensorMap map_dy =
      make_box_map(d_dyc, s.n, s.oh(), s.ow(), oc_pad, h.wp, h.rows_dy, h.images, "dy");
  const CUtensorMap map_x = make_box_map(d_xc, s.n, s.h, s.w, c_pad, h.wp, h.rows_x, h.images, "x");
  WgradHaloParams p{};
  p.dw = d_dw;
  p.oc = s.oc;
  p.c = s.c;
  p.kw = s.kw;
  p.taps = s.kh * s.kw;
  p.oc_tiles = int(ceil_div<int64_t>(s.oc, 64));
  p.chunks = c_pad / 64;
  p.tap_groups = wgrad_halo_taps(p.taps).groups;
  p.wp = h.wp;
  p.pad_h = s.pad_h;
  p.pad_w = s.pad_w;
  p.images = h.images;
  p.rows_dy = h.rows_dy;
  p.bands = h.bands;
  CNN_CHECK(h.ktiles <= INT32_MAX, "conv2d_backward_weight wgmma-nhwc: {} k-tiles", h.ktiles);
  p.ktiles = int(h.ktiles);
  p.ksteps = h.k_rows / 16;
  p.stages = h.stages;
  p.dy_slot_bytes = uint32_t(h.dy_slot_bytes());
  p.stage_bytes = uint32_t(h.stage_bytes());
  p.dy_box_bytes = uint32_t(h.dy_box_bytes());
  p.x_box_bytes = uint32_t(h.x_box_bytes());
  p.barrier_offset = uint32_t(ring_bytes(h));
  const int smem = smem_bytes(h);
  const int64_t tiles = int64_t(p.oc_tiles) * p.chunks * p.tap_groups;
  CNN_CHECK(tiles <= INT32_MAX, "conv2d_backward_weight wgmma-nhwc: {} tiles", tiles);
  splits = int(std::clamp<int64_t>(splits, 1, std::min<int64_t>(h.ktiles, 65535)));
  CNN_CUDA_CHECK(
      cudaFuncSetAttribute(wgrad_halo_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  wgrad_halo_kernel<<<dim3(unsigned(tiles), unsigned(splits)), kThreads, smem, stream>>>(map_dy,
                                                                                         map_x, p);
  CNN_LAUNCH_CHECK("conv2d_wgrad_wgmma_nhwc_halo");
}

}  // namespace cnn
