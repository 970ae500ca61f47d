// The TMA-im2col convolution's pre-passes (see conv2d_nhwc_prepass.h): the activation copy and
// the weight packing, each as a device function over a range of blocks, launched alone
// (nchw_to_nhwc_kernel, pack_weights_kernel) or both in one grid (conv_nhwc_prepass_kernel).
// One body serves both forms, so the fused launch writes the same bits as the separate ones.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_nhwc_prepass.h"
#include "kernels/conv/direct_conv_common.cuh"  // block_sum
#include "runtime/cuda_check.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;
// The weight packing's grid-stride loop covers any size from at most this many blocks.
constexpr int kMaxPackBlocks = 4096;

// The operand element of one precision: how a value is rounded into it, and its channel block
// (one 128-byte row).
template <class T>
struct RoundTo;
template <>
struct RoundTo<float> {  // TF32 in float storage: cvt.rna, as cuBLAS/cuDNN's TF32 mode
  static constexpr int kBlock = kNhwcChannelBlock;
  static __device__ __forceinline__ float round(float v) {
    return __uint_as_float(ptx::to_tf32(v));
  }
  static __device__ __forceinline__ float zero() { return 0.f; }
};
template <>
struct RoundTo<__nv_bfloat16> {  // round to nearest even, as the BF16 mma.sync kernels
  static constexpr int kBlock = kNhwcChannelBlockBf16;
  static __device__ __forceinline__ __nv_bfloat16 round(float v) { return __float2bfloat16_rn(v); }
  static __device__ __forceinline__ __nv_bfloat16 zero() { return __ushort_as_bfloat16(0); }
};

// Two bf16 as one 32-bit word, lo at the lower address.
__device__ __forceinline__ uint32_t pack_pair(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return uint32_t(__bfloat16_as_ushort(lo)) | uint32_t(__bfloat16_as_ushort(hi)) << 16;
}

