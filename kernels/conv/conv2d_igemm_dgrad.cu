// Input gradient, dedicated kernel (see conv2d_igemm_dgrad.h): C (M = N*H*W, N = C) = A (M, K) B
// (K, N) with K = OC*KH*KW, stride 1, TF32 mma.sync m16n8k8 with FP32 accumulation.
//
// Slab. Think of dy as one tall zero-padded image: image n occupies virtual rows n*PH .. n*PH +
// PH - 1 (PH = H + KH - 1) and columns 0 .. PW - 1 (PW = W + KW - 1); virtual (row, col) holds
// dy[n][oc][row - n*PH - (KH-1) + ph][col - (KW-1) + pw] when that lies inside dy, else 0. Pixel
// (n, iy, ix) with tap (ky, kx) reads virtual (n*PH + iy + KH-1-ky, ix + KW-1-kx). A block's 64
// consecutive pixels (possibly spanning images) touch `rows` consecutive virtual rows from
// vlo = n_first*PH + iy_first on; per chunk of 8 output channels the block copies those rows
// (4-byte cp.async, zero-filled outside dy; a per-block table gives each slab element's dy
// offset) and the chunk's weights w[oc][c0 .. c0+31][taps] (contiguous: 16-byte copies when
// C*KH*KW % 4 == 0 and w is 16-byte aligned). Then
//   A[m][k = (oc_l, ky, kx)] = slab[pb(m) + ta(k)],  B[k][c] = wsm[c_l*KHW + tb(k)]
// with pb per fragment row (fixed for the block), {ta, tb} from a per-block table of the chunk's
// 8*KHW k (a multiple of 8: no padded k). Rows past M read a valid slab address and are never
// stored; channels past OC are zero in both operands; weight columns past C are stale shared
// memory that only reaches accumulator columns that are never stored.
// Warps: 4 per block; warp w owns the 32x32 tile at rows (w % 2) 32 and takes the k8 steps
// s = w / 2, w / 2 + 2, ... of every chunk (an in-block split of K); the two halves are summed in
// a fixed order through shared memory at the end (bitwise repeatable).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_igemm_dgrad.h"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kBM = 64, kBN = 32, kThreads = 128, kOcChunk = 8, kMaxKhw = 25;
constexpr int kCsStride = kBN + 4;                 // epilogue partial tile [BM][BN + 4]
constexpr std::size_t kMaxSmemBytes = 100 * 1024;  // keeps >= 2 blocks per SM

using ptx::cp_async16;
using ptx::cp_async4;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::mma_tf32;
using ptx::to_tf32;
using Div = ptx::FastDiv;

struct DgParams {
  const float* dy;  // (N, OC, OH, OW)
  const float* w;   // (OC, C, KH, KW)
  float* dx;        // (N, C, H, W)
  int M, n, c, oc, hw, w_, kh, kw, khw, ph, pw, oh, ow, ohw;
  int PH, PW;  // virtual rows per image, virtual columns
  int slab;    // slab floats per output channel: rows * PW
  int sls;     // slab stride per output channel (slab rounded up to 4)
  int wsz;     // weight floats per output channel in shared memory: BN * KHW
  int stage;   // floats per pipeline stage: kOcChunk * (wsz + sls)
  int pipe;    // floats of the two stages (at least the epilogue tile)
  int chunks;  // ceil(OC / kOcChunk)
  bool vec_w;  // 16-byte weight copies
  Div div_hw, div_w, div_pw, div_ph;
};

