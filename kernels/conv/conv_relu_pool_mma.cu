// The fused single-input-channel conv -> ReLU -> 2x2 max-pool on the tensor cores
// (conv_relu_pool.h), for precision tf32 and bf16 under CNN_CRP_TENSOR_CORES=1; the weight
// gradient's kernel is described at crp_wgrad_mma. Forward: the convolution as an implicit GEMM of
// m16n8k8 TF32 / m16n8k16 BF16 mma.sync, rows = conv output pixels, columns = output channels,
// k = the K x K filter taps (zero padded to whole k steps), FP32 accumulation; the ReLU and the
// pool on the accumulators.
//
// Block: (tile of the pooled output, image), flattened in blockIdx.x; the tile is tph pooled
// rows x 4 cx pooled columns, its input window (2 tph + K - 1 rows x 8 cx + K - 1 columns) in
// shared memory, zero where it hangs over the padding or past the image (TF32: already rounded,
// cvt.rna, so the fragments are plain loads).
// Warp task: one m16 block = conv rows (2 ly, 2 ly + 1) x conv columns 8 c .. 8 c + 7 of the tile
// (fragment row g: row 2 ly, column 8 c + g; row g + 8: row 2 ly + 1, same column), for 32
// output channels (4 n8 blocks) at a time. A thread's accumulators c0 / c2 (rows g, g + 8) are
// then the two vertical neighbours of one pixel column for channels 8 j + 2 t (+1 in c1 / c3),
// and lane g ^ 1 (lane ^ 4) holds the next column: the 2x2 window is a thread's two values and
// its partner's. Even-g lanes pool, in crp_forward's order and rule (row-major, strictly greater
// replaces, NaN wins, ReLU keeping NaN), into a staged tile of 32 channels that the block then
// writes out coalesced (y and argmax).
// Fragments: A (pixel, tap) from the shared window at the pixel's address plus the tap's offset
// (dy * stride + dx; each thread's taps are fixed, so their offsets live in registers, and a tap
// past K*K reads 0, never the window, so inf and NaN inputs stay out of the padding products);
// B (tap, channel) from w into registers once a channel group (0 past OC or K*K); C starts at the
// bias.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv1ch_common.cuh"
#include "kernels/conv/conv_relu_pool_cuda.h"
#include "runtime/cuda_check.h"
#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

using conv1ch::relu_keep_nan;

constexpr int kThreads = 128;  // 4 warps
constexpr int kGroupOc = 32;   // output channels a pass: 4 n8 blocks
constexpr int kMaxChunks = 8;  // 8-column chunks a tile: up to 32 pooled columns
constexpr int kMaxTph = 16;    // pooled rows a tile
constexpr std::size_t kSmemLimit = 48 * 1024;

// The sizes both kernels read: ow is the conv output's width, poh x pow_ the pooled plane.
struct CrpShape {
  int n, h, w_, oc, ow, poh, pow_, pad_h, pad_w;
};
inline CrpShape crp_shape_of(const Conv2dShape& s) {
  return CrpShape{s.n, s.h, s.w, s.oc, s.ow(), s.oh() / 2, s.ow() / 2, s.pad_h, s.pad_w};
}

// Fills s_x (rows x is floats, row stride is) with the input window of image n whose conv
// outputs start at pooled (py0, px0): zero where it hangs over the padding or past the image,
// rounded to TF32 (cvt.rna) when kTf32, so that the fragments are plain loads. The whole block
// takes part; the caller synchronizes. Unrolled: a thread's next loads go out before its
// earlier ones land.
template <bool kTf32>
__device__ __forceinline__ void load_window(const CrpShape& p, const float* x, int n, int py0,
                                            int px0, int rows, int is, float* s_x) {
  const float* img = x + static_cast<int64_t>(n) * p.h * p.w_;
  const int iy0 = 2 * py0 - p.pad_h, ix0 = 2 * px0 - p.pad_w;
#pragma unroll 4
  for (int i = threadIdx.x; i < rows * is; i += blockDim.x) {
    const int r = i / is, c = i - r * is;
    const int iy = iy0 + r, ix = ix0 + c;
    float v = (iy >= 0 && iy < p.h && ix >= 0 && ix < p.w_) ? __ldg(img + iy * p.w_ + ix) : 0.f;
    if constexpr (kTf32) v = __uint_as_float(ptx::to_tf32(v));
    s_x[i] = v;
  }
}

