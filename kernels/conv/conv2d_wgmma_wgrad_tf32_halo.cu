// The TF32 halo weight gradient (see conv2d_wgmma_wgrad_tf32_halo.h, and
// conv2d_wgrad_tf32_halo_layout.h for the k-tile). The GEMM dw^T (M = (tap, C), N = OC) += A B,
// K = output pixels. A block owns 64 input channels x 64 output channels x one group of at most 9
// taps (WgradTf32HaloTaps) and a contiguous run of k-tiles (its split). 416 threads, one block an
// SM:
//   warp 12, the producer: lane 0 fills a ring of 2-8 stages, each an x slot (a zeroed guard, then
//     the k-tile's x box: 64 channels x rows_x input rows x `pitch` columns, NCHW as x holds it,
//     no swizzle) and a dy slot (dy_boxes boxes of 64 output channels x 32 pixels, K-major in the
//     128-byte swizzle), all by tiled TMA from the FP32 tensors;
//   warpgroups 0-2, the consumers: each takes up to 3 taps of the group; per k step (8 pixels) it
//     loads each tap's A fragment (64 channels x 8 pixels, m16n8k8's layout per warp) from the x
//     slot at the tap's offset, four ld.shared a tap, and issues a wgmma.m64n64k8 with A from
//     registers and B (dy) from the slot, then waits for them (wgmma_wait<0>) before the next
//     step's loads rewrite the registers. Overlapping a step's loads with the previous step's
//     products (two register sets, wgmma_wait<1>) made ptxas serialize the wgmmas (C7513); the
//     three consumers' steps overlap each other instead.
// Epilogue: the consumers gather their FP32 tiles in the ring's shared memory as dw's layout runs
// (input channel, then tap) and every thread adds it to dw (conv2d_wgrad_tile_add.cuh).
// Every mbarrier wait is bounded (wgmma_ptx.cuh: a trap after 10 s).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/common/split_k.h"
#include "kernels/conv/conv2d_wgmma.h"
#include "kernels/conv/conv2d_wgmma_wgrad_tf32_halo.h"
#include "kernels/conv/conv2d_wgrad_dy_map.h"
#include "kernels/conv/conv2d_wgrad_tf32_halo_layout.h"
#include "kernels/conv/conv2d_wgrad_tile_add.cuh"
#include "kernels/gemm/wgmma_ptx.cuh"
#include "runtime/cuda_check.h"
#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

using namespace wgmma;

constexpr int kConsumers = 3;
constexpr int kProducerWarp = 4 * kConsumers;
constexpr int kThreads = 128 * kConsumers + 32;
constexpr int kT = kWgradTf32HaloTapsPerConsumer;
constexpr int kDyBoxBytes = 64 * 128;  // 64 output channels x 32 pixels
// The epilogue's gathered block tile: 64 rows (output channels) of 64 x count (input channel,
// tap) pairs, on a pitch 4 floats longer.
__host__ __device__ constexpr int tile_pitch(int group_count) {
  return 64 * group_count + 4;
}

