// Implicit-GEMM convolutions (see conv2d_igemm.h) on the tiled main loop of gemm_tile.cuh.
// Each problem below says how one element of the A and B tiles is gathered from the NCHW
// tensors (padding, stride and tile edges become zero-filled cp.async), and where a finished
// element of C goes. The gathers keep per-thread state for the index that is fixed over the
// whole K loop (an output pixel, an input pixel, a weight column) and decompose the running
// k index with multiply-shift divisions.
//   _simt: FP32 FFMA, 8x4 register micro-tiles (64x64 or 128x32 block tiles)
//   _tf32: mma.sync m16n8k8 TF32, 32x32 warp tiles
//   _bf16: mma.sync m16n8k16 BF16 (operands rounded to nearest even), the same warp tiles
//   _bf16_packed: the same MMAs on packed bf16 tiles (Bf16Tiles::Packed): each loader also
//          has a register half (fetch: global loads one k-tile ahead; store: round, write pairs)
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_dgrad_phase.h"
#include "kernels/conv/conv2d_igemm.h"
#include "kernels/conv/conv2d_igemm_dgrad.h"
#include "kernels/conv/conv2d_igemm_wgrad.h"
#include "kernels/conv/conv2d_igemm_wgrad_window.h"
#include "kernels/gemm/gemm_tile.cuh"
#include "runtime/cuda_check.h"
#include "runtime/env_switches.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

using igemm::cp_async4;
using igemm::FastDiv;

// Output positions per split of the weight-gradient reduction: a fixed chunk, so the split
// count (and the deterministic scratch size) follows from the shape alone. 512 gives conv2
// 49 splits x 13 tiles = 637 blocks (~5 per SM); 1024 left 18% of the SM time idle.
constexpr int kWgradChunk = 512;

// Far outside any image: an out-of-range tile row gets this origin so every tap reads padding.
constexpr int kFarAway = -(1 << 29);

// The source of the constant-one column that turns the weight-gradient GEMM's extra column
// into db (a cp.async needs a global address to copy from).
__device__ const float kOneF = 1.f;

// Conv2dShape plus derived sizes and their dividers, usable on the device.
struct ConvGeom {
  int n, c, h, w, oc, kh, kw, sh, sw, ph, pw, oh, ow;
  int hw, ohw, khw, chw;
  bool unit_stride;
  FastDiv div_ohw, div_ow, div_hw, div_w, div_khw, div_kw, div_sh, div_sw;
};

ConvGeom geom_of(const Conv2dShape& s) {
  ConvGeom g{};
  g.n = s.n;
  g.c = s.c;
  g.h = s.h;
  g.w = s.w;
  g.oc = s.oc;
  g.kh = s.kh;
  g.kw = s.kw;
  g.sh = s.stride_h;
  g.sw = s.stride_w;
  g.ph = s.pad_h;
  g.pw = s.pad_w;
  g.oh = s.oh();
  g.ow = s.ow();
  g.hw = s.h * s.w;
  g.ohw = g.oh * g.ow;
  g.khw = s.kh * s.kw;
  g.chw = s.c * g.hw;
  g.unit_stride = s.stride_h == 1 && s.stride_w == 1;
  g.div_ohw = FastDiv(g.ohw);
  g.div_ow = FastDiv(g.ow);
  g.div_hw = FastDiv(g.hw);
  g.div_w = FastDiv(g.w);
  g.div_khw = FastDiv(g.khw);
  g.div_kw = FastDiv(g.kw);
  g.div_sh = FastDiv(g.sh);
  g.div_sw = FastDiv(g.sw);
  return g;
}

__device__ __forceinline__ float relu_keep_nan(float v) {
  return (v < 0.f) ? 0.f : v;
}

// Issues the copies of a k-lane loader (element (q, j): k = kl + 8 q, tile row x + j T/8) after
// all their sources were computed, so that the copies go out back to back.
template <class C, int kRows>
__device__ __forceinline__ void issue_klanes(float* s, int stride, int kl, int x,
                                             const float* const (&src)[C::BK / 8][kRows],
                                             const bool (&v)[C::BK / 8][kRows]) {
#pragma unroll
  for (int q = 0; q < C::BK / 8; ++q)
#pragma unroll
    for (int j = 0; j < kRows; ++j)
      cp_async4(s + (kl + 8 * q) * stride + x + j * (C::kThreads / 8), src[q][j], v[q][j]);
}

// The register half of a k-lane loader L (packed BF16 tiles): L::sources' elements loaded.
template <class C, int kRows, class L>
__device__ __forceinline__ void fetch_klanes(const L& l, int k0, float (&r)[C::BK / 8][kRows]) {
  const float* src[C::BK / 8][kRows];
  bool v[C::BK / 8][kRows];
  l.sources(k0, src, v);
#pragma unroll
  for (int q = 0; q < C::BK / 8; ++q)
#pragma unroll
    for (int j = 0; j < kRows; ++j) r[q][j] = igemm::load_or_zero(src[q][j], v[q][j]);
}

// The copy and register halves of a k-lane loader L over a tile of BX rows (element (q, j):
// k = k0 + kl + 8 q, tile row xl + j T/8, shared row stride S), both from L::sources(k0, src, v).
template <class C, int BX, int S, class L>
struct KLaneLoader {
  static constexpr int kRows = BX / (C::kThreads / 8);
  int kl, xl;
  __device__ __forceinline__ explicit KLaneLoader(int tid) : kl(tid % 8), xl(tid / 8) {}
  __device__ __forceinline__ void load(float* s, int k0) const {
    const float* src[C::BK / 8][kRows];
    bool v[C::BK / 8][kRows];
    static_cast<const L&>(*this).sources(k0, src, v);
    issue_klanes<C, kRows>(s, S, kl, xl, src, v);
  }
  // Packed BF16 tiles: the same elements through registers.
  struct Regs {
    float v[C::BK / 8][kRows];
  };
  __device__ __forceinline__ void fetch(Regs& rg, int k0) const {
    fetch_klanes<C, kRows>(static_cast<const L&>(*this), k0, rg.v);
  }
  __device__ __forceinline__ void store(uint32_t* s, const Regs& rg) const {
    igemm::store_klanes<C, S, kRows>(s, kl, xl, rg.v);
  }
};

// The tap-table gather of one A k-tile (forward and input gradient): the thread's tile row
// `row` takes k = k0 + kq + (T/BM) q; tap entries {offset, r} come from the shared table, a tap
// is real when bit r of `mask` is set, and its source is src + base + offset. All table reads
// and addresses come first, then the copies issue back to back. With one k per thread step
// (T == BM) the entries of two consecutive k arrive in one 16-byte shared load.
template <class C, int kN = C::BK / (C::kThreads / C::BM)>
__device__ __forceinline__ void taps_by_table(const int2* tab, int k0, int kq, unsigned mask,
                                              int (&off)[kN], bool (&v)[kN]) {
  constexpr int kStep = C::kThreads / C::BM;
  if constexpr (kStep == 1) {
    const int4* tab4 = reinterpret_cast<const int4*>(tab + k0);  // k0 % BK == 0: aligned
#pragma unroll
    for (int j = 0; j < kN / 2; ++j) {
      const int4 e = tab4[j];
      v[2 * j] = (mask >> e.y) & 1u;
      off[2 * j] = e.x;
      v[2 * j + 1] = (mask >> e.w) & 1u;
      off[2 * j + 1] = e.z;
    }
  } else {
#pragma unroll
    for (int q = 0; q < kN; ++q) {
      const int2 e = tab[k0 + kq + q * kStep];
      v[q] = (mask >> e.y) & 1u;
      off[q] = e.x;
    }
  }
}