template <int K, bool kBf16>
struct Taps {
  static constexpr int KK = K * K;
  static constexpr int kStep = kBf16 ? 16 : 8;         // k of one MMA
  static constexpr int KS = (KK + kStep - 1) / kStep;  // k steps
  static constexpr int kPerRow = kBf16 ? 4 : 2;        // a thread's taps a k step (per row)
  // The k slot of a thread's e-th tap in its k step (t = lane % 4): TF32 a0/a2 hold k t and
  // t + 4; BF16 a0 holds k 2t, 2t + 1 and a2 2t + 8, 2t + 9.
  __device__ __forceinline__ static int slot(int e, int t) {
    if constexpr (kBf16) return 2 * t + (e & 1) + 8 * (e >> 1);
    return t + 4 * e;
  }
};

struct MmaParams : CrpShape {
  const float* x;   // (N, 1, H, W)
  const float* w;   // (OC, 1, K, K)
  const float* b;   // (OC) or null
  float* y;         // (N, OC, PH, PW)
  int32_t* argmax;  // (N, OC, PH, PW)
  int tph, cx;      // pooled rows, 8-column chunks (4 pooled columns each) of a tile
  int tiles_x, tiles_y;
  int rows, is;  // the input window in shared memory: rows x is floats
};

template <int K, bool kBf16>
__global__ void __launch_bounds__(kThreads) crp_forward_mma(const MmaParams p) {
  ptx::griddep_enter();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using T = Taps<K, kBf16>;
  extern __shared__ float4 smem_f4[];
  const int tile_pw = 4 * p.cx, plane = p.tph * tile_pw;
  float* s_x = reinterpret_cast<float*>(smem_f4);  // (rows, is)
  float* s_y = s_x + p.rows * p.is;                // (32, tph, tile_pw)
  int32_t* s_am = reinterpret_cast<int32_t*>(s_y + kGroupOc * plane);

  int bid = blockIdx.x;
  const int tx = bid % p.tiles_x;
  bid /= p.tiles_x;
  const int ty = bid % p.tiles_y;
  const int n = bid / p.tiles_y;
  const int py0 = ty * p.tph, px0 = tx * tile_pw;

  load_window<!kBf16>(p, p.x, n, py0, px0, p.rows, p.is, s_x);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  int off[T::KS][T::kPerRow];  // the window offset of each of this thread's taps
  bool live[T::KS][T::kPerRow];
#pragma unroll
  for (int ks = 0; ks < T::KS; ++ks)
#pragma unroll
    for (int e = 0; e < T::kPerRow; ++e) {
      const int tap = ks * T::kStep + T::slot(e, t);
      live[ks][e] = tap < T::KK;
      off[ks][e] = live[ks][e] ? (tap / K) * p.is + tap % K : 0;
    }
  __syncthreads();

  for (int oc0 = 0; oc0 < p.oc; oc0 += kGroupOc) {
    uint32_t bfr[T::KS][4][2];
    float bias[4][2];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int oc = oc0 + 8 * j + g;
      auto wv = [&](int tap) {
        return (oc < p.oc && tap < T::KK) ? __ldg(p.w + static_cast<int64_t>(oc) * T::KK + tap)
                                          : 0.f;
      };
#pragma unroll
      for (int ks = 0; ks < T::KS; ++ks) {
        const int k0 = ks * T::kStep;
        if constexpr (kBf16) {
          bfr[ks][j][0] = ptx::pack_bf16x2(wv(k0 + 2 * t), wv(k0 + 2 * t + 1));
          bfr[ks][j][1] = ptx::pack_bf16x2(wv(k0 + 2 * t + 8), wv(k0 + 2 * t + 9));
        } else {
          bfr[ks][j][0] = ptx::to_tf32(wv(k0 + t));
          bfr[ks][j][1] = ptx::to_tf32(wv(k0 + t + 4));
        }
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = oc0 + 8 * j + 2 * t + e;
        bias[j][e] = (p.b && c < p.oc) ? __ldg(p.b + c) : 0.f;
      }
    }

    const int tasks = p.tph * p.cx;
    for (int task = warp; task < tasks; task += kThreads / 32) {
      const int ly = task / p.cx, cc = task - ly * p.cx;
      const float* px_row0 = s_x + 2 * ly * p.is + 8 * cc + g;  // fragment row g; g + 8: + is
      float acc[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        acc[j][0] = acc[j][2] = bias[j][0];
        acc[j][1] = acc[j][3] = bias[j][1];
      }
#pragma unroll
      for (int ks = 0; ks < T::KS; ++ks) {
        float v[2][T::kPerRow];  // [fragment row g / g + 8][tap]
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < T::kPerRow; ++e)
            v[h][e] = live[ks][e] ? px_row0[h * p.is + off[ks][e]] : 0.f;
        uint32_t a[4];
        if constexpr (kBf16) {
          a[0] = ptx::pack_bf16x2(v[0][0], v[0][1]);
          a[1] = ptx::pack_bf16x2(v[1][0], v[1][1]);
          a[2] = ptx::pack_bf16x2(v[0][2], v[0][3]);
          a[3] = ptx::pack_bf16x2(v[1][2], v[1][3]);
        } else {
          a[0] = __float_as_uint(v[0][0]);
          a[1] = __float_as_uint(v[1][0]);
          a[2] = __float_as_uint(v[0][1]);
          a[3] = __float_as_uint(v[1][1]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if constexpr (kBf16)
            ptx::mma_bf16(acc[j], a, bfr[ks][j]);
          else
            ptx::mma_tf32(acc[j], a, bfr[ks][j]);
        }
      }
      // Pool: this lane holds column 8 cc + g of conv rows 2 ly (c0, c1) and 2 ly + 1 (c2, c3);
      // lane ^ 4 the next column. Even g pools (columns 8 cc + g, + 1: pooled column 4 cc + g/2).
      const int lx = 4 * cc + (g >> 1);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float top = relu_keep_nan(acc[j][e]), bottom = relu_keep_nan(acc[j][2 + e]);
          const float top_r = __shfl_xor_sync(0xffffffffu, top, 4);
          const float bottom_r = __shfl_xor_sync(0xffffffffu, bottom, 4);
          if (g & 1) continue;
          const float win[4] = {top, top_r, bottom, bottom_r};
          float best = win[0];
          int bi = 0;
#pragma unroll
          for (int q = 1; q < 4; ++q)
            if (!isnan(best) && (win[q] > best || isnan(win[q]))) {
              best = win[q];
              bi = q;
            }
          const int ch = 8 * j + 2 * t + e;
          const int py = py0 + ly, px = px0 + lx;
          s_y[ch * plane + ly * tile_pw + lx] = best;
          s_am[ch * plane + ly * tile_pw + lx] = (2 * py + (bi >> 1)) * p.ow + 2 * px + (bi & 1);
        }
    }
    __syncthreads();
    const int nch = min(kGroupOc, p.oc - oc0);
    for (int i = threadIdx.x; i < nch * plane; i += kThreads) {
      const int ch = i / plane, r = (i - ch * plane) / tile_pw, c = i % tile_pw;
      const int py = py0 + r, px = px0 + c;
      if (py >= p.poh || px >= p.pow_) continue;
      const int64_t o = ((static_cast<int64_t>(n) * p.oc + oc0 + ch) * p.poh + py) * p.pow_ + px;
      p.y[o] = s_y[i];
      p.argmax[o] = s_am[i];
    }
    __syncthreads();  // the stage is rewritten by the next channel group
  }
