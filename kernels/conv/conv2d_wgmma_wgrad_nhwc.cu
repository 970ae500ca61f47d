// BF16 weight gradient on Hopper wgmma from channels-last copies (see conv2d_wgmma_wgrad_nhwc.h).
// The GEMM dw (M = OC, N = (tap, C)) += A (M, K) B (K, N), K = the N*OH*OW output pixels. A
// column "piece" q is one tap x 64 input channels (q = tap * chunks + chunk); a k-tile is 64
// consecutive output pixels p0 .. p0 + 63 (across rows and images).
// 384 threads in three warpgroups (WgradNhwcPlan: two blocks an SM with a ring of 4 stages, or
// one with 5-6):
//   warpgroup 0, the producer: thread 0 alone fills the ring. A stage holds 8 KB boxes of 64 pixel
//     rows x 128 bytes (64 bf16), landing in the 128-byte swizzle:
//       dy: tiled TMA of the (N*OH*OW, OCp) dy copy, box {64 channels, 64 pixels} at (oc, p0):
//           A^T, M-contiguous; pixels past the end are zero filled;
//       x:  TMA im2col of the (N, H, W, Cp) x copy, 64 channels x 64 pixels walked in output-pixel
//           order from p0's window corner, offset by the piece's tap: B, N-contiguous, exactly the
//           forward's A tile (conv2d_wgmma_nhwc.cu), zero outside the image;
//     one or two dy boxes (64 or 128 output channels) and one to four x pieces (the tile forms).
//   warpgroups 1 and 2, the consumers: each multiplies 64 output channels by one or two pieces
//     (the two split the dy boxes, or the pieces) with 4 wgmma.m64n64k16 or m64n128k16 a stage,
//     both operands MN-major (sw128_mn_desc; a k16 step is 16 pixel rows, 2048 bytes on), keeping
//     one stage's group in flight, then red.add's its FP32 tile into dw (K is split across
//     blocks).
// Every mbarrier wait is bounded (wgmma_ptx.cuh: a trap after 10 s).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/common/split_k.h"
#include "kernels/conv/conv2d_nhwc_layout.h"
#include "kernels/conv/conv2d_nhwc_prepass.h"
#include "kernels/conv/conv2d_nhwc_scratch.h"
#include "kernels/conv/conv2d_wgmma.h"
#include "kernels/conv/conv2d_wgmma_nhwc.h"
#include "kernels/conv/conv2d_wgmma_wgrad_halo.h"
#include "kernels/conv/conv2d_wgmma_wgrad_nhwc.h"
#include "kernels/conv/im2col_tma.cuh"
#include "kernels/gemm/wgmma_ptx.cuh"
#include "runtime/cuda_check.h"
#include "runtime/env_switches.h"
#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

using namespace wgmma;

constexpr int kPix = 64;               // output pixels a k-tile
constexpr int kBlockC = 64;            // bf16 channels a 128-byte row
constexpr int kBoxBytes = kPix * 128;  // one box: 64 pixel rows of 128 bytes
constexpr int kThreads = 384;

// One tile form: a stage holds kBoxesA dy boxes (64 output channels each) and kPieces x pieces;
// the two consumers split the dy boxes (kBoxesA 2: each takes every piece) or the pieces
// (kBoxesA 1: each takes half), so each multiplies 64 rows x kPerConsumer pieces, wgmma n64 or
// n128. The n64 forms fit two blocks an SM (58 registers, 4 stages of 24 KB each); the n128
// forms (64 accumulators a thread) one, with a deeper ring.
template <int kBoxesA, int kPieces>
struct WgradNhwcPlan {
  static_assert((kBoxesA == 2 && (kPieces == 1 || kPieces == 2)) ||
                    (kBoxesA == 1 && (kPieces == 2 || kPieces == 4)),
                "128 x 64, 128 x 128, 64 x 128 or 64 x 256 tiles");
  static constexpr int kPerConsumer = kBoxesA == 2 ? kPieces : kPieces / 2;
  static constexpr int kAcc = 32 * kPerConsumer;
  static constexpr int kStageBytes = (kBoxesA + kPieces) * kBoxBytes;
  static constexpr int kPerSm = kPerConsumer == 1 ? 2 : 1;
  static constexpr int kRingBytes = kPerSm == 2 ? 96 * 1024 : 200 * 1024;
  static constexpr int kStages = kRingBytes / kStageBytes < 8 ? kRingBytes / kStageBytes : 8;
  static constexpr int kBarrierOffset = kStages * kStageBytes;
  static constexpr int kSmemBytes = 1024 + kBarrierOffset + 2 * kStages * 8;  // + alignment
  // 228 KB an SM, 1 KB of it reserved per resident block.
  static_assert(kPerSm * (kSmemBytes + 1024) <= 228 * 1024, "over the per-SM shared memory");
  static_assert(kStages >= 4, "a ring of at least 4 stages");
};

