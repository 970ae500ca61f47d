// Weight gradient, dedicated kernel (see conv2d_igemm_wgrad.h): C (M = OC, N = C*KH*KW [+1]) =
// A (M, K) * B (K, N) with K = N*OH*OW output positions, split over K across blocks.
//   A[oc][k] = dy[n][oc][pix]          contiguous in k: 16-byte cp.async.cg when OH*OW % 4 == 0
//                                      and dy is 16-byte aligned, else 4-byte copies;
//   B[k][j]  = x[n][c][iy][ix]         4-byte cp.async; the tap test and the window offset of
//                                      position k come from a per-block shared table.
// Shared memory holds both tiles k-contiguous, [row][32 k], its eight 16-byte chunks permuted
// per row by chunk ^ swz(row), swz(row) = ((row & 3) << 1) | ((row >> 2) & 1). That one
// permutation makes every access of the kernel bank-conflict-free:
//   16-byte copies (8 lanes = one row, 8 chunks);       4-byte copies (4 rows x 8 k per warp);
//   TF32 float2 fragment reads (16 lanes = 4 rows x 4 pairs, k permuted within each k8 step:
//   MMA k slot t <-> k 2t, slot t + 4 <-> k 2t + 1, the same for A and B, so the sum is the
//   same dot product); BF16 fragments (m16n8k16) are the float2 reads of two such k8 steps,
//   k unpermuted (a register's pair is k 2t, 2t + 1).
// The db column (j = C*KH*KW) is a row of ones written once into every stage (A is zero past
// the end of K, so its value there does not matter); rows past N are zeros written once.
// Partial tiles are atomicAdd-ed into dw/db, or, deterministic, written to scratch and summed
// in split order by a second kernel (the same scheme as the generic variant).
//
// Math by precision: TF32 and BF16 round the fragments as they leave shared memory; FP32 runs
// 3xTF32 on the TF32 fragments (each value split into big + small, three MMAs a product, FP32
// accuracy), not FFMA: on the H200 an FFMA form of this kernel took 1.09-1.47x the 3xTF32 time on
// every convolution it runs in the ResNet, LeNet, VGG and MobileNet configs (docs/performance.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_igemm_wgrad.h"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kBM = 64, kBN = 64, kBK = 32, kThreads = 128, kStages = 3;
constexpr int kStageFloats = (kBM + kBN) * kBK;         // 16 KB
constexpr int kPipeBytes = kStages * kStageFloats * 4;  // 48 KB
constexpr int kCsStride = kBN + 4;                      // epilogue staging [BM][BN + 4]
static_assert(kBM * kCsStride <= kStages * kStageFloats, "staging must fit the pipeline");
// Split of K: one wave of 4 resident blocks on each of an H200's 132 SMs (a tuning constant,
// not a device query, so the deterministic scratch size is a function of the shape alone;
// targets of 264, 792 and 1056 blocks were 2-22% slower on LeNet's conv2 and the ResNet's
// 28x28, 14x14 and 7x7 layers);
// chunks of 256..2048 positions (the per-block table is 8 bytes a position).
constexpr int kTargetBlocks = 4 * 132;
constexpr int kMinChunk = 256, kMaxChunk = 2048;

using ptx::cp_async16;
using ptx::cp_async4;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::mma_bf16;
using ptx::mma_tf32;
using ptx::pack_bf16x2;
using ptx::to_tf32;
using Div = ptx::FastDiv;

// Chunk permutation of a tile row (see the top of the file) and the float index of (row, k).
__device__ __forceinline__ int swz(int row) {
  return ((row & 3) << 1) | ((row >> 2) & 1);
}
__device__ __forceinline__ int tile_idx(int row, int k) {
  return row * kBK + ((((k >> 2) ^ swz(row)) << 2) | (k & 3));
}

struct WgParams {
  const float* x;   // (N, C, H, W)
  const float* dy;  // (N, OC, OH, OW)
  float* dw;        // (OC, C*KH*KW), accumulated
  float* db;        // (OC) or null, accumulated
  float* scratch;   // deterministic: (splits, slots); else null
  int oc, h, w, kh, kw, sh, sw, ph, pw, ow;
  int hw, ohw, chw, khw, ckhw;
  int ncols;    // ckhw (+1 with db)
  int K;        // N*OH*OW
  int chunk;    // output positions per split, a multiple of kBK
  int slots;    // OC*ckhw (+ OC with db)
  bool vec_dy;  // 16-byte dy copies
  Div div_ohw, div_ow, div_khw, div_kw;
};