// Stores 16 bytes of T at p, 16-byte aligned.
__device__ __forceinline__ void store16(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store16(__nv_bfloat16* p, const __nv_bfloat16 (&v)[8]) {
  *reinterpret_cast<uint4*>(p) = make_uint4(pack_pair(v[0], v[1]), pack_pair(v[2], v[3]),
                                            pack_pair(v[4], v[5]), pack_pair(v[6], v[7]));
}

// The copy's arguments: x (n, c, hw) -> out (n, hw, c_pad) in `threads` threads (see copy_part);
// grouped, x (n, groups c, hw) -> out (groups, n, hw, c_pad) (nhwc_copy_image). small (T float,
// rounded copy only; null otherwise): the 3xTF32 residual copy.
template <class T>
struct CopyArgs {
  const float* x;
  int c;
  int64_t hw;
  int c_pad, pquads, blocks_c, threads;
  T* out;
  float* small;
  int n, groups;  // images and groups: x's image i / groups, group i % groups is x's image i
};

// The packing's arguments (WeightPack's fields): out (rows, taps, k_pad). small (T float only;
// null otherwise): the 3xTF32 residual pack.
template <class T>
struct PackArgs {
  const float* w;
  WeightPack wp;  // rows_per_group never 0 here: rows where the pack has one group
  T* out;
  float* small;
};

// NCHW -> (N, H, W, c_pad) in T, a transpose that only moves bytes: it runs at HBM bandwidth when
// every access is 16 bytes wide and every sector it touches is used whole.
// Thread mapping: thread i = block * blockDim + threadIdx owns a block of kChannels channels x 4
// pixels of one image, kChannels the channels in 16 bytes of T (4 TF32, 8 BF16): channels
// cb * kBlock + (i % 8) * kChannels .. + kChannels - 1 (kBlock = 8 kChannels: one 128-byte NHWC
// row segment) and pixels 4 pq .. 4 pq + 3, where unit i / 8 = (img, cb, pq), pq fastest. It
// reads each of its channels' 4 pixels with one 16-byte load (kVecLoad; four 4-byte ones where hw
// is not a multiple of 4 or x is not 16-byte aligned), transposes the block in registers and
// writes each pixel's kChannels values with one 16-byte store. So a warp's load reads 64
// contiguous bytes of each of 8 channel rows and its store writes 128 contiguous bytes of each of
// 4 pixel rows, with no shared memory; each thread has 64 (TF32) or 128 (BF16) bytes of loads in
// flight. Channels c..c_pad-1 are written as zeros without being read; values rounded to T's
// operand (RoundTo<T>::round), or copied unrounded without kRound (the 3xTF32 kernel splits them
// after loading them). small: also TF32(v - out) at the same place.
template <class T, bool kVecLoad, bool kRound>
__device__ __forceinline__ void copy_part(const CopyArgs<T>& a, int block) {
  constexpr int kChannels = 16 / int(sizeof(T));
  const int i = block * int(blockDim.x) + int(threadIdx.x);
  if (i >= a.threads) return;
  const int unit = i >> 3;
  const int pq = unit % a.pquads, rest = unit / a.pquads;
  const int cb = rest % a.blocks_c, img = rest / a.blocks_c;
  const int ch0 = cb * 8 * kChannels + (i & 7) * kChannels;
  const int64_t p0 = int64_t(pq) * 4;
  float v[kChannels][4];
#pragma unroll
  for (int k = 0; k < kChannels; ++k) {
    const int ch = ch0 + k;
    if (ch >= a.c) {
      v[k][0] = v[k][1] = v[k][2] = v[k][3] = 0.f;
      continue;
    }
    const float* row = a.x + (int64_t(img) * a.c + ch) * a.hw + p0;
    if (kVecLoad) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(row));
      v[k][0] = f.x, v[k][1] = f.y, v[k][2] = f.z, v[k][3] = f.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[k][j] = p0 + j < a.hw ? __ldg(row + j) : 0.f;
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (!kVecLoad && p0 + j >= a.hw) break;
    T o[kChannels];
#pragma unroll
    for (int k = 0; k < kChannels; ++k) {
      if constexpr (kRound)
        o[k] = RoundTo<T>::round(v[k][j]);
      else
        o[k] = v[k][j];
    }
    const int64_t at =
        (int64_t(nhwc_copy_image(img, a.n, a.groups)) * a.hw + p0 + j) * a.c_pad + ch0;
    store16(a.out + at, o);
    if constexpr (std::is_same_v<T, float> && kRound) {
      if (a.small) {
        float r[kChannels];
#pragma unroll
        for (int k = 0; k < kChannels; ++k) r[k] = __uint_as_float(ptx::to_tf32(v[k][j] - o[k]));
        store16(a.small + at, r);
      }
    }
  }
}

// Thread mapping: one thread per packed weight (r, t, k) (see WeightPack), grid-stride over
// `blocks` blocks of which this is `block`.
template <class T>
__device__ __forceinline__ void pack_part(const PackArgs<T>& a, int block, int blocks) {
  const WeightPack& wp = a.wp;
  const int64_t total = int64_t(wp.rows) * wp.taps * wp.k_pad;
  for (int64_t i = int64_t(block) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(blocks) * blockDim.x) {
    const int k = int(i % wp.k_pad);
    const int64_t rt = i / wp.k_pad;
    const int t = int(rt % wp.taps), r = int(rt / wp.taps);
    const int64_t src = int64_t(r / wp.rows_per_group) * wp.ld_g +
                        int64_t(r % wp.rows_per_group) * wp.ld_r + k * wp.ld_k +
                        weight_pack_tap(wp, t);
    const float v = k < wp.k_count ? __ldg(a.w + src) : 0.f;
    const T big = k < wp.k_count ? RoundTo<T>::round(v) : RoundTo<T>::zero();
    a.out[i] = big;
    if constexpr (std::is_same_v<T, float>) {
      if (a.small) a.small[i] = __uint_as_float(ptx::to_tf32(v - big));
    }
  }
}

