// Fused single-input-channel conv -> ReLU -> 2x2 / stride-2 max-pool (see conv_relu_pool.h).
//   crp_forward<K>:         conv + bias + ReLU + pool of one 2x2 window (one pooled output) for 8
//                           output channels per thread; writes the pooled y and the argmax only
//   crp_wgrad<K, kSlots>:   weight and bias gradients straight from the pooled dy, argmax and y:
//                           one warp per (output channel, image), lanes over pooled positions,
//                           the K x K window read from shared memory at the argmax's offset;
//                           warp reduce-scatter, per-block sum over images, then atomicAdd or
//                           (deterministic) per-block partials summed in block order by
//                           conv1ch_wgrad_reduce (kernels/conv1ch_common.cuh)
// Both passes tile the POOLED output and keep the matching input tile, about (2*tile + K - 1)
// squared, in shared memory (a 14x14 pooled plane of conv1 is one tile in both).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv1ch_common.cuh"
#include "kernels/conv/conv_relu_pool_cuda.h"
#include "runtime/cuda_check.h"
#include "runtime/env_switches.h"
#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

using conv1ch::relu_keep_nan;

constexpr int kFwdOc = 8;               // forward: output channels per thread (and per block)
constexpr int kFwdOcStep = 4;           // forward: channels whose sums a thread holds at once
constexpr int kMaxTile = 256;           // forward: pooled outputs per tile (one per thread)
static_assert(kFwdOc % kFwdOcStep == 0, "whole steps of channels");
constexpr int kMaxTileW = 32;           // pooled columns per tile (both passes)
constexpr int kWgradGroup = 8;          // weight gradient: output channels per block, one warp each
constexpr int kWgradTileFloats = 1280;  // weight gradient: bound on one input tile (rows * is)

// Images a weight-gradient block sums side by side (one warp per channel and image): 4 x 8 warps
// = 1024 threads, one block per SM at <= 64 registers; 2 for 7x7 (50 accumulators).
constexpr int wgrad_slots(int k) {
  return k == 7 ? 2 : 4;
}

// Tile of the pooled output (tpw x tph) and its input tile in shared memory: rows x is floats
// (row stride `is` even, so every window row starts 8-byte aligned and moves as float2).
// lanes_x: weight gradient only, lanes per pooled row (the power of two >= tpw).
struct Tiling {
  int tpw, tph, tiles_x, tiles_y, rows, is, lanes_x;
  __host__ __device__ int tiles() const { return tiles_x * tiles_y; }
  __host__ __device__ int items() const { return tpw * tph; }
  __host__ __device__ int tile_floats() const { return rows * is; }
};

struct Params {
  const float* x;     // (N, 1, H, W)
  const float* w;     // (OC, 1, K, K)                  forward
  const float* b;     // (OC) or null                    forward
  float* y;           // (N, OC, PH, PW) pooled          forward
  int32_t* argmax;    // (N, OC, PH, PW)                 forward
  const float* ry;    // (N, OC, PH, PW) pooled y        weight gradient (ReLU mask)
  const float* dy;    // (N, OC, PH, PW) pooled gradient weight gradient
  const int32_t* am;  // (N, OC, PH, PW) argmax          weight gradient
  float* dw;          // (OC, 1, K, K), accumulated
  float* db;          // (OC) or null, accumulated
  float* scratch;     // deterministic partials (blocks, values per block) or null
  int n, h, w_, oc, ow, poh, pow_, pad_h, pad_w;  // ow: conv output width; poh x pow_: pooled
  Tiling t;
  int ocg;      // output-channel groups
  int nchunks;  // weight gradient: ceil(n / images per block)
};

// Fills the shared input tile of image n for the pooled tile starting at (py0, px0): rows x is
// floats, zero where the conv window hangs over the padding (or past the image).
__device__ __forceinline__ void load_tile(const Params& p, int n, int py0, int px0, float* s_x) {
  conv1ch::load_input_tile(p.x + static_cast<int64_t>(n) * p.h * p.w_, p.h, p.w_, 2 * py0 - p.pad_h,
                           2 * px0 - p.pad_w, p.t.rows, p.t.is, s_x);
}

