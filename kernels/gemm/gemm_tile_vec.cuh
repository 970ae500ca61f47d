#pragma once
// The dense GEMM's 16-byte tile path (used by gemm_cuda.cu when both operands allow it):
//   C (M, N) row-major = epilogue(alpha * A (M, K) * B (K, N) + beta * C + bias[n]),
// in 64 x 64 block tiles, BK = 32, 4-stage cp.async pipeline, 128 threads; or, on the tensor
// cores, 128 x 128 tiles of 256 threads, 3 stages (the wide tile: a quarter of the blocks, each
// operand element read by half as many of them, for outputs with blocks to spare).
//
// Unlike gemm_tile.cuh (4-byte copies into k-major tiles, which any gather can fill) every
// global read here is one 16-byte `cp.async.cg` (LDGSTS.E.BYPASS.128): each operand is staged
// in shared memory along the dimension that is contiguous in global memory, so four elements
// land in one shared row:
//   operand contiguous along m (or n): k-major tile  S[k][x], row stride BX + 8;
//   operand contiguous along k:        x-major tile  S[x][k], row stride BK + 4 = 36.
// The strides keep the fragment reads conflict-free. The tensor cores' fragments come from an
// x-major tile by ldmatrix (8 rows of 16 bytes a matrix, 36 floats apart: 16-byte units 9 row + c,
// distinct mod 8) and from a k-major tile by 16-byte reads along x in BF16 (rows 72 or 136 floats
// apart, = 8 mod 32: a quarter-warp's rows t = 0..3 and units g = 0, 1 fall in 8 distinct 16-byte
// bank groups) or single floats in TF32 (banks 8t + g); see MmaMath. The FFMA path's float4 reads
// of an x-major tile are broadcasts (A) or 8 consecutive rows (B), of a k-major tile
// row-contiguous.
// Edges: a 16-byte copy whose four elements are partly outside the matrix reads only the valid
// ones (cp.async src-size 4/8/12) and zero-fills the rest; a chunk wholly outside reads nothing.
// So any M, N, K works, but every 16-byte source must be 16-byte aligned: the caller checks
// that the base pointers are 16-byte aligned and the leading dimensions multiples of 4 (tiles
// and chunks start at multiples of 4 elements).
//
// Split-K: as in gemm_tile.cuh, the k-tiles are split in equal runs over the gridDim.z blocks of
// a thread-block cluster (sm_90, <= 8), whose staged partial tiles are summed through
// distributed shared memory in rank order (deterministic, no scratch, no atomics).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/common/ptx.cuh"
#include "kernels/gemm/gemm_tile.cuh"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn::vgemm {

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::mma_bf16;
using ptx::mma_tf32;
using ptx::pack_bf16x2;
using ptx::smem_u32;
using ptx::to_tf32;

// kAK: A is contiguous along m in global memory (staged k-major); else along k (x-major).
// kBK: B is contiguous along n (staged k-major); else along k.
template <int BM_, int BN_, int BK_, int kStages_, igemm::Mma kMma_, bool kAK_, bool kBK_,
          int kThreads_ = 128>