template <class C>
__device__ __forceinline__ void gather_by_table(const int2* tab, int k0, int kq, int row,
                                                unsigned mask, int base, const float* src,
                                                float* s) {
  constexpr int kStep = C::kThreads / C::BM, kN = C::BK / kStep;
  int off[kN];
  bool v[kN];
  taps_by_table<C>(tab, k0, kq, mask, off, v);
#pragma unroll
  for (int q = 0; q < kN; ++q)
    cp_async4(s + (kq + q * kStep) * C::SA + row, src + (v[q] ? base + off[q] : 0), v[q]);
}

// The same elements into registers, for packed BF16 tiles (element q: k = kq + q T/BM).
template <class C>
__device__ __forceinline__ void fetch_by_table(const int2* tab, int k0, int kq, unsigned mask,
                                               int base, const float* src,
                                               float (&r)[C::BK / (C::kThreads / C::BM)]) {
  constexpr int kN = C::BK / (C::kThreads / C::BM);
  int off[kN];
  bool v[kN];
  taps_by_table<C>(tab, k0, kq, mask, off, v);
#pragma unroll
  for (int q = 0; q < kN; ++q) r[q] = igemm::load_or_zero(src + (v[q] ? base + off[q] : 0), v[q]);
}

// Packed BF16 tiles of a gather G that owns one tile row and steps k (element q: k = kq + q T/BM):
// through G's tap table when it has one (base, src as fetch_by_table's), else through
// G::source(k, valid).
template <class C, class G>
__device__ __forceinline__ void fetch_mlane(const G& g, int k0, int base, const float* src,
                                            float (&r)[C::BK / (C::kThreads / C::BM)]) {
  constexpr int kStep = C::kThreads / C::BM, kN = C::BK / kStep;
  if (g.tab) {
    fetch_by_table<C>(g.tab, k0, g.kq, g.mask, base, src, r);
    return;
  }
#pragma unroll
  for (int q = 0; q < kN; ++q) {
    bool v;
    const float* at = g.source(k0 + g.kq + q * kStep, v);
    r[q] = igemm::load_or_zero(at, v);
  }
}

// The copy and register halves of an m-lane gather L (tile row `row` per thread, lanes on
// consecutive rows; element q: k = kq + q T/BM): through the tap table when there is one (the
// source L::table_src() + L::table_base() + entry offset; bit r of `mask`: tap r is real), else
// through L::source(k, valid).
template <class C, class L>
struct MLaneLoader {
  const int2* tab;
  int row, kq;
  unsigned mask = 0;
  __device__ __forceinline__ MLaneLoader(int tid, const int* table)
      : tab(reinterpret_cast<const int2*>(table)), row(tid % C::BM), kq(tid / C::BM) {}
  __device__ __forceinline__ void load(float* s, int k0) const {
    const L& l = static_cast<const L&>(*this);
    constexpr int kStep = C::kThreads / C::BM;
    if (tab) {
      gather_by_table<C>(tab, k0, kq, row, mask, l.table_base(), l.table_src(), s);
      return;
    }
#pragma unroll
    for (int q = 0; q < C::BK / kStep; ++q) {
      bool v;
      const float* src = l.source(k0 + kq + q * kStep, v);
      cp_async4(s + (kq + q * kStep) * C::SA + row, src, v);
    }
  }
  // Packed BF16 tiles: the same elements through registers (element q: k = kq + q T/BM).
  struct Regs {
    float v[C::BK / (C::kThreads / C::BM)];
  };
  __device__ __forceinline__ void fetch(Regs& rg, int k0) const {
    const L& l = static_cast<const L&>(*this);
    fetch_mlane<C>(l, k0, l.table_base(), l.table_src(), rg.v);
  }
  __device__ __forceinline__ void store(uint32_t* s, const Regs& rg) const {
    constexpr int kStep = C::kThreads / C::BM;
    igemm::store_mlane<C::SA, C::BK / kStep, kStep>(s, kq, row, rg.v);
  }
};

// ---------------------------------------------------------------------------------------------
// Forward: C[m = (n, oy, ox)][oc] = sum over k = (c, ky, kx) of x[n][c][iy][ix] * w[oc][k].
struct FwdProblem {
  int M, N, K;
  ConvGeom g;
  const float* x;  // (N, C, H, W)
  const float* w;  // (OC, C*KH*KW)
  const float* b;  // (OC) or null
  float* y;        // (N, OC, OH, OW)
  bool relu;

  static constexpr bool kMFastOut = true;
  static constexpr bool kClusterSplit = true;

  // Tap table (when table_ints > 0): entry k = {offset of tap k = (c, ky, kx) from the pixel's
  // window origin, tap index r = ky*KW + kx} (r = 31 past K); a per-thread bit mask over r says
  // which taps fall inside the image, so a gathered element costs one shared load, a bit test
  // and an add instead of two divisions and four compares.
  static constexpr bool kHasTable = true;
  int table_ints;
  __device__ __forceinline__ void build_table(int* t, int tid, int nthreads) const {
    for (int k = tid; k < table_ints / 2; k += nthreads) {
      int delta = 0, code = 31;
      if (k < K) {
        const int c = g.div_khw.div(k), r = k - c * g.khw;
        const int ky = g.div_kw.div(r), kx = r - ky * g.kw;
        delta = c * g.hw + ky * g.w + kx;
        code = r;
      }
      t[2 * k] = delta;
      t[2 * k + 1] = code;
    }
  }