struct Tf32HaloParams {
  float* dw;  // (OC, C, KH, KW)
  int oc, c, kw, taps, ow, pad_h, pad_w;
  int chunks, tap_groups;  // ceil(C / 64); WgradTf32HaloTaps::groups
  int rows, bands, ksteps, dy_boxes, ktiles, stages;
  int pitch, chan_stride;
  uint32_t x_slot_bytes, stage_bytes, tx_bytes, ring_bytes;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CNN_WGRAD_TF32_HALO_DEVICE_CODE 1

__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

template <int N>
__device__ __forceinline__ void fence_taps(float (&acc)[N][32]) {
#pragma unroll
  for (int t = 0; t < N; ++t) fence_acc(acc[t]);
}

// The ring at `base`: `stages` stages of an x slot (guard, then box) and a dy slot; full[s] and
// empty[s] barriers, the consumers' meeting and the k steps' pixel offsets after it.
struct Tf32Ring {
  uint32_t base, bars, stage_bytes, x_slot_bytes;
  int stages;
  __device__ uint32_t full(int s) const { return bars + 8u * s; }
  __device__ uint32_t empty(int s) const { return bars + 8u * (stages + s); }
  __device__ uint32_t drained() const { return bars + 16u * stages; }
  // ksteps <= 8 ints: pixel_offset(8 ks) of each k step.
  __device__ uint32_t step_offsets() const { return drained() + 8u; }
  __device__ uint32_t x_slot(int s) const { return base + uint32_t(s) * stage_bytes; }
  __device__ uint32_t x_box(int s) const { return x_slot(s) + 4u * kWgradTf32HaloGuardFloats; }
  __device__ uint32_t dy_slot(int s) const { return x_slot(s) + x_slot_bytes; }
};

// One consumer warpgroup on kN taps (a template argument, so that no wgmma sits on a branch
// ptxas must treat as divergent): multiplies its nk stages, then writes its tile into the
// gathered block tile at `tile` (as tile[oc][c][tap of the group]) once all consumers are done
// with the ring. tap_off[t]: tap t's float offset in the x box (row ky, column kx - pad_w).
template <int kN>
__device__ __forceinline__ void consume_taps(const Tf32Ring& ring, const Tf32HaloParams& p, int nk,
                                             const int (&tap_off)[kT], uint32_t tile,
                                             int group_count, int t_base) {
  const int tid = threadIdx.x, lane = tid & 31, v = (tid / 32) & 3;
  const int g = lane >> 2, t = lane & 3;
  // This thread's fragment rows are channels 16 v + g and + 8, its columns pixels t and t + 4 of
  // each k step: float offset of (channel 16 v + g, pixel t) in the x box, and of row + 8.
  const int own = (16 * v + g) * p.chan_stride + t;
  const uint32_t row8 = 4u * 8u * uint32_t(p.chan_stride);
  float acc[kN > 0 ? kN : 1][32];  // kN 0: a consumer without taps still turns the ring
#pragma unroll
  for (int i = 0; i < kN; ++i)
#pragma unroll
    for (int j = 0; j < 32; ++j) acc[i][j] = 0.f;
  const int total = nk * p.ksteps;
  uint32_t a[kN > 0 ? kN : 1][4];
  for (int q = 0; q < total; ++q) {  // step q: stage q / ksteps, k step q % ksteps
    const int i = q / p.ksteps, ks = q - i * p.ksteps, s = i % ring.stages;
    if (ks == 0) mbar_wait(ring.full(s), (i / ring.stages) & 1);
    const int px = int(ld_shared_u32(ring.step_offsets() + 4u * uint32_t(ks)));
    const uint32_t xb = ring.x_box(s) + 4u * uint32_t(own + px);
#pragma unroll
    for (int tt = 0; tt < kN; ++tt) {
      const uint32_t at = uint32_t(int(xb) + 4 * tap_off[tt]);
      a[tt][0] = ld_shared_u32(at);
      a[tt][1] = ld_shared_u32(at + row8);
      a[tt][2] = ld_shared_u32(at + 16u);
      a[tt][3] = ld_shared_u32(at + row8 + 16u);
    }
    // k step ks: box ks / 4, 32 bytes (8 tf32) a step along its swizzled rows.
    const uint64_t db =
        sw128_desc(ring.dy_slot(s) + uint32_t(ks >> 2) * kDyBoxBytes) + 2u * uint32_t(ks & 3);
    wgmma_fence();
    fence_taps(acc);
#pragma unroll
    for (int tt = 0; tt < kN; ++tt) wgmma_m64n64k8_tf32_rs(acc[tt], a[tt], db);
    wgmma_commit();
    fence_taps(acc);
    wgmma_wait<0>();  // the registers are free, and the stage's dy read so far
#pragma unroll
    for (int tt = 0; tt < kN; ++tt) fence_regs(a[tt]);
    fence_taps(acc);
    // The last step of a stage: every read of its slots by this warp is done (the __syncwarp
    // orders the other lanes' loads before lane 0's arrival, which releases them).
    if (ks == p.ksteps - 1) {
      __syncwarp();
      if (lane == 0) mbar_arrive(ring.empty(s));
    }
  }
  // Every wgmma and load of every consumer is done reading the ring, and every copy landed (each
  // consumer waited for all nk stages): the ring is free for the tile. The consumers meet on an
  // mbarrier (they may run different instances of this function; synccheck reports threads of a
  // block meeting at different barrier instructions), every thread arriving: its own loads of
  // the ring then precede the tile's writes for racecheck too (one arrival a warp after
  // __syncwarp orders them as well, but racecheck reported those loads racing the writes).
  mbar_arrive(ring.drained());
  mbar_wait(ring.drained(), 0);
  // Accumulator (row 16 v + g + 8 (e >> 1), column 8 j + 2 t + (e & 1)) of tap tt: input channel
  // row, output channel column (wgmma_ptx.cuh's layout).
  const int pitch = tile_pitch(group_count);
#pragma unroll
  for (int tt = 0; tt < kN; ++tt)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 16 * v + g + 8 * (e >> 1), o = 8 * j + 2 * t + (e & 1);
        st_shared_f32(tile + 4u * uint32_t(o * pitch + c * group_count + t_base + tt),
                      acc[tt][4 * j + e]);
      }
}