struct Cfg {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, kThreads = kThreads_, kStages = kStages_;
  static constexpr igemm::Mma kMma = kMma_;
  static constexpr bool kAK = kAK_, kBK = kBK_;
  // k-major row padding: a stride of 8 (mod 32) floats for the reads above.
  static constexpr int kKPad = 8;
  static constexpr int SA = kAK ? BM + kKPad : BK + 4;  // row stride of the A tile
  static constexpr int SB = kBK ? BN + kKPad : BK + 4;
  static constexpr int kAFloats = kAK ? BK * SA : BM * SA;
  static constexpr int kBFloats = kBK ? BK * SB : BN * SB;
  static constexpr int kStageFloats = kAFloats + kBFloats;
  static constexpr int SC = BN + 4;  // output staging [BM][BN + 4], n contiguous
  static constexpr int kCsFloats = BM * SC;
  static constexpr std::size_t kSmemBytes =
      sizeof(float) * static_cast<std::size_t>(
                          kStages * kStageFloats > kCsFloats ? kStages * kStageFloats : kCsFloats);
  static_assert(BK == 32, "x-major stride BK + 4 must be 4 mod 32 (and 9 16-byte units)");
  static_assert((BM == 64 && BN == 64 && kThreads == 128) ||
                    (BM == 128 && BN == 128 && kThreads == 256 && kMma != igemm::Mma::Simt),
                "the math classes below take 64 x 64 tiles of 128 threads, or 128 x 128 tiles of "
                "256 on the tensor cores");
  static_assert(kAFloats % 4 == 0 && kBFloats % 4 == 0 && SA % 4 == 0 && SB % 4 == 0 && SC % 4 == 0,
                "16-byte aligned shared rows");
};

// Thread mapping of a loader: 16-byte chunk c = tid + q*T of the tile (q < kPer) is row
// c / kPerRow, 4-element column (c % kPerRow) * 4 of the shared tile, so consecutive lanes read
// consecutive 16 bytes of one global row (256 B per row for a k-major 64-wide tile, 128 B for
// an x-major 32-deep one).
template <class C, int BX, bool kKMajor>
struct VecLoader {
  static constexpr int S = kKMajor ? BX + C::kKPad : C::BK + 4;
  static constexpr int kPerRow = (kKMajor ? BX : C::BK) / 4;
  static constexpr int kChunks = BX * C::BK / 4;
  static constexpr int kPer = kChunks / C::kThreads;
  static_assert(kChunks % C::kThreads == 0, "tile must split evenly into 16-byte chunks");
  const float* base;  // element (x, k) at base[k*ld + x] (kKMajor) or base[x*ld + k]
  int64_t ld;
  int X, K, x0, tid;

  __device__ __forceinline__ VecLoader(const float* base_, int64_t ld_, int X_, int K_, int x0_,
                                       int tid_)
      : base(base_), ld(ld_), X(X_), K(K_), x0(x0_), tid(tid_) {}

  __device__ __forceinline__ void load(float* s, int k0) const {
    const float* src[kPer];
    int bytes[kPer];
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const int c = tid + q * C::kThreads;
      const int row = c / kPerRow, col = (c % kPerRow) * 4;
      if constexpr (kKMajor) {
        const int k = k0 + row, x = x0 + col;
        const int n = (k < K) ? min(max(X - x, 0), 4) : 0;
        bytes[q] = 4 * n;
        src[q] = n ? base + static_cast<int64_t>(k) * ld + x : base;
      } else {
        const int x = x0 + row, k = k0 + col;
        const int n = (x < X) ? min(max(K - k, 0), 4) : 0;
        bytes[q] = 4 * n;
        src[q] = n ? base + static_cast<int64_t>(x) * ld + k : base;
      }
    }
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const int c = tid + q * C::kThreads;
      cp_async16(s + (c / kPerRow) * S + (c % kPerRow) * 4, src[q], bytes[q]);
    }
  }
};

// FP32 math, 8 x 4 register micro-tile per thread; thread (tm, tn) = (tid / 16, tid % 16).
// Rows: k-major A: {tm*4 + i, 32 + tm*4 + i} (i < 4), float4 reads along m;
//       x-major A: {tm + 8 i} (i < 8), float4 reads along k (a quarter-warp shares tm).
// Columns: k-major B: {tn*4 + j}; x-major B: {tn + 16 j} (j < 4).
// Per 4 k: 8 + 4 float4 shared reads for 128 FFMA in either layout.
template <class C>
struct SimtMath {
  static constexpr int TM = 8, TN = 4;
  float acc[TM][TN];
  int tm, tn;