struct WgradNhwcParams {
  float* dw;                    // (OC, C, KH, KW)
  int oc, oc_pad, c, taps, kw;  // oc_pad: OC rounded up to 64; taps = KH * KW
  int chunks, pieces;           // chunks = Cp / 64, pieces = taps * chunks
  int ktiles;                   // ceil(N*OH*OW / 64)
  int tiles_n;                  // column tiles (of kPieces pieces)
  int oh, ow, stride_h, stride_w, lower_h, lower_w;
  int dil_h, dil_w;  // the im2col offsets of tap (ky, kx): (dil_w kx, dil_h ky)
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CNN_WGRAD_NHWC_DEVICE_CODE 1

template <int kBoxesA, int kPieces>
__device__ __forceinline__ void wgrad_nhwc_body(const CUtensorMap& map_dy, const CUtensorMap& map_x,
                                                const WgradNhwcParams& p) {
  using P = WgradNhwcPlan<kBoxesA, kPieces>;
  constexpr int kStages = P::kStages, kPC = P::kPerConsumer;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t bars = base + P::kBarrierOffset;
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (kStages + s); };
  auto box = [&](int s, int b) { return base + uint32_t(s * P::kStageBytes + b * kBoxBytes); };

  const int tid = threadIdx.x;
  const int tile_m = int(blockIdx.x) / p.tiles_n, tile_n = int(blockIdx.x) % p.tiles_n;
  const int oc0 = tile_m * 64 * kBoxesA, q0 = tile_n * kPieces;
  const int split = int(blockIdx.y), nsplit = int(gridDim.y);
  const int kt_begin = int(int64_t(p.ktiles) * split / nsplit);
  const int nk = int(int64_t(p.ktiles) * (split + 1) / nsplit) - kt_begin;

  // full: the producer's arrive.expect_tx (the copies complete the bytes); empty: lane 0 of each
  // consumer warp.
  if (tid == 0) mbar_init_ring(bars, kStages, 1, 8);
  __syncthreads();

  const int wg = tid / 128;
  if (tid == 0) {
    for (int i = 0; i < nk; ++i) {
      const int s = i % kStages;
      if (i >= kStages) mbar_wait(empty(s), ((i / kStages) - 1) & 1);
      const int p0 = (kt_begin + i) * kPix;
      const Im2colCorner at =
          im2col_corner(p0, p.oh, p.ow, p.stride_h, p.stride_w, p.lower_h, p.lower_w);
      mbar_arrive_expect_tx(full(s), P::kStageBytes);
      // A dy box past the padded channels (the second of a last 128-row tile) is loaded as the
      // last one: its rows lie past OC and are not stored, and no box lies wholly outside the
      // tensor.
#pragma unroll
      for (int a = 0; a < kBoxesA; ++a)
        tma_load_2d(box(s, a), &map_dy, min(oc0 + 64 * a, p.oc_pad - 64), p0, full(s));
#pragma unroll
      for (int b = 0; b < kPieces; ++b) {
        // A piece past the last is loaded as the last one (its products are not stored), so
        // that every stage carries the same bytes.
        const int q = min(q0 + b, p.pieces - 1);
        const int tap = q / p.chunks, c0 = (q - tap * p.chunks) * kBlockC;
        const int ky = tap / p.kw, kx = tap - ky * p.kw;
        tma_load_im2col_4d(box(s, kBoxesA + b), &map_x, c0, at.x, at.y, at.n,
                           uint16_t(kx * p.dil_w), uint16_t(ky * p.dil_h), full(s));
      }
    }
  }
  if (wg == 0) return;