  // Thread mapping: one tile row (output pixel) per thread, lanes on consecutive pixels (so
  // the reads of one tap coalesce along ox); k = tid / BM + (T / BM) q.
  template <class C>
  struct ALoader : MLaneLoader<C, ALoader<C>> {
    using Base = MLaneLoader<C, ALoader<C>>;
    using Base::tab, Base::row, Base::mask;  // mask bit r: tap r of the window is in the image
    const FwdProblem& p;
    int off, iy0, ix0;
    __device__ __forceinline__ ALoader(const FwdProblem& p_, int m0, int tid, const int* table)
        : Base(tid, table), p(p_) {
      const int m = m0 + row;
      if (m < p.M) {
        const int n = p.g.div_ohw.div(m), r = m - n * p.g.ohw;
        const int oy = p.g.div_ow.div(r), ox = r - oy * p.g.ow;
        iy0 = oy * p.g.sh - p.g.ph;
        ix0 = ox * p.g.sw - p.g.pw;
        off = n * p.g.chw + iy0 * p.g.w + ix0;
        if (tab) {
          int ky = 0, kx = 0;
          for (int r2 = 0; r2 < p.g.khw; ++r2) {
            if (static_cast<unsigned>(iy0 + ky) < static_cast<unsigned>(p.g.h) &&
                static_cast<unsigned>(ix0 + kx) < static_cast<unsigned>(p.g.w))
              mask |= 1u << r2;
            if (++kx == p.g.kw) {
              kx = 0;
              ++ky;
            }
          }
        }
      } else {
        iy0 = ix0 = kFarAway;
        off = 0;
      }
    }
    // The table path reads p.x + off + entry offset.
    __device__ __forceinline__ int table_base() const { return off; }
    __device__ __forceinline__ const float* table_src() const { return p.x; }
    // Element k of the thread's row without the table: its address (p.x when v is false).
    __device__ __forceinline__ const float* source(int k, bool& v) const {
      const int c = p.g.div_khw.div(k), r = k - c * p.g.khw;
      const int ky = p.g.div_kw.div(r), kx = r - ky * p.g.kw;
      v = k < p.K && static_cast<unsigned>(iy0 + ky) < static_cast<unsigned>(p.g.h) &&
          static_cast<unsigned>(ix0 + kx) < static_cast<unsigned>(p.g.w);
      return v ? p.x + (off + c * p.g.hw + ky * p.g.w + kx) : p.x;
    }
  };

  // Weights (OC, K) are a plain k-contiguous operand.
  template <class C>
  struct BLoader : igemm::StridedLoader<C, C::BN> {
    __device__ __forceinline__ BLoader(const FwdProblem& p, int n0, int tid, const int*)
        : igemm::StridedLoader<C, C::BN>(p.w, p.K, true, p.N, p.K, n0, tid) {}
  };

  __device__ __forceinline__ void apply(int m, int oc, float v, int) const {
    const int n = g.div_ohw.div(m), pix = m - n * g.ohw;
    if (b) v += b[oc];
    if (relu) v = relu_keep_nan(v);
    y[(n * g.oc + oc) * g.ohw + pix] = v;
  }
};

// ---------------------------------------------------------------------------------------------
// Input gradient: C[m = (n, iy, ix)][c] = sum over k = (oc, ky, kx) of dy[n][oc][oy][ox] *
// w[oc][c][ky][kx], where oy = (iy + ph - ky) / sh must be a whole number in [0, OH).
struct DgradProblem {
  int M, N, K;
  ConvGeom g;
  const float* dy;  // (N, OC, OH, OW)
  const float* w;   // (OC, C, KH, KW)
  float* dx;        // (N, C, H, W)

  static constexpr bool kMFastOut = true;
  static constexpr bool kClusterSplit = true;

  // Tap table for unit stride (see FwdProblem): entry k = (oc, ky, kx) -> {offset of dy[oc][iy +
  // ph - ky][ix + pw - kx] from dy[0][iy + ph][ix + pw], r}.
  static constexpr bool kHasTable = true;
  int table_ints;
  __device__ __forceinline__ void build_table(int* t, int tid, int nthreads) const {
    for (int k = tid; k < table_ints / 2; k += nthreads) {
      int delta = 0, code = 31;
      if (k < K) {
        const int oc = g.div_khw.div(k), r = k - oc * g.khw;
        const int ky = g.div_kw.div(r), kx = r - ky * g.kw;
        delta = oc * g.ohw - ky * g.ow - kx;
        code = r;
      }
      t[2 * k] = delta;
      t[2 * k + 1] = code;
    }
  }

  // Thread mapping: one tile row (input pixel) per thread, lanes on consecutive pixels.
  template <class C>
  struct ALoader : MLaneLoader<C, ALoader<C>> {
    using Base = MLaneLoader<C, ALoader<C>>;
    using Base::tab, Base::row, Base::mask;  // table path, mask bit r: tap r reads a dy pixel
    const DgradProblem& p;
    int off, ty0, tx0;
    int base = 0;  // table path: offset of dy[n][0][iy + ph][ix + pw]
    __device__ __forceinline__ ALoader(const DgradProblem& p_, int m0, int tid, const int* table)
        : Base(tid, table), p(p_) {
      const int m = m0 + row;
      if (m < p.M) {
        const int n = p.g.div_hw.div(m), r = m - n * p.g.hw;
        const int iy = p.g.div_w.div(r), ix = r - iy * p.g.w;
        ty0 = iy + p.g.ph;
        tx0 = ix + p.g.pw;
        off = n * p.g.oc * p.g.ohw;
        if (tab) {
          base = off + ty0 * p.g.ow + tx0;
          int ky = 0, kx = 0;
          for (int r2 = 0; r2 < p.g.khw; ++r2) {
            if (static_cast<unsigned>(ty0 - ky) < static_cast<unsigned>(p.g.oh) &&
                static_cast<unsigned>(tx0 - kx) < static_cast<unsigned>(p.g.ow))
              mask |= 1u << r2;
            if (++kx == p.g.kw) {
              kx = 0;
              ++ky;
            }
          }
        }
      } else {
        ty0 = tx0 = kFarAway;
        off = 0;
      }
    }
    // The table path reads p.dy + base + entry offset.
    __device__ __forceinline__ int table_base() const { return base; }
    __device__ __forceinline__ const float* table_src() const { return p.dy; }
    // Element k of the thread's row without the table: its address (p.dy when v is false).
    __device__ __forceinline__ const float* source(int k, bool& v) const {
      const int oc = p.g.div_khw.div(k), r = k - oc * p.g.khw;
      const int ky = p.g.div_kw.div(r), kx = r - ky * p.g.kw;
      int oy = ty0 - ky, ox = tx0 - kx;
      v = k < p.K;
      if (!p.g.unit_stride) {
        v = v && oy >= 0 && ox >= 0;
        const int qy = p.g.div_sh.div(max(oy, 0)), qx = p.g.div_sw.div(max(ox, 0));
        v = v && qy * p.g.sh == oy && qx * p.g.sw == ox;
        oy = qy;
        ox = qx;
      }
      v = v && static_cast<unsigned>(oy) < static_cast<unsigned>(p.g.oh) &&
          static_cast<unsigned>(ox) < static_cast<unsigned>(p.g.ow);
      return v ? p.dy + (off + oc * p.g.ohw + oy * p.g.ow + ox) : p.dy;
    }
  };