  __device__ __forceinline__ explicit SimtMath(int tid) : tm(tid / 16), tn(tid % 16) {
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
  }
  __device__ __forceinline__ int row(int i) const {
    return C::kAK ? (i / 4) * (C::BM / 2) + tm * 4 + (i % 4) : tm + 8 * i;
  }
  __device__ __forceinline__ int col(int j) const {
    return C::kBK ? tn * 4 + j : tn + 16 * j;
  }

  __device__ __forceinline__ void compute(const float* As, const float* Bs) {
#pragma unroll
    for (int kq = 0; kq < C::BK; kq += 4) {
      float a[TM][4], b[TN][4];
      if constexpr (C::kAK) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float4 v =
                *reinterpret_cast<const float4*>(As + (kq + kk) * C::SA + h * (C::BM / 2) + tm * 4);
            a[h * 4 + 0][kk] = v.x;
            a[h * 4 + 1][kk] = v.y;
            a[h * 4 + 2][kk] = v.z;
            a[h * 4 + 3][kk] = v.w;
          }
      } else {
#pragma unroll
        for (int i = 0; i < TM; ++i) {
          const float4 v = *reinterpret_cast<const float4*>(As + row(i) * C::SA + kq);
          a[i][0] = v.x;
          a[i][1] = v.y;
          a[i][2] = v.z;
          a[i][3] = v.w;
        }
      }
      if constexpr (C::kBK) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const float4 v = *reinterpret_cast<const float4*>(Bs + (kq + kk) * C::SB + tn * 4);
          b[0][kk] = v.x;
          b[1][kk] = v.y;
          b[2][kk] = v.z;
          b[3][kk] = v.w;
        }
      } else {
#pragma unroll
        for (int j = 0; j < TN; ++j) {
          const float4 v = *reinterpret_cast<const float4*>(Bs + col(j) * C::SB + kq);
          b[j][0] = v.x;
          b[j][1] = v.y;
          b[j][2] = v.z;
          b[j][3] = v.w;
        }
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
          for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i][kk], b[j][kk], acc[i][j]);
    }
  }

  __device__ __forceinline__ void stage(float* Cs) const {
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) Cs[row(i) * C::SC + col(j)] = acc[i][j];
  }
};

// Tensor-core math: 2 x (warps / 2) warps of BM / 2 x BN / (warps / 2) warp tiles (64 x 64:
// 2 x 2 warps of 32 x 32, MI x NI = 2 x 4 MMAs per k step; 128 x 128: 2 x 4 warps of 64 x 32,
// 4 x 4 MMAs) (m16n8k8 TF32 or m16n8k16 BF16, C::kMma); operands rounded (cvt.rna.tf32 /
// cvt.rn.bf16x2) as they leave shared memory, FP32 accumulation; the next k step's fragments are
// read while this step's MMAs issue. Tf32x3 (FP32 accuracy): each fragment value split into big and
// small TF32 parts as it leaves shared memory, three MMAs a product (ptx::mma_3xtf32).
//
// Fragment reads: an x-major tile (S[x][k]) by ldmatrix (TF32, BF16), one instruction for four
// 8 x 4 blocks of floats; in BF16 a k-major tile (S[k][x]) by 16-byte reads along x, one for the
// values of 4 fragment rows (columns) at one k. The latter needs a thread's rows to lie side by
// side, so the warp tile's rows and columns are permuted (a relabelling of C's rows and columns
// that stage() undoes): fragment row rho (0..15) of m16 block i is tile row
//   wm + 32 (i / 2) + 4 (rho % 8) + 2 (i % 2) + rho / 8   (k-major A; else wm + 16 i + rho),
// fragment column gamma (0..7) of n8 block j is tile column
//   wn + 32 (j / 4) + 4 gamma + j % 4                      (k-major B; else wn + 8 j + gamma).
// In BF16 the MMA's k slots 2t and 2t + 1 of each 8-k half hold tile k t and t + 4 of that half,
// in A and B alike (the same products, summed in the tensor core's order), so that each register
// pair comes from ldmatrix's 4-word rows or from two k-major rows. TF32 reads a k-major tile a
// value at a time, and Tf32x3 every tile, in the MMA's own order: measured with 16-byte reads,
// fc1's TF32 weight gradient was slower (64 x 64 tile 20.1 -> 21.0 us, 128 x 128 19.4 -> 22.6 on
// an H100; docs/performance.md) where BF16's went from 21.5 to 19.2. Each read is bank-conflict-free (strides: Cfg).
template <class C>
struct MmaMath {
  static constexpr bool kBf16 = C::kMma == igemm::Mma::Bf16;
  static constexpr bool kSplit = C::kMma == igemm::Mma::Tf32x3;
  static constexpr int KS = kBf16 ? 16 : 8;  // k per MMA step
  static constexpr int kWarps = C::kThreads / 32;
  static constexpr int WM = C::BM / 2, WN = C::BN / (kWarps / 2), MI = WM / 16, NI = WN / 8;
  static constexpr bool kPermA = kBf16 && C::kAK, kPermB = kBf16 && C::kBK;
  static_assert(MI % 2 == 0 && NI % 4 == 0,
                "16-byte k-major reads take m16 blocks in pairs and n8 blocks in fours");
  float acc[MI][NI][4];
  int wm, wn, g, t;