// The weight gradient's tiles, all in one pass: for images n0 .. n0 + kSlots - 1 the tile as
// load_tile fills it (copy 0, at s_x + 2 * slot * tf) and the same tile shifted one column right
// (copy 1, at s_x + (2 * slot + 1) * tf); slots past the batch are zero. Each thread issues its
// 2 * kSlots loads of an element before storing any, so the fill waits on one memory latency
// instead of 2 * kSlots in a row (as separate load_tile calls did: ~0.7 us each on the H200).
template <int kSlots>
__device__ __forceinline__ void load_wgrad_tiles(const Params& p, int n0, int py0, int px0,
                                                 float* s_x) {
  const int tf = p.t.tile_floats();
  const int iy0 = 2 * py0 - p.pad_h, ix0 = 2 * px0 - p.pad_w;
  for (int i = threadIdx.x; i < tf; i += blockDim.x) {
    const int r = i / p.t.is, c = i - r * p.t.is;
    const int iy = iy0 + r, ix = ix0 + c;
    const bool row_in = iy >= 0 && iy < p.h;
    const bool in0 = row_in && ix >= 0 && ix < p.w_;
    const bool in1 = row_in && ix + 1 >= 0 && ix + 1 < p.w_;
    float v0[kSlots], v1[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const bool live = n0 + s < p.n;
      const int64_t off = (static_cast<int64_t>(n0 + s) * p.h + iy) * p.w_ + ix;
      v0[s] = (live && in0) ? __ldg(p.x + off) : 0.f;
      v1[s] = (live && in1) ? __ldg(p.x + off + 1) : 0.f;
    }
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      s_x[(2 * s) * tf + i] = v0[s];
      s_x[(2 * s + 1) * tf + i] = v1[s];
    }
  }
}

// Loads K + 1 consecutive floats (K odd) from an 8-byte aligned shared address.
template <int K>
__device__ __forceinline__ void load_row(const float* src, float (&r)[K + 1]) {
#pragma unroll
  for (int j = 0; j < K + 1; j += 2) {
    const float2 v = *reinterpret_cast<const float2*>(src + j);
    r[j] = v.x;
    r[j + 1] = v.y;
  }
}