// Thread mapping. Staging: thread tid copies slab elements tid + 128 e (all 8 channels of each)
// and weight chunks tid + 128 e of every channel. Math: lane (g, t) = (lane / 4, lane % 4) of
// warp w holds the m16n8k8 fragments of rows (w % 2) 32 + 16 i + g [+ 8] and columns 8 j + g
// (B) / 8 j + 2 t [+ 1] (C); k slot t <-> k 2t, slot t + 4 <-> k 2t + 1 of each k8 step (the
// same permutation for A and B, so the dot product is unchanged; one 16-byte table read gives
// both). Epilogue: the warps of K half 0 add the half-1 partials and store their own fragments.
// Block (bx, by) = (64-pixel tile, 32-channel tile).
template <int kKhw>
__global__ void __launch_bounds__(kThreads, 3)
    dgrad_slab_kernel(const __grid_constant__ DgParams p) {
  ptx::griddep_enter();
  extern __shared__ float4 smem_f4[];
  float* smem = reinterpret_cast<float*>(smem_f4);
  const int khw = kKhw ? kKhw : p.khw;
  const int kc = kOcChunk * khw;                       // k per chunk (a multiple of 8)
  int* stab = reinterpret_cast<int*>(smem + p.pipe);   // [sls]
  int2* ttab = reinterpret_cast<int2*>(stab + p.sls);  // [kc]
  const int tid = threadIdx.x;
  const int m0 = blockIdx.x * kBM, c0 = blockIdx.y * kBN;
  const int na = p.div_hw.div(m0);
  const int iya = p.div_w.div(m0 - na * p.hw);

  // Slab table: dy offset (channel 0) of each slab element, -1 where it is padding.
  for (int e = tid; e < p.slab; e += kThreads) {
    const int vr = p.div_pw.div(e), pc = e - vr * p.PW;
    const int v = iya + vr;  // virtual row relative to image na
    const int dn = p.div_ph.div(v), pr = v - dn * p.PH;
    const int n = na + dn;
    const int oy = pr - (p.kh - 1) + p.ph, ox = pc - (p.kw - 1) + p.pw;
    int s = -1;
    if (n < p.n && static_cast<unsigned>(oy) < static_cast<unsigned>(p.oh) &&
        static_cast<unsigned>(ox) < static_cast<unsigned>(p.ow))
      s = n * p.oc * p.ohw + oy * p.ow + ox;
    stab[e] = s;
  }
  // Tap table of a chunk: k = (oc_l, ky, kx) -> {slab offset from the pixel's base, weight offset
  // from the column's base}.
  for (int k = tid; k < kc; k += kThreads) {
    const int ocl = k / khw, r = k - ocl * khw;
    const int ky = r / p.kw, kx = r - ky * p.kw;
    ttab[k] = make_int2(ocl * p.sls - ky * p.PW - kx, ocl * p.wsz + r);
  }

  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wm = (warp % 2) * 32, half = warp / 2;
  // Fragment rows q = 2 i + h: row wm + 16 i + 8 h + g. pb: slab offset of the pixel's tap
  // (0, 0) in channel 0 (tap offsets ta = oc_l sls - ky PW - kx are added to it); dxo: dx offset
  // of (pixel, channel 0), -1 past M.
  int pb[4], dxo[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int m = m0 + wm + 16 * (q / 2) + 8 * (q % 2) + g;
    pb[q] = (p.kh - 1) * p.PW + (p.kw - 1);  // a valid address for rows past M
    dxo[q] = -1;
    if (m < p.M) {
      const int n = p.div_hw.div(m), pix = m - n * p.hw;
      const int iy = p.div_w.div(pix), ix = pix - iy * p.w_;
      pb[q] += ((n - na) * p.PH + iy - iya) * p.PW + ix;
      dxo[q] = n * p.c * p.hw + pix;
    }
  }
  const int cb = g * khw;  // weight offset of column g (columns 8 j + g: + 8 j KHW)
  __syncthreads();         // tables visible

  const int bnc = min(kBN, p.c - c0);
  const int wlen = bnc * khw;  // weight floats per output channel of this block
  auto load = [&](int st, int chunk) {
    float* ws = smem + st * p.stage;
    float* sl = ws + kOcChunk * p.wsz;
    const int oc0 = chunk * kOcChunk;
    if (p.vec_w) {
      const int nq = (wlen + 3) / 4;
#pragma unroll
      for (int ocl = 0; ocl < kOcChunk; ++ocl) {
        const bool ocv = oc0 + ocl < p.oc;
        const float* src = ocv ? p.w + ((oc0 + ocl) * p.c + c0) * khw : p.w;
        for (int j = tid; j < nq; j += kThreads)
          cp_async16(ws + ocl * p.wsz + 4 * j, ocv ? src + 4 * j : p.w,
                     ocv ? 4 * min(4, wlen - 4 * j) : 0);
      }
    } else {
#pragma unroll
      for (int ocl = 0; ocl < kOcChunk; ++ocl) {
        const bool ocv = oc0 + ocl < p.oc;
        const float* src = ocv ? p.w + ((oc0 + ocl) * p.c + c0) * khw : p.w;
        for (int j = tid; j < wlen; j += kThreads)
          cp_async4(ws + ocl * p.wsz + j, ocv ? src + j : p.w, ocv);
      }
    }
    const int nvalid = min(kOcChunk, p.oc - oc0);
    for (int e = tid; e < p.slab; e += kThreads) {
      const int s = stab[e];
      const float* src = p.dy + (s >= 0 ? s + oc0 * p.ohw : 0);
#pragma unroll
      for (int ocl = 0; ocl < kOcChunk; ++ocl) {
        const bool v = s >= 0 && ocl < nvalid;
        cp_async4(sl + ocl * p.sls + e, v ? src + ocl * p.ohw : p.dy, v);
      }
    }
  };

  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;

  auto compute = [&](int st) {
    const float* ws = smem + st * p.stage;
    const float* sl = ws + kOcChunk * p.wsz;
    const int4* tab4 = reinterpret_cast<const int4*>(ttab);
    const float* wc = ws + cb;
#pragma unroll 2
    for (int s = half; s < khw; s += 2) {
      const int4 e = tab4[4 * s + t];  // k = 8 s + 2 t: {ta, tb}, k = 8 s + 2 t + 1: {ta, tb}
      uint32_t a[2][4], b[4][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        a[i][0] = to_tf32(sl[pb[2 * i] + e.x]);
        a[i][1] = to_tf32(sl[pb[2 * i + 1] + e.x]);
        a[i][2] = to_tf32(sl[pb[2 * i] + e.z]);
        a[i][3] = to_tf32(sl[pb[2 * i + 1] + e.z]);
      }
      const float* w0 = wc + e.y;
      const float* w1 = wc + e.w;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        b[j][0] = to_tf32(w0[8 * j * khw]);
        b[j][1] = to_tf32(w1[8 * j * khw]);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_tf32(acc[i][j], a[i], b[j]);
    }
  };

  load(0, 0);
  cp_async_commit();
  for (int ch = 0; ch < p.chunks; ++ch) {
    if (ch + 1 < p.chunks) load((ch + 1) % 2, ch + 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();  // chunk ch visible to all
    compute(ch % 2);
    __syncthreads();  // everyone is done with this stage before it is refilled
  }
  cp_async_wait<0>();

  // Fixed-order sum of the two K halves: half 1 stages its partial tile (over stage 0, no longer
  // read), half 0 adds it and stores.
  float* cs = smem;
  if (half == 1) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          cs[(wm + 16 * i + 8 * (r / 2) + g) * kCsStride + 8 * j + 2 * t + (r % 2)] = acc[i][j][r];
  }
  __syncthreads();
  if (half == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int q = 2 * i + r / 2;
        if (dxo[q] < 0) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int col = 8 * j + 2 * t + (r % 2);
          if (col >= bnc) continue;
          const float v = acc[i][j][r] + cs[(wm + 16 * i + 8 * (r / 2) + g) * kCsStride + col];
          p.dx[dxo[q] + (c0 + col) * p.hw] = v;
        }
      }
  }
}

