// Hopper wgmma convolution (see conv2d_wgmma.h). One block computes a 128 x BN tile of the
// implicit GEMM (rows: output pixels m = (n, oy, ox); columns: output channels) over a range of
// k-tiles of 32, k = (input channel, ky, kx); 384 threads in three warpgroups:
//   warpgroup 0, the producer: fills a ring of kStages shared-memory stages, each holding the A
//     tile (128 rows x 32 k) and the B^T tile (BN rows x 32 k), both K-major in the 128-byte
//     swizzled layout that wgmma's descriptors name (row r at r * 128 bytes, its 16-byte chunk c
//     at chunk c ^ (r % 8); the byte offset of element k of row r is (4 k) ^ (16 (r % 8))).
//     Thread t gathers A row t (pixel m0 + t) with one 4-byte cp.async per element, zero fill
//     (src-size 0) for padding, rows past M and k past K. The (channel, tap) decomposition of
//     the stage's 32 k is the same for every row: lane l of each producer warp computes that of
//     k0 + l into a warp-private table in shared memory, and each element then costs a table
//     read, two bounds checks and the copy. In a warp, lanes 8q .. 8q + 7 start at k = q and run
//     over the 32 k cyclically, so one copy instruction writes 8 rows x 4 distinct words: the 32
//     banks once (a common k for the warp would hit 8 banks four times each), while its reads
//     stay on consecutive pixels. B: TMA of the (OC, K) weights (K-contiguous, aligned: the
//     forward), else gathered the same way, row n at w[n ld_n + c ld_c + tap or its flip].
//     Default pipeline (WgmmaConvGather::Async): each thread ends a stage with
//     cp.async.mbarrier.arrive.noinc on the stage's `full` barrier (count 128, + 1 for the TMA's
//     arrive.expect_tx), so up to kStages stages are in flight and no thread waits for its copies.
//   warpgroups 1 and 2, the consumers: warpgroup w multiplies rows [64 (w - 1), +64) of the tile,
//     4 wgmma.m64nBNk8 per stage, one stage's group kept in flight while the next is issued; the
//     8 consumer warps release a stage on its `empty` barrier.
// Why the consumer fences: cp.async writes shared memory through the generic proxy, wgmma reads
// its operands through the async proxy, and the writer thread cannot put the cross-proxy fence
// after writes that complete asynchronously. The mbarrier phase completion makes the cp.async
// writes visible to the threads that observe it (PTX: cp.async.mbarrier.arrive; wait has
// acquire semantics), and each consumer thread then executes fence.proxy.async.shared::cta,
// which orders the generic-proxy writes it has observed before its subsequent async-proxy
// operations, the wgmma reads of that stage. (TMA writes are async-proxy and complete_tx on the
// same barrier: no fence needed for them; the epilogue's generic writes come after
// wgmma.wait_group 0, as in gemm_wgmma.cu.)
// Epilogue: as gemm_wgmma.cu's: the accumulators go to shared memory (reusing the ring), the
// blocks of the cluster (the K splits of one tile) each sum a band of rows over all ranks' tiles
// in rank order through distributed shared memory, add bias, apply ReLU and store NCHW.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_wgmma.h"
#include "kernels/conv/conv2d_wgmma_tile.cuh"
#include "kernels/gemm/gemm_wgmma.h"
#include "kernels/gemm/wgmma_ptx.cuh"
#include "runtime/cuda_check.h"
#include "runtime/env_switches.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

using namespace wgmma;

constexpr int kBM = 128, kBK = 32;  // kBK fp32 = one 128-byte swizzle row
constexpr int kThreads = 384;       // producer + 2 consumer warpgroups
constexpr int kATileBytes = kBM * kBK * 4;
constexpr int kTableBytes = 4 * 32 * 16;  // 4 producer warps x 32 k x int4
constexpr int kMaxSplits = 8;             // portable cluster size
// A row past M gets this top-left input row: every bounds check fails, so it reads nothing.
constexpr int kFarRow = -(1 << 29);
// A k past K gets this tap row/column (fails every bounds check) and B offset -1.
constexpr int kFarTap = -(1 << 28);

enum GatherMode : int { kAsync = 0, kWaitGroup = 1, kSync = 2 };