// Forward, K x K taps, stride 1. Block: (pooled tile, group of 8 output channels, image),
// flattened in blockIdx.x. Thread mapping: thread tid owns pooled output (tid / tpw, tid % tpw)
// of the tile for the block's 8 channels, i.e. the 2x2 conv outputs of its window, 4 channels
// (16 accumulators) at a time; for each 4 it slides two (K+1)-wide input rows from shared
// memory down the window, so each weight row is read once per thread and each input row twice.
// Holding 4 channels' sums instead of 8 lets K <= 5 run at 64 registers without spilling (4
// blocks of up to 256 threads an SM; 80 registers before): LeNet's conv1 (512 blocks of 224
// threads) then fits on the SMs at once instead of in 1.29 waves of 3 blocks an SM (H200, ncu).
// K = 7 would spill at 64 and keeps the compiler's choice. Sums run in the order of conv2d_1ch's
// fast kernel (bias, then ky, kx ascending, fmaf), so y is bitwise that chain's.
template <int K>
__global__ void __launch_bounds__(kMaxTile, K <= 5 ? 4 : 1) crp_forward(const Params p) {
  ptx::griddep_enter();
  static_assert(K % 2 == 1, "odd kernels only");
  constexpr int KW4 = (K + 3) / 4 * 4;  // weight row padded to whole float4s
  extern __shared__ float4 smem_f4[];
  float* s_w = reinterpret_cast<float*>(smem_f4);  // (8, K, KW4)
  float* s_b = s_w + kFwdOc * K * KW4;             // (8)
  float* s_x = s_b + kFwdOc;                       // (rows, is), 16-byte aligned

  int bid = blockIdx.x;
  const int tx = bid % p.t.tiles_x;
  bid /= p.t.tiles_x;
  const int ty = bid % p.t.tiles_y;
  bid /= p.t.tiles_y;
  const int g = bid % p.ocg, n = bid / p.ocg;
  const int oc0 = g * kFwdOc, py0 = ty * p.t.tph, px0 = tx * p.t.tpw;

  for (int i = threadIdx.x; i < kFwdOc * K * KW4; i += blockDim.x) {
    const int q = i / (K * KW4), r = i - q * (K * KW4);
    const int ky = r / KW4, kx = r - ky * KW4;
    s_w[i] = (kx < K && oc0 + q < p.oc) ? __ldg(p.w + (oc0 + q) * K * K + ky * K + kx) : 0.f;
  }
  if (threadIdx.x < kFwdOc) {
    const int oc = oc0 + threadIdx.x;
    s_b[threadIdx.x] = (p.b && oc < p.oc) ? __ldg(p.b + oc) : 0.f;
  }
  load_tile(p, n, py0, px0, s_x);
  __syncthreads();

  const int ly = threadIdx.x / p.t.tpw, lx = threadIdx.x - ly * p.t.tpw;
  const int py = py0 + ly, px = px0 + lx;
  if (ly >= p.t.tph || py >= p.poh || px >= p.pow_) return;

  const float* win = s_x + 2 * ly * p.t.is + 2 * lx;
  const int corner = 2 * py * p.ow + 2 * px;  // argmax of window element 0
#pragma unroll 1
  for (int q0 = 0; q0 < kFwdOc && oc0 + q0 < p.oc; q0 += kFwdOcStep) {
    float acc[kFwdOcStep]
             [4];  // conv outputs (2py, 2px), (2py, 2px+1), (2py+1, 2px), (2py+1, 2px+1)
#pragma unroll
    for (int q = 0; q < kFwdOcStep; ++q)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[q][j] = s_b[q0 + q];

    float ra[K + 1], rb[K + 1];  // input rows ky and ky + 1 of the window
    load_row<K>(win, rb);
#pragma unroll
    for (int ky = 0; ky < K; ++ky) {
#pragma unroll
      for (int j = 0; j < K + 1; ++j) ra[j] = rb[j];
      load_row<K>(win + (ky + 1) * p.t.is, rb);
#pragma unroll
      for (int q = 0; q < kFwdOcStep; ++q) {
        float wr[KW4];  // same address in every lane: broadcast
#pragma unroll
        for (int j = 0; j < KW4; j += 4)
          *reinterpret_cast<float4*>(&wr[j]) =
              *reinterpret_cast<const float4*>(s_w + ((q0 + q) * K + ky) * KW4 + j);
#pragma unroll
        for (int kx = 0; kx < K; ++kx) {
          acc[q][0] = fmaf(wr[kx], ra[kx], acc[q][0]);
          acc[q][1] = fmaf(wr[kx], ra[kx + 1], acc[q][1]);
          acc[q][2] = fmaf(wr[kx], rb[kx], acc[q][2]);
          acc[q][3] = fmaf(wr[kx], rb[kx + 1], acc[q][3]);
        }
      }
    }

#pragma unroll
    for (int q = 0; q < kFwdOcStep; ++q) {
      const int oc = oc0 + q0 + q;
      if (oc >= p.oc) break;
      // maxpool2x2_forward_exact's rule on the ReLU'd values: row-major order, strictly greater
      // replaces (the first of equal maxima stays, so among values <= 0 the first wins), NaN
      // wins.
      float best = relu_keep_nan(acc[q][0]);
      int bi = 0;
#pragma unroll
      for (int t = 1; t < 4; ++t) {
        const float v = relu_keep_nan(acc[q][t]);
        if (!isnan(best) && (v > best || isnan(v))) {
          best = v;
          bi = t;
        }
      }
      const int64_t o = ((static_cast<int64_t>(n) * p.oc + oc) * p.poh + py) * p.pow_ + px;
      p.y[o] = best;
      p.argmax[o] = corner + (bi >> 1) * p.ow + (bi & 1);
    }
  }
}