  // B[k = (oc, r)][c] = w[(oc*C + c)*KHW + r]: runs of KHW taps are contiguous, so lanes go
  // along k: lane -> k = k0 + lane % 8 [+ 8 q], column c = tid / 8 [+ T/8 j].
  template <class C>
  struct BLoader : KLaneLoader<C, C::BN, C::SB, BLoader<C>> {
    using Base = KLaneLoader<C, C::BN, C::SB, BLoader<C>>;
    using Base::kl, Base::kRows;
    const DgradProblem& p;
    int c0;
    __device__ __forceinline__ BLoader(const DgradProblem& p_, int n0, int tid, const int*)
        : Base(tid), p(p_) {
      c0 = n0 + Base::xl;
    }
    // The thread's elements of the k-tile at k0: addresses (the base pointer where v is false).
    __device__ __forceinline__ void sources(int k0, const float* (&src)[C::BK / 8][kRows],
                                            bool (&v)[C::BK / 8][kRows]) const {
#pragma unroll
      for (int q = 0; q < C::BK / 8; ++q) {
        const int k = k0 + kl + 8 * q;
        const int oc = p.g.div_khw.div(k), r = k - oc * p.g.khw;
        const int koff = oc * p.g.c * p.g.khw + r;
#pragma unroll
        for (int j = 0; j < kRows; ++j) {
          const int c = c0 + j * (C::kThreads / 8);
          v[q][j] = k < p.K && c < p.g.c;
          src[q][j] = v[q][j] ? p.w + (koff + c * p.g.khw) : p.w;
        }
      }
    }
  };

  __device__ __forceinline__ void apply(int m, int c, float v, int) const {
    const int n = g.div_hw.div(m), pix = m - n * g.hw;
    dx[(n * g.c + c) * g.hw + pix] = v;
  }
};

// ---------------------------------------------------------------------------------------------
// One phase of a strided input gradient (kernels/conv/conv2d_dgrad_phase.h): C[m = (n, qy,
// qx)][c] = sum over k = (oc, jy, jx) of dy[n][oc][qy + oy0 - jy][qx + ox0 - jx] *
// w[oc][c][ky0 + sh jy][kx0 + sw jx], written to dx[n][c][py + sh qy][px + sw qx]. Every k is a
// tap that can reach the pixel: only the image border zeroes an element, as at unit stride, and
// the unit-stride tap table applies with (jy, jx) in place of (ky, kx).
struct DgradPhaseProblem {
  int M, N, K;
  ConvGeom g;
  int py, px;     // the phase: dx rows py + sh qy, columns px + sw qx
  int ky0, kx0;   // its first tap
  int tx, taps;   // its taps: taps / tx rows of tx
  int oy0, ox0;   // dy row of tap jy at qy: qy + oy0 - jy (columns alike)
  int cols, qhw;  // pixels of the phase an image: qhw / cols rows of cols
  FastDiv div_qhw, div_cols, div_taps, div_tx;
  const float* dy;  // (N, OC, OH, OW)
  const float* w;   // (OC, C, KH, KW)
  float* dx;        // (N, C, H, W)

  static constexpr bool kMFastOut = true;
  static constexpr bool kClusterSplit = true;

  // Tap table (see FwdProblem) of kp = table_ints / 3 entries: entry k = (oc, jy, jx) -> {offset
  // of dy[oc][ty0 - jy][tx0 - jx] from dy[0][ty0][tx0], r = jy*tx + jx}, then kp ints: the offset
  // of w[oc][0][ky0 + sh jy][kx0 + sw jx] (-1 past K), so that the weight loader needs no divisions
  // either (with them the packed BF16 wide tile spilled). The table is required: the launcher takes
  // the division path (DgradProblem) for a shape whose phase table would not fit.
  static constexpr bool kHasTable = true;
  int table_ints;
  __device__ __forceinline__ void build_table(int* t, int tid, int nthreads) const {
    const int kp = table_ints / 3;
    for (int k = tid; k < kp; k += nthreads) {
      int delta = 0, code = 31, woff = -1;
      if (k < K) {
        const int oc = div_taps.div(k), r = k - oc * taps;
        const int jy = div_tx.div(r), jx = r - jy * tx;
        delta = oc * g.ohw - jy * g.ow - jx;
        code = r;
        woff = weight_offset(oc, jy, jx);
      }
      t[2 * k] = delta;
      t[2 * k + 1] = code;
      t[2 * kp + k] = woff;
    }
  }
  // Offset of w[oc][0][ky0 + sh jy][kx0 + sw jx].
  __device__ __forceinline__ int weight_offset(int oc, int jy, int jx) const {
    return oc * g.c * g.khw + (ky0 + g.sh * jy) * g.kw + kx0 + g.sw * jx;
  }

  // Thread mapping: one tile row (pixel of the phase) per thread, lanes on consecutive pixels;
  // k = tid / BM + (T / BM) q. Always through the tap table (the launcher builds one for every
  // phase it runs), so there is no division fallback to carry (it cost the packed BF16 wide tile
  // a spill).
  template <class C>
  struct ALoader {
    const int2* tab;
    const float* dy;
    int row, kq;
    unsigned mask = 0;  // bit r: tap r of the phase reads a dy pixel
    int base = 0;       // offset of dy[n][0][qy + oy0][qx + ox0]
    __device__ __forceinline__ ALoader(const DgradPhaseProblem& p, int m0, int tid,
                                       const int* table)
        : tab(reinterpret_cast<const int2*>(table)), dy(p.dy), row(tid % C::BM), kq(tid / C::BM) {
      const int m = m0 + row;
      if (m >= p.M) return;  // mask 0: every element is zero
      const int n = p.div_qhw.div(m), r = m - n * p.qhw;
      const int qy = p.div_cols.div(r), qx = r - qy * p.cols;
      const int ty0 = qy + p.oy0, tx0 = qx + p.ox0;
      base = n * p.g.oc * p.g.ohw + ty0 * p.g.ow + tx0;
      int jy = 0, jx = 0;
      for (int r2 = 0; r2 < p.taps; ++r2) {
        if (static_cast<unsigned>(ty0 - jy) < static_cast<unsigned>(p.g.oh) &&
            static_cast<unsigned>(tx0 - jx) < static_cast<unsigned>(p.g.ow))
          mask |= 1u << r2;
        if (++jx == p.tx) {
          jx = 0;
          ++jy;
        }
      }
    }
    __device__ __forceinline__ void load(float* s, int k0) const {
      gather_by_table<C>(tab, k0, kq, row, mask, base, dy, s);
    }
    // Packed BF16 tiles: the same elements through registers (element q: k = kq + q T/BM).
    struct Regs {
      float v[C::BK / (C::kThreads / C::BM)];
    };
    __device__ __forceinline__ void fetch(Regs& rg, int k0) const {
      fetch_by_table<C>(tab, k0, kq, mask, base, dy, rg.v);
    }
    __device__ __forceinline__ void store(uint32_t* s, const Regs& rg) const {
      constexpr int kStep = C::kThreads / C::BM;
      igemm::store_mlane<C::SA, C::BK / kStep, kStep>(s, kq, row, rg.v);
    }
  };

