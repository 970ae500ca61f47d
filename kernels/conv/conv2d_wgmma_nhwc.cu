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
// (consume_stages_3xtf32_split); three wgmmas a k step either way.
// Every mbarrier wait is bounded (wgmma_ptx.cuh: a trap after 10 s), so a wrong byte count fails
// the launch instead of hanging the device.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_nhwc_layout.h"
#include "kernels/conv/conv2d_nhwc_scratch.h"
#include "kernels/conv/conv2d_wgmma.h"
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
constexpr int kWindowSlots = 2;  // at most: a chunk's taps read one while the next one loads

// The operand element type of one instance: what the pre-passes write, the TMA maps read and
// the wgmmas multiply. kBlock elements fill one 128-byte row (a k-tile's channels).
template <class T>
struct OperandOf;
template <>
struct OperandOf<float> {  // TF32 in float storage
  static constexpr int kBlock = kNhwcChannelBlock;
  static constexpr bool kBf16 = false;
  static constexpr CUtensorMapDataType kTmaType = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  static __device__ __forceinline__ float round(float v) {
    return __uint_as_float(ptx::to_tf32(v));
  }
  static __device__ __forceinline__ float zero() { return 0.f; }
};
template <>
struct OperandOf<__nv_bfloat16> {  // round to nearest even, as the BF16 mma.sync kernels
  static constexpr int kBlock = kNhwcChannelBlockBf16;
  static constexpr bool kBf16 = true;
  static constexpr CUtensorMapDataType kTmaType = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  static __device__ __forceinline__ __nv_bfloat16 round(float v) { return __float2bfloat16_rn(v); }
  static __device__ __forceinline__ __nv_bfloat16 zero() { return __ushort_as_bfloat16(0); }
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
//
// kWindow, the row-window form (conv2d_nhwc_layout.h, WindowGeometry): a stage holds B only (its
// one or two tiles); A comes in window slots of their own, one a channel chunk, shared by that
// chunk's taps (sized at run time: the tile's rows plus the halo). The shared memory is then
// [slots][B ring][barriers]; the epilogue's tile spans the slots and the ring.
// The window form's ring of B stages: 64 KB an SM, 2 to 6 stages (its stages are B alone).
constexpr int nhwc_window_stages(int stage_bytes, int per_sm) {
  const int n = 64 * 1024 / per_sm / stage_bytes;
  return n < 2 ? 2 : n > 6 ? 6 : n;
}
// The window form's B ring and the bytes around it, for NhwcPlan and the host's slot sizing.
struct WindowRing {
  int stage_bytes, stages, ring_bytes, epi_bytes, barrier_bytes;
};
constexpr WindowRing window_ring(int bn, int per_sm, bool split, int sub) {
  const int stage = (split ? 2 : 1) * bn * kRowBytes;
  const int stages = nhwc_window_stages(stage, per_sm);
  return {stage, stages, stages * stage, kBM * sub * (bn + 4) * 4,
          2 * stages * 8 + 2 * kWindowSlots * 8};
}
template <int BN, int kPerSm, bool kSplit = false, int kSub = 1, bool kWindow = false>
struct NhwcPlan {
  static_assert(BN == 32 || BN == 64 || BN == 128, "tile widths 32, 64 and 128");
  static_assert(kPerSm == 1 || kPerSm == 2 || (kPerSm == 3 && BN == 32),
                "one or two blocks an SM, three of BN 32");
  static_assert(!kSplit || kPerSm == 1 || (kPerSm == 2 && BN <= 64),
                "the 3xTF32 instance runs one block an SM, or two of BN 32 or 64");
  static_assert(kSub == 1 || (kSub == 2 && kPerSm == 1 && !kSplit && BN == 128),
                "the 256-row tile: TF32 or BF16, BN 128, one block an SM");
  // A split by the pre-pass into two copies (big, small): at two an SM, and in the row-window
  // form (whose shifted A tiles the register-splitting consumer does not address).
  static constexpr bool kSplitA = kSplit && (kPerSm > 1 || kWindow);
  static constexpr int kRows = kBM * kSub;  // tile rows (output pixels or positions)
  static constexpr int kATileBytes = kRows * kRowBytes;
  static constexpr int kBTileBytes = BN * kRowBytes;
  static constexpr int kBOffset = kWindow ? 0 : (kSplitA ? 2 : 1) * kATileBytes;  // B in a stage
  static constexpr int kStageBytes = kBOffset + (kSplit ? 2 : 1) * kBTileBytes;
  static constexpr int kStages = kWindow ? window_ring(BN, kPerSm, kSplit, kSub).stages
                                         : nhwc_ring_stages(BN, kPerSm, kSplit, kSub);
  static constexpr int kEpiPitch = BN + 4;  // floats; rows stay 16-byte aligned
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr int kBarrierBytes = 2 * kStages * 8 + (kWindow ? 2 * kWindowSlots * 8 : 0);
  static constexpr int kBarrierOffset = kRingBytes;  // im2col form (window: after the slots)
  static constexpr int kSmemBytes = 1024 + kRingBytes + kBarrierBytes;  // im2col; + alignment
  static constexpr int kEpiBytes = kRows * kEpiPitch * 4;
  static_assert(kWindow || kEpiBytes <= kRingBytes, "epilogue tile must fit the ring");
  // 228 KB an SM, 1 KB of it reserved per resident block (the window form checks at run time).
  static_assert(kWindow || kPerSm * (kSmemBytes + 1024) <= 228 * 1024,
                "over the per-SM shared memory");
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
  // The row-window form (M = positions): the padded grid (wp wide, pos_per_img an image), and
  // its A slots: a_slots of a_slot_bytes (one or, kSplitA, two copies of a_copy_bytes = a_copies
  // boxes of a_box_rows rows), then the B ring, then the barriers at bar_offset.
  int wp, pos_per_img;
  int a_slots, a_copies, a_box_rows;
  uint32_t a_copy_bytes, a_slot_bytes, bar_offset;
  int desc_mode;
};

// Two bf16 as one 32-bit word, lo at the lower address.
__device__ __forceinline__ uint32_t pack_pair(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return uint32_t(__bfloat16_as_ushort(lo)) | uint32_t(__bfloat16_as_ushort(hi)) << 16;
}

// Stores kChannels values (16 bytes) of T at p, 16-byte aligned.
__device__ __forceinline__ void store16(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store16(__nv_bfloat16* p, const __nv_bfloat16 (&v)[8]) {
  *reinterpret_cast<uint4*>(p) = make_uint4(pack_pair(v[0], v[1]), pack_pair(v[2], v[3]),
                                            pack_pair(v[4], v[5]), pack_pair(v[6], v[7]));
}

// Where pixel p (row-major, w wide) of image img lands in the copy: at img hw + p in the plain
// copy (img_pixels = hw, wp = w, pad_off = 0), inside the padding of the row-window copy
// (img_pixels = Hp Wp, wp = Wp, pad_off = pad_h Wp + pad_w).
struct NhwcOutPixels {
  int64_t img_pixels;
  int w, wp, pad_off;
  __host__ __device__ int64_t pixel(int img, int64_t p) const {
    if (wp == w && pad_off == 0) return int64_t(img) * img_pixels + p;
    const int64_t y = p / w;
    return int64_t(img) * img_pixels + y * wp + (p - y * w) + pad_off;
  }
};

// The row-window copy's padding, zeroed (the pre-pass writes only the image). Thread mapping: one
// thread per 16 bytes (kChannels of T) of one padding pixel, pixel b of image img enumerated as
// the top pad_h rows, the bottom pad_h rows, then the pad_w left and right pixels of each image
// row.
template <class T>
__global__ void zero_window_padding_kernel(T* __restrict__ out, int h, int w, int pad_h, int pad_w,
                                           int c_pad, int64_t threads, T* __restrict__ small) {
  ptx::griddep_enter();
  constexpr int kChannels = 16 / int(sizeof(T));
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= threads) return;
  const int hp = h + 2 * pad_h, wp = w + 2 * pad_w;
  const int vecs = c_pad / kChannels, border = hp * wp - h * w;
  const int v = int(i % vecs);
  const int64_t pb = i / vecs;
  const int img = int(pb / border);
  int b = int(pb - int64_t(img) * border), y, x;
  if (b < 2 * pad_h * wp) {  // top and bottom rows
    y = b / wp;
    x = b - y * wp;
    if (y >= pad_h) y += h;
  } else {
    b -= 2 * pad_h * wp;
    const int side = 2 * pad_w, row = b / side, j = b - row * side;
    y = pad_h + row;
    x = j < pad_w ? j : j + w;
  }
  const int64_t at = ((int64_t(img) * hp + y) * wp + x) * c_pad + v * kChannels;
  *reinterpret_cast<uint4*>(out + at) = make_uint4(0, 0, 0, 0);
  if (small) *reinterpret_cast<uint4*>(small + at) = make_uint4(0, 0, 0, 0);
}

// The pre-pass, NCHW -> (N, H, W, c_pad) in T, a transpose that only moves bytes: it runs at
// HBM bandwidth when every access is 16 bytes wide and every sector it touches is used whole.
// Thread mapping: thread i owns a block of kChannels channels x 4 pixels of one image, kChannels
// the channels in 16 bytes of T (4 TF32, 8 BF16): channels cb * kBlock + (i % 8) * kChannels ..
// + kChannels - 1 (kBlock = 8 kChannels: one 128-byte NHWC row segment) and pixels 4 pq ..
// 4 pq + 3, where unit i / 8 = (img, cb, pq), pq fastest. It reads each of its channels' 4 pixels
// with one 16-byte load (kVecLoad; four 4-byte ones where hw is not a multiple of 4 or x is not
// 16-byte aligned), transposes the block in registers and writes each pixel's kChannels values
// with one 16-byte store. So a warp's load reads 64 contiguous bytes of each of 8 channel rows and
// its store writes 128 contiguous bytes of each of 4 pixel rows, with no shared memory; each
// thread has 64 (TF32) or 128 (BF16) bytes of loads in flight. Channels c..c_pad-1 are written as
// zeros without being read; values rounded to T's operand (OperandOf<T>::round), or copied
// unrounded without kRound (the 3xTF32 kernel splits them after loading them). small (T float,
// kRound; null otherwise): also the 3xTF32 residual copy, TF32(v - out) at the same place.
// out_px: where the pixels land (NhwcOutPixels): the row-window copy is written inside its padding.
template <class T, bool kVecLoad, bool kRound = true>
__global__ void nchw_to_nhwc_kernel(const float* __restrict__ x, int c, int64_t hw, int c_pad,
                                    int pquads, int blocks_c, int threads, NhwcOutPixels out_px,
                                    T* __restrict__ out, float* __restrict__ small) {
  ptx::griddep_enter();
  constexpr int kChannels = 16 / int(sizeof(T));
  const int i = int(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= threads) return;
  const int unit = i >> 3;
  const int pq = unit % pquads, rest = unit / pquads;
  const int cb = rest % blocks_c, img = rest / blocks_c;
  const int ch0 = cb * 8 * kChannels + (i & 7) * kChannels;
  const int64_t p0 = int64_t(pq) * 4;
  float v[kChannels][4];
#pragma unroll
  for (int k = 0; k < kChannels; ++k) {
    const int ch = ch0 + k;
    if (ch >= c) {
      v[k][0] = v[k][1] = v[k][2] = v[k][3] = 0.f;
      continue;
    }
    const float* row = x + (int64_t(img) * c + ch) * hw + p0;
    if (kVecLoad) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(row));
      v[k][0] = a.x, v[k][1] = a.y, v[k][2] = a.z, v[k][3] = a.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[k][j] = p0 + j < hw ? __ldg(row + j) : 0.f;
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (!kVecLoad && p0 + j >= hw) break;
    T o[kChannels];
#pragma unroll
    for (int k = 0; k < kChannels; ++k) {
      if constexpr (kRound)
        o[k] = OperandOf<T>::round(v[k][j]);
      else
        o[k] = v[k][j];
    }
    const int64_t at = out_px.pixel(img, p0 + j) * c_pad + ch0;
    store16(out + at, o);
    if constexpr (std::is_same_v<T, float> && kRound) {
      if (small) {
        float r[kChannels];
#pragma unroll
        for (int k = 0; k < kChannels; ++k) r[k] = __uint_as_float(ptx::to_tf32(v[k][j] - o[k]));
        store16(small + at, r);
      }
    }
  }
}