// Shared-memory plan of one tile width: the stage ring, the producer warps' k tables, then the
// mbarriers full[kStages], empty[kStages]. The epilogue's partial tile reuses the ring.
template <int BN>
struct Plan {
  static constexpr int kBTileBytes = BN * kBK * 4;
  static constexpr int kStageBytes = kATileBytes + kBTileBytes;
  static constexpr int kStages = BN == 64 ? 6 : 4;
  static constexpr int kEpiPitch = BN + 4;  // floats; rows stay 16-byte aligned
  static constexpr int kTableOffset = kStages * kStageBytes;
  static constexpr int kBarrierOffset = kTableOffset + kTableBytes;
  static constexpr int kSmemBytes = 1024 + kBarrierOffset + 2 * kStages * 8;  // + alignment
  static_assert(kBM * kEpiPitch * 4 <= kStages * kStageBytes, "epilogue tile must fit the ring");
  static_assert(kSmemBytes <= 227 * 1024, "over the per-block shared-memory limit");
  static_assert(kStageBytes % 1024 == 0 && kATileBytes % 1024 == 0, "tiles 1024-byte aligned");
};

// The implicit GEMM of one convolution. A (M = N*OH*OW, K = C*KH*KW) = im2col(x), x (N, C, H, W)
// with the given stride and padding (negative padding allowed: the input gradient's). B (k, n)
// = w[n * b_ld_n + c * b_ld_c + (b_flip ? taps - 1 - tap : tap)] for k = c * taps + tap. C (M, N)
// stored into y (N_img, N, OH, OW). All offsets fit int32 (checked on the host).
struct ConvParams {
  const float* a_src;  // x of the convolution (dy for the input gradient)
  const float* b_src;  // its weights
  const float* bias;   // (N) or null
  float* y;
  int relu;
  int M, N, K, ktiles;
  int c, h, w, kw, taps, stride_h, stride_w, pad_h, pad_w, oh, ow;
  int b_ld_n, b_ld_c, b_flip;
  int gather;  // GatherMode
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CNN_WGMMA_CONV_DEVICE_CODE 1

// Lane l's entry of the stage's k table: {A offset c*H*W + ky*W + kx, ky, kx, B offset}.
__device__ __forceinline__ int4 k_entry(const ConvParams& p, int k) {
  if (k >= p.K) return make_int4(0, kFarTap, kFarTap, -1);
  const int c = k / p.taps, tap = k - c * p.taps;
  const int ky = tap / p.kw, kx = tap - ky * p.kw;
  const int b = c * p.b_ld_c + (p.b_flip ? p.taps - 1 - tap : tap);
  return make_int4((c * p.h + ky) * p.w + kx, ky, kx, b);
}

// The copy of one element: cp.async (zero fill when !ok), or, in Sync mode, load and store.
__device__ __forceinline__ void copy_elem(uint32_t dst, const float* base, int off, bool ok,
                                          bool sync) {
  if (sync) {
    st_shared_f32(dst, ok ? __ldg(base + off) : 0.f);
  } else {
    cp_async4_zfill(dst, ok ? base + off : base, ok ? 4u : 0u);
  }
}

// Thread mapping: see the file comment. Grid (tiles_m * tiles_n, 1, splits), cluster
// (1, 1, splits); block x owns C rows [128 (x / tiles_n), +128) x columns [BN (x % tiles_n),
// +BN), split z its k-tiles [z T / splits, (z + 1) T / splits) of T = ceil(K / 32).
template <int BN, bool kBTma>
__device__ __forceinline__ void conv_wgmma_body(const CUtensorMap& map_b, const ConvParams& p) {
  using P = Plan<BN>;
  constexpr int kStages = P::kStages;
  constexpr int kLag = kStages - 2;  // WaitGroup mode: stages in flight behind the newest
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t bars = base + P::kBarrierOffset;
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (kStages + s); };
  auto tile_a = [&](int s) { return base + uint32_t(s) * P::kStageBytes; };
  auto tile_b = [&](int s) { return base + uint32_t(s) * P::kStageBytes + kATileBytes; };

  const int tid = threadIdx.x;
  const int tiles_n = (p.N + BN - 1) / BN;
  const int m0 = int(blockIdx.x / tiles_n) * kBM, n0 = int(blockIdx.x % tiles_n) * BN;
  const uint32_t rank = cluster_rank(), nsplit = cluster_size();
  const int kt_begin = int(int64_t(p.ktiles) * rank / nsplit);
  const int kt_end = int(int64_t(p.ktiles) * (rank + 1) / nsplit);
  const int nk = kt_end - kt_begin;
  const bool async = p.gather == kAsync;

  // full: one arrival per producer thread (+ TMA's); empty: lane 0 of each consumer warp.
  if (tid == 0) mbar_init_ring(bars, kStages, 128 + (kBTma ? 1 : 0), 8);
  __syncthreads();