  // B[k = (oc, jy, jx)][c] = w[oc][c][ky0 + sh jy][kx0 + sw jx]: lanes along k as in
  // DgradProblem (a phase's taps of one (oc, c) are no longer contiguous, but a k-tile's still
  // fall within a few rows of w).
  template <class C>
  struct BLoader : KLaneLoader<C, C::BN, C::SB, BLoader<C>> {
    using Base = KLaneLoader<C, C::BN, C::SB, BLoader<C>>;
    using Base::kl, Base::kRows;
    const DgradPhaseProblem& p;
    const int* woffs;  // the table's weight offsets by k (-1 past K)
    const float* wc;   // w[0][c0]
    int live;          // the thread's columns c0 + j T/8 below C: j < live
    __device__ __forceinline__ BLoader(const DgradPhaseProblem& p_, int n0, int tid,
                                       const int* table)
        : Base(tid), p(p_) {
      woffs = table + 2 * (p.table_ints / 3);
      const int c0 = n0 + Base::xl;
      constexpr int kStep = C::kThreads / 8;
      live = c0 < p.g.c ? (p.g.c - c0 + kStep - 1) / kStep : 0;
      wc = p.w + (c0 < p.g.c ? c0 * p.g.khw : 0);
    }
    // The thread's elements of the k-tile at k0: addresses (the base pointer where v is false).
    // The table covers K rounded up to 32, so every k of a k-tile has an entry.
    __device__ __forceinline__ void sources(int k0, const float* (&src)[C::BK / 8][kRows],
                                            bool (&v)[C::BK / 8][kRows]) const {
      constexpr int kStep = C::kThreads / 8;
#pragma unroll
      for (int q = 0; q < C::BK / 8; ++q) {
        const int koff = woffs[k0 + kl + 8 * q];
#pragma unroll
        for (int j = 0; j < kRows; ++j) {
          v[q][j] = koff >= 0 && j < live;
          src[q][j] = v[q][j] ? wc + (koff + j * kStep * p.g.khw) : p.w;
        }
      }
    }
  };

  __device__ __forceinline__ void apply(int m, int c, float v, int) const {
    const int n = div_qhw.div(m), r = m - n * qhw;
    const int qy = div_cols.div(r), qx = r - qy * cols;
    dx[(n * g.c + c) * g.hw + (py + g.sh * qy) * g.w + px + g.sw * qx] = v;
  }
};

// The phases of one strided input gradient stacked along M in one grid (gemm_tile.cuh,
// kStackedAlongM): phase i's rows start at start[i], a multiple of kRowAlign, so no block tile
// straddles two phases, and each block runs its phase's loaders, K and tap table. One launch
// instead of one a phase: alone, a phase of a ResNet's stride-2 layer is a GEMM of 49-196 block
// tiles, a fraction of a wave each.
struct DgradPhaseStack {
  static constexpr int kMaxPhases = 4;   // stride 2 x 2; more phases run one launch a phase
  static constexpr int kRowAlign = 128;  // a multiple of every BM the launcher picks
  int M, N, K;                           // K: the longest phase's (the launcher's split choice)
  int count;
  int start[kMaxPhases];
  DgradPhaseProblem ph[kMaxPhases];
  int table_ints;  // the largest phase's (shared memory for any block's table)

  static constexpr bool kMFastOut = true;
  static constexpr bool kClusterSplit = true;
  static constexpr bool kHasTable = true;
  static constexpr bool kStackedAlongM = true;

  // The phase of stacked row m.
  __device__ __forceinline__ int part(int m) const {
    int i = 0;
    while (i + 1 < count && m >= start[i + 1]) ++i;
    return i;
  }
  __device__ __forceinline__ int k_of(int m0) const { return ph[part(m0)].K; }
  __device__ __forceinline__ void build_table_of(int* t, int tid, int nthreads, int m0) const {
    ph[part(m0)].build_table(t, tid, nthreads);
  }

  template <class C>
  struct ALoader {
    static_assert(kRowAlign % C::BM == 0, "a block tile must not straddle two phases");
    using Inner = typename DgradPhaseProblem::template ALoader<C>;
    using Regs = typename Inner::Regs;
    Inner in;
    __device__ __forceinline__ ALoader(const DgradPhaseStack& p, int m0, int tid, const int* table)
        : in(p.ph[p.part(m0)], m0 - p.start[p.part(m0)], tid, table) {}
    __device__ __forceinline__ void load(float* s, int k0) const { in.load(s, k0); }
    __device__ __forceinline__ void fetch(Regs& rg, int k0) const { in.fetch(rg, k0); }
    __device__ __forceinline__ void store(uint32_t* s, const Regs& rg) const { in.store(s, rg); }
  };
  // The block's phase from its row tile (igemm_body: m0 = blockIdx.x * BM).
  template <class C>
  struct BLoader {
    using Inner = typename DgradPhaseProblem::template BLoader<C>;
    using Regs = typename Inner::Regs;
    Inner in;
    __device__ __forceinline__ BLoader(const DgradPhaseStack& p, int n0, int tid, const int* table)
        : in(p.ph[p.part(int(blockIdx.x) * C::BM)], n0, tid, table) {}
    __device__ __forceinline__ void load(float* s, int k0) const { in.load(s, k0); }
    __device__ __forceinline__ void fetch(Regs& rg, int k0) const { in.fetch(rg, k0); }
    __device__ __forceinline__ void store(uint32_t* s, const Regs& rg) const { in.store(s, rg); }
  };

  // Rows past a phase's own M (its padding up to the next start) are not written.
  __device__ __forceinline__ void apply(int m, int c, float v, int split) const {
    const int i = part(m), r = m - start[i];
    if (r < ph[i].M) ph[i].apply(r, c, v, split);
  }
};

// ---------------------------------------------------------------------------------------------
// Weight gradient: C[oc][j = (c, ky, kx)] = sum over k = (n, oy, ox) of dy[n][oc][oy][ox] *
// x[n][c][iy][ix]; column j = C*KH*KW (when db is wanted) multiplies by ones and yields db.
struct WgradProblem {
  int M, N, K;
  ConvGeom g;
  const float* x;   // (N, C, H, W)
  const float* dy;  // (N, OC, OH, OW)
  float* dw;        // (OC, C*KH*KW), accumulated
  float* db;        // (OC) or null, accumulated
  float* scratch;   // deterministic: (splits, slots) partial tiles; else null
  int slots;        // OC*C*KH*KW (+ OC with db)

  static constexpr bool kMFastOut = false;  // dw rows run along j
  static constexpr bool kClusterSplit = false;
  static constexpr bool kHasTable = false;

  // A[oc][k] = dy[(n*OC + oc)*OHW + pix]: lanes along k (output pixels, contiguous).
  // Thread mapping: k = k0 + tid % 8 [+ 8 q], row oc = m0 + tid / 8 [+ T/8 j].
  template <class C>
  struct ALoader : KLaneLoader<C, C::BM, C::SA, ALoader<C>> {
    using Base = KLaneLoader<C, C::BM, C::SA, ALoader<C>>;
    using Base::kl, Base::kRows;
    const WgradProblem& p;
    int r0;
    __device__ __forceinline__ ALoader(const WgradProblem& p_, int m0, int tid, const int*)
        : Base(tid), p(p_) {
      r0 = m0 + Base::xl;
    }
    // The thread's elements of the k-tile at k0: addresses (the base pointer where v is false).
    __device__ __forceinline__ void sources(int k0, const float* (&src)[C::BK / 8][kRows],
                                            bool (&v)[C::BK / 8][kRows]) const {
#pragma unroll
      for (int q = 0; q < C::BK / 8; ++q) {
        const int k = k0 + kl + 8 * q;
        const int n = p.g.div_ohw.div(k), pix = k - n * p.g.ohw;
        const int koff = n * p.g.oc * p.g.ohw + pix;
#pragma unroll
        for (int j = 0; j < kRows; ++j) {
          const int oc = r0 + j * (C::kThreads / 8);
          v[q][j] = k < p.K && oc < p.g.oc;
          src[q][j] = v[q][j] ? p.dy + (koff + oc * p.g.ohw) : p.dy;
        }
      }
    }
  };