  __device__ __forceinline__ explicit MmaMath(int tid) {
    const int warp = tid / 32, lane = tid % 32;
    wm = (warp % 2) * WM;
    wn = (warp / 2) * WN;
    g = lane / 4;
    t = lane % 4;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;
  }

  // The tile row of fragment row rho of m16 block i, the tile column of fragment column gamma of
  // n8 block j (the maps above).
  __device__ __forceinline__ int tile_row(int i, int rho) const {
    if constexpr (kPermA) return wm + 32 * (i / 2) + 4 * (rho % 8) + 2 * (i % 2) + rho / 8;
    return wm + 16 * i + rho;
  }
  __device__ __forceinline__ int tile_col(int j, int gamma) const {
    if constexpr (kPermB) return wn + 32 * (j / 4) + 4 * gamma + j % 4;
    return wn + 8 * j + gamma;
  }

  // A(m, k) and B(k, n) of the staged tiles, in either layout.
  __device__ __forceinline__ static float at_a(const float* As, int m, int k) {
    return C::kAK ? As[k * C::SA + m] : As[m * C::SA + k];
  }
  __device__ __forceinline__ static float at_b(const float* Bs, int k, int n) {
    return C::kBK ? Bs[k * C::SB + n] : Bs[n * C::SB + k];
  }
  __device__ __forceinline__ static float4 ld4(const float* p) {
    return *reinterpret_cast<const float4*>(p);
  }
  __device__ __forceinline__ static uint32_t tf32_bits(uint32_t bits) {
    return to_tf32(__uint_as_float(bits));
  }
  __device__ __forceinline__ static uint32_t bf16_pair(uint32_t lo, uint32_t hi) {
    return pack_bf16x2(__uint_as_float(lo), __uint_as_float(hi));
  }
  // BF16 register pairs of a k-major tile (row stride S) for the k step at ks, four consecutive
  // columns from col: lo[e] = column e at tile k (ks + t, ks + t + 4) (slots 2t, 2t + 1), hi[e] at
  // (ks + t + 8, ks + t + 12) (slots 2t + 8, 2t + 9).
  __device__ __forceinline__ void kmajor_bf16(const float* col, int S, int ks, uint32_t (&lo)[4],
                                              uint32_t (&hi)[4]) const {
    const float4 v0 = ld4(col + (ks + t) * S), v1 = ld4(col + (ks + t + 4) * S);
    const float4 v2 = ld4(col + (ks + t + 8) * S), v3 = ld4(col + (ks + t + 12) * S);
    lo[0] = pack_bf16x2(v0.x, v1.x);
    lo[1] = pack_bf16x2(v0.y, v1.y);
    lo[2] = pack_bf16x2(v0.z, v1.z);
    lo[3] = pack_bf16x2(v0.w, v1.w);
    hi[0] = pack_bf16x2(v2.x, v3.x);
    hi[1] = pack_bf16x2(v2.y, v3.y);
    hi[2] = pack_bf16x2(v2.z, v3.z);
    hi[3] = pack_bf16x2(v2.w, v3.w);
  }