  const int w = wg - 1, lane = tid & 31;
  float acc[P::kAcc];
#pragma unroll
  for (int i = 0; i < P::kAcc; ++i) acc[i] = 0.f;
  // Consumer w's dy box and its first piece; its kPC pieces lie next to each other.
  const int a_box = kBoxesA == 2 ? w : 0, b_first = kBoxesA == 2 ? 0 : w * kPC;
  for (int i = 0; i < nk; ++i) {
    const int s = i % kStages;
    mbar_wait(full(s), (i / kStages) & 1);
    // A 64-wide operand is one atom along M or N, so its M/N stride is never used; it is given
    // the k-group stride too, which makes the descriptor read the same whichever of its two
    // offsets the hardware takes as the k stride of an MN-major layout. B of n128: two atoms,
    // the second piece's box kBoxBytes further.
    const uint64_t da = sw128_mn_desc(box(s, a_box), 1024);
    const uint64_t db = sw128_mn_desc(box(s, kBoxesA + b_first), kPC == 2 ? kBoxBytes : 1024);
    wgmma_fence();
    fence_acc(acc);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {  // 16 pixel rows (2048 bytes, 128 in the descriptor) a step
      if constexpr (kPC == 2)
        wgmma_m64n128k16_bf16_mn(acc, da + 128 * kk, db + 128 * kk);
      else
        wgmma_m64n64k16_bf16_mn(acc, da + 128 * kk, db + 128 * kk);
    }
    commit_and_release_previous([&] { fence_acc(acc); }, i > 0 && lane == 0,
                                empty((i + kStages - 1) % kStages));
  }
  wgmma_wait<0>();
  fence_acc(acc);
  if (nk == 0) return;