  const int wg = tid / 128;
  if (wg == 0) {
    const int lane = tid & 31, rot = (tid >> 3) & 3;
    const uint32_t sw = uint32_t(tid & 7) << 4;
    const uint32_t table = base + P::kTableOffset + uint32_t(tid >> 5) * 512;
    // A row tid: output pixel m0 + tid.
    int iy0 = kFarRow, ix0 = 0, a_row = 0;
    {
      const int m = m0 + tid;
      if (m < p.M) {
        const int pix_per_img = p.oh * p.ow;
        const int img = m / pix_per_img, pix = m - img * pix_per_img;
        const int oy = pix / p.ow, ox = pix - oy * p.ow;
        iy0 = oy * p.stride_h - p.pad_h;
        ix0 = ox * p.stride_w - p.pad_w;
        a_row = img * p.c * p.h * p.w + iy0 * p.w + ix0;
      }
    }
    // B row: tid (BN 128, all 32 k) or tid % 64 (BN 64, k half tid / 64).
    const int b_r = BN == 128 ? tid : (tid & 63);
    const int b_half = BN == 128 ? 0 : (tid >> 6);
    const bool b_row_ok = n0 + b_r < p.N;
    const int b_row = b_row_ok ? (n0 + b_r) * p.b_ld_n : 0;

    for (int i = 0; i < nk; ++i) {
      const int s = i % kStages;
      if (i >= kStages) mbar_wait(empty(s), ((i / kStages) - 1) & 1);
      const int k0 = (kt_begin + i) * kBK;
      if constexpr (kBTma) {
        if (tid == 0) {
          mbar_arrive_expect_tx(full(s), P::kBTileBytes);
          tma_load_2d(tile_b(s), &map_b, k0, n0, full(s));
        }
      }
      __syncwarp();  // the previous stage's table reads are done
      st_shared_s32x4(table + lane * 16, k_entry(p, k0 + lane));
      __syncwarp();
      const bool sync = !async && p.gather == kSync;
      const uint32_t a_dst = tile_a(s) + uint32_t(tid) * 128;
      const uint32_t b_dst = tile_b(s) + uint32_t(b_r) * 128;
#pragma unroll 8
      for (int j = 0; j < kBK; ++j) {
        const int kk = (j + rot) & 31;
        const int4 e = ld_shared_s32x4(table + kk * 16);
        const uint32_t off = (uint32_t(kk) * 4) ^ sw;
        const bool ok = unsigned(iy0 + e.y) < unsigned(p.h) && unsigned(ix0 + e.z) < unsigned(p.w);
        copy_elem(a_dst + off, p.a_src, a_row + e.x, ok, sync);
        if constexpr (!kBTma && BN == 128)
          copy_elem(b_dst + off, p.b_src, b_row + e.w, b_row_ok && e.w >= 0, sync);
      }
      if constexpr (!kBTma && BN == 64) {
#pragma unroll 8
        for (int j = 0; j < kBK / 2; ++j) {
          const int kk = 16 * b_half + ((j + rot) & 15);
          const int4 e = ld_shared_s32x4(table + kk * 16);
          copy_elem(b_dst + ((uint32_t(kk) * 4) ^ sw), p.b_src, b_row + e.w, b_row_ok && e.w >= 0,
                    sync);
        }
      }
      if (async) {
        cp_async_mbar_arrive_noinc(full(s));
      } else if (sync) {
        fence_proxy_async();  // this thread's st.shared before the consumers' wgmma reads
        mbar_arrive(full(s));
      } else {
        cp_async_commit();
        if (i >= kLag) {
          cp_async_wait<kLag>();  // k-tile i - kLag has landed
          fence_proxy_async();
          mbar_arrive(full((i - kLag) % kStages));
        }
      }
    }
    if (p.gather == kWaitGroup) {
      cp_async_wait<0>();
      fence_proxy_async();
      for (int i = nk > kLag ? nk - kLag : 0; i < nk; ++i) mbar_arrive(full(i % kStages));
    }
  }