// Weight gradient from the pooled gradient. Block: (pooled tile, chunk of kSlots images, group of
// 8 output channels), flattened as blockIdx.x = (group * nchunks + chunk) * tiles + tile; its
// shared memory holds every image's input tile twice: copy 0, and copy 1 whose column c holds
// copy 0's column c + 1.
// Thread mapping: warp w serves channel oc0 + w % 8 of image n0 + w / 8. Lane l owns pooled
// column lx = l % lanes_x and, in step s, row ly = s * (32 / lanes_x) + l / lanes_x of the tile:
// it reads that output's dy, y (the ReLU mask: dy counts only where y > 0) and argmax, one
// coalesced load each (issued a step ahead, so they are in flight during the previous item's
// math), and adds g x (the K x K input window of the winning conv output) into K*K + 1 register
// accumulators (taps, then the bias). The winner's row inside the 2x2 window moves the window
// down one row, its column picks copy 1: no per-tap selects, taps in pairs as aligned float2.
// Bank conflicts: with lanes_x >= 16 the row stride `is` and the copy size are multiples of 32
// floats, so the 8-byte bank of a lane's float2 depends only on lx, not on the argmax: the 16
// lanes of a half warp (distinct lx) hit 16 distinct banks, 2 wavefronts per float2 load (the
// floor for 256 bytes). The odd last tap of each row is a scalar load on which the two half
// warps' rows collide: 2 wavefronts too, so (K+1)/2 loads and K+1 wavefronts per window row.
// Then a warp reduce-scatter, a per-block sum over the kSlots images in slot order, and
// atomicAdd or scratch (block, value) when deterministic.
template <int K, int kSlots>
__global__ void __launch_bounds__(kWgradGroup * 32 * kSlots, 1) crp_wgrad(const Params p) {
  ptx::griddep_enter();
  constexpr int KK = K * K;
  constexpr int VP = KK + 1 <= 32 ? 32 : 64;  // a channel's taps + bias, padded for the reduce
  constexpr int kBlockValues = kWgradGroup * (KK + 1);  // layout of conv1ch_common.cuh
  static_assert(KK + 1 <= VP, "gradient count exceeds the reduce-scatter width");
  extern __shared__ float4 smem_f4[];
  float* s_part = reinterpret_cast<float*>(smem_f4);  // (kSlots, kBlockValues)
  float* s_x = s_part + kSlots * kBlockValues;        // (kSlots, 2 copies, rows, is)

  const Tiling& t = p.t;
  const int tiles = t.tiles();
  const int tile = blockIdx.x % tiles, rest = blockIdx.x / tiles;
  const int chunk = rest % p.nchunks, g = rest / p.nchunks;
  const int tx = tile % t.tiles_x, ty = tile / t.tiles_x;
  const int oc0 = g * kWgradGroup, py0 = ty * t.tph, px0 = tx * t.tpw;
  const int n0 = chunk * kSlots, nbl = min(kSlots, p.n - n0);
  const int tf = t.rows * t.is;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int q = warp % kWgradGroup, slot = warp / kWgradGroup;
  const int oc = oc0 + q;
  const int lx = lane % t.lanes_x, ly_lane = lane / t.lanes_x, ly_step = 32 / t.lanes_x;
  const int px = px0 + lx;
  // Warp-uniform except for the column test; a dead lane still walks the (uniform) steps.
  const bool col_live = oc < p.oc && slot < nbl && lx < t.tpw && px < p.pow_;
  const int64_t plane = col_live ? (static_cast<int64_t>(n0 + slot) * p.oc + oc) * p.poh : 0;

  // One item's three loads; live == false leaves it out (past the tile, the plane, the batch or
  // the channels).
  struct Item {
    int ly;
    bool live;
    int32_t am;
    float y, dy;
  };
  auto fetch = [&](int ly) {
    Item it{ly, col_live && ly < t.tph && py0 + ly < p.poh, 0, 0.f, 0.f};
    if (it.live) {
      const int64_t o = (plane + py0 + ly) * p.pow_ + px;
      it.am = __ldg(p.am + o);
      it.y = __ldg(p.ry + o);
      it.dy = __ldg(p.dy + o);
    }
    return it;
  };
  Item next = fetch(ly_lane);  // in flight while the tiles load

  load_wgrad_tiles<kSlots>(p, n0, py0, px0, s_x);
  __syncthreads();

  float acc[VP];
#pragma unroll
  for (int i = 0; i < VP; ++i) acc[i] = 0.f;

  for (int ly0 = 0; ly0 < t.tph; ly0 += ly_step) {
    const Item cur = next;
    next = fetch(ly0 + ly_step + ly_lane);
    if (!cur.live) continue;
    const int py = py0 + cur.ly;
    const int a = cur.am - (2 * py * p.ow + 2 * px);  // 0, 1, OW or OW + 1
    const int down = a >= p.ow ? 1 : 0;
    const int right = (a - down * p.ow) != 0 ? 1 : 0;
    // Zero where the pool's output is not positive (maxpool_backward's ReLU mask). The window is
    // still multiplied (never skipped), so 0 x inf gives NaN as in the CPU reference, which
    // multiplies every conv output's gradient, zeros included.
    const float gv = (cur.y > 0.f) ? cur.dy : 0.f;
    const float* win = s_x + (2 * slot + right) * tf + (2 * cur.ly + down) * t.is + 2 * lx;
#pragma unroll
    for (int ky = 0; ky < K; ++ky) {
#pragma unroll
      for (int kx = 0; kx + 1 < K; kx += 2) {
        const float2 v = *reinterpret_cast<const float2*>(win + ky * t.is + kx);
        acc[ky * K + kx] = fmaf(gv, v.x, acc[ky * K + kx]);
        acc[ky * K + kx + 1] = fmaf(gv, v.y, acc[ky * K + kx + 1]);
      }
      acc[ky * K + K - 1] = fmaf(gv, win[ky * t.is + K - 1], acc[ky * K + K - 1]);
    }
    acc[KK] += gv;
  }

  conv1ch::reduce_scatter_step<VP / 2, 16, VP>(acc, lane);
  float* part = s_part + slot * kBlockValues;
#pragma unroll
  for (int i = 0; i < VP / 32; ++i) {
    const int r = lane * (VP / 32) + i;
    if (r < KK)
      part[q * KK + r] = acc[i];
    else if (r == KK)
      part[kWgradGroup * KK + q] = acc[i];
  }
  __syncthreads();
  conv1ch::wgrad_block_epilogue<kSlots>(s_part, kBlockValues, kWgradGroup, KK, oc0, p.oc, p.dw,
                                        p.db, p.scratch, blockIdx.x);
}