// Thread mapping: copy_part's, block = blockIdx.x.
template <class T, bool kVecLoad, bool kRound>
__global__ void nchw_to_nhwc_kernel(const CopyArgs<T> a) {
  ptx::griddep_enter();
  copy_part<T, kVecLoad, kRound>(a, int(blockIdx.x));
}

// Thread mapping: pack_part's over the whole grid.
template <class T>
__global__ void pack_weights_kernel(const PackArgs<T> a) {
  ptx::griddep_enter();
  pack_part(a, int(blockIdx.x), int(gridDim.x));
}

// Both pre-passes of one convolution call in one grid, because each alone cost about a launch's
// latency for a few microseconds of work (conv2d_nhwc_prepass.h). Thread mapping: blocks
// [0, pack_blocks) are pack_part's grid; block pack_blocks + b is copy_part's block b. Neither
// part reads what the other writes, so the blocks need no order between them; the packing comes
// first so that its grid-stride blocks, which do several weights each on large layers, start
// early. Registers (ptxas, sm_90): 32-48, within 4 of the copy alone; the packing alone takes 28.
template <class T, bool kVecLoad, bool kRound>
__global__ void conv_nhwc_prepass_kernel(const PackArgs<T> w, int pack_blocks,
                                         const CopyArgs<T> x) {
  ptx::griddep_enter();
  if (int(blockIdx.x) < pack_blocks)
    pack_part(w, int(blockIdx.x), pack_blocks);
  else
    copy_part<T, kVecLoad, kRound>(x, int(blockIdx.x) - pack_blocks);
}

// The bias gradient's arguments: db[o] += sum over images and pixels of dy (n, oc, hw), by oc x
// parts blocks.
struct BiasArgs {
  const float* dy;
  int n, oc, parts;
  int64_t hw;
  float* db;
};

// Block b sums channel b % oc over images b / oc, + parts, ..., each image's hw contiguous floats
// read by consecutive threads, then adds the block's sum to db (block_sum: blockDim.x threads).
__device__ __forceinline__ void bias_part(const BiasArgs& a, int b) {
  __shared__ float s_warp[kThreads / 32];
  const int o = b % a.oc;
  float sum = 0.f;
  for (int img = b / a.oc; img < a.n; img += a.parts) {
    const float* row = a.dy + (int64_t(img) * a.oc + o) * a.hw;
    for (int64_t p = threadIdx.x; p < a.hw; p += blockDim.x) sum += row[p];
  }
  sum = block_sum(sum, s_warp);
  if (threadIdx.x == 0) atomicAdd(a.db + o, sum);
}

// The weight gradient's pre-passes in one grid (wgrad_nhwc_prepass_bf16_cuda): blocks
// [0, x_blocks) are x's copy, the next dy_blocks dy's, the rest (oc x parts, or none) the bias
// gradient. No part reads what another writes.
template <bool kVecX, bool kVecDy>
__global__ void wgrad_nhwc_prepass_kernel(const CopyArgs<__nv_bfloat16> x, int x_blocks,
                                          const CopyArgs<__nv_bfloat16> dy, int dy_blocks,
                                          const BiasArgs db) {
  ptx::griddep_enter();
  int b = int(blockIdx.x);
  if (b < x_blocks) {
    copy_part<__nv_bfloat16, kVecX, true>(x, b);
    return;
  }
  b -= x_blocks;
  if (b < dy_blocks) {
    copy_part<__nv_bfloat16, kVecDy, true>(dy, b);
    return;
  }
  bias_part(db, b - dy_blocks);
}