// Thread mapping: one thread per packed weight (r, t, k), grid-stride (see WeightPack). small
// (T float only; null otherwise): also the 3xTF32 residual pack, TF32(w - out) at the same place.
template <class T>
__global__ void pack_weights_kernel(const float* __restrict__ w, int rows, int taps, int k_count,
                                    int k_pad, int64_t ld_r, int64_t ld_k, int flip,
                                    T* __restrict__ out, float* __restrict__ small) {
  ptx::griddep_enter();
  const int64_t total = int64_t(rows) * taps * k_pad;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int k = int(i % k_pad);
    const int64_t rt = i / k_pad;
    const int t = int(rt % taps), r = int(rt / taps);
    const int tap = flip ? taps - 1 - t : t;
    const float v = k < k_count ? __ldg(w + r * ld_r + k * ld_k + tap) : 0.f;
    const T big = k < k_count ? OperandOf<T>::round(v) : OperandOf<T>::zero();
    out[i] = big;
    if constexpr (std::is_same_v<T, float>) {
      if (small) small[i] = __uint_as_float(ptx::to_tf32(v - big));
    }
  }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CNN_WGMMA_NHWC_DEVICE_CODE 1

// The consumers' A source in the row-window form (consume_stages): k-tile i of the block's range
// reads window j (its chunk's, counted from the block's first chunk) in slot j % a_slots, at the
// row offset of its tap (window_tap_offset); the first k-tile of a window waits for it, the last
// tap of a chunk releases it (lane 0 of each consumer warp).
struct WindowA {
  uint32_t slots, slot_bytes, small_offset, full0, empty0;
  int a_slots, kt_begin, taps, kw, wp, desc_mode;
  __device__ __forceinline__ void locate(int i, int& j, int& tap) const {
    const int kt = kt_begin + i, chunk = kt / taps;
    j = chunk - kt_begin / taps;
    tap = kt - chunk * taps;
  }
  __device__ __forceinline__ uint32_t big(int i, int) const {
    int j, tap;
    locate(i, j, tap);
    const int ky = tap / kw, kx = tap - ky * kw;
    return slots + uint32_t(j % a_slots) * slot_bytes + uint32_t(ky * wp + kx) * kRowBytes;
  }
  __device__ __forceinline__ uint32_t small(int i, int s) const { return big(i, s) + small_offset; }
  __device__ __forceinline__ uint64_t desc(uint32_t addr) const {
    return sw128_desc(addr) | (desc_mode ? uint64_t((addr >> 7) & 7) << 49 : uint64_t{0});
  }
  // With one slot the next chunk's window overwrites this one: the previous chunk is released
  // here, once every product that read it is done (wgmma_wait<0>), before its successor is
  // waited for (released only after that wait, it would never come).
  __device__ __forceinline__ void wait(int i) const {
    int j, tap;
    locate(i, j, tap);
    if (i > 0 && tap == 0 && a_slots == 1) {
      wgmma_wait<0>();
      if ((threadIdx.x & 31) == 0) mbar_arrive(empty0);
    }
    if (i == 0 || tap == 0) mbar_wait(full0 + 8u * (j % a_slots), (j / a_slots) & 1);
  }
  __device__ __forceinline__ void done(int i) const {
    int j, tap;
    locate(i, j, tap);
    if (a_slots > 1 && tap == taps - 1 && (threadIdx.x & 31) == 0)
      mbar_arrive(empty0 + 8u * (j % a_slots));
  }
};