// Thread mapping. Loaders: thread tid copies tile rows tid/8 + 16 r (r < 4) at k lane tid % 8
// (16-byte dy path: chunk tid % 8; 4-byte paths: k = tid % 8 + 8 q, q < 4). Math (kMath):
// warp w owns the 32x32 warp tile at ((w % 2) 32, (w / 2) 32), m16n8k8 TF32 (kTf32, k3xTf32) or
// m16n8k16 BF16 (kBf16) fragments.
// Epilogue: thread tid owns staged elements tid + 128 e, column-fastest (coalesced along j).
// Block (bx, by, bz) = (column tile, split of K, row tile).
constexpr int kTf32 = 1, kBf16 = 2, k3xTf32 = 3;
template <int kMath>
__global__ void __launch_bounds__(kThreads, 4)
    wgrad_ktile_kernel(const __grid_constant__ WgParams p) {
  ptx::griddep_enter();
  extern __shared__ float4 smem_f4[];
  float* smem = reinterpret_cast<float*>(smem_f4);
  int2* tab = reinterpret_cast<int2*>(smem + kStages * kStageFloats);  // [chunk]
  const int tid = threadIdx.x;
  const int n0 = blockIdx.x * kBN, split = blockIdx.y, m0 = blockIdx.z * kBM;
  const int kbeg = split * p.chunk;  // < K (splits = ceil(K / chunk))
  const int kend = kbeg + min(p.chunk, p.K - kbeg);
  const int nk = (kend - kbeg + kBK - 1) / kBK;

  // Position table of this split: {x offset of the window origin (may be negative), taps
  // inside the image as bits r = ky*KW + kx}; zero mask past the end of K.
  for (int t = tid; t < p.chunk; t += kThreads) {
    const int pos = kbeg + t;
    int xbase = 0;
    unsigned mask = 0;
    if (pos < kend) {
      const int n = p.div_ohw.div(pos), pix = pos - n * p.ohw;
      const int oy = p.div_ow.div(pix), ox = pix - oy * p.ow;
      const int iy0 = oy * p.sh - p.ph, ix0 = ox * p.sw - p.pw;
      xbase = n * p.chw + iy0 * p.w + ix0;
      const int ylo = max(0, -iy0), yhi = min(p.kh, p.h - iy0);
      const int xlo = max(0, -ix0), xhi = min(p.kw, p.w - ix0);
      if (ylo < yhi && xlo < xhi) {
        const uint64_t cols = (uint64_t{1} << xhi) - (uint64_t{1} << xlo);
        for (int ky = ylo; ky < yhi; ++ky) mask |= static_cast<unsigned>(cols << (ky * p.kw));
      }
    }
    tab[t] = make_int2(xbase, static_cast<int>(mask));
  }

  const int lk = tid % 8, lrow = tid / 8;  // loader k lane (or chunk) and first row
  const int lswz = swz(lrow);              // = swz(lrow + 16 r)

  // dy rows of this thread: oc = m0 + lrow + 16 r at offset aoff + r * aoff16 (one register
  // pair instead of four), bit r of alive set when oc < OC.
  const int aoff = (m0 + lrow) * p.ohw, aoff16 = 16 * p.ohw;
  unsigned alive = 0;
#pragma unroll
  for (int r = 0; r < 4; ++r)
    if (m0 + lrow + 16 * r < p.oc) alive |= 1u << r;
  // x columns of this thread: offset of tap (c, ky, kx) from the window origin and its tap bit.
  // Columns past C*KH*KW are never copied: the ones column (db) and the columns past N get
  // constant rows, written here into every stage.
  int joff[4];
  unsigned jbit[4];
  unsigned jlive = 0;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int col = n0 + lrow + 16 * r;
    joff[r] = 0;
    jbit[r] = 0;
    if (col < p.ckhw) {
      const int c = p.div_khw.div(col), rr = col - c * p.khw;
      const int ky = p.div_kw.div(rr), kx = rr - ky * p.kw;
      joff[r] = c * p.hw + ky * p.w + kx;
      jbit[r] = 1u << rr;
      jlive |= 1u << r;
    } else {
      const float v = col < p.ncols ? 1.f : 0.f;
      for (int s = 0; s < kStages; ++s)
#pragma unroll
        for (int q = 0; q < 4; ++q)
          smem[s * kStageFloats + kBM * kBK + tile_idx(lrow + 16 * r, lk + 8 * q)] = v;
    }
  }
  __syncthreads();  // table (and constant rows) visible

  auto load = [&](int stage, int k0) {
    float* As = smem + stage * kStageFloats;
    float* Bs = As + kBM * kBK;
    if (p.vec_dy) {
      const int k = k0 + 4 * lk;
      const bool kv = k < kend;
      const int kk = kv ? k : 0;
      const int n = p.div_ohw.div(kk);
      const int off = n * p.oc * p.ohw + (kk - n * p.ohw);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const bool v = kv && ((alive >> r) & 1u);
        cp_async16(As + (lrow + 16 * r) * kBK + ((lk ^ lswz) << 2),
                   p.dy + (v ? off + aoff + r * aoff16 : 0), v ? 16 : 0);
      }
    } else {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int k = k0 + lk + 8 * q;
        const bool kv = k < kend;
        const int kk = kv ? k : 0;
        const int n = p.div_ohw.div(kk);
        const int off = n * p.oc * p.ohw + (kk - n * p.ohw);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const bool v = kv && ((alive >> r) & 1u);
          cp_async4(As + tile_idx(lrow + 16 * r, lk + 8 * q),
                    p.dy + (v ? off + aoff + r * aoff16 : 0), v ? 16 : 0);
        }
      }
    }
    int2 e[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) e[q] = tab[k0 - kbeg + lk + 8 * q];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      if ((jlive >> r) & 1u) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const bool v = (static_cast<unsigned>(e[q].y) & jbit[r]) != 0u;
          cp_async4(Bs + tile_idx(lrow + 16 * r, lk + 8 * q), p.x + (v ? e[q].x + joff[r] : 0), v);
        }
      }
    }
  };

  // Accumulators: acc[i][j][4], m16n8 tile (i, j) of the warp tile in the standard C fragment
  // layout.
  constexpr int kAcc = 32;
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;

  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wm = (warp % 2) * 32, wn = (warp / 2) * 32;

  auto compute = [&](int stage) {
    const float* As = smem + stage * kStageFloats;
    const float* Bs = As + kBM * kBK;
    if constexpr (kMath == kBf16) {
      const int f = swz(g);
      // The float2 of k8 step q at row r: k = 8 q + 2 t, 8 q + 2 t + 1 (as in the TF32 reads).
      auto pair = [&](const float* T, int r, int q) {
        const int co = (((2 * q + (t >> 1)) ^ f) << 2) | ((t & 1) << 1);
        return *reinterpret_cast<const float2*>(T + r * kBK + co);
      };
#pragma unroll
      for (int s = 0; s < kBK / 16; ++s) {
        uint32_t a[2][4], b[4][2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int r = wm + 16 * i + g;
          const float2 a0 = pair(As, r, 2 * s), a1 = pair(As, r + 8, 2 * s);
          const float2 a2 = pair(As, r, 2 * s + 1), a3 = pair(As, r + 8, 2 * s + 1);
          a[i][0] = pack_bf16x2(a0.x, a0.y);
          a[i][1] = pack_bf16x2(a1.x, a1.y);
          a[i][2] = pack_bf16x2(a2.x, a2.y);
          a[i][3] = pack_bf16x2(a3.x, a3.y);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 b0 = pair(Bs, wn + 8 * j + g, 2 * s),
                       b1 = pair(Bs, wn + 8 * j + g, 2 * s + 1);
          b[j][0] = pack_bf16x2(b0.x, b0.y);
          b[j][1] = pack_bf16x2(b1.x, b1.y);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) mma_bf16(&acc[(i * 4 + j) * 4], a[i], b[j]);
      }
    } else if constexpr (kMath == k3xTf32) {
      // The TF32 fragments below, each value split into big + small (ptx::split_tf32); a product
      // is small_A big_B + big_A small_B + big_A big_B (small_A small_B, ~2^-22 of it, left out).
      const int f = swz(g);
#pragma unroll
      for (int s = 0; s < kBK / 8; ++s) {
        const int co = ((((2 * s + (t >> 1)) ^ f)) << 2) | ((t & 1) << 1);
        uint32_t a[2][4], as[2][4], b[4][2], bs[4][2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float2 lo = *reinterpret_cast<const float2*>(As + (wm + 16 * i + g) * kBK + co);
          const float2 hi = *reinterpret_cast<const float2*>(As + (wm + 16 * i + 8 + g) * kBK + co);
          ptx::split_tf32_frag({lo.x, hi.x, lo.y, hi.y}, a[i], as[i]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 bb = *reinterpret_cast<const float2*>(Bs + (wn + 8 * j + g) * kBK + co);
          ptx::split_tf32_frag({bb.x, bb.y}, b[j], bs[j]);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j)
            ptx::mma_3xtf32(&acc[(i * 4 + j) * 4], a[i], as[i], b[j], bs[j]);
      }
    } else if constexpr (kMath == kTf32) {
      const int f = swz(g);  // every fragment row is g (mod 8)
#pragma unroll
      for (int s = 0; s < kBK / 8; ++s) {
        // k = 8 s + 2 t and 8 s + 2 t + 1: one float2 per row.
        const int co = ((((2 * s + (t >> 1)) ^ f)) << 2) | ((t & 1) << 1);
        uint32_t a[2][4], b[4][2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float2 lo = *reinterpret_cast<const float2*>(As + (wm + 16 * i + g) * kBK + co);
          const float2 hi = *reinterpret_cast<const float2*>(As + (wm + 16 * i + 8 + g) * kBK + co);
          a[i][0] = to_tf32(lo.x);
          a[i][1] = to_tf32(hi.x);
          a[i][2] = to_tf32(lo.y);
          a[i][3] = to_tf32(hi.y);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 bb = *reinterpret_cast<const float2*>(Bs + (wn + 8 * j + g) * kBK + co);
          b[j][0] = to_tf32(bb.x);
          b[j][1] = to_tf32(bb.y);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) mma_tf32(&acc[(i * 4 + j) * 4], a[i], b[j]);
      }
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nk) load(s, kbeg + s * kBK);
    cp_async_commit();
  }
  for (int i = 0; i < nk; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile i visible to all; everyone is done with tile i - 1's buffer
    const int nx = i + kStages - 1;
    if (nx < nk) load(nx % kStages, kbeg + nx * kBK);
    cp_async_commit();
    compute(i % kStages);
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline buffers become the staging tile

  float* Cs = smem;  // [BM][BN + 4]
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        Cs[(wm + 16 * i + g + (r / 2) * 8) * kCsStride + wn + 8 * j + 2 * t + (r % 2)] =
            acc[(i * 4 + j) * 4 + r];
  __syncthreads();
  for (int e = tid; e < kBM * kBN; e += kThreads) {
    const int m = e / kBN, n = e % kBN;
    const int oc = m0 + m, col = n0 + n;
    if (oc >= p.oc || col >= p.ncols) continue;
    const float v = Cs[m * kCsStride + n];
    const int slot = col < p.ckhw ? oc * p.ckhw + col : p.oc * p.ckhw + oc;
    if (p.scratch)
      p.scratch[static_cast<int64_t>(split) * p.slots + slot] = v;
    else if (col < p.ckhw)
      atomicAdd(p.dw + slot, v);
    else
      atomicAdd(p.db + oc, v);
  }
}

// Second stage of the deterministic path: target[i] += sum over splits of scratch[split][i], in
// split order. Thread mapping: one slot per thread (grid-stride).
__global__ void wgrad_ktile_reduce(const float* __restrict__ d_scratch, int splits, int slots,
                                   int weight_slots, float* __restrict__ d_dw,
                                   float* __restrict__ d_db) {
  ptx::griddep_enter();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < slots; i += gridDim.x * blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < splits; ++s) acc += d_scratch[static_cast<int64_t>(s) * slots + i];
    if (i < weight_slots)
      d_dw[i] += acc;
    else
      d_db[i - weight_slots] += acc;
  }
}