// A checked copy: its arguments, blocks and load width.
template <class T>
struct CopyPlan {
  CopyArgs<T> args{};
  int64_t blocks = 0;
  bool vec = false;
};
template <class T>
CopyPlan<T> plan_copy(const float* d_x, int n, int c, int64_t hw, int c_pad, T* d_out,
                      float* d_small, const char* what, int groups = 1) {
  constexpr int kBlock = RoundTo<T>::kBlock;
  CNN_CHECK(n >= 1 && c >= 1 && hw >= 1 && groups >= 1 && c_pad >= c && c_pad % kBlock == 0,
            "{}: n={} c={} hw={} c_pad={} groups={} (expected positive sizes, c_pad >= c, a "
            "multiple of {})",
            what, n, c, hw, c_pad, groups, kBlock);
  CNN_CHECK(int64_t(n) * groups <= INT32_MAX, "{}: {} images in {} groups", what, n, groups);
  CNN_CHECK(d_out, "{}: null output", what);
  CNN_CHECK((reinterpret_cast<uintptr_t>(d_out) & 15u) == 0 &&
                (reinterpret_cast<uintptr_t>(d_small) & 15u) == 0,
            "{}: the output must be 16-byte aligned (its rows are written 16 bytes at a time)",
            what);
  const int64_t pquads = ceil_div<int64_t>(hw, 4), blocks_c = c_pad / kBlock;
  const int64_t threads = int64_t(n) * groups * blocks_c * pquads * 8;
  CNN_CHECK(threads <= INT32_MAX - (kThreads - 1),
            "{}: n={} groups={} hw={} c_pad={} need {} threads (expected at most 2^31 - 256)", what,
            n, groups, hw, c_pad, threads);
  CopyPlan<T> p;
  p.args = {d_x, c, hw, c_pad, int(pquads), int(blocks_c), int(threads), d_out, d_small, n, groups};
  p.blocks = ceil_div<int64_t>(threads, kThreads);
  p.vec = hw % 4 == 0 && (reinterpret_cast<uintptr_t>(d_x) & 15u) == 0;
  return p;
}

// A checked packing: its arguments and blocks.
template <class T>
struct PackPlan {
  PackArgs<T> args{};
  int blocks = 0;
};
template <class T>
PackPlan<T> plan_pack(const WeightPack& wp, const float* d_w, T* d_out, float* d_small,
                      const char* what) {
  CNN_CHECK(wp.rows >= 1 && wp.taps >= 1 && wp.k_count >= 1 && wp.k_pad >= wp.k_count &&
                wp.kh >= 1 && wp.kw >= 1 && wp.kh * wp.kw == wp.taps,
            "{}: rows={} taps={} ({}x{}) k={} k_pad={}", what, wp.rows, wp.taps, wp.kh, wp.kw,
            wp.k_count, wp.k_pad);
  CNN_CHECK(d_out, "{}: null weight pack", what);
  const int64_t total = int64_t(wp.rows) * wp.taps * wp.k_pad;
  PackPlan<T> p;
  PackArgs<T>& a = p.args;
  a.w = d_w;
  a.wp = wp;
  if (a.wp.rows_per_group <= 0) a.wp.rows_per_group = wp.rows;
  a.out = d_out;
  a.small = d_small;
  p.blocks = int(std::min<int64_t>(ceil_div<int64_t>(total, kThreads), kMaxPackBlocks));
  return p;
}

template <class T, bool kRound = true>
void launch_copy(const float* d_x, int n, int c, int64_t hw, int c_pad, T* d_out, float* d_small,
                 cudaStream_t stream, const char* what) {
  const CopyPlan<T> p = plan_copy(d_x, n, c, hw, c_pad, d_out, d_small, what);
  const unsigned grid = unsigned(p.blocks);
  if (p.vec)
    nchw_to_nhwc_kernel<T, true, kRound><<<grid, kThreads, 0, stream>>>(p.args);
  else
    nchw_to_nhwc_kernel<T, false, kRound><<<grid, kThreads, 0, stream>>>(p.args);
  CNN_LAUNCH_CHECK(what);
}