// Both passes go to the tensor-core kernels (conv_relu_pool_mma.cu) at precision tf32 / bf16
// under CNN_CRP_TENSOR_CORES=1, on compute capability 8.0 and later.
bool on_tensor_cores(const Exec& ex) {
  return (ex.precision == Precision::TF32 || ex.precision == Precision::BF16) &&
         process_env_switches().crp_tensor_cores && conv_relu_pool_mma_supported();
}

Tiling tiling_of(const Conv2dShape& s) {
  Tiling t{};
  const int poh = s.oh() / 2, pow_ = s.ow() / 2;
  t.tpw = std::min(pow_, kMaxTileW);
  t.tph = std::max(1, std::min(poh, kMaxTile / t.tpw));
  t.tiles_x = ceil_div(pow_, t.tpw);
  t.tiles_y = ceil_div(poh, t.tph);
  t.rows = 2 * t.tph + s.kh - 1;
  t.is = (2 * t.tpw + s.kw - 1 + 1) / 2 * 2;
  return t;
}

Params params_of(const Conv2dShape& s) {
  Params p{};
  p.n = s.n;
  p.h = s.h;
  p.w_ = s.w;
  p.oc = s.oc;
  p.ow = s.ow();
  p.poh = s.oh() / 2;
  p.pow_ = s.ow() / 2;
  p.pad_h = s.pad_h;
  p.pad_w = s.pad_w;
  p.t = tiling_of(s);
  return p;
}