  // B[k][j] = x[n][c][oy*sh - ph + ky][ox*sw - pw + kx]: lanes along k (consecutive output
  // pixels read consecutive input pixels). Each thread's columns j are fixed for the whole K
  // loop, so their (c, ky, kx) offsets are computed once.
  template <class C>
  struct BLoader : KLaneLoader<C, C::BN, C::SB, BLoader<C>> {
    using Base = KLaneLoader<C, C::BN, C::SB, BLoader<C>>;
    using Base::kl, Base::kRows;
    const WgradProblem& p;
    int joff[kRows], jy[kRows], jx[kRows];
    unsigned ones = 0;  // bit j: column j is the ones column (db)
    __device__ __forceinline__ BLoader(const WgradProblem& p_, int n0, int tid, const int*)
        : Base(tid), p(p_) {
      const int ckhw = p.g.c * p.g.khw;
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        const int col = n0 + Base::xl + j * (C::kThreads / 8);
        joff[j] = 0;
        jy[j] = jx[j] = kFarAway;  // never inside the image: reads padding (zero)
        if (col < ckhw) {
          const int c = p.g.div_khw.div(col), r = col - c * p.g.khw;
          const int ky = p.g.div_kw.div(r), kx = r - ky * p.g.kw;
          joff[j] = c * p.g.hw + ky * p.g.w + kx;
          jy[j] = ky;
          jx[j] = kx;
        } else if (col < p.N) {
          ones |= 1u << j;
        }
      }
    }
    // The thread's elements of the k-tile at k0: addresses (the base pointer where v is false).
    __device__ __forceinline__ void sources(int k0, const float* (&src)[C::BK / 8][kRows],
                                            bool (&v)[C::BK / 8][kRows]) const {
#pragma unroll
      for (int q = 0; q < C::BK / 8; ++q) {
        const int k = k0 + kl + 8 * q;
        const int n = p.g.div_ohw.div(k), pix = k - n * p.g.ohw;
        const int oy = p.g.div_ow.div(pix), ox = pix - oy * p.g.ow;
        const int iy0 = oy * p.g.sh - p.g.ph, ix0 = ox * p.g.sw - p.g.pw;
        const int xoff = n * p.g.chw + iy0 * p.g.w + ix0;
        const bool kv = k < p.K;
#pragma unroll
        for (int j = 0; j < kRows; ++j) {
          const bool one = (ones >> j) & 1u;
          const bool inside = static_cast<unsigned>(iy0 + jy[j]) < static_cast<unsigned>(p.g.h) &&
                              static_cast<unsigned>(ix0 + jx[j]) < static_cast<unsigned>(p.g.w);
          v[q][j] = kv && (one || inside);
          src[q][j] = v[q][j] ? (one ? &kOneF : p.x + (xoff + joff[j])) : p.x;
        }
      }
    }
  };

  __device__ __forceinline__ void apply(int oc, int j, float v, int split) const {
    const int ckhw = g.c * g.khw;
    const int slot = (j < ckhw) ? oc * ckhw + j : g.oc * ckhw + oc;
    if (scratch) {
      scratch[static_cast<int64_t>(split) * slots + slot] = v;
    } else if (j < ckhw) {
      atomicAdd(dw + slot, v);
    } else {
      atomicAdd(db + oc, v);
    }
  }
};

