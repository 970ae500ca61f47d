// Window weight gradient (see conv2d_igemm_wgrad_window.h and, for the plan and the names used
// here, conv2d_wgrad_window_plan.h): C (M = OC, N = channels x taps) = A (M, K) * B (K, N), K the
// output positions of a unit (image n, band of rows x OW), with
//   A[oc][q] = dy tile  [oc][q]                           shared memory, row stride ds
//   B[q][(c, ky, kx)] = window[c][table[q] + ky ws + kx]  shared memory, channel stride cs
// The A fragments of a k-step serve every tap and channel group of the warp, and a B fragment
// costs one shared load a register (two for BF16) at an address that differs between taps by a
// constant: no index math in the MMA loop beyond one table read a position.
//
// Staging: cp.async, two stages (the next unit's copies fly while this one's MMAs run); the
// window in 4-byte pieces (zero-filled outside the image and past C), dy in 16-byte pieces where
// the plan's bands start 16-byte aligned (dy_vec), else 4-byte ones (zero-filled past the band).
// One pass over the landed window rounds it in place (TF32: cvt.rna; BF16: round to nearest
// even, kept as a float whose low 16 bits are zero), so that the B fragment loads, one a tap,
// convert nothing; the A (dy) fragments, loaded once a k-step, are rounded as they are loaded.
// The copies and the rounding pass run between the MMAs of the same warps, so their
// instructions are kept few: ncu counted 3.4 times the MMA loop's instructions in them when
// they were one 4-byte copy a cell, each with its own index arithmetic, and dy rounded in place.
//
// Bank conflicts. Every fragment load is 8 rows g (dy rows, or channels) x 4 lanes t of
// consecutive positions. The row strides ds and cs are 4 (mod 8) words, so row g starts in bank
// 4 g + const (mod 32) for g = 0..7, and the 4 lanes' word offsets are distinct mod 4: for dy
// they are consecutive; for the window they are table[q..q+3] (+ a tap constant), consecutive
// within an output row and, across a row end, jumping by ws - OW + 1 = 1 (mod 4) because the plan
// makes ws = OW (mod 4). 8 rows x 4 residues = 32 banks. (Only the k-step that reaches past the
// band's positions, whose table entries are 0, may conflict.)
//
// BF16 (m16n8k16) takes its k slots in the order slot 2t <-> position t, 2t+1 <-> t+4, 2t+8 <->
// t+8, 2t+9 <-> t+12, for A and B alike (the MMA sums over k, so any common permutation gives the
// same dot product): each register is two positions 4 apart, read by two conflict-free loads and
// joined by one byte permute (window values are already BF16, so no rounding happens there).
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_igemm_wgrad.h"
#include "kernels/conv/conv2d_igemm_wgrad_window.h"
#include "runtime/cuda_check.h"