// The weight gradient's tiling: tpw pooled columns per tile on lanes_x lanes; the row stride a
// multiple of 32 floats when lanes_x >= 16 (the conflict-free case of crp_wgrad), else just
// even; as many rows as keep one input tile within kWgradTileFloats (two copies of kSlots
// tiles stay under 48 KB). A function of the shape only (it sizes the scratch).
Tiling wgrad_tiling_of(const Conv2dShape& s) {
  Tiling t{};
  const int poh = s.oh() / 2, pow_ = s.ow() / 2, k = s.kh;
  t.tpw = std::min(pow_, kMaxTileW);
  t.lanes_x = 1;
  while (t.lanes_x < t.tpw) t.lanes_x *= 2;
  const int cols = 2 * t.tpw + k - 2;  // a window reads columns 0 .. 2 * (tpw - 1) + K - 1
  const int align = t.lanes_x >= 16 ? 32 : 2;
  t.is = ceil_div(cols, align) * align;
  t.tph = std::max(1, std::min(poh, (kWgradTileFloats / t.is - (k - 1)) / 2));
  t.tiles_x = ceil_div(pow_, t.tpw);
  t.tiles_y = ceil_div(poh, t.tph);
  t.rows = 2 * t.tph + k - 1;
  return t;
}

int grid_for(int64_t work, int block) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(ceil_div<int64_t>(work, block), int64_t{1} << 20)));
}

template <int K>
void launch_forward(const Params& p, unsigned blocks, int threads, cudaStream_t stream) {
  constexpr int KW4 = (K + 3) / 4 * 4;
  const std::size_t smem = sizeof(float) * (kFwdOc * K * KW4 + kFwdOc + p.t.tile_floats());
  crp_forward<K><<<blocks, threads, smem, stream>>>(p);
  CNN_LAUNCH_CHECK("crp_forward");
}

template <int K>
void launch_wgrad(const Params& p, unsigned blocks, cudaStream_t stream) {
  constexpr int kSlots = wgrad_slots(K);
  const std::size_t smem =
      sizeof(float) * (std::size_t{kSlots} * kWgradGroup * (K * K + 1) +
                       std::size_t{kSlots} * 2 * static_cast<std::size_t>(p.t.tile_floats()));
  CNN_CHECK(smem <= 48 * 1024, "conv_relu_pool_backward_weight: {} bytes of shared memory", smem);
  crp_wgrad<K, kSlots><<<blocks, kWgradGroup * 32 * kSlots, smem, stream>>>(p);
  CNN_LAUNCH_CHECK("crp_wgrad");
}

}  // namespace