// Shared-memory plan of a shape (all counts in floats unless named bytes).
struct Plan {
  int64_t rows = 0, slab = 0, sls = 0, wsz = 0, stage = 0, pipe = 0, bytes = 0;
};

Plan plan_of(const Conv2dShape& s) {
  Plan pl;
  const int64_t hw = int64_t{s.h} * s.w;
  // 64 consecutive pixels span at most `spans` flattened pixel rows beyond the first and cross
  // at most `crosses` image boundaries; each crossing adds KH - 1 virtual rows.
  const int64_t spans = (s.w - 1 + kBM - 1) / s.w;
  const int64_t crosses = (hw - 1 + kBM - 1) / hw;
  pl.rows = spans + crosses * (s.kh - 1) + s.kh;
  pl.slab = pl.rows * (s.w + s.kw - 1);
  pl.sls = (pl.slab + 3) / 4 * 4;
  pl.wsz = int64_t{kBN} * s.kh * s.kw;
  pl.stage = kOcChunk * (pl.wsz + pl.sls);
  pl.pipe = std::max<int64_t>(2 * pl.stage, int64_t{kBM} * kCsStride);
  pl.bytes = 4 * (pl.pipe + pl.sls) + 8 * int64_t{kOcChunk} * s.kh * s.kw;
  return pl;
}

}  // namespace