  // The fragments of the k step at ks. Layouts: m16n8k8 TF32 a0 (g, t), a1 (g+8, t), a2 (g, t+4),
  // a3 (g+8, t+4), b0 (k t, n g), b1 (k t+4, n g); m16n8k16 BF16: ptx::mma_bf16, with the k
  // slots above.
  __device__ __forceinline__ void load_frag(const float* As, const float* Bs, int ks,
                                            uint32_t (&a)[MI][4], uint32_t (&b)[NI][2]) const {
    const int lane = 4 * g + t;
    // ldmatrix row addresses: lanes 8q .. 8q + 7 address matrix q. A: matrices (rows 0-7, k +0),
    // (rows 8-15, k +0), (rows 0-7, k +4), (rows 8-15, k +4) of an m16 block; B: four 8 x 4
    // blocks along k (BF16) or (n8 block, k +0), (same, k +4), (next block, k +0), (next, k +4).
    const int a_row = lane % 8 + 8 * ((lane / 8) % 2), a_k = 4 * (lane / 16);
    if constexpr (kBf16) {
      // A: the tile k of slot pairs (2t, 2t+1) and (2t+8, 2t+9): t, t+4, t+8, t+12.
      if constexpr (C::kAK) {
#pragma unroll
        for (int ip = 0; ip < MI / 2; ++ip) {
          uint32_t lo[4], hi[4];  // tile rows 4g .. 4g + 3 of the block pair
          kmajor_bf16(As + wm + 32 * ip + 4 * g, C::SA, ks, lo, hi);
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // block 2 ip + h: rows g (lo / hi[2h]), g + 8 (2h + 1)
            a[2 * ip + h][0] = lo[2 * h];
            a[2 * ip + h][1] = lo[2 * h + 1];
            a[2 * ip + h][2] = hi[2 * h];
            a[2 * ip + h][3] = hi[2 * h + 1];
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t r[4];
            ptx::ldmatrix_x4(r, As + (wm + 16 * i + a_row) * C::SA + ks + 8 * h + a_k);
            a[i][2 * h] = bf16_pair(r[0], r[2]);
            a[i][2 * h + 1] = bf16_pair(r[1], r[3]);
          }
      }
      if constexpr (C::kBK) {
#pragma unroll
        for (int jq = 0; jq < NI / 4; ++jq) {
          uint32_t lo[4], hi[4];  // n8 blocks 4 jq .. 4 jq + 3
          kmajor_bf16(Bs + wn + 32 * jq + 4 * g, C::SB, ks, lo, hi);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            b[4 * jq + e][0] = lo[e];
            b[4 * jq + e][1] = hi[e];
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < NI; ++j) {
          uint32_t r[4];  // k +0, +4, +8, +12 of n8 block j
          ptx::ldmatrix_x4(r, Bs + (wn + 8 * j + lane % 8) * C::SB + ks + 4 * (lane / 8));
          b[j][0] = bf16_pair(r[0], r[1]);
          b[j][1] = bf16_pair(r[2], r[3]);
        }
      }
    } else {
      if constexpr (C::kAK) {
#pragma unroll
        for (int i = 0; i < MI; ++i) {
          const int m = wm + i * 16 + g;
          a[i][0] = to_tf32(at_a(As, m, ks + t));
          a[i][1] = to_tf32(at_a(As, m + 8, ks + t));
          a[i][2] = to_tf32(at_a(As, m, ks + t + 4));
          a[i][3] = to_tf32(at_a(As, m + 8, ks + t + 4));
        }
      } else {
#pragma unroll
        for (int i = 0; i < MI; ++i) {
          uint32_t r[4];
          ptx::ldmatrix_x4(r, As + (wm + 16 * i + a_row) * C::SA + ks + a_k);
#pragma unroll
          for (int q = 0; q < 4; ++q) a[i][q] = tf32_bits(r[q]);
        }
      }
      if constexpr (C::kBK) {
#pragma unroll
        for (int j = 0; j < NI; ++j) {
          const int n = wn + j * 8 + g;
          b[j][0] = to_tf32(at_b(Bs, ks + t, n));
          b[j][1] = to_tf32(at_b(Bs, ks + t + 4, n));
        }
      } else {
#pragma unroll
        for (int jp = 0; jp < NI / 2; ++jp) {
          uint32_t r[4];  // (block 2jp, k +0), (2jp, +4), (2jp + 1, +0), (2jp + 1, +4)
          ptx::ldmatrix_x4(r, Bs + (wn + 8 * (2 * jp + lane / 16) + lane % 8) * C::SB + ks +
                                  4 * ((lane / 8) % 2));
          b[2 * jp][0] = tf32_bits(r[0]);
          b[2 * jp][1] = tf32_bits(r[1]);
          b[2 * jp + 1][0] = tf32_bits(r[2]);
          b[2 * jp + 1][1] = tf32_bits(r[3]);
        }
      }
    }
  }