void conv_relu_pool_forward_cuda(const Conv2dShape& s, const float* d_x, const float* d_w,
                                 const float* d_b, float* d_y, int32_t* d_argmax, const Exec& ex) {
  if (on_tensor_cores(ex))
    return conv_relu_pool_forward_mma_cuda(s, d_x, d_w, d_b, d_y, d_argmax, ex);
  Params p = params_of(s);
  p.x = d_x;
  p.w = d_w;
  p.b = d_b;
  p.y = d_y;
  p.argmax = d_argmax;
  p.ocg = ceil_div(s.oc, kFwdOc);
  const int64_t blocks = int64_t{p.t.tiles()} * p.ocg * s.n;
  CNN_CHECK(blocks < (int64_t{1} << 31), "conv_relu_pool_forward: {} blocks", blocks);
  const int threads = ceil_div(p.t.items(), 32) * 32;  // one pooled output each, whole warps
  const unsigned nb = static_cast<unsigned>(blocks);
  switch (s.kh) {
    case 1:
      return launch_forward<1>(p, nb, threads, ex.stream);
    case 3:
      return launch_forward<3>(p, nb, threads, ex.stream);
    case 5:
      return launch_forward<5>(p, nb, threads, ex.stream);
    case 7:
      return launch_forward<7>(p, nb, threads, ex.stream);
    default:
      CNN_FAIL("conv_relu_pool_forward: kernel {} has no fused kernel", s.kh);
  }
}

std::size_t conv_relu_pool_backward_weight_scratch_floats_cuda(const Conv2dShape& s,
                                                               const Exec& ex) {
  if (on_tensor_cores(ex)) return conv_relu_pool_backward_weight_mma_scratch_floats(s, ex);
  if (!ex.deterministic) return 0;
  const Tiling t = wgrad_tiling_of(s);
  const int64_t blocks =
      int64_t{t.tiles()} * ceil_div(s.n, wgrad_slots(s.kh)) * ceil_div(s.oc, kWgradGroup);
  return static_cast<std::size_t>(blocks * kWgradGroup * (s.kh * s.kw + 1));
}

void conv_relu_pool_backward_weight_cuda(const Conv2dShape& s, const float* d_x, const float* d_y,
                                         const float* d_dy, const int32_t* d_argmax, float* d_dw,
                                         float* d_db, float* d_scratch, const Exec& ex) {
  if (on_tensor_cores(ex))
    return conv_relu_pool_backward_weight_mma_cuda(s, d_x, d_y, d_dy, d_argmax, d_dw, d_db,
                                                   d_scratch, ex);
  Params p = params_of(s);
  p.t = wgrad_tiling_of(s);
  p.x = d_x;
  p.ry = d_y;
  p.dy = d_dy;
  p.am = d_argmax;
  p.dw = d_dw;
  p.db = d_db;
  p.scratch = ex.deterministic ? d_scratch : nullptr;
  CNN_CHECK(!ex.deterministic || d_scratch,
            "conv_relu_pool_backward_weight: deterministic mode needs scratch");
  p.ocg = ceil_div(s.oc, kWgradGroup);
  p.nchunks = ceil_div(s.n, wgrad_slots(s.kh));
  const int64_t blocks = int64_t{p.t.tiles()} * p.nchunks * p.ocg;
  CNN_CHECK(blocks < (int64_t{1} << 31), "conv_relu_pool_backward_weight: {} blocks", blocks);
  const unsigned nb = static_cast<unsigned>(blocks);
  switch (s.kh) {
    case 1:
      launch_wgrad<1>(p, nb, ex.stream);
      break;
    case 3:
      launch_wgrad<3>(p, nb, ex.stream);
      break;
    case 5:
      launch_wgrad<5>(p, nb, ex.stream);
      break;
    case 7:
      launch_wgrad<7>(p, nb, ex.stream);
      break;
    default:
      CNN_FAIL("conv_relu_pool_backward_weight: kernel {} has no fused kernel", s.kh);
  }
  if (ex.deterministic) {
    const int kk = s.kh * s.kw, total = s.oc * (kk + 1);
    conv1ch::conv1ch_wgrad_reduce<kWgradGroup><<<grid_for(total, 256), 256, 0, ex.stream>>>(
        p.scratch, p.dw, p.db, p.oc, kk, p.nchunks * p.t.tiles());
    CNN_LAUNCH_CHECK("conv1ch_wgrad_reduce");
  }
}

}  // namespace cnn