// Thread mapping: see the file comment. Grid (tiles_m * tiles_n, 1, splits), cluster (1, 1,
// splits); block x owns C rows [R (x / tiles_n), +R) x columns [BN (x % tiles_n), +BN), R = 128
// kSub, split z its k-tiles [z T / splits, (z + 1) T / splits).
// kSplit: the 3xTF32 instance (T float): a stage's B tiles are map_b's (the weights' TF32 part)
// then map_b_small's (their residual); the consumers split A themselves, or at two blocks an SM
// (kSplitA) A comes as two tiles too, map_a's (its TF32 part) then map_a_small's (residual).
template <int BN, class T, int kPerSm, bool kSplit, int kSub, bool kWindow>
__device__ __forceinline__ void conv_nhwc_body(const CUtensorMap& map_a,
                                               const CUtensorMap& map_a_small,
                                               const CUtensorMap& map_b,
                                               const CUtensorMap& map_b_small,
                                               const NhwcParams& p) {
  using P = NhwcPlan<BN, kPerSm, kSplit, kSub, kWindow>;
  constexpr int kStages = P::kStages;
  constexpr int kBK = OperandOf<T>::kBlock;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  // im2col: [ring of A + B stages][barriers]; window: [A slots][ring of B stages][barriers].
  const uint32_t ring = kWindow ? base + uint32_t(p.a_slots) * p.a_slot_bytes : base;
  const uint32_t bars = base + (kWindow ? p.bar_offset : uint32_t(P::kBarrierOffset));
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (kStages + s); };
  auto a_full = [&](int j) { return bars + 8u * (2 * kStages + j); };                  // window
  auto a_empty = [&](int j) { return bars + 8u * (2 * kStages + kWindowSlots + j); };  // window
  auto tile_a = [&](int s) { return ring + uint32_t(s) * P::kStageBytes; };
  auto tile_a_small = [&](int s) { return tile_a(s) + P::kATileBytes; };  // kSplitA
  auto tile_b = [&](int s) { return ring + uint32_t(s) * P::kStageBytes + P::kBOffset; };
  auto tile_b_small = [&](int s) { return tile_b(s) + P::kBTileBytes; };

  const int tid = threadIdx.x;
  const int tiles_n = (p.N + BN - 1) / BN;
  const int m0 = int(blockIdx.x / tiles_n) * P::kRows, n0 = int(blockIdx.x % tiles_n) * BN;
  const uint32_t rank = cluster_rank(), nsplit = cluster_size();
  const int kt_begin = int(int64_t(p.ktiles) * rank / nsplit);
  const int kt_end = int(int64_t(p.ktiles) * (rank + 1) / nsplit);
  const int nk = kt_end - kt_begin;

  // full: the producer's arrive.expect_tx (the copies complete the bytes); empty: lane 0 of each
  // consumer warp. Window slots the same.
  if (tid == 0) {
    mbar_init_ring(bars, kStages, 1, 8);
    if constexpr (kWindow) mbar_init_ring(a_full(0), kWindowSlots, 1, 8);
  }
  __syncthreads();

  const int wg = tid / 128;
  if constexpr (kWindow) {
    // k-tile kt = (chunk, tap), tap innermost, so the taps of a chunk share its window. The
    // window of the j-th chunk this block reads: slot j % a_slots, rows [m0, m0 + rows + halo)
    // of the (positions, c_pad) copy (a_copies boxes; past the last position zero-filled).
    const int taps = p.ktiles / p.chunks;
    if (tid == 0) {
      int j = -1;
      for (int i = 0; i < nk; ++i) {
        const int kt = kt_begin + i, chunk = kt / taps, tap = kt - chunk * taps;
        if (i == 0 || tap == 0) {
          ++j;
          const int slot = j % p.a_slots;
          if (j >= p.a_slots) mbar_wait(a_empty(slot), ((j / p.a_slots) - 1) & 1);
          mbar_arrive_expect_tx(a_full(slot), p.a_slot_bytes);
          const uint32_t dst = base + uint32_t(slot) * p.a_slot_bytes;
          for (int c = 0; c < p.a_copies; ++c) {
            const uint32_t off = uint32_t(c * p.a_box_rows) * kRowBytes;
            tma_load_2d(dst + off, &map_a, chunk * kBK, m0 + c * p.a_box_rows, a_full(slot));
            if constexpr (P::kSplitA)
              tma_load_2d(dst + p.a_copy_bytes + off, &map_a_small, chunk * kBK,
                          m0 + c * p.a_box_rows, a_full(slot));
          }
        }
        const int s = i % kStages;
        if (i >= kStages) mbar_wait(empty(s), ((i / kStages) - 1) & 1);
        mbar_arrive_expect_tx(full(s), P::kStageBytes);
        const int kb = (tap * p.chunks + chunk) * kBK;  // the pack is (rows, taps, k_pad)
        tma_load_2d(tile_b(s), &map_b, kb, n0, full(s));
        if constexpr (kSplit) tma_load_2d(tile_b_small(s), &map_b_small, kb, n0, full(s));
      }
    }
  } else if (tid == 0) {
    const Im2colCorner at =
        im2col_corner(m0, p.oh, p.ow, p.stride_h, p.stride_w, p.lower_h, p.lower_w);
    // The tall tile's second copy (rows m0 + 128 ..): left out where those rows are all past M
    // (their products are never stored, and a row of the product reads only its row of A).
    const bool second = kSub == 2 && m0 + kBM < p.M;
    const Im2colCorner at2 =
        second ? im2col_corner(m0 + kBM, p.oh, p.ow, p.stride_h, p.stride_w, p.lower_h, p.lower_w)
               : at;
    const uint32_t stage_bytes = P::kStageBytes - (kSub == 2 && !second ? kATileBytes : 0);
    for (int i = 0; i < nk; ++i) {
      const int s = i % kStages;
      if (i >= kStages) mbar_wait(empty(s), ((i / kStages) - 1) & 1);
      const int kt = kt_begin + i;
      const int tap = kt / p.chunks, c0 = (kt - tap * p.chunks) * kBK;
      const int ky = tap / p.kw, kx = tap - ky * p.kw;
      mbar_arrive_expect_tx(full(s), stage_bytes);
      tma_load_im2col_4d(tile_a(s), &map_a, c0, at.x, at.y, at.n, uint16_t(kx), uint16_t(ky),
                         full(s));
      if constexpr (P::kSplitA)
        tma_load_im2col_4d(tile_a_small(s), &map_a_small, c0, at.x, at.y, at.n, uint16_t(kx),
                           uint16_t(ky), full(s));
      if (second)
        tma_load_im2col_4d(tile_a(s) + kATileBytes, &map_a, c0, at2.x, at2.y, at2.n, uint16_t(kx),
                           uint16_t(ky), full(s));
      tma_load_2d(tile_b(s), &map_b, kt * kBK, n0, full(s));
      if constexpr (kSplit) tma_load_2d(tile_b_small(s), &map_b_small, kt * kBK, n0, full(s));
    }
  }

  float acc[kSub][BN / 2];