  // Thread (warp v of the consumer, lane l) holds rows 16 v + l / 4 (+ 8) and columns
  // 8 j + 2 (l % 4) (+ 1) of its 64 x 64 kPC tile (wgmma_ptx.cuh's accumulator layout); column
  // block j / 8 is piece b_first + j / 8.
  const int v = (tid / 32) & 3;
  const int row0 = oc0 + 64 * a_box + 16 * v + lane / 4;
#pragma unroll
  for (int j = 0; j < 8 * kPC; ++j) {
    const int q = q0 + b_first + j / 8;
    if (q >= p.pieces) break;
    const int tap = q / p.chunks, cbase = (q - tap * p.chunks) * kBlockC;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int oc = row0 + 8 * (e >> 1), c = cbase + 8 * (j % 8) + 2 * (lane & 3) + (e & 1);
      if (oc < p.oc && c < p.c)
        atomicAdd(p.dw + (int64_t(oc) * p.c + c) * p.taps + tap, acc[4 * j + e]);
    }
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <int kBoxesA, int kPieces>
__global__ void __launch_bounds__(kThreads, WgradNhwcPlan<kBoxesA, kPieces>::kPerSm)
    wgrad_nhwc_kernel(const __grid_constant__ CUtensorMap map_dy,
                      const __grid_constant__ CUtensorMap map_x, const WgradNhwcParams p) {
  ptx::griddep_enter();
#ifdef CNN_WGRAD_NHWC_DEVICE_CODE
  wgrad_nhwc_body<kBoxesA, kPieces>(map_dy, map_x, p);
#else
  (void)map_dy;
  (void)map_x;
  (void)p;
#if defined(__CUDA_ARCH__)
  __trap();  // never dispatched: conv2d_wgrad_wgmma_nhwc_available() is false without sm_90a
#endif
#endif
}

// The scratch: the x copy (N, H, W, Cp) then the dy copy (N*OH*OW, OCp), bf16, each rounded up
// to 64 elements (128 bytes) so that the second stays 128-byte aligned.
struct WgradNhwcLayout {
  int c_pad = 0, oc_pad = 0;
  int64_t x_elems = 0, dy_elems = 0, pixels = 0;
  int64_t x_span() const { return ceil_div<int64_t>(x_elems, 64) * 64; }
  int64_t dy_span() const { return ceil_div<int64_t>(dy_elems, 64) * 64; }
};
WgradNhwcLayout wgrad_nhwc_layout(const Conv2dShape& s) {
  WgradNhwcLayout l;
  l.c_pad = int(ceil_div<int64_t>(s.c, kBlockC) * kBlockC);
  l.oc_pad = int(ceil_div<int64_t>(s.oc, kBlockC) * kBlockC);
  l.pixels = int64_t(s.n) * s.oh() * s.ow();
  l.x_elems = int64_t(s.n) * s.h * s.w * l.c_pad;
  l.dy_elems = l.pixels * l.oc_pad;
  return l;
}

// The tile form of a call: two dy boxes (128 output channels) where OC > 64, else one; each
// consumer n64 (two blocks an SM), or n128 (two pieces, one block an SM) where `consumer_n` asks
// for it. n64 is the default: on the H200 (BF16, batch 128) n128 took 0.92-1.25x n64's time
// over VGG's and the ResNet's weight gradients, faster only on the ResNet's 64-channel 14x14
// layers (0.92x) and VGG's conv3 (0.99x).
struct WgradNhwcForm {
  int boxes_a = 1, pieces = 2, per_sm = 2;  // per_sm: WgradNhwcPlan's kPerSm
};
WgradNhwcForm wgrad_nhwc_form(const Conv2dShape& s, int consumer_n) {
  const int64_t pieces = int64_t(s.kh) * s.kw * ceil_div<int64_t>(s.c, kBlockC);
  WgradNhwcForm f;
  f.boxes_a = s.oc > 64 ? 2 : 1;
  const bool n128 = consumer_n == 128 && pieces >= 2;
  f.pieces = (f.boxes_a == 2 ? 1 : 2) * (n128 ? 2 : 1);
  f.per_sm = n128 ? 1 : 2;
  return f;
}

// Blocks per column of tiles: enough for a wave of the form's blocks an SM (split_k.h); at least
// 4 k-tiles each (the epilogue's atomics cost about as much as 4 stages).
int pick_splits(const Conv2dShape& s, const WgradNhwcForm& f, int sms) {
  const WgradNhwcLayout l = wgrad_nhwc_layout(s);
  const int64_t ktiles = ceil_div<int64_t>(l.pixels, kPix);
  const int64_t pieces = int64_t(s.kh) * s.kw * (l.c_pad / kBlockC);
  const int64_t tiles =
      ceil_div<int64_t>(s.oc, 64 * f.boxes_a) * ceil_div<int64_t>(pieces, f.pieces);
  const int64_t slots = int64_t(sms) * f.per_sm;
  return int(split_k_one_wave(tiles, ktiles, slots, 4));
}

// The consumer width a call runs: the option's, else CNN_WGMMA_WGRAD_NHWC_N's (0: auto).
int consumer_n_for(const WgmmaWgradNhwcOptions& opt) {
  return opt.consumer_n ? opt.consumer_n : process_env_switches().wgmma_wgrad_nhwc_n;
}

// Whether this call loads halo boxes: the option's, else CNN_WGMMA_WGRAD_NHWC_HALO's (where the
// shape allows), else the pick. Halo boxes asked for by the option on a shape they cannot run
// are refused by wgrad_halo_geometry after.
bool use_halo(const Conv2dShape& s, const WgmmaWgradNhwcOptions& opt) {
  if (opt.b_load != WgradNhwcLoad::Auto) return opt.b_load == WgradNhwcLoad::Halo;
  const int env = process_env_switches().wgmma_wgrad_nhwc_halo;
  if (env >= 0) return env == 1 && wgrad_halo_refusal(s).empty();
  return conv2d_wgrad_wgmma_nhwc_pick_halo(s);
}

template <int kBoxesA, int kPieces>
void launch_form(dim3 grid, cudaStream_t stream, const CUtensorMap& map_dy,
                 const CUtensorMap& map_x, const WgradNhwcParams& p) {
  constexpr int smem = WgradNhwcPlan<kBoxesA, kPieces>::kSmemBytes;
  auto kernel = wgrad_nhwc_kernel<kBoxesA, kPieces>;
  CNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<grid, kThreads, smem, stream>>>(map_dy, map_x, p);
  CNN_LAUNCH_CHECK("conv2d_wgrad_wgmma_nhwc");
}

CUtensorMap make_dy_map(const uint16_t* d_dy, const WgradNhwcLayout& l) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(l.oc_pad), cuuint64_t(l.pixels)};
  const cuuint64_t strides[1] = {cuuint64_t(l.oc_pad) * 2};
  const cuuint32_t box[2] = {cuuint32_t(kBlockC), cuuint32_t(kPix)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(d_dy), dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CNN_CHECK(r == CUDA_SUCCESS,
            "conv2d_backward_weight wgmma-nhwc: cuTensorMapEncodeTiled failed (error {}) for dy "
            "({} pixels, {} channels)",
            int(r), l.pixels, l.oc_pad);
  return map;
}