// Second stage of the deterministic weight gradient: target[i] += sum over splits of
// scratch[split][i], in split order. Thread mapping: one slot per thread (grid-stride).
__global__ void wgrad_reduce_splits(const float* __restrict__ d_scratch, int splits, int slots,
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

// ---------------------------------------------------------------------------------------------
// Tile choices (128 threads each):
//   Wide   128x64: forward / input gradient with more than 32 output columns (conv2 forward:
//          OC = 64): 8x8 FFMA micro-tiles or 32x64 MMA warp tiles, the most work per loaded
//          element and the most independent accumulators per warp;
//   Narrow 128x32: at most 32 output columns (conv2's input gradient: C = 32; conv1: OC = 32);
//   Square 64x64:  the weight gradient (M = OC is small, N = C*KH*KW large).
// All keep 4 stages in flight (3 ahead of the math): the long-scoreboard stalls of the
// 3-stage version were the load latency of the gathers.
using igemm::Mma;
template <Mma kMma>
using CfgWide = igemm::Cfg<128, 64, 16, 128, 4, kMma>;
template <Mma kMma>
using CfgNarrow = igemm::Cfg<128, 32, 16, 128, 4, kMma>;
template <Mma kMma>
using CfgSquare = igemm::Cfg<64, 64, 16, 128, 4, kMma>;
// Packed BF16 tiles (CNN_BF16_SMEM=bf16): the same block tiles, 32 k a tile in two shared stages
// (32 k of bf16 pairs take the bytes of 16 k of floats) and one k-tile in flight in registers.
using CfgWidePacked = igemm::Cfg<128, 64, 32, 128, 2, Mma::Bf16, true>;
using CfgNarrowPacked = igemm::Cfg<128, 32, 32, 128, 2, Mma::Bf16, true>;
using CfgSquarePacked = igemm::Cfg<64, 64, 32, 128, 2, Mma::Bf16, true>;

bool packed(Bf16Tiles tiles) {
  return tiles == Bf16Tiles::Packed ||
         (tiles == Bf16Tiles::Auto && process_env_switches().bf16_smem_packed);
}

// Runs a full-K-epilogue problem (forward, input gradient). K is split across a cluster
// (summed in a fixed order through distributed shared memory) until the grid has ~2.5 blocks
// per SM: the short-scoreboard and MMA latencies need more resident warps than one tile row
// of blocks gives.
// A split keeps at least 128 k (8 k-tiles of 16, 4 of 32).
template <class CNarrow, class CWide, class P>
void run_full(const P& p, cudaStream_t stream, const char* name) {
  const igemm::DeviceInfo dev = igemm::device_info();
  const int64_t target = static_cast<int64_t>(dev.sms) * 5 / 2;
  auto go = [&](auto cfg) {
    using C = decltype(cfg);
    const int64_t tiles = ceil_div<int64_t>(p.M, C::BM) * ceil_div<int64_t>(p.N, C::BN);
    const int splits =
        dev.clusters ? igemm::pick_splits(tiles, ceil_div(p.K, C::BK), target, 8, 128 / C::BK) : 1;
    igemm::launch<C>(p, splits, stream, name);
  };
  if (p.N <= 32)
    go(CNarrow{});
  else
    go(CWide{});
}

// The precision's tiles: FP32 FFMA or 3xTF32, TF32, BF16 on float or (CNN_BF16_SMEM) packed
// tiles. Launch names: the kernel's name and the precision's suffix (_simt, _3xtf32, _tf32,
// _bf16, _bf16_packed).
struct LaunchNames {
  const char *simt, *tf32x3, *tf32, *bf16, *bf16_packed;
};
#define CNN_IGEMM_NAMES(base)                                                     \
  LaunchNames {                                                                   \
    base "_simt", base "_3xtf32", base "_tf32", base "_bf16", base "_bf16_packed" \
  }
template <class P>
void run_full_for(const P& p, Precision precision, Bf16Tiles tiles, Fp32Math fp32,
                  cudaStream_t stream, const LaunchNames& names) {
  if (precision == Precision::TF32)
    run_full<CfgNarrow<Mma::Tf32>, CfgWide<Mma::Tf32>>(p, stream, names.tf32);
  else if (precision == Precision::BF16 && packed(tiles))
    run_full<CfgNarrowPacked, CfgWidePacked>(p, stream, names.bf16_packed);
  else if (precision == Precision::BF16)
    run_full<CfgNarrow<Mma::Bf16>, CfgWide<Mma::Bf16>>(p, stream, names.bf16);
  else if (fp32 == Fp32Math::Tf32x3)
    run_full<CfgNarrow<Mma::Tf32x3>, CfgWide<Mma::Tf32x3>>(p, stream, names.tf32x3);
  else
    run_full<CfgNarrow<Mma::Simt>, CfgWide<Mma::Simt>>(p, stream, names.simt);
}

void check_int32(const Conv2dShape& s, const char* op) {
  const int64_t x = int64_t{s.n} * s.c * s.h * s.w;
  const int64_t y = int64_t{s.n} * s.oc * s.oh() * s.ow();
  const int64_t w = int64_t{s.oc} * s.c * s.kh * s.kw + s.oc;
  CNN_CHECK(x < INT_MAX && y < INT_MAX && w < INT_MAX,
            "{}: tensors of {} / {} / {} elements exceed the 2^31 limit of the igemm kernels", op,
            x, y, w);
}

// Ints of the tap table for a K-long reduction over khw taps (0: gather by division instead).
// The table covers K rounded up to a multiple of every BK used (32) and stays within 32 KB.
int tap_table_ints(int K, int khw) {
  const int k_pad = (K + 31) / 32 * 32;
  return (khw <= 31 && k_pad <= 4096) ? 2 * k_pad : 0;
}

int wgrad_splits(const Conv2dShape& s) {
  const int64_t positions = int64_t{s.n} * s.oh() * s.ow();
  return static_cast<int>(std::max<int64_t>(1, ceil_div<int64_t>(positions, kWgradChunk)));
}

int wgrad_slots(const Conv2dShape& s, bool with_db) {
  return s.oc * s.c * s.kh * s.kw + (with_db ? s.oc : 0);
}

// CNN_CONV_GENERIC=1 makes Auto take the generic kernels (to bisect the dedicated ones).
bool generic_from_env() {
  return process_env_switches().conv_generic;
}

bool use_dedicated_wgrad(const Conv2dShape& s, IgemmVariant variant) {
  if (variant == IgemmVariant::Generic) return false;
  if (variant == IgemmVariant::Auto && generic_from_env()) return false;
  return conv2d_wgrad_dedicated_supported(s);
}

// The window kernel where asked for and it takes the shape, or, under Auto, where it is expected
// to be faster, with CNN_CONV_WGRAD_WINDOW=1 (off by default: slower than the dedicated kernel
// on the H200 so far); CNN_CONV_GENERIC=1 turns it off.
bool use_window_wgrad(const Conv2dShape& s, const Exec& ex, IgemmVariant variant) {
  if (variant == IgemmVariant::Window) return wgrad_window_supported(s, ex.precision);
  if (variant != IgemmVariant::Auto || generic_from_env()) return false;
  return process_env_switches().conv_wgrad_window && wgrad_window_preferred(s, ex);
}

bool use_dedicated_dgrad(const Conv2dShape& s, const Exec& ex, IgemmVariant variant) {
  if (variant == IgemmVariant::Generic) return false;
  if (variant == IgemmVariant::Auto && generic_from_env()) return false;
  return conv2d_dgrad_dedicated_supported(s, ex);
}

// Ints of a phase's table (DgradPhaseProblem::build_table: tap entries, then weight offsets); 0
// where it would not fit (more than 31 taps, OC * taps above 4096).
int phase_table_ints(int K, int taps) {
  return tap_table_ints(K, taps) / 2 * 3;
}

// Strided input gradients run by phases unless told otherwise (DgradStrided) or a phase's table
// would not fit (the phase problem has no gather without it).
bool use_dgrad_phases(const Conv2dShape& s, DgradStrided strided) {
  if (s.stride_h == 1 && s.stride_w == 1) return false;
  if (strided == DgradStrided::Division) return false;
  if (strided == DgradStrided::Auto && !process_env_switches().conv_dgrad_phases) return false;
  for (const DgradPhase& ph : dgrad_phases(s))
    if (ph.taps() > 0 && phase_table_ints(s.oc * ph.taps(), ph.taps()) == 0) return false;
  return true;
}

// One implicit GEMM a phase with taps: all of them stacked in one launch (DgradPhaseStack) where
// there are at most kMaxPhases, else one after the other on ex.stream (each dx element belongs to
// exactly one phase: no atomics, the result does not depend on the order).
void run_dgrad_phases(const Conv2dShape& s, const float* d_dy, const float* d_w, float* d_dx,
                      const Exec& ex, Bf16Tiles tiles, Fp32Math fp32) {
  const std::vector<DgradPhase> phases = dgrad_phases(s);
  bool tapless = false;
  for (const DgradPhase& ph : phases) tapless = tapless || (ph.pixels() > 0 && ph.taps() == 0);
  // dx is overwritten by contract, so the pixels that no tap reaches must become zeros.
  if (tapless && s.n > 0 && s.c > 0)
    CNN_CUDA_CHECK(cudaMemsetAsync(
        d_dx, 0, sizeof(float) * static_cast<std::size_t>(s.n) * s.c * s.h * s.w, ex.stream));
  std::vector<DgradPhaseProblem> gemms;
  for (const DgradPhase& ph : phases) {
    if (ph.pixels() == 0 || ph.taps() == 0) continue;
    DgradPhaseProblem p{};
    p.g = geom_of(s);
    p.py = ph.py;
    p.px = ph.px;
    p.ky0 = ph.y.first;
    p.kx0 = ph.x.first;
    p.tx = ph.x.taps;
    p.taps = ph.taps();
    p.oy0 = ph.y.origin;
    p.ox0 = ph.x.origin;
    p.cols = ph.x.count;
    p.qhw = ph.pixels();
    p.div_qhw = FastDiv(p.qhw);
    p.div_cols = FastDiv(p.cols);
    p.div_taps = FastDiv(p.taps);
    p.div_tx = FastDiv(p.tx);
    p.M = s.n * p.qhw;
    p.N = s.c;
    p.K = s.oc * p.taps;
    p.dy = d_dy;
    p.w = d_w;
    p.dx = d_dx;
    p.table_ints = phase_table_ints(p.K, p.taps);
    if (p.M == 0 || p.N == 0) continue;
    gemms.push_back(p);
  }
  if (gemms.size() > 1 && gemms.size() <= DgradPhaseStack::kMaxPhases) {
    DgradPhaseStack st{};
    st.N = s.c;
    st.count = static_cast<int>(gemms.size());
    int64_t rows = 0;  // the stack's M; launched only below 2^31
    for (int i = 0; i < st.count; ++i) {
      const DgradPhaseProblem& p = gemms[static_cast<std::size_t>(i)];
      st.ph[i] = p;
      st.start[i] = static_cast<int>(std::min<int64_t>(rows, INT_MAX));
      rows += ceil_div<int64_t>(p.M, DgradPhaseStack::kRowAlign) * DgradPhaseStack::kRowAlign;
      st.K = std::max(st.K, p.K);
      st.table_ints = std::max(st.table_ints, p.table_ints);
    }
    if (rows < INT_MAX) {
      st.M = static_cast<int>(rows);
      run_full_for(st, ex.precision, tiles, fp32, ex.stream,
                   CNN_IGEMM_NAMES("conv2d_backward_data_igemm_phases"));
      return;
    }
  }
  for (const DgradPhaseProblem& p : gemms)
    run_full_for(p, ex.precision, tiles, fp32, ex.stream,
                 CNN_IGEMM_NAMES("conv2d_backward_data_igemm_phase"));
}

}  // namespace