#else
  (void)p;
  __trap();  // the launcher runs it on compute capability 8.0 and later only
#endif
}

// ---- Weight gradient ----
// dw (oc, tap) += sum over conv pixels of dconv (oc, pixel) * x (pixel + tap), db (oc) += sum of
// dconv, where dconv is the pool's backward (dy at the argmax pixel of each window where the
// pooled y > 0, else 0), as one GEMM a block: rows = 32 output channels (2 m16 blocks), columns
// = the taps and one more, a column of ones that sums dconv into db (tap K*K, a dead slot of the
// last n8 block: K*K is odd), k = the conv pixels of the block's tile.
// Block: (channel group, run of tiles_per_block consecutive tiles of tph pooled rows x 16 pooled
// columns, images outermost), the group outermost in blockIdx.x, so that conv1ch_wgrad_reduce
// finds the deterministic partials where it expects them; its accumulators add up its tiles. Shared
// memory: the tile's input window (2 tph + K - 1 rows x kWCols + K - 1 columns), and dconv written
// out as a dense [32][2 tph][kWCols] tile (one thread a pooled output: its gradient at the argmax's
// pixel, zeros at the other three; zeros past the plane), both rounded for the precision. Warps
// take the k steps (8 TF32 / 16 BF16 pixels along a conv row) in turn, each with its own
// accumulators; then the warps' sums are added in warp order into one shared buffer and handed on
// as conv1ch_common.cuh's block epilogue does (atomicAdd, or per-block partials summed in block
// order by conv1ch_wgrad_reduce when deterministic).
constexpr int kWThreads = 256;  // 8 warps
constexpr int kWCols = 32;      // conv columns a tile (16 pooled), a whole number of k steps
constexpr int kWMaxTph = 4;     // pooled rows a tile: dconv 32 x 8 x 32 floats = 32 KB
// A channel's dconv plane is padded to 8 (mod 32) floats, so that the A fragments' channels
// g = 0..7 fall in distinct banks: TF32 loads at 8 g + t, BF16 float2 loads at 8 g + 2 t (+1),
// where an unpadded plane (a multiple of 32 floats) put all eight channels in one bank.
constexpr int kDPad = 8;