CUtensorMap make_x_map(const uint16_t* d_x, const Conv2dShape& s, const Im2colGeometry& geo) {
  CUtensorMap map{};
  const cuuint64_t dims[4] = {cuuint64_t(geo.c_pad), cuuint64_t(s.w), cuuint64_t(s.h),
                              cuuint64_t(s.n)};
  const cuuint64_t row = cuuint64_t(geo.c_pad) * 2;
  const cuuint64_t strides[3] = {row, row * cuuint64_t(s.w), row * cuuint64_t(s.w) * s.h};
  const int lower[2] = {geo.lower_w, geo.lower_h};
  const int upper[2] = {geo.upper_w, geo.upper_h};
  const cuuint32_t elem_strides[4] = {1, cuuint32_t(geo.stride_w), cuuint32_t(geo.stride_h), 1};
  const CUresult r = im2col_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<uint16_t*>(d_x), dims, strides, lower,
      upper, kBlockC, kPix, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CNN_CHECK(r == CUDA_SUCCESS,
            "conv2d_backward_weight wgmma-nhwc: cuTensorMapEncodeIm2col failed (error {}) for "
            "N={} H={} W={} Cp={}",
            int(r), s.n, s.h, s.w, geo.c_pad);
  return map;
}

}  // namespace

bool conv2d_wgrad_wgmma_nhwc_available() {
  return conv2d_wgmma_available();
}

std::string conv2d_wgrad_wgmma_nhwc_refusal(const Conv2dShape& s, const Exec& ex) {
  const char* what = "conv2d_backward_weight";
  if (!conv2d_wgrad_wgmma_nhwc_available())
    return fmt::format(
        "{}: algo wgmma-nhwc needs a compute capability 9.0 GPU and a build with CUDA "
        "architecture 90",
        what);
  if (ex.precision != Precision::BF16)
    return fmt::format(
        "{}: the channels-last wgmma weight gradient multiplies in bf16 (got "
        "precision {})",
        what, precision_name(ex.precision));
  if (ex.deterministic)
    return fmt::format(
        "{}: the channels-last wgmma weight gradient sums its K splits with "
        "atomics, not in deterministic mode",
        what);
  if (s.groups != 1)
    return fmt::format(
        "{}: the channels-last wgmma weight gradient runs one group (got groups = {}); the "
        "wgmma gather runs grouped ones",
        what, s.groups);
  try {
    check_conv2d_shape_any(s);
    (void)im2col_geometry(s, what, kBlockC);
  } catch (const Error& e) {
    return e.what();
  }
  const WgradNhwcLayout l = wgrad_nhwc_layout(s);
  if (l.x_elems > INT32_MAX || l.dy_elems > INT32_MAX || l.pixels + kPix > INT32_MAX ||
      int64_t(s.oc) * s.c * s.kh * s.kw > INT32_MAX)
    return fmt::format("{}: algo wgmma-nhwc handles tensors of at most 2^31-1 elements", what);
  return "";
}