__device__ __forceinline__ void wgrad_tf32_halo_body(const CUtensorMap& map_x,
                                                     const CUtensorMap& map_dy,
                                                     const Tf32HaloParams& p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const Tf32Ring ring{base, base + p.ring_bytes, p.stage_bytes, p.x_slot_bytes, p.stages};
  const int tid = threadIdx.x, warp = tid / 32;
  int tile = int(blockIdx.x);
  const int group = tile % p.tap_groups;
  tile /= p.tap_groups;
  const int chunk = tile % p.chunks, oc_tile = tile / p.chunks;
  const int c0 = chunk * 64, oc0 = oc_tile * 64;
  const int split = int(blockIdx.y), nsplit = int(gridDim.y);
  const int kt_begin = int(int64_t(p.ktiles) * split / nsplit);
  const int nk = int(int64_t(p.ktiles) * (split + 1) / nsplit) - kt_begin;

  // The guards (read, never written by the TMA) and the k steps' pixel offsets.
  for (int s = 0; s < p.stages; ++s)
    if (tid < kWgradTf32HaloGuardFloats) st_shared_f32(ring.x_slot(s) + 4u * tid, 0.f);
  if (tid < p.ksteps) {
    const int k = 8 * tid;
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(ring.step_offsets() + 4u * tid),
                 "r"((k / p.ow) * p.pitch + k % p.ow)
                 : "memory");
  }
  // full: the producer's arrive.expect_tx (the copies complete the bytes); empty: lane 0 of each
  // consumer warp.
  if (tid == 0) {
    mbar_init(ring.drained(), 128 * kConsumers);  // before the ring's: its init fence covers both
    mbar_init_ring(ring.bars, p.stages, 1, 4 * kConsumers);
  }
  __syncthreads();

  const WgradTf32HaloTaps groups{p.tap_groups};
  const int group_first = groups.first(group, p.taps), group_count = groups.count(group, p.taps);
  if (warp == kProducerWarp) {
    if (tid == 32 * kProducerWarp) {
      for (int i = 0; i < nk; ++i) {
        const int s = i % p.stages;
        if (i >= p.stages) mbar_wait(ring.empty(s), ((i / p.stages) - 1) & 1);
        const int kt = kt_begin + i, n = kt / p.bands, oy0 = (kt - n * p.bands) * p.rows;
        mbar_arrive_expect_tx(ring.full(s), p.tx_bytes);
        tma_load_4d(ring.x_box(s), &map_x, 0, oy0 - p.pad_h, c0, n, ring.full(s));
        for (int j = 0; j < p.dy_boxes; ++j)
          tma_load_3d(ring.dy_slot(s) + uint32_t(j) * kDyBoxBytes, &map_dy, oy0 * p.ow + 32 * j,
                      oc0, n, ring.full(s));
      }
    }
    __syncwarp();
  } else {
    const int w = warp / 4;
    const int first = WgradTf32HaloTaps::consumer_first(group_count, w);
    const int count = WgradTf32HaloTaps::consumer_count(group_count, w);
    int tap_off[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const int tap = min(group_first + first + t, p.taps - 1), ky = tap / p.kw;
      tap_off[t] = ky * p.pitch + (tap - ky * p.kw) - p.pad_w;
    }
    static_assert(kT == 2, "one case a tap count");
    switch (count) {
      case 2:
        consume_taps<2>(ring, p, nk, tap_off, base, group_count, first);
        break;
      case 1:
        consume_taps<1>(ring, p, nk, tap_off, base, group_count, first);
        break;
      default:
        consume_taps<0>(ring, p, nk, tap_off, base, group_count, first);
        break;
    }
  }

  // Add the gathered tile to dw with every thread (the producer's copies all landed: the consumers
  // waited for every stage before gathering).
  __syncthreads();
  add_wgrad_tile(base, tile_pitch(group_count),
                 {p.dw, p.oc, p.c, p.taps, oc0, c0, group_first, group_count}, tid, kThreads);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