  float acc[1][BN / 2];
  zero_acc(acc);
  if (wg > 0)
    consume_stages<BN, kStages>(acc, nk, wg, async, full, empty, tile_a, tile_a, tile_b, tile_b);
  store_conv_tile<BN, P::kEpiPitch>(acc, base, m0, n0,
                                    ConvTileStore{p.y, p.bias, p.relu, p.M, p.N, p.oh * p.ow, p.N});
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <int BN, bool kBTma>
__global__ void __launch_bounds__(kThreads, 1)
    conv2d_wgmma_kernel(const __grid_constant__ CUtensorMap map_b, const ConvParams p) {
  ptx::griddep_enter();
#ifdef CNN_WGMMA_CONV_DEVICE_CODE
  conv_wgmma_body<BN, kBTma>(map_b, p);
#else
  (void)map_b;
  (void)p;
#if defined(__CUDA_ARCH__)
  __trap();  // never dispatched: conv2d_wgmma_available() is false without the sm_90a cubin
#endif
#endif
}

// The (OC, K) weights as a 2-D tensor map (k, row), 32 x BN boxes, 128-byte swizzle, zero fill
// past the edges: the K-major B^T tile itself.
CUtensorMap make_weight_map(const float* d_w, int k, int oc, int bn) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(oc)};
  const cuuint64_t strides[1] = {cuuint64_t(k) * 4};
  const cuuint32_t box[2] = {kBK, cuuint32_t(bn)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<float*>(d_w), dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CNN_CHECK(r == CUDA_SUCCESS,
            "conv2d wgmma: cuTensorMapEncodeTiled failed (error {}) for ({}, {}) weights", int(r),
            oc, k);
  return map;
}

template <int BN, bool kBTma>
void launch(const ConvParams& p, const CUtensorMap& map_b, int splits, cudaStream_t stream) {
  const int64_t tiles = ceil_div<int64_t>(p.M, kBM) * ceil_div<int64_t>(p.N, BN);
  launch_split_k_clusters(conv2d_wgmma_kernel<BN, kBTma>, tiles, splits, kThreads,
                          Plan<BN>::kSmemBytes, stream, "conv2d_wgmma", map_b, p);
}

int pick_splits(int64_t m, int n, int k, int bn) {
  // One wave at one block per SM: double the splits while the doubled grid still fits on the
  // SMs and each split keeps >= 4 k-tiles.
  const int64_t tiles = ceil_div<int64_t>(m, kBM) * ceil_div<int64_t>(n, bn);
  const int ktiles = ceil_div(k, kBK);
  const int64_t sms = sm_count();
  int s = 1;
  while (s * 2 <= kMaxSplits && tiles * s * 2 <= sms && ktiles / (s * 2) >= 4) s *= 2;
  return s;
}

GatherMode gather_mode(WgmmaConvGather g) {
  if (g == WgmmaConvGather::Default) {
    switch (process_env_switches().wgmma_conv_gather) {
      case WgmmaConvGatherSwitch::WaitGroup:
        return kWaitGroup;
      case WgmmaConvGatherSwitch::Sync:
        return kSync;
      case WgmmaConvGatherSwitch::Async:
        return kAsync;
    }
  }
  return g == WgmmaConvGather::WaitGroup ? kWaitGroup : g == WgmmaConvGather::Sync ? kSync : kAsync;
}

// Runs the implicit GEMM p (geometry and B addressing filled in; M, N, K set) on the tile width
// and split count of `opt`.
void run(ConvParams p, const char* what, bool b_tma_ok, const WgmmaConvOptions& opt,
         cudaStream_t stream) {
  CNN_CHECK(opt.block_n == 0 || opt.block_n == 64 || opt.block_n == 128,
            "{}: block_n={} (expected 0, 64 or 128)", what, opt.block_n);
  const int env_bn = process_env_switches().wgmma_conv_block_n;
  const int bn = opt.block_n ? opt.block_n : env_bn ? env_bn : conv2d_wgmma_pick_block_n(p.M, p.N);
  const int splits = opt.splits > 0 ? opt.splits : pick_splits(p.M, p.N, p.K, bn);
  CNN_CHECK(splits == 1 || splits == 2 || splits == 4 || splits == 8,
            "{}: splits={} (expected 1, 2, 4 or 8)", what, splits);
  p.ktiles = ceil_div(p.K, kBK);
  p.gather = gather_mode(opt.gather);
  const bool b_tma = b_tma_ok && !opt.force_b_gather;
  const CUtensorMap map_b = b_tma ? make_weight_map(p.b_src, p.K, p.N, bn) : CUtensorMap{};
  if (bn == 64) {
    if (b_tma)
      launch<64, true>(p, map_b, splits, stream);
    else
      launch<64, false>(p, map_b, splits, stream);
  } else {
    if (b_tma)
      launch<128, true>(p, map_b, splits, stream);
    else
      launch<128, false>(p, map_b, splits, stream);
  }
}

void check_sizes(const char* what, int64_t m, int64_t k, int64_t x_elems, int64_t w_elems,
                 int64_t y_elems) {
  CNN_CHECK(m <= INT32_MAX && k <= INT32_MAX && x_elems <= INT32_MAX && w_elems <= INT32_MAX &&
                y_elems <= INT32_MAX,
            "{}: algo wgmma handles tensors of at most 2^31-1 elements", what);
}

}  // namespace