template <class T>
void launch_pack(const WeightPack& wp, const float* d_w, T* d_out, float* d_small,
                 cudaStream_t stream, const char* what) {
  const PackPlan<T> p = plan_pack(wp, d_w, d_out, d_small, what);
  pack_weights_kernel<T><<<p.blocks, kThreads, 0, stream>>>(p.args);
  CNN_LAUNCH_CHECK(what);
}

// The fused launch of element type T; kRound: whether the copy is rounded (false: FP32's
// unrounded copy). An empty job contributes no blocks.
template <class T, bool kRound>
void launch_fused(const NhwcWeightJob& wj, const NhwcCopyJob& cj, cudaStream_t stream,
                  const char* what) {
  PackPlan<T> pack;
  if (wj.d_w) pack = plan_pack(wj.wp, wj.d_w, static_cast<T*>(wj.d_out), wj.d_small, what);
  CopyPlan<T> copy;
  if (cj.d_x)
    copy = plan_copy(cj.d_x, cj.n, cj.c, cj.hw, cj.c_pad, static_cast<T*>(cj.d_out), cj.d_small,
                     what, cj.groups);
  // At most 4096 + 2^23 blocks (plan_copy's thread limit): far inside gridDim.x's 2^31 - 1.
  const int64_t blocks = pack.blocks + copy.blocks;
  if (blocks == 0) return;
  const unsigned grid = unsigned(blocks);
  if (copy.vec)
    conv_nhwc_prepass_kernel<T, true, kRound>
        <<<grid, kThreads, 0, stream>>>(pack.args, pack.blocks, copy.args);
  else
    conv_nhwc_prepass_kernel<T, false, kRound>
        <<<grid, kThreads, 0, stream>>>(pack.args, pack.blocks, copy.args);
  CNN_LAUNCH_CHECK(what);
}

}  // namespace

void nchw_to_nhwc_tf32_cuda(const float* d_x, int n, int c, int64_t hw, int c_pad, float* d_out,
                            cudaStream_t stream) {
  launch_copy(d_x, n, c, hw, c_pad, d_out, nullptr, stream, "nchw_to_nhwc_tf32");
}

void nchw_to_nhwc_bf16_cuda(const float* d_x, int n, int c, int64_t hw, int c_pad, uint16_t* d_out,
                            cudaStream_t stream) {
  launch_copy(d_x, n, c, hw, c_pad, reinterpret_cast<__nv_bfloat16*>(d_out), nullptr, stream,
              "nchw_to_nhwc_bf16");
}

void wgrad_nhwc_prepass_bf16_cuda(const NhwcCopyJob& x_copy, const NhwcCopyJob& dy_copy,
                                  float* d_db, cudaStream_t stream) {
  const char* what = "wgrad_nhwc_prepass_bf16";
  CNN_CHECK(x_copy.d_x && dy_copy.d_x && !x_copy.d_small && !dy_copy.d_small,
            "{}: both copies are required, without residual copies", what);
  using T = __nv_bfloat16;
  const CopyPlan<T> x = plan_copy(x_copy.d_x, x_copy.n, x_copy.c, x_copy.hw, x_copy.c_pad,
                                  static_cast<T*>(x_copy.d_out), nullptr, what);
  const CopyPlan<T> dy = plan_copy(dy_copy.d_x, dy_copy.n, dy_copy.c, dy_copy.hw, dy_copy.c_pad,
                                   static_cast<T*>(dy_copy.d_out), nullptr, what);
  BiasArgs db{dy_copy.d_x, dy_copy.n, dy_copy.c, 0, dy_copy.hw, d_db};
  int64_t bias_blocks = 0;
  if (d_db) {
    // About two blocks an SM in all, at least an image each.
    const int target = 2 * current_device_sm_count();
    db.parts = std::clamp((target + db.oc - 1) / db.oc, 1, db.n);
    bias_blocks = int64_t(db.oc) * db.parts;
  }
  const int64_t blocks = x.blocks + dy.blocks + bias_blocks;
  CNN_CHECK(blocks <= INT32_MAX, "{}: {} blocks", what, blocks);
  const unsigned grid = unsigned(blocks);
  const int xb = int(x.blocks), dyb = int(dy.blocks);
  if (x.vec && dy.vec)
    wgrad_nhwc_prepass_kernel<true, true>
        <<<grid, kThreads, 0, stream>>>(x.args, xb, dy.args, dyb, db);
  else if (x.vec)
    wgrad_nhwc_prepass_kernel<true, false>
        <<<grid, kThreads, 0, stream>>>(x.args, xb, dy.args, dyb, db);
  else if (dy.vec)
    wgrad_nhwc_prepass_kernel<false, true>
        <<<grid, kThreads, 0, stream>>>(x.args, xb, dy.args, dyb, db);
  else
    wgrad_nhwc_prepass_kernel<false, false>
        <<<grid, kThreads, 0, stream>>>(x.args, xb, dy.args, dyb, db);
  CNN_LAUNCH_CHECK(what);
}