__global__ void __launch_bounds__(kThreads, 1)
    wgrad_tf32_halo_kernel(const __grid_constant__ CUtensorMap map_x,
                           const __grid_constant__ CUtensorMap map_dy, const Tf32HaloParams p) {
  ptx::griddep_enter();
#ifdef CNN_WGRAD_TF32_HALO_DEVICE_CODE
  wgrad_tf32_halo_body(map_x, map_dy, p);
#else
  (void)map_x;
  (void)map_dy;
  (void)p;
#if defined(__CUDA_ARCH__)
  __trap();  // never dispatched: conv2d_wgrad_tf32_halo_available() is false without sm_90a
#endif
#endif
}

// db[oc] += the sum of dy's plane oc over the batch: one block a channel, a fixed order.
__global__ void __launch_bounds__(256) wgrad_tf32_halo_bias_kernel(const float* __restrict__ dy,
                                                                   int n, int oc, int64_t ohw,
                                                                   float* __restrict__ db) {
  ptx::griddep_enter();
  __shared__ float part[256];
  const int o = int(blockIdx.x);
  float sum = 0.f;
  for (int i = 0; i < n; ++i) {
    const float* plane = dy + (int64_t(i) * oc + o) * ohw;
    for (int64_t j = threadIdx.x; j < ohw; j += 256) sum += plane[j];
  }
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[o] += part[0];
}

// x (N, C, H, W) FP32 as a 4-D tiled map, box {pitch columns, rows_x rows, 64 channels, 1}: the
// columns past W and rows outside the image zero filled; no swizzle (the consumers' own loads).
CUtensorMap make_x_map(const float* d_x, const Conv2dShape& s, const WgradTf32HaloGeometry& h) {
  CUtensorMap map{};
  const cuuint64_t dims[4] = {cuuint64_t(s.w), cuuint64_t(s.h), cuuint64_t(s.c), cuuint64_t(s.n)};
  const cuuint64_t row = cuuint64_t(s.w) * 4;
  const cuuint64_t strides[3] = {row, row * cuuint64_t(s.h), row * cuuint64_t(s.h) * s.c};
  const cuuint32_t box[4] = {cuuint32_t(h.pitch), cuuint32_t(h.rows_x), 64, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, const_cast<float*>(d_x), dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CNN_CHECK(r == CUDA_SUCCESS,
            "conv2d_backward_weight (TF32 halo): cuTensorMapEncodeTiled failed (error {}) for the "
            "x box {}x{}x64 of N={} C={} {}x{}",
            int(r), h.rows_x, h.pitch, s.n, s.c, s.h, s.w);
  return map;
}

// The dynamic shared memory: the ring (or the gathered tile, if larger), its barriers (full and
// empty a stage, the consumers' meeting), the k steps' offsets, and the slack to align the ring
// to 1024 bytes.
int64_t ring_bytes(const WgradTf32HaloGeometry& h, int group_count_max) {
  return std::max<int64_t>(int64_t(h.stages) * h.stage_bytes(),
                           int64_t(4) * 64 * tile_pitch(group_count_max));
}
int smem_bytes(const WgradTf32HaloGeometry& h, int group_count_max) {
  return int(1024 + ring_bytes(h, group_count_max) + 16 * h.stages + 8 + 4 * 8);
}
// The most any geometry takes (8 stages, a ring of kWgradTf32HaloRingBytes, or the tile of a
// whole tap group) fits an SM's 227 KB, so no shape is refused for it.
static_assert(1024 + std::max<int64_t>(kWgradTf32HaloRingBytes, 4 * 64 * tile_pitch(3 * kT)) +
                      16 * 8 + 8 + 4 * 8 <=
                  227 * 1024,
              "the TF32 halo kernel's shared memory");

int64_t output_tiles(const Conv2dShape& s) {
  return ceil_div<int64_t>(s.oc, 64) * ceil_div<int64_t>(s.c, 64) *
         wgrad_tf32_halo_taps(s.kh * s.kw).groups;
}

}  // namespace

bool conv2d_wgrad_tf32_halo_available() {
  return conv2d_wgmma_available();
}