  // Tf32x3: the fragments of one k step split into big and small parts (ptx::split_tf32).
  __device__ __forceinline__ void load_frag_split(const float* As, const float* Bs, int ks,
                                                  uint32_t (&a)[MI][4], uint32_t (&as)[MI][4],
                                                  uint32_t (&b)[NI][2],
                                                  uint32_t (&bs)[NI][2]) const {
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      const int m = wm + i * 16 + g;
      ptx::split_tf32_frag({at_a(As, m, ks + t), at_a(As, m + 8, ks + t), at_a(As, m, ks + t + 4),
                            at_a(As, m + 8, ks + t + 4)},
                           a[i], as[i]);
    }
#pragma unroll
    for (int j = 0; j < NI; ++j) {
      const int n = wn + j * 8 + g;
      ptx::split_tf32_frag({at_b(Bs, ks + t, n), at_b(Bs, ks + t + 4, n)}, b[j], bs[j]);
    }
  }

  __device__ __forceinline__ void compute(const float* As, const float* Bs) {
    if constexpr (kSplit) {
      igemm::mma_steps_3xtf32<C::BK / KS>(*this, As, Bs);
    } else {
      igemm::mma_steps_double_buffered<C::BK / KS>(*this, As, Bs);
    }
  }

  // Accumulator layout: c0, c1 (fragment row g, columns 2t, 2t+1), c2, c3 (row g+8, same
  // columns), at the tile rows and columns of the maps above. Permuted columns put a thread's
  // values of four n8 blocks side by side: one 16-byte store for them.
  __device__ __forceinline__ void stage(float* Cs) const {
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        float* row = Cs + tile_row(i, g + (r / 2) * 8) * C::SC;
        if constexpr (kPermB) {
#pragma unroll
          for (int jq = 0; jq < NI / 4; ++jq)
            *reinterpret_cast<float4*>(row + tile_col(4 * jq, 2 * t + (r % 2))) =
                make_float4(acc[i][4 * jq][r], acc[i][4 * jq + 1][r], acc[i][4 * jq + 2][r],
                            acc[i][4 * jq + 3][r]);
        } else {
#pragma unroll
          for (int j = 0; j < NI; ++j) row[tile_col(j, 2 * t + (r % 2))] = acc[i][j][r];
        }
      }
  }
};

// C (M, N) row-major with row stride ldc; A element (m, k) at a[k*lda + m] (kAK) or
// a[m*lda + k]; B element (k, n) at b[k*ldb + n] (kBK) or b[n*ldb + k].
struct Problem {
  int M, N, K;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  float* c;
  int64_t ldc;
  float alpha, beta;
  const float* bias;  // (N) or null
  bool relu;
  bool c_vec;  // c 16-byte aligned and ldc % 4 == 0: float4 epilogue where 4 columns are in range