struct WgradParams : CrpShape {
  const float* x;             // (N, 1, H, W)
  const float* y;             // (N, OC, PH, PW) pooled y (the ReLU mask)
  const float* dy;            // (N, OC, PH, PW) pooled gradient
  const int32_t* am;          // (N, OC, PH, PW) argmax
  float* dw;                  // (OC, K, K), accumulated
  float* db;                  // (OC) or null, accumulated
  float* scratch;             // deterministic partials (blocks, 32 * (K*K + 1)) or null
  int tph, tiles_x, tiles_y;  // tile: tph pooled rows x kWCols / 2 pooled columns
  int tiles_per_block;        // consecutive tiles (of the same channel group) a block sums
  int rows, is;               // the input window: rows x is floats
};

template <int K, bool kBf16>
__global__ void __launch_bounds__(kWThreads) crp_wgrad_mma(const WgradParams p) {
  ptx::griddep_enter();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int KK = K * K, NB = (KK + 1 + 7) / 8;  // n8 blocks: the taps and the ones column
  constexpr int kStep = kBf16 ? 16 : 8;             // pixels a k step
  constexpr int kTpw = kWCols / 2;
  extern __shared__ float4 smem_f4[];
  const int crows = 2 * p.tph;                     // conv rows of the tile
  const int dplane = crows * kWCols + kDPad;       // one channel's dconv, padded
  float* s_d = reinterpret_cast<float*>(smem_f4);  // (32, crows, kWCols)
  float* s_x = s_d + kGroupOc * dplane;            // (rows, is)
  float* s_sum = s_x + p.rows * p.is;              // (32 * (KK + 1)): epilogue layout

  const int tiles = p.tiles_x * p.tiles_y * p.n;  // of one channel group
  const int per_group = ceil_div(tiles, p.tiles_per_block);
  const int grp = blockIdx.x / per_group;
  const int tile_begin = (blockIdx.x - grp * per_group) * p.tiles_per_block;
  const int tile_end = min(tiles, tile_begin + p.tiles_per_block);
  const int oc0 = grp * kGroupOc;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  // Column g of n8 block j is tap 8 j + g: its window offset, or the ones column, or dead (0).
  int off[NB];
  float fixed[NB];  // the B value where the column is not a live tap: 1 (ones) or 0
  bool tap[NB];
#pragma unroll
  for (int j = 0; j < NB; ++j) {
    const int c = 8 * j + g;
    tap[j] = c < KK;
    off[j] = tap[j] ? (c / K) * p.is + c % K : 0;
    fixed[j] = c == KK ? 1.f : 0.f;
  }
  float acc[2][NB][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < NB; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int tx = tile % p.tiles_x, ty = (tile / p.tiles_x) % p.tiles_y;
    const int n = tile / (p.tiles_x * p.tiles_y);
    const int py0 = ty * p.tph, px0 = tx * kTpw;
    // dconv, one pooled output a thread (unrolled: a thread's next loads go out before its
    // earlier ones land).
#pragma unroll 4
    for (int i = threadIdx.x; i < kGroupOc * p.tph * kTpw; i += kWThreads) {
      const int ch = i / (p.tph * kTpw), rem = i - ch * (p.tph * kTpw);
      const int ly = rem / kTpw, lx = rem - ly * kTpw;
      const int oc = oc0 + ch, py = py0 + ly, px = px0 + lx;
      float gv = 0.f;
      int code = 0;  // 2 * (row in the window) + column
      if (oc < p.oc && py < p.poh && px < p.pow_) {
        const int64_t o = ((static_cast<int64_t>(n) * p.oc + oc) * p.poh + py) * p.pow_ + px;
        const float yv = __ldg(p.y + o), dyv = __ldg(p.dy + o);
        const int a = __ldg(p.am + o) - (2 * py * p.ow + 2 * px);  // 0, 1, OW or OW + 1
        const int down = a >= p.ow ? 1 : 0;
        code = 2 * down + ((a - down * p.ow) != 0 ? 1 : 0);
        gv = (yv > 0.f) ? dyv : 0.f;  // maxpool_backward's ReLU mask
        if constexpr (!kBf16) gv = __uint_as_float(ptx::to_tf32(gv));
      }
      float* d = s_d + ch * dplane + 2 * ly * kWCols + 2 * lx;
      d[0] = code == 0 ? gv : 0.f;
      d[1] = code == 1 ? gv : 0.f;
      d[kWCols] = code == 2 ? gv : 0.f;
      d[kWCols + 1] = code == 3 ? gv : 0.f;
    }
    load_window<!kBf16>(p, p.x, n, py0, px0, p.rows, p.is, s_x);
    __syncthreads();

    constexpr int kStepsRow = kWCols / kStep;
    const int steps = crows * kStepsRow;
    for (int st = warp; st < steps; st += kWThreads / 32) {
      const int r = st / kStepsRow, c0 = (st - r * kStepsRow) * kStep;
      const float* d0 = s_d + g * dplane + r * kWCols + c0;  // channel g, pixel c0
      const float* x0 = s_x + r * p.is + c0;                 // the window at pixel c0, tap (0, 0)
      uint32_t a[2][4], b[NB][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float* dm = d0 + 16 * i * dplane;  // rows g (dm) and g + 8 (dm + 8 dplane)
        if constexpr (kBf16) {
          const float2 v0 = *reinterpret_cast<const float2*>(dm + 2 * t);
          const float2 v1 = *reinterpret_cast<const float2*>(dm + 8 * dplane + 2 * t);
          const float2 v2 = *reinterpret_cast<const float2*>(dm + 2 * t + 8);
          const float2 v3 = *reinterpret_cast<const float2*>(dm + 8 * dplane + 2 * t + 8);
          a[i][0] = ptx::pack_bf16x2(v0.x, v0.y);
          a[i][1] = ptx::pack_bf16x2(v1.x, v1.y);
          a[i][2] = ptx::pack_bf16x2(v2.x, v2.y);
          a[i][3] = ptx::pack_bf16x2(v3.x, v3.y);
        } else {
          a[i][0] = __float_as_uint(dm[t]);
          a[i][1] = __float_as_uint(dm[8 * dplane + t]);
          a[i][2] = __float_as_uint(dm[t + 4]);
          a[i][3] = __float_as_uint(dm[8 * dplane + t + 4]);
        }
      }
#pragma unroll
      for (int j = 0; j < NB; ++j) {
        auto xv = [&](int k) { return tap[j] ? x0[off[j] + k] : fixed[j]; };
        if constexpr (kBf16) {
          b[j][0] = ptx::pack_bf16x2(xv(2 * t), xv(2 * t + 1));
          b[j][1] = ptx::pack_bf16x2(xv(2 * t + 8), xv(2 * t + 9));
        } else {
          b[j][0] = __float_as_uint(xv(t));
          b[j][1] = __float_as_uint(xv(t + 4));
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < NB; ++j) {
          if constexpr (kBf16)
            ptx::mma_bf16(acc[i][j], a[i], b[j]);
          else
            ptx::mma_tf32(acc[i][j], a[i], b[j]);
        }
    }
    __syncthreads();  // the tiles are refilled for the next tile
  }

  // The warps' sums into s_sum in warp order (the epilogue layout: channel q's tap c at
  // q * KK + c, its bias at 32 * KK + q). Accumulator (i, j, r): channel 16 i + g + 8 (r / 2),
  // column 8 j + 2 t + r % 2.
  for (int w = 0; w < kWThreads / 32; ++w) {
    if (warp == w) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < NB; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int q = 16 * i + g + 8 * (r / 2), c = 8 * j + 2 * t + r % 2;
            if (c > KK) continue;
            const int vi = c < KK ? q * KK + c : kGroupOc * KK + q;
            s_sum[vi] = (w == 0 ? 0.f : s_sum[vi]) + acc[i][j][r];
          }
    }
    __syncthreads();
  }
  conv1ch::wgrad_block_epilogue<1>(s_sum, 0, kGroupOc, KK, oc0, p.oc, p.dw, p.db, p.scratch,
                                   blockIdx.x);