std::string conv2d_wgrad_tf32_halo_refusal(const Conv2dShape& s, const Exec& ex) {
  const char* what = "conv2d_backward_weight";
  if (!conv2d_wgrad_tf32_halo_available())
    return fmt::format(
        "{}: the TF32 halo weight gradient needs a compute capability 9.0 GPU and a build with "
        "CUDA architecture 90",
        what);
  if (ex.precision != Precision::TF32)
    return fmt::format("{}: the TF32 halo weight gradient multiplies in tf32 (got precision {})",
                       what, precision_name(ex.precision));
  if (ex.deterministic)
    return fmt::format(
        "{}: the TF32 halo weight gradient sums its K splits with atomics, not in deterministic "
        "mode",
        what);
  const std::string why = wgrad_tf32_halo_shape_refusal(s);
  if (!why.empty()) return fmt::format("{}: {}", what, why);
  return "";
}

int conv2d_wgrad_tf32_halo_splits(const Conv2dShape& s) {
  const WgradTf32HaloGeometry h = wgrad_tf32_halo_geometry(s, "conv2d_backward_weight");
  // One block an SM; at least 2 k-tiles a split.
  return int(split_k_one_wave(output_tiles(s), h.ktiles,
                              conv2d_wgrad_tf32_halo_available() ? sm_count() : 132, 2));
}

bool conv2d_backward_weight_tf32_halo(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                      float* d_dw, float* d_db, const Exec& ex, int splits) {
  const std::string why = conv2d_wgrad_tf32_halo_refusal(s, ex);
  CNN_CHECK(why.empty(), "{}", why);
  CNN_CHECK(d_x && d_dy && d_dw, "conv2d_backward_weight: x, dy and dw must not be null");
  if (reinterpret_cast<uintptr_t>(d_x) % 16 != 0 || reinterpret_cast<uintptr_t>(d_dy) % 16 != 0)
    return false;
  const WgradTf32HaloGeometry h = wgrad_tf32_halo_geometry(s, "conv2d_backward_weight");
  const CUtensorMap map_x = make_x_map(d_x, s, h);
  const CUtensorMap map_dy = wgrad_dy_tf32_map(d_dy, s, 64);
  Tf32HaloParams p{};
  p.dw = d_dw;
  p.oc = s.oc;
  p.c = s.c;
  p.kw = s.kw;
  p.taps = s.kh * s.kw;
  p.ow = s.ow();
  p.pad_h = s.pad_h;
  p.pad_w = s.pad_w;
  p.chunks = int(ceil_div<int64_t>(s.c, 64));
  p.tap_groups = wgrad_tf32_halo_taps(p.taps).groups;
  p.rows = h.rows;
  p.bands = h.bands;
  p.ksteps = h.ksteps;
  p.dy_boxes = h.dy_boxes;
  CNN_CHECK(h.ktiles <= INT32_MAX, "conv2d_backward_weight (TF32 halo): {} k-tiles", h.ktiles);
  p.ktiles = int(h.ktiles);
  p.stages = h.stages;
  p.pitch = h.pitch;
  p.chan_stride = h.chan_stride;
  p.x_slot_bytes = uint32_t(h.x_slot_bytes());
  p.stage_bytes = uint32_t(h.stage_bytes());
  p.tx_bytes = uint32_t(h.x_box_bytes() + h.dy_box_bytes());
  const int group_count_max = WgradTf32HaloTaps{p.tap_groups}.count(p.tap_groups - 1, p.taps);
  p.ring_bytes = uint32_t(ring_bytes(h, group_count_max));
  const int smem = smem_bytes(h, group_count_max);
  const int64_t tiles = output_tiles(s);
  CNN_CHECK(tiles <= INT32_MAX, "conv2d_backward_weight (TF32 halo): {} tiles", tiles);
  if (splits <= 0) splits = conv2d_wgrad_tf32_halo_splits(s);
  splits = int(std::clamp<int64_t>(splits, 1, std::min<int64_t>(h.ktiles, 65535)));
  CNN_CUDA_CHECK(cudaFuncSetAttribute(wgrad_tf32_halo_kernel,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  wgrad_tf32_halo_kernel<<<dim3(unsigned(tiles), unsigned(splits)), kThreads, smem, ex.stream>>>(
      map_x, map_dy, p);
  CNN_LAUNCH_CHECK("conv2d_wgrad_tf32_halo");
  if (d_db) {
    wgrad_tf32_halo_bias_kernel<<<unsigned(s.oc), 256, 0, ex.stream>>>(
        d_dy, s.n, s.oc, int64_t(s.oh()) * s.ow(), d_db);
    CNN_LAUNCH_CHECK("conv2d_wgrad_tf32_halo_bias");
  }
  return true;
}

}  // namespace cnn