struct Split {
  int64_t chunk = 0, splits = 0, tiles_m = 0, tiles_n = 0;
};

// Depends on the shape only (the column count includes the db column either way).
Split split_of(const Conv2dShape& s) {
  Split sp;
  const int64_t positions = int64_t{s.n} * s.oh() * s.ow();
  sp.tiles_m = ceil_div<int64_t>(s.oc, kBM);
  sp.tiles_n = ceil_div<int64_t>(int64_t{s.c} * s.kh * s.kw + 1, kBN);
  const int64_t want = std::max<int64_t>(1, kTargetBlocks / (sp.tiles_m * sp.tiles_n));
  int64_t chunk = ceil_div<int64_t>(ceil_div<int64_t>(positions, want), kBK) * kBK;
  chunk = std::min<int64_t>(kMaxChunk, std::max<int64_t>(kMinChunk, chunk));
  sp.chunk = chunk;
  sp.splits = std::max<int64_t>(1, ceil_div<int64_t>(positions, chunk));
  return sp;
}

}  // namespace

bool conv2d_wgrad_dedicated_supported(const Conv2dShape& s) {
  const int64_t x = int64_t{s.n} * s.c * s.h * s.w;
  const int64_t y = int64_t{s.n} * s.oc * s.oh() * s.ow();
  const int64_t w = int64_t{s.oc} * s.c * s.kh * s.kw + s.oc;
  if (s.kh * s.kw > 32 || x >= INT_MAX || y >= INT_MAX || w >= INT_MAX) return false;
  const Split sp = split_of(s);
  return sp.splits <= 65535 && sp.tiles_m <= 65535 && sp.tiles_n <= INT_MAX;
}