bool conv2d_dgrad_dedicated_supported(const Conv2dShape& s, const Exec& ex) {
  if (ex.precision != Precision::TF32) return false;
  if (s.n <= 0 || s.c <= 0 || s.h <= 0 || s.w <= 0 || s.oc <= 0 || s.kh <= 0 || s.kw <= 0 ||
      s.oh() <= 0 || s.ow() <= 0)
    return false;  // Generic handles (or rejects) degenerate shapes
  if (s.stride_h != 1 || s.stride_w != 1) return false;
  if (s.kh * s.kw > kMaxKhw) return false;
  const int64_t x = int64_t{s.n} * s.c * s.h * s.w;
  const int64_t y = int64_t{s.n} * s.oc * s.oh() * s.ow();
  const int64_t w = int64_t{s.oc} * s.c * s.kh * s.kw;
  const int64_t virt = int64_t{s.n} * (s.h + s.kh - 1) * (s.w + s.kw - 1);
  if (x >= INT_MAX || y >= INT_MAX || w >= INT_MAX || virt >= INT_MAX) return false;
  if (ceil_div<int64_t>(s.c, kBN) > 65535) return false;
  return plan_of(s).bytes <= static_cast<int64_t>(kMaxSmemBytes);
}

void conv2d_backward_data_dedicated_cuda(const Conv2dShape& s, const float* d_dy, const float* d_w,
                                         float* d_dx, const Exec& ex) {
  CNN_CHECK(conv2d_dgrad_dedicated_supported(s, ex),
            "conv2d_backward_data_dedicated: shape or precision outside the kernel's limits (TF32, "
            "stride 1, KH*KW <= 25, shared memory, 2^31)");
  const int64_t M = int64_t{s.n} * s.h * s.w;
  const Plan pl = plan_of(s);
  DgParams p{};
  p.dy = d_dy;
  p.w = d_w;
  p.dx = d_dx;
  p.M = static_cast<int>(M);
  p.n = s.n;
  p.c = s.c;
  p.oc = s.oc;
  p.hw = s.h * s.w;
  p.w_ = s.w;
  p.kh = s.kh;
  p.kw = s.kw;
  p.khw = s.kh * s.kw;
  p.ph = s.pad_h;
  p.pw = s.pad_w;
  p.oh = s.oh();
  p.ow = s.ow();
  p.ohw = p.oh * p.ow;
  p.PH = s.h + s.kh - 1;
  p.PW = s.w + s.kw - 1;
  p.slab = static_cast<int>(pl.slab);
  p.sls = static_cast<int>(pl.sls);
  p.wsz = static_cast<int>(pl.wsz);
  p.stage = static_cast<int>(pl.stage);
  p.pipe = static_cast<int>(pl.pipe);
  p.chunks = static_cast<int>(ceil_div<int64_t>(s.oc, kOcChunk));
  p.vec_w = (int64_t{s.c} * p.khw) % 4 == 0 && reinterpret_cast<uintptr_t>(d_w) % 16 == 0;
  p.div_hw = Div(p.hw);
  p.div_w = Div(s.w);
  p.div_pw = Div(p.PW);
  p.div_ph = Div(p.PH);

  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(M, kBM)),
                  static_cast<unsigned>(ceil_div<int64_t>(s.c, kBN)));
  const std::size_t smem = static_cast<std::size_t>(pl.bytes);
  auto kern = p.khw == 25  ? dgrad_slab_kernel<25>
              : p.khw == 9 ? dgrad_slab_kernel<9>
              : p.khw == 1 ? dgrad_slab_kernel<1>
                           : dgrad_slab_kernel<0>;
  CNN_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
  // 3 blocks of ~70 KB (conv2) need the largest shared-memory carveout; each slab value is read
  // once per block, so the smaller L1 costs nothing.
  CNN_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared));
  kern<<<grid, kThreads, smem, ex.stream>>>(p);
  CNN_LAUNCH_CHECK("conv2d_backward_data_dedicated_tf32");
}

}  // namespace cnn