#else
  (void)p;
  __trap();  // the launcher runs it on compute capability 8.0 and later only
#endif
}

// The tile: up to kMaxChunks chunks of 4 pooled columns across, and as many pooled rows as give
// the grid about two blocks an SM (fewer rows a tile for small batches), within the shared
// memory limit.
MmaParams mma_params_of(const Conv2dShape& s, int sms) {
  MmaParams p{};
  static_cast<CrpShape&>(p) = crp_shape_of(s);
  p.cx = std::min(kMaxChunks, ceil_div(p.pow_, 4));
  p.tiles_x = ceil_div(p.pow_, 4 * p.cx);
  const int64_t per_image = int64_t{p.tiles_x} * s.n;
  const int64_t want_y = std::max<int64_t>(1, ceil_div<int64_t>(2 * int64_t{sms}, per_image));
  p.tph = static_cast<int>(std::min<int64_t>(kMaxTph, ceil_div<int64_t>(p.poh, want_y)));
  p.tph = std::max(1, p.tph);
  auto smem = [&](int tph) {
    const int rows = 2 * tph + s.kh - 1, is = 8 * p.cx + s.kw - 1;
    return sizeof(float) * (std::size_t(rows) * is + 2 * std::size_t(kGroupOc) * tph * 4 * p.cx);
  };
  while (p.tph > 1 && smem(p.tph) > kSmemLimit) --p.tph;
  p.tiles_y = ceil_div(p.poh, p.tph);
  p.rows = 2 * p.tph + s.kh - 1;
  p.is = 8 * p.cx + s.kw - 1;
  return p;
}