namespace cnn {
namespace {

constexpr int kThreads = kWgradWindowThreads;
constexpr int kTf32 = 1, kBf16 = 2;

using ptx::cp_async16;
using ptx::cp_async4;
using ptx::cp_async_commit;
using ptx::cp_async_wait;

struct WwParams {
  const float* x;   // (N, C, H, W)
  const float* dy;  // (N, OC, OH, OW)
  float* dw;        // (OC, C, KH, KW), accumulated
  float* db;        // (OC) or null, accumulated
  float* scratch;   // deterministic: (splits, slots); else null
  int c, h, w, oc, oh, ow, ph, pw;
  int rows, bands, units, units_per_split;
  int ww, ws, wr, cs, p, kp, ds, stage;
  int slots;   // scratch row: OC*C*KH*KW (+ OC with db)
  int dy_vec;  // dy rows copied in 16-byte pieces (WgradWindowPlan::dy_vec)
};

__device__ __forceinline__ uint32_t f2u(float f) {
  return __float_as_uint(f);
}
// The two halves of a bf16x2 register as floats.
__device__ __forceinline__ float bf16_lo(uint32_t v) {
  return __uint_as_float(v << 16);
}
__device__ __forceinline__ float bf16_hi(uint32_t v) {
  return __uint_as_float(v & 0xffff0000u);
}
// Two BF16-valued floats as one bf16x2 register, `lo` in bits 0..15 (the lower k slot).
__device__ __forceinline__ uint32_t join_bf16(float lo, float hi) {
  return __byte_perm(f2u(lo), f2u(hi), 0x7632);
}

// Thread mapping. Copies: warp w copies the window rows wr = w, w + 4, ... of every channel and
// the dy rows oc = w, w + 4, ..., lane l the columns (16-byte pieces of dy) l + 32 i. Rounding
// pass: thread tid the float4s tid + 128 i of the stage's window. MMA: warp w = ((wm WT + wt) WC
// + wc) owns the OC rows 16 (wm MTW + mt) + 0..15 (mt < MTW), the channels 8 (wc CGW + cg) +
// 0..7 (cg < CGW) of the block's chunk, and the taps wt TW .. wt TW + TW - 1 (TW = ceil(T /
// WT), those below T); standard m16n8 C fragments (lane g = lane / 4 rows g, g + 8; t = lane % 4
// columns 2t, 2t + 1). Block (bx, by) = (channel chunk, split: units by * units_per_split ...).
template <int kMath, int K, int MTW, int CGW, int WM, int WT>
__global__ void __launch_bounds__(kThreads, 2)
    wgrad_window_kernel(const __grid_constant__ WwParams p) {
  ptx::griddep_enter();
  constexpr int WC = 4 / (WM * WT), CB = 8 * CGW * WC, OCP = 16 * MTW * WM, T = K * K;
  constexpr int TW = (T + WT - 1) / WT;
  constexpr int kStep = kMath == kBf16 ? 16 : 8;
  extern __shared__ float4 smem_f4[];
  float* smem = reinterpret_cast<float*>(smem_f4);          // [2][stage]
  int* table = reinterpret_cast<int*>(smem + 2 * p.stage);  // [kp]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int chunk = blockIdx.x, c0 = chunk * CB;
  const int u0 = blockIdx.y * p.units_per_split;
  const int nu = min(p.units, u0 + p.units_per_split) - u0;  // >= 1 (splits = ceil)

  // Window offset of each position; positions past the band read cell 0 (a written cell: its dy
  // is zero, its value finite).
  for (int q = tid; q < p.kp; q += kThreads) table[q] = q < p.p ? (q / p.ow) * p.ws + q % p.ow : 0;
  // dy rows OC..OCP of both stages: zeros, written once (no copy touches them).
  for (int s = 0; s < 2; ++s)
    for (int e = tid; e < (OCP - p.oc) * p.ds; e += kThreads)
      smem[s * p.stage + CB * p.cs + p.oc * p.ds + e] = 0.f;

  // The copies of unit u into stage s. The window: a lane's column (and whether it is inside the
  // image) is the same in every row, so a row costs a pointer step and one row test.
  const int cvalid = min(CB, p.c - c0);
  auto issue = [&](int u, int s) {
    const int n = u / p.bands, oy0 = (u - n * p.bands) * p.rows;
    const int pvalid = min(p.rows, p.oh - oy0) * p.ow;
    float* win = smem + s * p.stage;
    const float* xn = p.x + (static_cast<int64_t>(n) * p.c + c0) * p.h * p.w;
    for (int col = lane; col < p.ww; col += 32) {
      const int ix = col - p.pw;
      const bool cv = ix >= 0 && ix < p.w;
      for (int wr = warp; wr < p.wr; wr += 4) {
        const int iy = oy0 + wr - p.ph;
        const bool rv = cv && iy >= 0 && iy < p.h;
        const float* src = xn + iy * p.w + ix;
        float* dst = win + wr * p.ws + col;
#pragma unroll 4
        for (int c = 0; c < CB; ++c) {
          const bool v = rv && c < cvalid;
          cp_async4(dst + c * p.cs, v ? src + c * p.h * p.w : p.x, v);
        }
      }
    }
    float* dys = win + CB * p.cs;
    const float* dyn = p.dy + (static_cast<int64_t>(n) * p.oc * p.oh + oy0) * p.ow;
    if (p.dy_vec) {
      const int pieces = p.kp / 4;
      for (int oc = warp; oc < p.oc; oc += 4) {
        const float* src = dyn + static_cast<int64_t>(oc) * p.oh * p.ow;
        for (int j = lane; j < pieces; j += 32) {
          const int bytes = 4 * max(0, min(4, pvalid - 4 * j));
          cp_async16(dys + oc * p.ds + 4 * j, bytes > 0 ? src + 4 * j : p.dy, bytes);
        }
      }
    } else {
      for (int oc = warp; oc < p.oc; oc += 4) {
        const float* src = dyn + static_cast<int64_t>(oc) * p.oh * p.ow;
        for (int q = lane; q < p.kp; q += 32) {
          const bool v = q < pvalid;
          cp_async4(dys + oc * p.ds + q, v ? src + q : p.dy, v);
        }
      }
    }
  };

  // Rounds the landed window in place (padding cells included: they are never read); dy is
  // rounded as its fragments are loaded (each value is loaded once a warp), which costs fewer
  // instructions than a pass over the larger dy tile.
  auto round_window = [&](int s) {
    float4* v = reinterpret_cast<float4*>(smem + s * p.stage);
    for (int i = tid; i < CB * p.cs / 4; i += kThreads) {
      float4 f = v[i];
      if constexpr (kMath == kTf32) {
        f.x = __uint_as_float(ptx::to_tf32(f.x));
        f.y = __uint_as_float(ptx::to_tf32(f.y));
        f.z = __uint_as_float(ptx::to_tf32(f.z));
        f.w = __uint_as_float(ptx::to_tf32(f.w));
      } else {
        const uint32_t xy = ptx::pack_bf16x2(f.x, f.y), zw = ptx::pack_bf16x2(f.z, f.w);
        f.x = __uint_as_float(xy << 16);
        f.y = __uint_as_float(xy & 0xffff0000u);
        f.z = __uint_as_float(zw << 16);
        f.w = __uint_as_float(zw & 0xffff0000u);
      }
      v[i] = f;
    }
  };

  float acc[MTW * CGW * TW * 4];
#pragma unroll
  for (int i = 0; i < MTW * CGW * TW * 4; ++i) acc[i] = 0.f;
  // db: the sum of this lane's A values of rows g, g + 8 of each m-tile (warps wt == wc == 0 of
  // chunk 0), rounded as the MMAs see them.
  float dbs[MTW][2] = {};
  const int wm = warp / (WT * WC), wt = warp / WC % WT, wc = warp % WC;
  const bool want_db = p.db != nullptr && chunk == 0 && wc == 0 && wt == 0;  // warp-uniform

  // The MMAs of one stage for the taps of run R (a constant, so that every tap's (ky, kx) and
  // its accumulators are known at compile time).
  auto compute = [&](int s, auto run) {
    constexpr int R = decltype(run)::value;
    constexpr int tap0 = R * TW, taps = T - tap0 < TW ? T - tap0 : TW;
    const float* win = smem + s * p.stage;
    const float* wl = win + (wc * CGW * 8 + g) * p.cs;                   // channel row of lane g
    const float* al = win + CB * p.cs + (wm * MTW * 16 + g) * p.ds + t;  // dy row g, position t
    const int* tl = table + t;
    for (int k0 = 0; k0 < p.kp; k0 += kStep) {
      uint32_t a[MTW][4];
      int o[kStep / 4];  // window offsets of positions k0 + t + 4 j
#pragma unroll
      for (int j = 0; j < kStep / 4; ++j) o[j] = tl[k0 + 4 * j];
#pragma unroll
      for (int mt = 0; mt < MTW; ++mt) {
        const float* lo = al + mt * 16 * p.ds + k0;  // row g
        const float* hi = lo + 8 * p.ds;             // row g + 8
        if constexpr (kMath == kTf32) {
          a[mt][0] = ptx::to_tf32(lo[0]);
          a[mt][1] = ptx::to_tf32(hi[0]);
          a[mt][2] = ptx::to_tf32(lo[4]);
          a[mt][3] = ptx::to_tf32(hi[4]);
        } else {
          a[mt][0] = ptx::pack_bf16x2(lo[0], lo[4]);
          a[mt][1] = ptx::pack_bf16x2(hi[0], hi[4]);
          a[mt][2] = ptx::pack_bf16x2(lo[8], lo[12]);
          a[mt][3] = ptx::pack_bf16x2(hi[8], hi[12]);
        }
        // db sums the rounded values, as the MMAs see them.
        if (want_db) {
          if constexpr (kMath == kTf32) {
            dbs[mt][0] += __uint_as_float(a[mt][0]) + __uint_as_float(a[mt][2]);
            dbs[mt][1] += __uint_as_float(a[mt][1]) + __uint_as_float(a[mt][3]);
          } else {
            dbs[mt][0] +=
                (bf16_lo(a[mt][0]) + bf16_hi(a[mt][0])) + (bf16_lo(a[mt][2]) + bf16_hi(a[mt][2]));
            dbs[mt][1] +=
                (bf16_lo(a[mt][1]) + bf16_hi(a[mt][1])) + (bf16_lo(a[mt][3]) + bf16_hi(a[mt][3]));
          }
        }
      }
#pragma unroll
      for (int cg = 0; cg < CGW; ++cg)
#pragma unroll
        for (int j = 0; j < taps; ++j) {
          const int ky = (tap0 + j) / K, kx = (tap0 + j) % K;
          const float* wrow = wl + cg * 8 * p.cs + ky * p.ws;
          uint32_t b[2];
          if constexpr (kMath == kTf32) {
            b[0] = f2u(wrow[o[0] + kx]);
            b[1] = f2u(wrow[o[1] + kx]);
          } else {
            b[0] = join_bf16(wrow[o[0] + kx], wrow[o[1] + kx]);
            b[1] = join_bf16(wrow[o[2] + kx], wrow[o[3] + kx]);
          }
#pragma unroll
          for (int mt = 0; mt < MTW; ++mt) {
            float* d = &acc[((mt * CGW + cg) * TW + j) * 4];
            if constexpr (kMath == kTf32)
              ptx::mma_tf32(d, a[mt], b);
            else
              ptx::mma_bf16(d, a[mt], b);
          }
        }
    }
  };

  // Calls f with this warp's run of taps as a compile-time constant.
  static_assert(WT == 1 || WT == 2, "taps split over at most two warps");
  auto with_run = [&](auto f) {
    if (WT == 1 || wt == 0)
      f(std::integral_constant<int, 0>{});
    else
      f(std::integral_constant<int, WT - 1>{});
  };

  issue(u0, 0);
  cp_async_commit();
  for (int i = 0; i < nu; ++i) {
    cp_async_wait<0>();
    __syncthreads();  // unit i landed for everyone; everyone is done with unit i - 1's stage
    if (i + 1 < nu) issue(u0 + i + 1, (i + 1) & 1);
    cp_async_commit();
    round_window(i & 1);
    __syncthreads();  // unit i's window rounded
    with_run([&](auto run) { compute(i & 1, run); });
  }

  // Epilogue: this block's partial tile, atomically or into its split's scratch row; the taps
  // of the warp's run known at compile time, so that each (row, channel) is one address and
  // its taps' stores take immediate offsets.
  float* srow = p.scratch ? p.scratch + static_cast<int64_t>(blockIdx.y) * p.slots : nullptr;
  const int taps_c = p.c * T;
  auto store = [&](auto run) {
    constexpr int R = decltype(run)::value;
    constexpr int tap0 = R * TW, taps = T - tap0 < TW ? T - tap0 : TW;
#pragma unroll
    for (int mt = 0; mt < MTW; ++mt)
#pragma unroll
      for (int cg = 0; cg < CGW; ++cg)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int oc = (wm * MTW + mt) * 16 + g + 8 * (r >> 1);
          const int c = c0 + (wc * CGW + cg) * 8 + 2 * t + (r & 1);
          if (oc >= p.oc || c >= p.c) continue;
          const float* v = &acc[(mt * CGW + cg) * TW * 4 + r];
          if (srow) {
            float* d = srow + oc * taps_c + c * T + tap0;
#pragma unroll
            for (int j = 0; j < taps; ++j) d[j] = v[4 * j];
          } else {
            float* d = p.dw + oc * taps_c + c * T + tap0;
#pragma unroll
            for (int j = 0; j < taps; ++j) atomicAdd(d + j, v[4 * j]);
          }
        }
  };
  with_run(store);
  if (want_db) {
#pragma unroll
    for (int mt = 0; mt < MTW; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v = dbs[mt][h];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        const int oc = (wm * MTW + mt) * 16 + g + 8 * h;
        if (t != 0 || oc >= p.oc) continue;
        if (srow)
          srow[p.oc * taps_c + oc] = v;
        else
          atomicAdd(p.db + oc, v);
      }
  }
}

using KernelFn = void (*)(WwParams);

template <int kMath>
KernelFn kernel_for(const WgradWindowPlan& pl, int k) {
  // The tilings of wgrad_window_plan (tiling_of): (K, MTW, CGW, WM, WT).
  if (k == 3 && pl.wm == 1) return wgrad_window_kernel<kMath, 3, 2, 1, 1, 1>;
  if (k == 3 && pl.wm == 2) return wgrad_window_kernel<kMath, 3, 2, 1, 2, 1>;
  if (k == 3 && pl.wm == 4) return wgrad_window_kernel<kMath, 3, 2, 1, 4, 1>;
  if (k == 5 && pl.wm == 1) return wgrad_window_kernel<kMath, 5, 2, 1, 1, 2>;
  if (k == 5 && pl.wm == 2) return wgrad_window_kernel<kMath, 5, 2, 1, 2, 2>;
  if (k == 1 && pl.wm == 1) return wgrad_window_kernel<kMath, 1, 2, 2, 1, 1>;
  if (k == 1 && pl.wm == 2) return wgrad_window_kernel<kMath, 1, 2, 2, 2, 1>;
  if (k == 1 && pl.wm == 4) return wgrad_window_kernel<kMath, 1, 2, 2, 4, 1>;
  return nullptr;
}

}  // namespace