  __device__ __forceinline__ float finish(float v, float old, int n) const {
    v *= alpha;
    if (beta != 0.f) v = fmaf(beta, old, v);
    if (bias) v += bias[n];
    if (relu) v = (v <= 0.f) ? 0.f : v;  // NaN passes, as in the CPU references
    return v;
  }

  // C's columns n .. n+3 of row m (n a multiple of 4) where beta != 0, those in range (zero
  // elsewhere): read by the epilogue for all of a thread's groups before it stores any, so that
  // their latencies overlap (a read after the previous group's store would wait for it).
  __device__ __forceinline__ float4 load_old4(int m, int n) const {
    float4 old = make_float4(0.f, 0.f, 0.f, 0.f);
    if (beta == 0.f || m >= M) return old;
    const float* src = c + m * ldc + n;
    if (c_vec && n + 3 < N) return *reinterpret_cast<const float4*>(src);
    float vs[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 4; ++r)
      if (n + r < N) vs[r] = src[r];
    return make_float4(vs[0], vs[1], vs[2], vs[3]);
  }

  // Columns n .. n+3 of row m (n a multiple of 4), those < N; old: load_old4(m, n).
  __device__ __forceinline__ void store4(int m, int n, float4 v, float4 old) const {
    if (m >= M) return;
    float* dst = c + m * ldc + n;
    if (c_vec && n + 3 < N) {
      *reinterpret_cast<float4*>(dst) =
          make_float4(finish(v.x, old.x, n), finish(v.y, old.y, n + 1), finish(v.z, old.z, n + 2),
                      finish(v.w, old.w, n + 3));
      return;
    }
    const float vs[4] = {v.x, v.y, v.z, v.w}, olds[4] = {old.x, old.y, old.z, old.w};
#pragma unroll
    for (int q = 0; q < 4; ++q)
      if (n + q < N) dst[q] = finish(vs[q], olds[q], n + q);  // bias[n + q] read only in range
  }
};

// Block (bx, by, bz) computes tile (bx, by) over the bz-th of gridDim.z equal runs of k-tiles.
// Thread mapping: the math classes above (a thread's register micro-tile, or a warp's MMA
// tile); in the epilogue thread tid owns the 4-column groups e = tid, tid + T, ... of the
// staged tile (of its cluster rank's slice when split), row e / (BN/4), columns 4 (e % (BN/4)).
template <class C>
__device__ __forceinline__ void vec_gemm_body(const Problem& p) {
  extern __shared__ float4 smem_f4[];
  float* smem = reinterpret_cast<float*>(smem_f4);
  const int tid = threadIdx.x;
  const int m0 = blockIdx.x * C::BM, n0 = blockIdx.y * C::BN;
  const int splits = gridDim.z;
  const igemm::KTileRun run = igemm::k_tile_run(p.K, C::BK, blockIdx.z, splits);

  const VecLoader<C, C::BM, C::kAK> al(p.a, p.lda, p.M, p.K, m0, tid);
  const VecLoader<C, C::BN, C::kBK> bl(p.b, p.ldb, p.N, p.K, n0, tid);
  std::conditional_t<C::kMma == igemm::Mma::Simt, SimtMath<C>, MmaMath<C>> math(tid);

  auto stage_a = [&](int s) { return smem + s * C::kStageFloats; };
  auto stage_b = [&](int s) { return smem + s * C::kStageFloats + C::kAFloats; };

  igemm::run_k_pipeline<C>(al, bl, math, run, stage_a, stage_b);

  float* Cs = smem;
  math.stage(Cs);
  constexpr int kGroups = C::BM * C::BN / 4, kPerRow = C::BN / 4;
  // This thread's groups e = e_begin + tid + j T, j < kMine, below e_end: C's old values first
  // (load_old4), then the stores.
  constexpr int kMine = (kGroups + C::kThreads - 1) / C::kThreads;
  auto store_groups = [&](int e_begin, int e_end, auto value) {
    float4 old[kMine];
#pragma unroll
    for (int j = 0; j < kMine; ++j) {
      const int e = e_begin + tid + j * C::kThreads;
      if (e < e_end) old[j] = p.load_old4(m0 + e / kPerRow, n0 + (e % kPerRow) * 4);
    }
#pragma unroll
    for (int j = 0; j < kMine; ++j) {
      const int e = e_begin + tid + j * C::kThreads;
      if (e < e_end) {
        const int m = e / kPerRow, n = (e % kPerRow) * 4;
        p.store4(m0 + m, n0 + n, value(m, n), old[j]);
      }
    }
  };

  if (splits > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every split's tile staged
    const int rank = static_cast<int>(cluster.block_rank());
    const int chunk = (kGroups + splits - 1) / splits;
    store_groups(rank * chunk, min(kGroups, (rank + 1) * chunk), [&](int m, int n) {
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int q = 0; q < splits; ++q) {  // fixed order
        const float4 w =
            *reinterpret_cast<const float4*>(cluster.map_shared_rank(Cs, q) + m * C::SC + n);
        v.x += w.x;
        v.y += w.y;
        v.z += w.z;
        v.w += w.w;
      }
      return v;
    });
    cluster.sync();  // keep this block's shared memory alive until every reader is done
#else
    __trap();  // the launcher never splits below sm_90
#endif
  } else {
    __syncthreads();
    store_groups(0, kGroups, [&](int m, int n) {
      return *reinterpret_cast<const float4*>(Cs + m * C::SC + n);
    });
  }
}