#pragma unroll
  for (int h = 0; h < kSub; ++h)
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[h][i] = 0.f;
  if (wg > 0) {
    constexpr bool kBf16 = OperandOf<T>::kBf16;
    if constexpr (kWindow) {
      const WindowA a_src{base,     p.a_slot_bytes, p.a_copy_bytes, a_full(0), a_empty(0),
                          p.a_slots, kt_begin,      p.ktiles / p.chunks, p.kw, p.wp,
                          p.desc_mode};
      consume_stages<BN, kStages, kBf16, kSub, kSplit>(acc, nk, wg, false, full, empty, a_src,
                                                       tile_b, tile_b_small);
    } else if constexpr (P::kSplitA) {
      consume_stages<BN, kStages, false, 1, true>(acc, nk, wg, false, full, empty,
                                                  stage_a(tile_a, tile_a_small), tile_b,
                                                  tile_b_small);
    } else if constexpr (kSplit) {
      consume_stages_3xtf32<BN, kStages>(acc[0], nk, wg, full, empty, tile_a, tile_b, tile_b_small);
    } else {
      consume_stages<BN, kStages, kBf16, kSub>(acc, nk, wg, false, full, empty,
                                               stage_a(tile_a, tile_a), tile_b, tile_b);
    }
  }
  ConvTileStore store = conv_tile_store(p.y, p.bias, p.relu, p.M, p.N, p.oh, p.ow);
  if constexpr (kWindow) {
    store.pos_per_img = p.pos_per_img;
    store.row_pitch = p.wp;
  }
  store_conv_tile<BN, P::kEpiPitch, kSub>(acc, base, m0, n0, store);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <int BN, class T, int kPerSm, bool kSplit, int kSub, bool kWindow>