std::size_t conv2d_wgrad_wgmma_nhwc_scratch_floats(const Conv2dShape& s) {
  const WgradNhwcLayout l = wgrad_nhwc_layout(s);
  return std::size_t((l.x_span() + l.dy_span()) / 2);  // two bf16 a float
}

bool conv2d_wgrad_wgmma_nhwc_pick_halo(const Conv2dShape& s) {
  if (s.kh * s.kw < 4 || s.c < 16 || !wgrad_halo_refusal(s).empty()) return false;
  return wgrad_halo_useful_fraction(s, wgrad_halo_geometry(s, "conv2d_backward_weight")) >=
         kWgradHaloMinUseful;
}

int conv2d_wgrad_wgmma_nhwc_halo_splits(const Conv2dShape& s) {
  const WgradHaloGeometry h = wgrad_halo_geometry(s, "conv2d_backward_weight");
  return int(std::min<int64_t>(wgrad_halo_pick_splits(s, h, sm_count()), h.ktiles));
}

int conv2d_wgrad_wgmma_nhwc_splits(const Conv2dShape& s) {
  return pick_splits(s, wgrad_nhwc_form(s, consumer_n_for({})),
                     conv2d_wgrad_wgmma_nhwc_available() ? sm_count() : 132);
}

bool conv2d_backward_wgmma_nhwc_shares_dy(const Conv2dShape& s, const Exec& ex) {
  if (!nhwc_input_gradient_refusal(s).empty() || !conv2d_wgrad_wgmma_nhwc_refusal(s, ex).empty())
    return false;
  // The pack (floats) over the x copy (bf16 elements, two a float).
  return int64_t(conv2d_backward_data_wgmma_nhwc_pack_floats(s)) * 2 <=
         wgrad_nhwc_layout(s).x_span();
}

bool conv2d_backward_wgmma_nhwc_shared_dy(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                          const float* d_w, float* d_dw, float* d_db, float* d_dx,
                                          float* d_scratch, const Exec& ex) {
  if (!conv2d_backward_wgmma_nhwc_shares_dy(s, ex)) return false;
  CNN_CHECK(d_w && d_dx, "conv2d_backward (shared dy copy): null tensor pointer");
  conv2d_backward_weight_wgmma_nhwc(s, d_x, d_dy, d_dw, d_db, d_scratch, ex);
  // The weight gradient's dy copy, (N*OH*OW, OC padded to 64): the input gradient's
  // (N, OH, OW, OC padded to 64), both nchw_to_nhwc_bf16 of dy.
  const uint16_t* dy_copy =
      reinterpret_cast<const uint16_t*>(d_scratch) + wgrad_nhwc_layout(s).x_span();
  WgmmaNhwcOptions o;
  o.precision = Precision::BF16;
  conv2d_backward_data_wgmma_nhwc_from_copy(s, dy_copy, d_w, d_dx, d_scratch, ex.stream, o);
  return true;
}