void conv2d_forward_igemm_cuda(const Conv2dShape& s, const float* d_x, const float* d_w,
                               const float* d_b, float* d_y, bool relu, const Exec& ex,
                               Bf16Tiles tiles, Fp32Math fp32) {
  check_int32(s, "conv2d_forward_igemm");
  FwdProblem p{};
  p.g = geom_of(s);
  p.M = s.n * p.g.ohw;
  p.N = s.oc;
  p.K = s.c * p.g.khw;
  p.x = d_x;
  p.w = d_w;
  p.b = d_b;
  p.y = d_y;
  p.relu = relu;
  p.table_ints = tap_table_ints(p.K, p.g.khw);
  if (p.M == 0 || p.N == 0) return;
  run_full_for(p, ex.precision, tiles, fp32, ex.stream, CNN_IGEMM_NAMES("conv2d_forward_igemm"));
}

void conv2d_backward_data_igemm_cuda(const Conv2dShape& s, const float* d_dy, const float* d_w,
                                     float* d_dx, const Exec& ex, IgemmVariant variant,
                                     Bf16Tiles tiles, DgradStrided strided, Fp32Math fp32) {
  check_int32(s, "conv2d_backward_data_igemm");
  if (use_dedicated_dgrad(s, ex, variant)) {
    conv2d_backward_data_dedicated_cuda(s, d_dy, d_w, d_dx, ex);
    return;
  }
  if (use_dgrad_phases(s, strided)) {
    run_dgrad_phases(s, d_dy, d_w, d_dx, ex, tiles, fp32);
    return;
  }
  DgradProblem p{};
  p.g = geom_of(s);
  p.M = s.n * p.g.hw;
  p.N = s.c;
  p.K = s.oc * p.g.khw;
  p.dy = d_dy;
  p.w = d_w;
  p.dx = d_dx;
  p.table_ints = p.g.unit_stride ? tap_table_ints(p.K, p.g.khw) : 0;
  if (p.M == 0 || p.N == 0) return;
  run_full_for(p, ex.precision, tiles, fp32, ex.stream,
               CNN_IGEMM_NAMES("conv2d_backward_data_igemm"));
}

std::size_t conv2d_backward_weight_igemm_scratch_floats(const Conv2dShape& s, const Exec& ex) {
  if (!ex.deterministic) return 0;
  // Sized for the db slots too, so the same buffer serves calls with and without db; and for
  // every variant, so the variant can change without reallocating.
  const std::size_t generic =
      static_cast<std::size_t>(wgrad_splits(s)) * static_cast<std::size_t>(wgrad_slots(s, true));
  const std::size_t dedicated =
      conv2d_wgrad_dedicated_supported(s) ? conv2d_wgrad_dedicated_scratch_floats(s, ex) : 0;
  return std::max({generic, dedicated, wgrad_window_scratch_floats(s, ex)});
}

void conv2d_backward_weight_igemm_cuda(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                       float* d_dw, float* d_db, float* d_scratch, const Exec& ex,
                                       IgemmVariant variant, Bf16Tiles tiles) {
  check_int32(s, "conv2d_backward_weight_igemm");
  CNN_CHECK(!ex.deterministic || d_scratch,
            "conv2d_backward_weight_igemm: deterministic mode needs {} floats of scratch, got null",
            conv2d_backward_weight_igemm_scratch_floats(s, ex));
  if (use_window_wgrad(s, ex, variant)) {
    conv2d_backward_weight_window_cuda(s, d_x, d_dy, d_dw, d_db, d_scratch, ex);
    return;
  }
  if (use_dedicated_wgrad(s, variant)) {
    conv2d_backward_weight_dedicated_cuda(s, d_x, d_dy, d_dw, d_db, d_scratch, ex);
    return;
  }
  WgradProblem p{};
  p.g = geom_of(s);
  const bool with_db = d_db != nullptr;
  const int ckhw = s.c * p.g.khw;
  p.M = s.oc;
  p.N = ckhw + (with_db ? 1 : 0);
  p.K = s.n * p.g.ohw;
  p.x = d_x;
  p.dy = d_dy;
  p.dw = d_dw;
  p.db = d_db;
  p.scratch = ex.deterministic ? d_scratch : nullptr;
  p.slots = wgrad_slots(s, with_db);
  if (p.K == 0) return;
  const int splits = wgrad_splits(s);
  if (ex.precision == Precision::TF32)
    igemm::launch<CfgSquare<Mma::Tf32>>(p, splits, ex.stream, "conv2d_backward_weight_igemm_tf32");
  else if (ex.precision == Precision::BF16 && packed(tiles))
    igemm::launch<CfgSquarePacked>(p, splits, ex.stream,
                                   "conv2d_backward_weight_igemm_bf16_packed");
  else if (ex.precision == Precision::BF16)
    igemm::launch<CfgSquare<Mma::Bf16>>(p, splits, ex.stream, "conv2d_backward_weight_igemm_bf16");
  else
    igemm::launch<CfgSquare<Mma::Simt>>(p, splits, ex.stream, "conv2d_backward_weight_igemm_simt");
  if (ex.deterministic) {
    constexpr int kBlock = 256;
    const int blocks =
        static_cast<int>(std::min<int64_t>(ceil_div<int64_t>(p.slots, kBlock), 4096));
    wgrad_reduce_splits<<<blocks, kBlock, 0, ex.stream>>>(d_scratch, splits, p.slots, s.oc * ckhw,
                                                          d_dw, d_db);
    CNN_LAUNCH_CHECK("wgrad_reduce_splits");
  }
}

}  // namespace cnn