bool conv2d_wgmma_available() {
  return gemm_wgmma_available();
}

int conv2d_wgmma_pick_block_n(int64_t m, int n) {
  if (n <= 64) return 64;
  if (ceil_div(n, 64) * 64 < ceil_div(n, 128) * 128) return 64;  // e.g. 130: 192 vs 256 columns
  // Fewer 128-wide tiles than SMs still win: split-K fills the SMs, and the 64-wide tile costs
  // its producer as much per stage for half the columns (H200, VGG at batch 128: conv5 forward,
  // 128 tiles, 88.8 vs 166.1 us; conv3-conv6 forward and input gradient alike).
  (void)m;
  return 128;
}

void conv2d_forward_wgmma(const Conv2dShape& s, const float* d_x, const float* d_w,
                          const float* d_b, float* d_y, bool relu, cudaStream_t stream,
                          const WgmmaConvOptions& opt) {
  const char* what = "conv2d_forward";
  CNN_CHECK(conv2d_wgmma_available(),
            "{}: algo wgmma needs a compute capability 9.0 GPU and a build with CUDA "
            "architecture 90",
            what);
  check_conv2d_shape(s);
  CNN_CHECK(d_x && d_w && d_y, "{}: null tensor pointer", what);
  const int oh = s.oh(), ow = s.ow();
  const int64_t m = int64_t(s.n) * oh * ow, k = int64_t(s.c) * s.kh * s.kw;
  check_sizes(what, m, k, int64_t(s.n) * s.c * s.h * s.w, k * s.oc, m * s.oc);
  ConvParams p{};
  p.a_src = d_x;
  p.b_src = d_w;
  p.bias = d_b;
  p.y = d_y;
  p.relu = relu;
  p.M = int(m);
  p.N = s.oc;
  p.K = int(k);
  p.c = s.c;
  p.h = s.h;
  p.w = s.w;
  p.kw = s.kw;
  p.taps = s.kh * s.kw;
  p.stride_h = s.stride_h;
  p.stride_w = s.stride_w;
  p.pad_h = s.pad_h;
  p.pad_w = s.pad_w;
  p.oh = oh;
  p.ow = ow;
  p.b_ld_n = int(k);
  p.b_ld_c = p.taps;
  p.b_flip = 0;
  const bool b_tma_ok = (reinterpret_cast<uintptr_t>(d_w) & 15u) == 0 && k % 4 == 0;
  run(p, what, b_tma_ok, opt, stream);
}

void conv2d_backward_data_wgmma(const Conv2dShape& s, const float* d_dy, const float* d_w,
                                float* d_dx, cudaStream_t stream, const WgmmaConvOptions& opt) {
  const char* what = "conv2d_backward_data";
  CNN_CHECK(conv2d_wgmma_available(),
            "{}: algo wgmma needs a compute capability 9.0 GPU and a build with CUDA "
            "architecture 90",
            what);
  check_conv2d_shape(s);
  CNN_CHECK(s.stride_h == 1 && s.stride_w == 1,
            "{}: algo wgmma handles stride 1 only (got stride {}x{}); expected igemm, fast or "
            "auto for strided convolutions",
            what, s.stride_h, s.stride_w);
  CNN_CHECK(d_dy && d_w && d_dx, "{}: null tensor pointer", what);
  const int oh = s.oh(), ow = s.ow();
  // dx = conv(dy, w') over (N, OC, OH, OW) -> (N, C, H, W), stride 1, padding KH-1-ph.
  const int64_t m = int64_t(s.n) * s.h * s.w, k = int64_t(s.oc) * s.kh * s.kw;
  check_sizes(what, m, k, int64_t(s.n) * s.oc * oh * ow, k * s.c, m * s.c);
  ConvParams p{};
  p.a_src = d_dy;
  p.b_src = d_w;
  p.bias = nullptr;
  p.y = d_dx;
  p.relu = 0;
  p.M = int(m);
  p.N = s.c;
  p.K = int(k);
  p.c = s.oc;
  p.h = oh;
  p.w = ow;
  p.kw = s.kw;
  p.taps = s.kh * s.kw;
  p.stride_h = 1;
  p.stride_w = 1;
  p.pad_h = s.kh - 1 - s.pad_h;
  p.pad_w = s.kw - 1 - s.pad_w;
  p.oh = s.h;
  p.ow = s.w;
  p.b_ld_n = p.taps;        // w' row c: w[.][c]
  p.b_ld_c = s.c * p.taps;  // w' column block oc: w[oc]
  p.b_flip = 1;
  run(p, what, false, opt, stream);
}

}  // namespace cnn