void conv2d_backward_weight_wgmma_nhwc(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                       float* d_dw, float* d_db, float* d_scratch, const Exec& ex,
                                       const WgmmaWgradNhwcOptions& opt) {
  const std::string why = conv2d_wgrad_wgmma_nhwc_refusal(s, ex);
  CNN_CHECK(why.empty(), "{}", why);
  const char* what = "conv2d_backward_weight";
  CNN_CHECK(d_x && d_dy && d_dw, "{}: null tensor pointer", what);
  CNN_CHECK(d_scratch && (reinterpret_cast<uintptr_t>(d_scratch) & 15u) == 0,
            "{}: algo wgmma-nhwc needs a 16-byte aligned scratch of {} floats "
            "(conv2d_wgrad_wgmma_nhwc_scratch_floats)",
            what, conv2d_wgrad_wgmma_nhwc_scratch_floats(s));
  CNN_CHECK(opt.splits >= 0, "{}: splits={} (expected 0 to pick, or at least 1)", what, opt.splits);
  CNN_CHECK(opt.consumer_n == 0 || opt.consumer_n == 64 || opt.consumer_n == 128,
            "{}: consumer_n={} (expected 0, 64 or 128)", what, opt.consumer_n);
  const Im2colGeometry geo = im2col_geometry(s, what, kBlockC);
  const WgradNhwcLayout l = wgrad_nhwc_layout(s);
  uint16_t* d_xc = reinterpret_cast<uint16_t*>(d_scratch);
  uint16_t* d_dyc = d_xc + l.x_span();
  const cudaStream_t stream = ex.stream;
  const NhwcCopyJob x_copy{d_x, s.n, s.c, int64_t(s.h) * s.w, l.c_pad, d_xc};
  const NhwcCopyJob dy_copy{d_dy, s.n, s.oc, int64_t(s.oh()) * s.ow(), l.oc_pad, d_dyc};
  wgrad_nhwc_prepass_bf16_cuda(x_copy, dy_copy, d_db, stream);

  if (use_halo(s, opt)) {
    const WgradHaloGeometry h = wgrad_halo_geometry(s, what);
    const int splits = opt.splits > 0 ? opt.splits : wgrad_halo_pick_splits(s, h, sm_count());
    conv2d_wgrad_halo_launch(s, h, d_xc, l.c_pad, d_dyc, l.oc_pad, d_dw, splits, stream);
    return;
  }

  const CUtensorMap map_dy = make_dy_map(d_dyc, l);
  const CUtensorMap map_x = make_x_map(d_xc, s, geo);
  const WgradNhwcForm f = wgrad_nhwc_form(s, consumer_n_for(opt));
  WgradNhwcParams p{};
  p.dw = d_dw;
  p.oc = s.oc;
  p.oc_pad = l.oc_pad;
  p.c = s.c;
  p.taps = s.kh * s.kw;
  p.kw = s.kw;
  p.chunks = l.c_pad / kBlockC;
  p.pieces = p.taps * p.chunks;
  p.ktiles = int(ceil_div<int64_t>(l.pixels, kPix));
  p.tiles_n = int(ceil_div<int64_t>(p.pieces, f.pieces));
  p.oh = s.oh();
  p.ow = s.ow();
  p.stride_h = s.stride_h;
  p.stride_w = s.stride_w;
  p.lower_h = geo.lower_h;
  p.lower_w = geo.lower_w;
  p.dil_h = geo.dil_h;
  p.dil_w = geo.dil_w;
  const int64_t tiles = ceil_div<int64_t>(s.oc, 64 * f.boxes_a) * p.tiles_n;
  const int splits = std::min(opt.splits > 0 ? opt.splits : pick_splits(s, f, sm_count()),
                              std::min(p.ktiles, 65535));
  CNN_CHECK(tiles <= INT32_MAX, "{}: {} tiles exceed the grid limit", what, tiles);
  const dim3 grid{unsigned(tiles), unsigned(splits), 1u};
  if (f.boxes_a == 2 && f.pieces == 1)
    launch_form<2, 1>(grid, stream, map_dy, map_x, p);
  else if (f.boxes_a == 2)
    launch_form<2, 2>(grid, stream, map_dy, map_x, p);
  else if (f.pieces == 2)
    launch_form<1, 2>(grid, stream, map_dy, map_x, p);
  else
    launch_form<1, 4>(grid, stream, map_dy, map_x, p);
}

}  // namespace cnn