// The 64 x 64 tile takes ptxas's register choice (its shared memory caps it at 3 blocks an SM);
// the wide tile asks for two blocks an SM (at most 128 registers a thread; its shared memory fits
// twice): left alone, the BF16 instances took 149 registers with the fragment reads above, one
// block an SM, which would run fc1's 200 weight-gradient tiles in two waves.
template <class C>
__global__ void __launch_bounds__(C::kThreads) vec_gemm_kernel(const __grid_constant__ Problem p) {
  ptx::griddep_enter();
  vec_gemm_body<C>(p);
}
template <class C>
__global__ void __launch_bounds__(C::kThreads, 2)
    vec_gemm_wide_kernel(const __grid_constant__ Problem p) {
  ptx::griddep_enter();
  vec_gemm_body<C>(p);
}

// Launches vec_gemm_kernel<C> (vec_gemm_wide_kernel<C> for 256 threads) over a (ceil(M/BM),
// ceil(N/BN), splits) grid; splits > 1 forms clusters of the splits (sm_90, <= 8).
template <class C>
void launch(const Problem& p, int splits, cudaStream_t stream, const char* name) {
  const int64_t tiles_m = ceil_div<int64_t>(p.M, C::BM), tiles_n = ceil_div<int64_t>(p.N, C::BN);
  CNN_CHECK(tiles_m <= 0x7fffffff && tiles_n <= 65535 && splits >= 1 && splits <= 8,
            "{}: grid ({}, {}, {}) exceeds the limits", name, tiles_m, tiles_n, splits);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(tiles_m), static_cast<unsigned>(tiles_n),
                     static_cast<unsigned>(splits));
  cfg.blockDim = dim3(C::kThreads);
  cfg.dynamicSmemBytes = C::kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if (splits > 1) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = static_cast<unsigned>(splits);
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  auto run = [&](auto kern) {
    if (C::kSmemBytes > 48 * 1024)
      CNN_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(C::kSmemBytes)));
    CNN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, p));
  };
  if constexpr (C::kThreads == 256)
    run(vec_gemm_wide_kernel<C>);
  else
    run(vec_gemm_kernel<C>);
  CNN_LAUNCH_CHECK(name);
}

}  // namespace cnn::vgemm