std::size_t conv2d_wgrad_dedicated_scratch_floats(const Conv2dShape& s, const Exec& ex) {
  if (!ex.deterministic) return 0;
  // Sized for the db slots too, so the same buffer serves calls with and without db.
  return static_cast<std::size_t>(split_of(s).splits) *
         static_cast<std::size_t>(int64_t{s.oc} * s.c * s.kh * s.kw + s.oc);
}

void conv2d_backward_weight_dedicated_cuda(const Conv2dShape& s, const float* d_x,
                                           const float* d_dy, float* d_dw, float* d_db,
                                           float* d_scratch, const Exec& ex) {
  CNN_CHECK(
      conv2d_wgrad_dedicated_supported(s),
      "conv2d_backward_weight_dedicated: shape outside the kernel's limits (KH*KW <= 32, 2^31)");
  CNN_CHECK(
      !ex.deterministic || d_scratch,
      "conv2d_backward_weight_dedicated: deterministic mode needs {} floats of scratch, got null",
      conv2d_wgrad_dedicated_scratch_floats(s, ex));
  WgParams p{};
  p.x = d_x;
  p.dy = d_dy;
  p.dw = d_dw;
  p.db = d_db;
  p.scratch = ex.deterministic ? d_scratch : nullptr;
  p.oc = s.oc;
  p.h = s.h;
  p.w = s.w;
  p.kh = s.kh;
  p.kw = s.kw;
  p.sh = s.stride_h;
  p.sw = s.stride_w;
  p.ph = s.pad_h;
  p.pw = s.pad_w;
  p.ow = s.ow();
  p.hw = s.h * s.w;
  p.ohw = s.oh() * s.ow();
  p.chw = s.c * p.hw;
  p.khw = s.kh * s.kw;
  p.ckhw = s.c * p.khw;
  p.ncols = p.ckhw + (d_db ? 1 : 0);
  p.K = s.n * p.ohw;
  if (p.K == 0 || s.oc == 0 || p.ckhw == 0) return;
  const Split sp = split_of(s);
  p.chunk = static_cast<int>(sp.chunk);
  p.slots = s.oc * p.ckhw + (d_db ? s.oc : 0);
  p.vec_dy = p.ohw % 4 == 0 && reinterpret_cast<uintptr_t>(d_dy) % 16 == 0;
  p.div_ohw = Div(p.ohw);
  p.div_ow = Div(p.ow);
  p.div_khw = Div(p.khw);
  p.div_kw = Div(p.kw);

  // The column tiles this call has: split_of counts the db column either way (its chunk and the
  // scratch depend on the shape alone), and without db a C*KH*KW that is a multiple of 64 (64
  // channels at 3x3, 1x1 layers) would launch a column of blocks that store nothing.
  const dim3 grid(static_cast<unsigned>(ceil_div(p.ncols, kBN)), static_cast<unsigned>(sp.splits),
                  static_cast<unsigned>(sp.tiles_m));
  const std::size_t smem = kPipeBytes + sizeof(int2) * static_cast<std::size_t>(p.chunk);
  auto kern = ex.precision == Precision::TF32   ? wgrad_ktile_kernel<kTf32>
              : ex.precision == Precision::BF16 ? wgrad_ktile_kernel<kBf16>
                                                : wgrad_ktile_kernel<k3xTf32>;
  CNN_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
  kern<<<grid, kThreads, smem, ex.stream>>>(p);
  CNN_LAUNCH_CHECK(ex.precision == Precision::TF32   ? "conv2d_backward_weight_dedicated_tf32"
                   : ex.precision == Precision::BF16 ? "conv2d_backward_weight_dedicated_bf16"
                                                     : "conv2d_backward_weight_dedicated_3xtf32");
  if (ex.deterministic)
    launch_wgrad_split_reduce(d_scratch, static_cast<int>(sp.splits), p.slots, s.oc * p.ckhw, d_dw,
                              d_db, ex);
}

void launch_wgrad_split_reduce(const float* d_scratch, int splits, int slots, int weight_slots,
                               float* d_dw, float* d_db, const Exec& ex) {
  constexpr int kBlock = 256;
  const int blocks = static_cast<int>(std::min<int64_t>(ceil_div<int64_t>(slots, kBlock), 4096));
  wgrad_ktile_reduce<<<blocks, kBlock, 0, ex.stream>>>(d_scratch, splits, slots, weight_slots, d_dw,
                                                       d_db);
  CNN_LAUNCH_CHECK("wgrad_ktile_reduce");
}

}  // namespace cnn