template <int K, bool kBf16>
void launch(const MmaParams& p, int64_t blocks, cudaStream_t stream) {
  const std::size_t smem =
      sizeof(float) * (std::size_t(p.rows) * p.is + 2 * std::size_t(kGroupOc) * p.tph * 4 * p.cx);
  CNN_CHECK(smem <= kSmemLimit, "conv_relu_pool_forward (tensor cores): {} bytes of shared memory",
            smem);
  crp_forward_mma<K, kBf16><<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(p);
  CNN_LAUNCH_CHECK(kBf16 ? "crp_forward_mma_bf16" : "crp_forward_mma_tf32");
}

// The weight gradient's tiling: up to kWMaxTph pooled rows by 16 pooled columns, and runs of
// tiles a block such that the grid is about two blocks an SM of an H200 (a constant, not a
// device query, so that the deterministic scratch depends on the shape alone).
constexpr int kSmsTarget = 2 * 132;
WgradParams wgrad_params_of(const Conv2dShape& s) {
  WgradParams p{};
  static_cast<CrpShape&>(p) = crp_shape_of(s);
  p.tph = std::min(kWMaxTph, p.poh);
  p.tiles_x = ceil_div(p.pow_, kWCols / 2);
  p.tiles_y = ceil_div(p.poh, p.tph);
  const int64_t tiles = int64_t{p.tiles_x} * p.tiles_y * s.n;
  const int64_t all = tiles * ceil_div(s.oc, kGroupOc);
  p.tiles_per_block = static_cast<int>(
      std::min<int64_t>(tiles, std::max<int64_t>(1, ceil_div<int64_t>(all, kSmsTarget))));
  p.rows = 2 * p.tph + s.kh - 1;
  p.is = kWCols + s.kw - 1;
  return p;
}