bool wgrad_window_preferred(const Conv2dShape& s, const Exec& ex) {
  if (!wgrad_window_supported(s, ex.precision) || s.c < 8) return false;
  if (!((s.kh == 3 && s.oc <= 128) || (s.kh == 5 && s.oc <= 64))) return false;
  // Every channel chunk reads all of dy: beyond 4 chunks only where dy stays in L2 (16 MB, a
  // third of the H200's) between the chunks, e.g. C = OC = 128 at 7x7 (16 chunks, 3.2 MB), not
  // at 56x56 (205 MB, 16 times from DRAM).
  const WgradWindowPlan pl = wgrad_window_plan(s, ex.precision);
  const double dy_bytes = 4.0 * s.n * s.oc * s.oh() * s.ow();
  return pl.chunks <= 4 || dy_bytes <= 16.0 * (1 << 20);
}

void conv2d_backward_weight_window_cuda(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                        float* d_dw, float* d_db, float* d_scratch,
                                        const Exec& ex) {
  const WgradWindowPlan pl = wgrad_window_plan(s, ex.precision);  // throws when unsupported
  CNN_CHECK(
      !ex.deterministic || d_scratch,
      "conv2d_backward_weight_window: deterministic mode needs {} floats of scratch, got null",
      wgrad_window_scratch_floats(s, ex));
  WwParams p{};
  p.x = d_x;
  p.dy = d_dy;
  p.dw = d_dw;
  p.db = d_db;
  p.scratch = ex.deterministic ? d_scratch : nullptr;
  p.c = s.c;
  p.h = s.h;
  p.w = s.w;
  p.oc = s.oc;
  p.oh = s.oh();
  p.ow = s.ow();
  p.ph = s.pad_h;
  p.pw = s.pad_w;
  p.rows = pl.rows;
  p.bands = pl.bands;
  p.units = pl.units;
  p.units_per_split = pl.units_per_split;
  p.ww = pl.ww;
  p.ws = pl.ws;
  p.wr = pl.wr;
  p.cs = pl.cs;
  p.p = pl.p;
  p.kp = pl.kp;
  p.ds = pl.ds;
  p.stage = pl.stage_floats;
  p.dy_vec = pl.dy_vec ? 1 : 0;
  const int weight_slots = s.oc * s.c * s.kh * s.kw;
  p.slots = weight_slots + (d_db ? s.oc : 0);

  const KernelFn kern =
      ex.precision == Precision::BF16 ? kernel_for<kBf16>(pl, s.kh) : kernel_for<kTf32>(pl, s.kh);
  CNN_CHECK(kern, "conv2d_backward_weight_window: no kernel for {}x{} with {} warps along OC", s.kh,
            s.kw, pl.wm);
  CNN_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(pl.smem)));
  const dim3 grid(static_cast<unsigned>(pl.chunks), static_cast<unsigned>(pl.splits));
  kern<<<grid, kThreads, pl.smem, ex.stream>>>(p);
  CNN_LAUNCH_CHECK(ex.precision == Precision::BF16 ? "conv2d_backward_weight_window_bf16"
                                                   : "conv2d_backward_weight_window_tf32");
  if (ex.deterministic)
    launch_wgrad_split_reduce(d_scratch, pl.splits, p.slots, weight_slots, d_dw, d_db, ex);
}

}  // namespace cnn