__global__ void __launch_bounds__(kThreads, kPerSm)
    conv2d_wgmma_nhwc_kernel(const __grid_constant__ CUtensorMap map_a,
                             const __grid_constant__ CUtensorMap map_a_small,
                             const __grid_constant__ CUtensorMap map_b,
                             const __grid_constant__ CUtensorMap map_b_small, const NhwcParams p) {
  ptx::griddep_enter();
#ifdef CNN_WGMMA_NHWC_DEVICE_CODE
  conv_nhwc_body<BN, T, kPerSm, kSplit, kSub, kWindow>(map_a, map_a_small, map_b, map_b_small, p);
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

// The (N, H, W, Cp) copy as an im2col map: 128 pixels x one 128-byte row of channels (32 fp32 or
// 64 bf16) per copy, 128-byte swizzle, zero fill outside the tensor; corners and traversal
// strides from `geo` (conv2d_nhwc_layout.h).
template <class T>
CUtensorMap make_im2col_map(const T* d_nhwc, const Conv2dShape& g, const Im2colGeometry& geo) {
  CUtensorMap map{};
  const cuuint64_t dims[4] = {cuuint64_t(geo.c_pad), cuuint64_t(g.w), cuuint64_t(g.h),
                              cuuint64_t(g.n)};
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

int pick_splits(int64_t m, int n, int ktiles, int bm, int bn) {
  // One wave at one block per SM: double the splits while the doubled grid still fits on the
  // SMs and each split keeps >= 4 k-tiles (as conv2d_wgmma.cu).
  const int64_t tiles = ceil_div<int64_t>(m, bm) * ceil_div<int64_t>(n, bn);
  const int64_t sms = sm_count();
  int s = 1;
  while (s * 2 <= kMaxSplits && tiles * s * 2 <= sms && ktiles / (s * 2) >= 4) s *= 2;
  return s;
}

// Launches nchw_to_nhwc_kernel<T> after the checks common to both element types.
template <class T, bool kRound = true>
void launch_nchw_to_nhwc(const float* d_x, int n, int c, int64_t hw, int c_pad, T* d_out,
                         float* d_small, NhwcOutPixels out_px, cudaStream_t stream,
                         const char* what) {
  constexpr int kBlock = OperandOf<T>::kBlock;
  CNN_CHECK(n >= 1 && c >= 1 && hw >= 1 && c_pad >= c && c_pad % kBlock == 0,
            "{}: n={} c={} hw={} c_pad={} (expected positive sizes, c_pad >= c, a multiple of {})",
            what, n, c, hw, c_pad, kBlock);
  CNN_CHECK((reinterpret_cast<uintptr_t>(d_out) & 15u) == 0 &&
                (reinterpret_cast<uintptr_t>(d_small) & 15u) == 0,
            "{}: the output must be 16-byte aligned (its rows are written 16 bytes at a time)",
            what);
  const int64_t pquads = ceil_div<int64_t>(hw, 4), blocks_c = c_pad / kBlock;
  const int64_t threads = int64_t(n) * blocks_c * pquads * 8;
  CNN_CHECK(threads <= INT32_MAX - 255,
            "{}: n={} hw={} c_pad={} need {} threads (expected at most 2^31 - 256)", what, n, hw,
            c_pad, threads);
  const unsigned grid = unsigned(ceil_div<int64_t>(threads, 256));
  const bool vec = hw % 4 == 0 && (reinterpret_cast<uintptr_t>(d_x) & 15u) == 0;
  if (vec)
    nchw_to_nhwc_kernel<T, true, kRound><<<grid, 256, 0, stream>>>(
        d_x, c, hw, c_pad, int(pquads), int(blocks_c), int(threads), out_px, d_out, d_small);
  else
    nchw_to_nhwc_kernel<T, false, kRound><<<grid, 256, 0, stream>>>(
        d_x, c, hw, c_pad, int(pquads), int(blocks_c), int(threads), out_px, d_out, d_small);
  CNN_LAUNCH_CHECK(what);
}

// Where the pre-pass writes: the plain copy, or inside the padding of the row-window copy.
NhwcOutPixels plain_out_pixels(int64_t hw) { return {hw, 1, 1, 0}; }
NhwcOutPixels window_out_pixels(const Conv2dShape& g, const WindowGeometry& w) {
  return {int64_t(w.hp) * w.wp, g.w, w.wp, g.pad_h * w.wp + g.pad_w};
}

// Zeroes the padding of the row-window copy (and of its residual copy, small, where not null).
template <class T>
void launch_window_padding(T* d_out, T* d_small, const Conv2dShape& g, int c_pad,
                           cudaStream_t stream) {
  const WindowGeometry w = window_geometry(g, "window padding");
  const int64_t border = int64_t(w.hp) * w.wp - int64_t(g.h) * g.w;
  if (border == 0) return;
  const int64_t threads = int64_t(g.n) * border * (c_pad * int64_t(sizeof(T)) / 16);
  const unsigned grid = unsigned(ceil_div<int64_t>(threads, 256));
  zero_window_padding_kernel<T><<<grid, 256, 0, stream>>>(d_out, g.h, g.w, g.pad_h, g.pad_w, c_pad,
                                                          threads, d_small);
  CNN_LAUNCH_CHECK("zero_window_padding");
}

// The (positions, c_pad) row-window copy as a 2-D map: boxes of box_rows rows x one 128-byte
// row of channels, 128-byte swizzle, zero fill past the last position.
template <class T>
CUtensorMap make_window_map(const T* d_copy, int64_t positions, int c_pad, int box_rows) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(c_pad), cuuint64_t(positions)};
  const cuuint64_t strides[1] = {cuuint64_t(c_pad) * sizeof(T)};
  const cuuint32_t box[2] = {cuuint32_t(OperandOf<T>::kBlock), cuuint32_t(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      tensor_map_encoder()(&map, OperandOf<T>::kTmaType, 2, const_cast<T*>(d_copy), dims, strides,
                           box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                           CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CNN_CHECK(r == CUDA_SUCCESS,
            "conv2d wgmma-nhwc: cuTensorMapEncodeTiled failed (error {}) for a ({}, {}) "
            "row-window copy, boxes of {} rows",
            int(r), positions, c_pad, box_rows);
  return map;
}

void pack_weights(const WeightPack& wp, const float* d_w, float* d_out, cudaStream_t stream) {
  pack_weights_tf32_cuda(wp, d_w, d_out, stream);
}
void pack_weights(const WeightPack& wp, const float* d_w, __nv_bfloat16* d_out,
                  cudaStream_t stream) {
  pack_weights_bf16_cuda(wp, d_w, reinterpret_cast<uint16_t*>(d_out), stream);
}

// The main kernel of one tile shape, element type and residency on tiles x splits blocks.
// The maps: A (and at kSplitA its residual copy), B (and at kSplit its residual pack); the maps
// an instance does not read may be any map.
struct NhwcMaps {
  CUtensorMap a, a_small, b, b_small;
};
template <int BN, class T, int kPerSm, bool kSplit = false, int kSub = 1, bool kWindow = false>
void launch_nhwc(int64_t tiles, int splits, cudaStream_t stream, const char* name,
                 const NhwcMaps& maps, const NhwcParams& p, int window_smem) {
  using P = NhwcPlan<BN, kPerSm, kSplit, kSub, kWindow>;
  if constexpr (kWindow)
    CNN_CHECK(window_ring(BN, kPerSm, kSplit, kSub).stages == P::kStages, "{}: window ring", name);
  launch_split_k_clusters(conv2d_wgmma_nhwc_kernel<BN, T, kPerSm, kSplit, kSub, kWindow>, tiles,
                          splits, kThreads, kWindow ? window_smem : P::kSmemBytes, stream, name,
                          maps.a, maps.a_small, maps.b, maps.b_small, p);
}

// One instance's launch at run time: (bn, per_sm, bm) as picked, window or im2col.
template <class T, bool kSplit, bool kWindow>
void launch_picked(int bn, int per_sm, int bm, int64_t tiles, int splits, cudaStream_t stream,
                   const char* name, const NhwcMaps& maps, const NhwcParams& p, int window_smem) {
  auto go = [&](auto bn_c, auto per_sm_c, auto sub_c) {
    launch_nhwc<decltype(bn_c)::value, T, decltype(per_sm_c)::value, kSplit,
                decltype(sub_c)::value, kWindow>(tiles, splits, stream, name, maps, p,
                                                 window_smem);
  };
  using I32 = std::integral_constant<int, 32>;
  using I64 = std::integral_constant<int, 64>;
  using I128 = std::integral_constant<int, 128>;
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  using Three = std::integral_constant<int, 3>;
  if constexpr (kSplit) {
    if (bn == 32 && per_sm == 2)
      go(I32{}, Two{}, One{});
    else if (bn == 32)
      go(I32{}, One{}, One{});
    else if (bn == 64 && per_sm == 2)
      go(I64{}, Two{}, One{});
    else if (bn == 64)
      go(I64{}, One{}, One{});
    else
      go(I128{}, One{}, One{});
  } else if (bm == 256) {
    go(I128{}, One{}, Two{});
  } else if (bn == 32 && per_sm == 3) {
    go(I32{}, Three{}, One{});
  } else if (bn == 32 && per_sm == 2) {
    go(I32{}, Two{}, One{});
  } else if (bn == 32) {
    go(I32{}, One{}, One{});
  } else if (bn == 64 && per_sm == 2) {
    go(I64{}, Two{}, One{});
  } else if (bn == 64) {
    go(I64{}, One{}, One{});
  } else {
    go(I128{}, One{}, One{});
  }
}

// The window slots of one launch: `slots` (1 or 2) of `slot_bytes` (one copy, or two at kSplitA,
// of `copies` boxes of `box_rows` rows covering the tile's rows plus the halo), the ring after
// them, the barriers after the larger of slots + ring and the epilogue's tile; 0 slots where even
// one does not fit the shared memory of one of per_sm blocks.
struct WindowSlots {
  int slots = 0, copies = 0, box_rows = 0, smem = 0;
  uint32_t copy_bytes = 0, slot_bytes = 0, bar_offset = 0;
};
WindowSlots window_slots(const WindowRing& r, int per_sm, int rows, bool split_a, int want) {
  WindowSlots w;
  w.copies = (rows + 255) / 256;
  w.box_rows = ((rows + w.copies - 1) / w.copies + 7) / 8 * 8;  // 1024-byte aligned boxes
  w.copy_bytes = uint32_t(w.copies * w.box_rows * kRowBytes);
  w.slot_bytes = w.copy_bytes * (split_a ? 2 : 1);
  const int limit = 228 * 1024 / per_sm - 1024;  // 1 KB reserved per resident block
  for (int slots = want; slots >= 1; --slots) {
    const uint32_t used = std::max<uint32_t>(slots * w.slot_bytes + r.ring_bytes, r.epi_bytes);
    const int smem = 1024 + int(used) + r.barrier_bytes;
    if (smem <= limit) {
      w.slots = slots;
      w.bar_offset = used;
      w.smem = smem;
      return w;
    }
  }
  w.slots = 0;
  return w;
}

// Runs conv(a, packed weights) of the GEMM view g (a: g's input, NCHW) into y, NCHW, with
// operands of type T: the two pre-passes into the scratch, then the main kernel. kSplit (T
// float): 3xTF32, two weight packs, and the copy unrounded (one block an SM) or split into two
// copies (two an SM).
template <class T, bool kSplit = false>
void run(const Conv2dShape& g, const WeightPack& wp, const float* d_a, const float* d_w,
         const float* d_b, float* d_y, bool relu, float* d_scratch, cudaStream_t stream,
         const WgmmaNhwcOptions& opt, const char* what) {
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
  CNN_CHECK(opt.window >= 0 && opt.window <= 2,
            "{}: algo wgmma-nhwc window={} (expected 0, 1 im2col or 2 row windows)", what,
            opt.window);
  const Im2colGeometry geo = im2col_geometry(g, what, OperandOf<T>::kBlock);
  const int oh = g.oh(), ow = g.ow();
  const int64_t out_pixels = int64_t(g.n) * oh * ow;
  const int64_t a_elems = int64_t(g.n) * g.c * g.h * g.w;
  const int env_window = process_env_switches().wgmma_nhwc_window;
  int window = opt.window       ? opt.window
               : env_window     ? env_window
                                : conv2d_wgmma_nhwc_pick_window(g);
  if (window == 2 && !opt.window && !window_supported(g)) window = 1;  // the env asks; not here
  const WindowGeometry wgeo = window == 2 ? window_geometry(g, what) : WindowGeometry{};
  // The GEMM's rows: output pixels (im2col), or positions of the padded grid (row windows).
  const int64_t m = window == 2 ? wgeo.positions : out_pixels;
  const int64_t copy_elems = (window == 2 ? wgeo.positions : a_elems / g.c) * geo.c_pad;
  CNN_CHECK(m + 256 <= INT32_MAX && a_elems <= INT32_MAX && copy_elems <= INT32_MAX &&
                out_pixels * g.oc <= INT32_MAX &&
                int64_t(wp.rows) * wp.taps * wp.k_pad <= INT32_MAX,
            "{}: algo wgmma-nhwc handles tensors of at most 2^31-1 elements", what);
  const int env_bn = process_env_switches().wgmma_conv_block_n;
  // CNN_WGMMA_NHWC_BN32=0 leaves the 32-column tile out of the pick (for comparisons).
  const int bn = opt.block_n                              ? opt.block_n
                 : env_bn                                 ? env_bn
                 : process_env_switches().wgmma_nhwc_bn32 ? conv2d_wgmma_nhwc_pick_block_n(m, g.oc)
                                                          : conv2d_wgmma_pick_block_n(m, g.oc);
  CNN_CHECK(opt.block_m == 0 || opt.block_m == 128 ||
                (opt.block_m == 256 && !kSplit && bn == 128 && opt.blocks_per_sm <= 1),
            "{}: algo wgmma-nhwc block_m={} with block_n={}, blocks_per_sm={} (expected 0 or "
            "128, or 256 at precision tf32 or bf16 with block_n 128 and one block an SM)",
            what, opt.block_m, bn, opt.blocks_per_sm);
  const int env_bm = process_env_switches().wgmma_nhwc_block_m;
  int bm = 128;  // 256 rows: TF32 or BF16, 128 columns, one block an SM
  if (!kSplit && bn == 128 && opt.blocks_per_sm <= 1)
    bm = opt.block_m ? opt.block_m
         : env_bm    ? env_bm
                     : conv2d_wgmma_nhwc_pick_block_m(m, g.oc, bn, sm_count());
  // Checked after the refusals above, so that a variant that cannot run says why, not that it
  // was given no scratch (autotune passes its scratch to every candidate alike).
  const NhwcScratchLayout layout = nhwc_scratch_layout(g, wp, opt.precision);
  CNN_CHECK(d_scratch,
            "{}: algo wgmma-nhwc needs a scratch of {} floats ({}_scratch_floats), got null", what,
            layout.floats(), what);
  CNN_CHECK((reinterpret_cast<uintptr_t>(d_scratch) & 15u) == 0,
            "{}: algo wgmma-nhwc needs a 16-byte aligned scratch", what);

  const int splits = opt.splits > 0 ? opt.splits : pick_splits(m, g.oc, geo.ktiles, bm, bn);
  CNN_CHECK(splits == 1 || splits == 2 || splits == 4 || splits == 8,
            "{}: splits={} (expected 1, 2, 4 or 8)", what, splits);

  const int64_t tiles = ceil_div<int64_t>(m, bm) * ceil_div<int64_t>(g.oc, bn);
  // Two blocks an SM only with 32- and 64-column tiles: a 128-column consumer (64 accumulators
  // per thread) does not compile within the 80 registers that two 384-thread blocks leave it.
  // Three (56 registers a thread) only with 32-column tiles (16 accumulators; a 64-column stage
  // would leave a ring of two), and not at FP32 (3xTF32: four tiles a stage). The 256-row tile:
  // one.
  const int env_per_sm = process_env_switches().wgmma_nhwc_blocks_per_sm;
  const int max_per_sm = bm == 256 || bn == 128 ? 1 : kSplit || bn == 64 ? 2 : 3;
  int per_sm = opt.blocks_per_sm;
  if (per_sm == 0) {
    per_sm = env_per_sm ? env_per_sm
                        : conv2d_wgmma_nhwc_pick_blocks_per_sm(tiles * splits, sm_count(), bn);
    per_sm = std::min(per_sm, max_per_sm);
  }
  CNN_CHECK(per_sm <= max_per_sm,
            "{}: algo wgmma-nhwc blocks_per_sm={} with block_n={} (expected 1, 2 with block_n 32 "
            "or 64, or 3 with block_n 32 at precision tf32 or bf16)",
            what, per_sm, bn);
  // A split into two copies by the pre-pass: at two an SM, and in the row-window form.
  const bool split_a = kSplit && (per_sm > 1 || window == 2);
  WindowSlots slots;
  if (window == 2) {
    // Two slots where a block reads more than one channel chunk: the next loads while the taps
    // read this one. Picked: where none fits the shared memory, the im2col form instead.
    slots = window_slots(window_ring(bn, per_sm, kSplit, bm / kBM), per_sm, bm + wgeo.halo,
                         split_a, geo.chunks > 1 ? 2 : 1);
    CNN_CHECK(slots.slots > 0 || !opt.window,
              "{}: algo wgmma-nhwc window=2: a window of {} rows (the tile's {} and a halo of "
              "{}) does not fit the shared memory at blocks_per_sm={}; expected window 0 or 1",
              what, bm + wgeo.halo, bm, wgeo.halo, per_sm);
    if (slots.slots == 0) {  // picked: fall back (same tiles and splits: M changes, so redo)
      WgmmaNhwcOptions im2col = opt;
      im2col.window = 1;
      run<T, kSplit>(g, wp, d_a, d_w, d_b, d_y, relu, d_scratch, stream, im2col, what);
      return;
    }
  }

  T* d_wpack = reinterpret_cast<T*>(d_scratch);  // (rows, taps, k_pad)
  T* d_wsmall = d_wpack + layout.pack_elems;     // kSplit: the residual pack
  T* d_nhwc = d_wpack + layout.weight_elems;     // (N, H, W, c_pad) or (N, Hp, Wp, c_pad)
  T* d_nhwc_small = d_nhwc + layout.copy_elems;  // split_a: A's residual copy
  const NhwcOutPixels out_px = window == 2 ? window_out_pixels(g, wgeo) : plain_out_pixels(int64_t(g.h) * g.w);
  if constexpr (kSplit) {
    pack_weights_tf32_split_cuda(wp, d_w, d_wpack, d_wsmall, stream);
    if (split_a)
      launch_nchw_to_nhwc(d_a, g.n, g.c, int64_t(g.h) * g.w, geo.c_pad, d_nhwc, d_nhwc_small,
                          out_px, stream, "nchw_to_nhwc_tf32_split");
    else
      launch_nchw_to_nhwc<float, false>(d_a, g.n, g.c, int64_t(g.h) * g.w, geo.c_pad, d_nhwc,
                                        nullptr, out_px, stream, "nchw_to_nhwc_fp32");
  } else {
    pack_weights(wp, d_w, d_wpack, stream);
    launch_nchw_to_nhwc(d_a, g.n, g.c, int64_t(g.h) * g.w, geo.c_pad, d_nhwc, nullptr, out_px,
                        stream, "nchw_to_nhwc");
  }
  if (window == 2)
    launch_window_padding(d_nhwc, split_a ? d_nhwc_small : nullptr, g, geo.c_pad, stream);

  NhwcMaps maps;
  if (window == 2) {
    maps.a = make_window_map(d_nhwc, wgeo.positions, geo.c_pad, slots.box_rows);
    maps.a_small =
        split_a ? make_window_map(d_nhwc_small, wgeo.positions, geo.c_pad, slots.box_rows) : maps.a;
  } else {
    maps.a = make_im2col_map(d_nhwc, g, geo);
    maps.a_small = split_a ? make_im2col_map(d_nhwc_small, g, geo) : maps.a;
  }
  const int64_t packed_k = int64_t(wp.taps) * wp.k_pad;
  maps.b = make_packed_weight_map(d_wpack, packed_k, wp.rows, bn);
  maps.b_small = kSplit ? make_packed_weight_map(d_wsmall, packed_k, wp.rows, bn) : maps.b;
  NhwcParams p{};
  p.bias = d_b;
  p.y = d_y;
  p.relu = relu;
  p.M = int(m);
  p.N = g.oc;
  p.ktiles = geo.ktiles;
  p.chunks = geo.chunks;
  p.kw = g.kw;
  p.oh = oh;
  p.ow = ow;
  p.stride_h = g.stride_h;
  p.stride_w = g.stride_w;
  p.lower_h = geo.lower_h;
  p.lower_w = geo.lower_w;
  p.wp = wgeo.wp;
  p.pos_per_img = wgeo.hp * wgeo.wp;
  p.a_slots = slots.slots;
  p.a_copies = slots.copies;
  p.a_box_rows = slots.box_rows;
  p.a_copy_bytes = slots.copy_bytes;
  p.a_slot_bytes = slots.slot_bytes;
  p.bar_offset = slots.bar_offset;
  p.desc_mode = std::getenv("CNN_WINDOW_DESC_MODE") ? 1 : 0;  // TEMPORARY experiment
  const char* name = kSplit                ? "conv2d_wgmma_nhwc_3xtf32"
                     : OperandOf<T>::kBf16 ? "conv2d_wgmma_nhwc_bf16"
                                           : "conv2d_wgmma_nhwc";
  if (window == 2)
    launch_picked<T, kSplit, true>(bn, per_sm, bm, tiles, splits, stream, name, maps, p,
                                   slots.smem);
  else
    launch_picked<T, kSplit, false>(bn, per_sm, bm, tiles, splits, stream, name, maps, p, 0);
}

// run() at the options' precision, on the caller's scratch. wp was packed for that precision's
// channel block.
void run_at_precision(const Conv2dShape& g, const WeightPack& wp, const float* d_a,
                      const float* d_w, const float* d_b, float* d_y, bool relu, float* d_scratch,
                      cudaStream_t stream, const WgmmaNhwcOptions& opt, const char* what) {
  if (opt.precision == Precision::BF16)
    run<__nv_bfloat16>(g, wp, d_a, d_w, d_b, d_y, relu, d_scratch, stream, opt, what);
  else if (opt.precision == Precision::FP32)
    run<float, true>(g, wp, d_a, d_w, d_b, d_y, relu, d_scratch, stream, opt, what);
  else
    run<float>(g, wp, d_a, d_w, d_b, d_y, relu, d_scratch, stream, opt, what);
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

int conv2d_wgmma_nhwc_pick_window(const Conv2dShape& g) {
  // Row windows where the padded grid adds at most 35% to the GEMM's rows (28x28 with padding 1:
  // 15%; 14x14: 31%; 7x7: 104%), im2col elsewhere.
  if (!window_supported(g)) return 1;
  const int64_t grid = int64_t(g.h + 2 * g.pad_h) * (g.w + 2 * g.pad_w);
  return grid * 100 <= int64_t(g.oh()) * g.ow() * 135 ? 2 : 1;
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

void nchw_to_nhwc_tf32_cuda(const float* d_x, int n, int c, int64_t hw, int c_pad, float* d_out,
                            cudaStream_t stream) {
  launch_nchw_to_nhwc(d_x, n, c, hw, c_pad, d_out, nullptr, plain_out_pixels(hw), stream,
                      "nchw_to_nhwc_tf32");
}

void nchw_to_nhwc_bf16_cuda(const float* d_x, int n, int c, int64_t hw, int c_pad, uint16_t* d_out,
                            cudaStream_t stream) {
  launch_nchw_to_nhwc(d_x, n, c, hw, c_pad, reinterpret_cast<__nv_bfloat16*>(d_out), nullptr,
                      plain_out_pixels(hw), stream, "nchw_to_nhwc_bf16");
}

void nchw_to_nhwc_fp32_cuda(const float* d_x, int n, int c, int64_t hw, int c_pad, float* d_out,
                            cudaStream_t stream) {
  launch_nchw_to_nhwc<float, false>(d_x, n, c, hw, c_pad, d_out, nullptr, plain_out_pixels(hw),
                                    stream,
                                    "nchw_to_nhwc_fp32");
}

void nchw_to_nhwc_tf32_split_cuda(const float* d_x, int n, int c, int64_t hw, int c_pad,
                                  float* d_big, float* d_small, cudaStream_t stream) {
  CNN_CHECK(d_small, "nchw_to_nhwc_tf32_split: null residual copy");
  launch_nchw_to_nhwc(d_x, n, c, hw, c_pad, d_big, d_small, plain_out_pixels(hw), stream,
                      "nchw_to_nhwc_tf32_split");
}

void nchw_to_nhwc_window_tf32_cuda(const float* d_x, const Conv2dShape& g, int c_pad,
                                   float* d_out, cudaStream_t stream) {
  const WindowGeometry w = window_geometry(g, "nchw_to_nhwc_window_tf32");
  launch_nchw_to_nhwc(d_x, g.n, g.c, int64_t(g.h) * g.w, c_pad, d_out, nullptr,
                      window_out_pixels(g, w), stream, "nchw_to_nhwc_window_tf32");
  launch_window_padding<float>(d_out, nullptr, g, c_pad, stream);
}

namespace {

// Launches pack_weights_kernel<T> (small: see there) after the checks common to every form.
template <class T>
void launch_pack_weights(const WeightPack& wp, const float* d_w, T* d_out, float* d_small,
                         cudaStream_t stream, const char* what) {
  CNN_CHECK(wp.rows >= 1 && wp.taps >= 1 && wp.k_count >= 1 && wp.k_pad >= wp.k_count,
            "{}: rows={} taps={} k={} k_pad={}", what, wp.rows, wp.taps, wp.k_count, wp.k_pad);
  const int64_t total = int64_t(wp.rows) * wp.taps * wp.k_pad;
  const int threads = 256;
  const int blocks = int(std::min<int64_t>(ceil_div<int64_t>(total, threads), 4096));
  pack_weights_kernel<T><<<blocks, threads, 0, stream>>>(d_w, wp.rows, wp.taps, wp.k_count,
                                                         wp.k_pad, wp.ld_r, wp.ld_k,
                                                         wp.flip ? 1 : 0, d_out, d_small);
  CNN_LAUNCH_CHECK(what);
}

}  // namespace

void pack_weights_tf32_cuda(const WeightPack& wp, const float* d_w, float* d_out,
                            cudaStream_t stream) {
  launch_pack_weights(wp, d_w, d_out, nullptr, stream, "pack_weights_tf32");
}

void pack_weights_bf16_cuda(const WeightPack& wp, const float* d_w, uint16_t* d_out,
                            cudaStream_t stream) {
  launch_pack_weights(wp, d_w, reinterpret_cast<__nv_bfloat16*>(d_out), nullptr, stream,
                      "pack_weights_bf16");
}

void pack_weights_tf32_split_cuda(const WeightPack& wp, const float* d_w, float* d_big,
                                  float* d_small, cudaStream_t stream) {
  CNN_CHECK(d_small, "pack_weights_tf32_split: null residual pack");
  launch_pack_weights(wp, d_w, d_big, d_small, stream, "pack_weights_tf32_split");
}

void conv2d_forward_wgmma_nhwc(const Conv2dShape& s, const float* d_x, const float* d_w,
                               const float* d_b, float* d_y, bool relu, float* d_scratch,
                               cudaStream_t stream, const WgmmaNhwcOptions& opt) {
  const char* what = "conv2d_forward";
  check_conv2d_shape(s);
  CNN_CHECK(d_x && d_w && d_y, "{}: null tensor pointer", what);
  const int block = nhwc_channel_block(opt.precision, what);
  run_at_precision(s, forward_weight_pack(s, block), d_x, d_w, d_b, d_y, relu, d_scratch, stream,
                   opt, what);
}

void conv2d_backward_data_wgmma_nhwc(const Conv2dShape& s, const float* d_dy, const float* d_w,
                                     float* d_dx, float* d_scratch, cudaStream_t stream,
                                     const WgmmaNhwcOptions& opt) {
  const char* what = "conv2d_backward_data";
  check_conv2d_shape(s);
  CNN_CHECK(s.stride_h == 1 && s.stride_w == 1,
            "{}: algo wgmma-nhwc handles stride 1 only (got stride {}x{}); expected igemm, fast "
            "or auto for strided convolutions",
            what, s.stride_h, s.stride_w);
  CNN_CHECK(d_dy && d_w && d_dx, "{}: null tensor pointer", what);
  const int block = nhwc_channel_block(opt.precision, what);
  run_at_precision(backward_data_as_forward(s), backward_data_weight_pack(s, block), d_dy, d_w,
                   nullptr, d_dx, false, d_scratch, stream, opt, what);
}

}  // namespace cnn