int64_t wgrad_blocks(const Conv2dShape& s, const WgradParams& p) {
  const int64_t tiles = int64_t{p.tiles_x} * p.tiles_y * s.n;
  return ceil_div<int64_t>(tiles, p.tiles_per_block) * ceil_div(s.oc, kGroupOc);
}

template <int K, bool kBf16>
void launch_wgrad(const WgradParams& p, int64_t blocks, cudaStream_t stream) {
  const std::size_t smem =
      sizeof(float) * (std::size_t(kGroupOc) * (2 * p.tph * kWCols + kDPad) +
                       std::size_t(p.rows) * p.is + std::size_t(kGroupOc) * (K * K + 1));
  CNN_CHECK(smem <= kSmemLimit,
            "conv_relu_pool_backward_weight (tensor cores): {} bytes of shared memory", smem);
  crp_wgrad_mma<K, kBf16><<<static_cast<unsigned>(blocks), kWThreads, smem, stream>>>(p);
  CNN_LAUNCH_CHECK(kBf16 ? "crp_wgrad_mma_bf16" : "crp_wgrad_mma_tf32");
}

// Calls f(std::integral_constant<int, K>{}, std::bool_constant<BF16>{}) for the kernel size
// (1, 3, 5 or 7) and the precision (BF16 or TF32), the template arguments of both kernels.
template <class F>
void with_kernel(const Conv2dShape& s, Precision precision, const char* op, F&& f) {
  auto by_k = [&](auto bf16) {
    switch (s.kh) {
      case 1:
        return f(std::integral_constant<int, 1>{}, bf16);
      case 3:
        return f(std::integral_constant<int, 3>{}, bf16);
      case 5:
        return f(std::integral_constant<int, 5>{}, bf16);
      case 7:
        return f(std::integral_constant<int, 7>{}, bf16);
      default:
        CNN_FAIL("{}: kernel {} has no fused kernel", op, s.kh);
    }
  };
  if (precision == Precision::BF16)
    by_k(std::true_type{});
  else
    by_k(std::false_type{});
}

}  // namespace