void nchw_to_nhwc_fp32_cuda(const float* d_x, int n, int c, int64_t hw, int c_pad, float* d_out,
                            cudaStream_t stream) {
  launch_copy<float, false>(d_x, n, c, hw, c_pad, d_out, nullptr, stream, "nchw_to_nhwc_fp32");
}

void nchw_to_nhwc_tf32_split_cuda(const float* d_x, int n, int c, int64_t hw, int c_pad,
                                  float* d_big, float* d_small, cudaStream_t stream) {
  CNN_CHECK(d_small, "nchw_to_nhwc_tf32_split: null residual copy");
  launch_copy(d_x, n, c, hw, c_pad, d_big, d_small, stream, "nchw_to_nhwc_tf32_split");
}

void pack_weights_tf32_cuda(const WeightPack& wp, const float* d_w, float* d_out,
                            cudaStream_t stream) {
  launch_pack(wp, d_w, d_out, nullptr, stream, "pack_weights_tf32");
}

void pack_weights_bf16_cuda(const WeightPack& wp, const float* d_w, uint16_t* d_out,
                            cudaStream_t stream) {
  launch_pack(wp, d_w, reinterpret_cast<__nv_bfloat16*>(d_out), nullptr, stream,
              "pack_weights_bf16");
}

void pack_weights_tf32_split_cuda(const WeightPack& wp, const float* d_w, float* d_big,
                                  float* d_small, cudaStream_t stream) {
  CNN_CHECK(d_small, "pack_weights_tf32_split: null residual pack");
  launch_pack(wp, d_w, d_big, d_small, stream, "pack_weights_tf32_split");
}

void conv_nhwc_prepass_cuda(Precision precision, const NhwcWeightJob& weights,
                            const NhwcCopyJob& copy, cudaStream_t stream) {
  const char* what = "conv_nhwc_prepass";
  const bool fp32 = precision == Precision::FP32;
  CNN_CHECK(!weights.d_w || fp32 == (weights.d_small != nullptr),
            "{}: a residual weight pack is written at precision fp32 only, and there always "
            "(precision {}, residual {})",
            what, precision_name(precision), weights.d_small ? "given" : "null");
  CNN_CHECK(!copy.d_x || fp32 || !copy.d_small,
            "{}: a residual copy is written at precision fp32 only (precision {})", what,
            precision_name(precision));
  if (precision == Precision::BF16)
    launch_fused<__nv_bfloat16, true>(weights, copy, stream, what);
  else if (precision == Precision::TF32 || (fp32 && copy.d_small))
    launch_fused<float, true>(weights, copy, stream, what);
  else if (fp32)
    launch_fused<float, false>(weights, copy, stream, what);
  else
    CNN_FAIL("{}: precision {} (expected tf32, bf16 or fp32)", what, precision_name(precision));
}

}  // namespace cnn