bool conv_relu_pool_mma_supported() {
  int dev = 0, major = 0;
  CNN_CUDA_CHECK(cudaGetDevice(&dev));
  CNN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major >= 8;
}

void conv_relu_pool_forward_mma_cuda(const Conv2dShape& s, const float* d_x, const float* d_w,
                                     const float* d_b, float* d_y, int32_t* d_argmax,
                                     const Exec& ex) {
  int dev = 0, sms = 0;
  CNN_CUDA_CHECK(cudaGetDevice(&dev));
  CNN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  MmaParams p = mma_params_of(s, sms);
  p.x = d_x;
  p.w = d_w;
  p.b = d_b;
  p.y = d_y;
  p.argmax = d_argmax;
  const int64_t blocks = int64_t{p.tiles_x} * p.tiles_y * s.n;
  CNN_CHECK(blocks < (int64_t{1} << 31), "conv_relu_pool_forward: {} blocks", blocks);
  with_kernel(s, ex.precision, "conv_relu_pool_forward", [&](auto k, auto bf16) {
    launch<decltype(k)::value, decltype(bf16)::value>(p, blocks, ex.stream);
  });
}

std::size_t conv_relu_pool_backward_weight_mma_scratch_floats(const Conv2dShape& s,
                                                              const Exec& ex) {
  if (!ex.deterministic) return 0;
  const WgradParams p = wgrad_params_of(s);
  return static_cast<std::size_t>(wgrad_blocks(s, p)) * kGroupOc * (s.kh * s.kw + 1);
}

void conv_relu_pool_backward_weight_mma_cuda(const Conv2dShape& s, const float* d_x,
                                             const float* d_y, const float* d_dy,
                                             const int32_t* d_argmax, float* d_dw, float* d_db,
                                             float* d_scratch, const Exec& ex) {
  WgradParams p = wgrad_params_of(s);
  p.x = d_x;
  p.y = d_y;
  p.dy = d_dy;
  p.am = d_argmax;
  p.dw = d_dw;
  p.db = d_db;
  p.scratch = ex.deterministic ? d_scratch : nullptr;
  CNN_CHECK(!ex.deterministic || d_scratch,
            "conv_relu_pool_backward_weight: deterministic mode needs scratch");
  const int64_t blocks = wgrad_blocks(s, p);
  CNN_CHECK(blocks < (int64_t{1} << 31), "conv_relu_pool_backward_weight: {} blocks", blocks);
  with_kernel(s, ex.precision, "conv_relu_pool_backward_weight", [&](auto k, auto bf16) {
    launch_wgrad<decltype(k)::value, decltype(bf16)::value>(p, blocks, ex.stream);
  });
  if (ex.deterministic) {
    const int kk = s.kh * s.kw, total = s.oc * (kk + 1);
    const int grid = std::max(1, std::min(ceil_div(total, 256), 1 << 20));
    const int per_group = static_cast<int>(blocks / ceil_div(s.oc, kGroupOc));
    conv1ch::conv1ch_wgrad_reduce<kGroupOc>
        <<<grid, 256, 0, ex.stream>>>(p.scratch, d_dw, d_db, s.oc, kk, per_group);
    CNN_LAUNCH_CHECK("conv1ch_wgrad_reduce");
  }
}

}  // namespace cnn
