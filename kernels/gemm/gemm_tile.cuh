#pragma once
// Device-side building blocks shared by the dense GEMM (gemm_cuda.cu) and the implicit-GEMM
// convolutions (conv2d_igemm.cu): one tiled GEMM main loop, parameterized by a "problem" that
// says how to gather the A and B tiles from global memory and what to do with each result.
//
//   C (M, N) = A (M, K) * B (K, N), computed in BM x BN block tiles, BK-deep k-tiles.
//
// Shared memory holds both operands k-major (As[k][m], Bs[k][n], rows padded) in kStages
// buffers filled with 4-byte cp.async (zero-filled where the element is out of range or is
// padding), so any M/N/K, stride, transpose or gather works without an im2col buffer. The math
// is either FP32 FFMA on 8 x TN register micro-tiles (SimtMath) or tensor cores with FP32
// accumulation (MmaMath): mma.sync.m16n8k8 on TF32 (or, 3xTF32, on FP32 operands split into two
// TF32 parts) or m16n8k16 on BF16 operands. The epilogue
// stages the accumulator tile through shared memory so the problem can write it with whichever
// index runs contiguous in its output, and, for split-K inside a thread-block cluster (sm_90),
// reduces the splits through distributed shared memory in a fixed order (deterministic, no
// scratch).
//
// A problem type P provides:
//   int M, N, K;
//   template <class C> struct ALoader { ALoader(const P&, int m0, int tid, const int* table);
//                                        void load(float* s, int k0) const; };  // s: [BK][SA]
//   template <class C> struct BLoader { ... same with n0, s: [BK][SB] };
//     with packed BF16 tiles (C::kPacked) both loaders also provide
//       struct Regs;                                  // one k-tile's elements of this thread
//       void fetch(Regs&, int k0) const;              // global -> registers (0 where invalid)
//       void store(uint32_t* s, const Regs&) const;   // registers -> packed words [BK/2][SX]
//   static constexpr bool kHasTable;       // with table_ints > 0: build_table(int* t, tid, T)
//   int table_ints;                        // fills a per-block shared table (then synced) that
//                                          // the loaders get; null when table_ints == 0
//   static constexpr bool kMFastOut;       // output runs contiguous in m (else in n)
//   static constexpr bool kClusterSplit;   // gridDim.z > 1: splits summed in a cluster (else
//                                          // apply() gets each split's partial and its index)
//   void apply(int m, int n, float v, int split) const;  // one finished element
//   optionally static constexpr bool kStackedAlongM = true: several GEMMs of one N stacked along
//   M in one grid (no block tile straddles two), each with its own K and table:
//     int k_of(int m0) const;                                   // K of the block at row m0
//     void build_table_of(int* t, int tid, int T, int m0) const;  // that block's table
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/common/ptx.cuh"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn::igemm {

// The shared PTX wrappers (kernels/ptx.cuh), under the names this namespace's users know.
using ptx::cp_async4;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::FastDiv;
using ptx::mma_bf16;
using ptx::mma_tf32;
using ptx::pack_bf16x2;
using ptx::smem_u32;
using ptx::to_tf32;

// ---------------------------------------------------------------------------------------------
// Which math a tile runs: FP32 FFMA, or mma.sync tensor cores on TF32 or BF16 operands (FP32
// accumulation either way), or on FP32 operands as 3xTF32 (Tf32x3: each operand split into
// big = TF32(v) and small = TF32(v - big), three TF32 MMAs a product, FP32 accuracy).
enum class Mma { Simt, Tf32, Bf16, Tf32x3 };

// Tile configuration. kThreads = 128 or 256. For the MMA math the warps form a WGM x WGN grid
// of warp tiles (32 rows each when possible). kPacked (BF16 only): the operand tiles hold packed
// bf16 pairs instead of floats (see PackedPipeline below); SA, SB and kStageFloats then count
// 32-bit words, one word per (k pair, row).
template <int BM_, int BN_, int BK_, int kThreads_, int kStages_, Mma kMma_, bool kPacked_ = false>
struct Cfg {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, kThreads = kThreads_, kStages = kStages_;
  static constexpr Mma kMma = kMma_;
  static constexpr bool kPacked = kPacked_;
  // Row padding of the k-major tiles. TF32 fragment loads read As[k0 + t][g] for t < 4, g < 8:
  // a row stride = 8 (mod 32) puts the 32 lanes on 32 banks. BF16 fragment loads read rows
  // k0 + 2t and k0 + 2t + 1: there a stride = 4 (mod 32) does (banks 8t + g and 8t + 4 + g).
  // Packed BF16 fragment loads read word rows kp0 + t (one word = the k pair 2t, 2t + 1): a
  // stride = 8 (mod 32) again. The SIMT loads read whole float4 rows; there a stride = 4 (mod
  // 32) makes the k-lane cp.async writes conflict-free.
  static constexpr int kPad = (kMma == Mma::Tf32 || kMma == Mma::Tf32x3 || kPacked) ? 8 : 4;
  static constexpr int SA = BM + kPad, SB = BN + kPad;
  static constexpr int kStageFloats = (kPacked ? BK / 2 : BK) * (SA + SB);
  // Output staging: [BN][BM + 4] (m contiguous) or [BM][BN + 4] (n contiguous).
  static constexpr int kCsFloats = (BM + 4) * (BN + 4);
  static constexpr std::size_t kSmemBytes =
      sizeof(float) * static_cast<std::size_t>(
                          kStages * kStageFloats > kCsFloats ? kStages * kStageFloats : kCsFloats);
  static_assert(BK % 8 == 0, "BK must be a multiple of 8 (k-lane groups, MMA k8 steps)");
  static_assert(kMma != Mma::Bf16 || BK % 16 == 0, "BF16 MMA steps are k16");
  static_assert(!kPacked || (kMma == Mma::Bf16 && kStages == 2),
                "packed tiles are BF16, double-buffered");
  static_assert(BM % 32 == 0 && BN % 32 == 0, "tile sides must be multiples of 32");
  static_assert(kThreads % BM == 0 && kThreads % BN == 0, "m-lane loaders need T % BX == 0");
};

// ---------------------------------------------------------------------------------------------
// Packed BF16 tiles: word (kp, x) of a stage = {bf16(k = 2 kp) in bits 0..15, bf16(2 kp + 1) in
// bits 16..31} of row x, each rounded to nearest even by the same cvt as pack_bf16x2 (so the MMA
// operands are bitwise the ones the float tiles give). The loaders' register half: fetch() reads
// a k-tile from global memory into registers (zero where invalid, as the zero-filled cp.async),
// store() rounds and writes them.

// Round-to-nearest-even BF16 bits of f: the low half of pack_bf16x2(f, 0).
__device__ __forceinline__ unsigned short bf16_bits(float f) {
  return static_cast<unsigned short>(pack_bf16x2(f, 0.f) & 0xffffu);
}

// Global load of *src when v, else 0 (src is a valid address either way, as for cp_async4).
__device__ __forceinline__ float load_or_zero(const float* src, bool v) {
  float r = 0.f;
  if (v) r = __ldg(src);
  return r;
}

// Element (k, x) of a packed stage with row stride S words.
__device__ __forceinline__ void store_bf16(uint32_t* s, int S, int k, int x, float f) {
  reinterpret_cast<unsigned short*>(s)[2 * ((k >> 1) * S + x) + (k & 1)] = bf16_bits(f);
}

// Stores the elements of an m-lane loader (element q: k = kq + q kStep, row x). With kStep == 1
// each thread holds whole k pairs: one 32-bit store per pair.
template <int S, int kN, int kStep>
__device__ __forceinline__ void store_mlane(uint32_t* s, int kq, int x, const float (&r)[kN]) {
  if constexpr (kStep == 1) {
#pragma unroll
    for (int j = 0; j < kN / 2; ++j) s[j * S + x] = pack_bf16x2(r[2 * j], r[2 * j + 1]);
  } else {
#pragma unroll
    for (int q = 0; q < kN; ++q) store_bf16(s, S, kq + q * kStep, x, r[q]);
  }
}

// Stores the elements of a k-lane loader (element (q, j): k = kl + 8 q, row x + j T/8). A warp's
// 16-bit stores land in 16 distinct words of 16 banks (S = 8 mod 32), two lanes a word.
template <class C, int S, int kRows>
__device__ __forceinline__ void store_klanes(uint32_t* s, int kl, int x,
                                             const float (&r)[C::BK / 8][kRows]) {
#pragma unroll
  for (int q = 0; q < C::BK / 8; ++q)
#pragma unroll
    for (int j = 0; j < kRows; ++j)
      store_bf16(s, S, kl + 8 * q, x + j * (C::kThreads / 8), r[q][j]);
}

// ---------------------------------------------------------------------------------------------
// FP32 math: thread (tm, tn) owns rows {tm*4 + i, BM/2 + tm*4 + i} (i < 4) and columns
// {tn*4 + j (, BN/2 + tn*4 + j)} (j < 4), so each k step reads two float4 of A and one or two
// float4 of B from shared memory for 32 or 64 FFMA.
template <class C>
struct SimtMath {
  static constexpr int TM = 8;
  static constexpr int TN = C::BM * C::BN / (C::kThreads * TM);
  static_assert(TN == 4 || TN == 8, "SIMT micro-tile must be 8x4 or 8x8");
  static constexpr int TGN = C::BN / TN;  // threads along n
  static_assert((C::BM / TM) * TGN == C::kThreads, "thread grid must cover the tile");
  float acc[TM][TN];
  int tm, tn;

  __device__ __forceinline__ explicit SimtMath(int tid) : tm(tid / TGN), tn(tid % TGN) {
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
  }
  __device__ __forceinline__ static int row(int i) {
    return (i / 4) * (C::BM / 2) + (i % 4);
  }
  __device__ __forceinline__ static int col(int j) {
    return (j / 4) * (C::BN / 2) + (j % 4);
  }

  // Fragments of step k + 1 are read from shared memory while step k's FFMAs issue, so the
  // shared-memory latency hides behind arithmetic instead of stalling the warp.
  __device__ __forceinline__ void load_frag(const float* As, const float* Bs, int k, float (&a)[TM],
                                            float (&b)[TN]) const {
    const float* ap = As + k * C::SA + tm * 4;
    const float* bp = Bs + k * C::SB + tn * 4;
    *reinterpret_cast<float4*>(&a[0]) = *reinterpret_cast<const float4*>(ap);
    *reinterpret_cast<float4*>(&a[4]) = *reinterpret_cast<const float4*>(ap + C::BM / 2);
    *reinterpret_cast<float4*>(&b[0]) = *reinterpret_cast<const float4*>(bp);
    if constexpr (TN == 8)
      *reinterpret_cast<float4*>(&b[4]) = *reinterpret_cast<const float4*>(bp + C::BN / 2);
  }

  __device__ __forceinline__ void compute(const float* As, const float* Bs) {
    float a[2][TM], b[2][TN];
    load_frag(As, Bs, 0, a[0], b[0]);
#pragma unroll
    for (int k = 0; k < C::BK; ++k) {
      if (k + 1 < C::BK) load_frag(As, Bs, k + 1, a[(k + 1) % 2], b[(k + 1) % 2]);
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[k % 2][i], b[k % 2][j], acc[i][j]);
    }
  }

  // Writes the accumulators to the staging tile (layout: see Cfg::kCsFloats).
  __device__ __forceinline__ void stage(float* Cs, bool m_fast) const {
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int m = tm * 4 + row(i), n = tn * 4 + col(j);
        if (m_fast)
          Cs[n * (C::BM + 4) + m] = acc[i][j];
        else
          Cs[m * (C::BN + 4) + n] = acc[i][j];
      }
  }
};

// The kSteps MMA steps of one staged k-tile on a tensor-core math M (M::load_frag, M::acc),
// register double-buffered: step s + 1's fragments load before step s's MMAs issue.
template <int kSteps, class M>
__device__ __forceinline__ void mma_steps_double_buffered(M& m, const float* As, const float* Bs) {
  uint32_t a[2][M::MI][4], b[2][M::NI][2];
  m.load_frag(As, Bs, 0, a[0], b[0]);
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    if (s + 1 < kSteps) m.load_frag(As, Bs, (s + 1) * M::KS, a[(s + 1) % 2], b[(s + 1) % 2]);
#pragma unroll
    for (int i = 0; i < M::MI; ++i)
#pragma unroll
      for (int j = 0; j < M::NI; ++j) {
        if constexpr (M::kBf16)
          mma_bf16(m.acc[i][j], a[s % 2][i], b[s % 2][j]);
        else
          mma_tf32(m.acc[i][j], a[s % 2][i], b[s % 2][j]);
      }
  }
}

// The kSteps 3xTF32 steps of one staged k-tile on a tensor-core math M (M::load_frag_split,
// M::acc), single-buffered: the split fragments take twice TF32's registers, and the three MMAs
// a product give the next step's loads time to land.
template <int kSteps, class M>
__device__ __forceinline__ void mma_steps_3xtf32(M& m, const float* As, const float* Bs) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    uint32_t a[M::MI][4], as[M::MI][4], b[M::NI][2], bs[M::NI][2];
    m.load_frag_split(As, Bs, s * M::KS, a, as, b, bs);
#pragma unroll
    for (int i = 0; i < M::MI; ++i)
#pragma unroll
      for (int j = 0; j < M::NI; ++j) ptx::mma_3xtf32(m.acc[i][j], a[i], as[i], b[j], bs[j]);
  }
}

// Tensor-core math: warp w owns a WM x WN warp tile of MI x NI m16n8 accumulator tiles, fed by
// m16n8k8 TF32 (three a product for Tf32x3) or m16n8k16 BF16 MMAs (C::kMma). With float tiles
// the operands are rounded (or split) as they leave shared memory (the cp.async copies that fill
// them cannot convert); packed BF16 tiles (C::kPacked) were rounded by the loaders, and a
// fragment register is one shared word.
template <class C>
struct MmaMath {
  static constexpr bool kBf16 = C::kMma == Mma::Bf16;
  static constexpr int KS = kBf16 ? 16 : 8;  // k per MMA step
  static constexpr int kWarps = C::kThreads / 32;
  static constexpr int WGM = (C::BM / 32 < kWarps) ? C::BM / 32 : kWarps;
  static constexpr int WGN = kWarps / WGM;
  static constexpr int WM = C::BM / WGM, WN = C::BN / WGN;
  static constexpr int MI = WM / 16, NI = WN / 8;
  static_assert(WGM * WGN == kWarps && WM % 16 == 0 && WN % 8 == 0, "bad warp grid");
  float acc[MI][NI][4];
  int wm, wn, g, t;  // warp tile origin; lane's group (row) and thread-in-group (column)

  __device__ __forceinline__ explicit MmaMath(int tid) {
    const int warp = tid / 32, lane = tid % 32;
    wm = (warp % WGM) * WM;
    wn = (warp / WGM) * WN;
    g = lane / 4;
    t = lane % 4;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;
  }

  // Fragments of one k step, rounded to TF32 or BF16 (layouts: ptx::mma_tf32 / mma_bf16). The
  // next step's are loaded before this step's MMAs issue (register double buffering).
  __device__ __forceinline__ void load_frag(const float* As, const float* Bs, int ks,
                                            uint32_t (&a)[MI][4], uint32_t (&b)[NI][2]) const {
    if constexpr (C::kPacked) {
      const uint32_t* ap = reinterpret_cast<const uint32_t*>(As) + (ks / 2 + t) * C::SA + wm + g;
      const uint32_t* bp = reinterpret_cast<const uint32_t*>(Bs) + (ks / 2 + t) * C::SB + wn + g;
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        const uint32_t* q = ap + i * 16;
        a[i][0] = q[0];
        a[i][1] = q[8];
        a[i][2] = q[4 * C::SA];
        a[i][3] = q[4 * C::SA + 8];
      }
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        b[j][0] = bp[j * 8];
        b[j][1] = bp[4 * C::SB + j * 8];
      }
    } else if constexpr (kBf16) {
      const float* ap = As + (ks + 2 * t) * C::SA + wm + g;
      const float* bp = Bs + (ks + 2 * t) * C::SB + wn + g;
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        const float* q = ap + i * 16;
        a[i][0] = pack_bf16x2(q[0], q[C::SA]);
        a[i][1] = pack_bf16x2(q[8], q[C::SA + 8]);
        a[i][2] = pack_bf16x2(q[8 * C::SA], q[9 * C::SA]);
        a[i][3] = pack_bf16x2(q[8 * C::SA + 8], q[9 * C::SA + 8]);
      }
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        const float* q = bp + j * 8;
        b[j][0] = pack_bf16x2(q[0], q[C::SB]);
        b[j][1] = pack_bf16x2(q[8 * C::SB], q[9 * C::SB]);
      }
    } else {
      const float* ap = As + (ks + t) * C::SA + wm + g;
      const float* bp = Bs + (ks + t) * C::SB + wn + g;
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        a[i][0] = to_tf32(ap[i * 16]);
        a[i][1] = to_tf32(ap[i * 16 + 8]);
        a[i][2] = to_tf32(ap[4 * C::SA + i * 16]);
        a[i][3] = to_tf32(ap[4 * C::SA + i * 16 + 8]);
      }
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        b[j][0] = to_tf32(bp[j * 8]);
        b[j][1] = to_tf32(bp[4 * C::SB + j * 8]);
      }
    }
  }

  // Tf32x3: the TF32 fragments of one k step split into big and small parts (ptx::split_tf32).
  __device__ __forceinline__ void load_frag_split(const float* As, const float* Bs, int ks,
                                                  uint32_t (&a)[MI][4], uint32_t (&as)[MI][4],
                                                  uint32_t (&b)[NI][2],
                                                  uint32_t (&bs)[NI][2]) const {
    const float* ap = As + (ks + t) * C::SA + wm + g;
    const float* bp = Bs + (ks + t) * C::SB + wn + g;
#pragma unroll
    for (int i = 0; i < MI; ++i)
      ptx::split_tf32_frag(
          {ap[i * 16], ap[i * 16 + 8], ap[4 * C::SA + i * 16], ap[4 * C::SA + i * 16 + 8]}, a[i],
          as[i]);
#pragma unroll
    for (int j = 0; j < NI; ++j)
      ptx::split_tf32_frag({bp[j * 8], bp[4 * C::SB + j * 8]}, b[j], bs[j]);
  }

  __device__ __forceinline__ void compute(const float* As, const float* Bs) {
    constexpr int kSteps = C::BK / KS;
    if constexpr (C::kMma == Mma::Tf32x3) {
      mma_steps_3xtf32<kSteps>(*this, As, Bs);
      return;
    }
    if constexpr (C::kPacked) {
      // A fragment is one shared load a register here (no conversion): single-buffered, which
      // saves the registers the k-tile in flight needs; the other warps hide the load latency.
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        uint32_t a[MI][4], b[NI][2];
        load_frag(As, Bs, s * KS, a, b);
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
          for (int j = 0; j < NI; ++j) mma_bf16(acc[i][j], a[i], b[j]);
      }
      return;
    }
    mma_steps_double_buffered<kSteps>(*this, As, Bs);
  }

  __device__ __forceinline__ void stage(float* Cs, bool m_fast) const {
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int m = wm + i * 16 + g + (r / 2) * 8, n = wn + j * 8 + 2 * t + (r % 2);
          if (m_fast)
            Cs[n * (C::BM + 4) + m] = acc[i][j][r];
          else
            Cs[m * (C::BN + 4) + n] = acc[i][j][r];
        }
  }
};

template <class C>
using MathOf = std::conditional_t<C::kMma == Mma::Simt, SimtMath<C>, MmaMath<C>>;

// ---------------------------------------------------------------------------------------------
// Loader for a plain strided operand: element (x, k) of the tile's operand (x = m for A, n for
// B) is at base[x * ld + k] when k_contig, else at base[k * ld + x]. The lanes of a warp run
// along the contiguous index so the global reads coalesce:
//   k_contig: lane -> (k = lane % 8 [+ 8q], x = tid / 8 [+ T/8 r]), 32-byte row segments;
//   else:     lane -> (x = tid % BX, k = tid / BX [+ T/BX q]).
template <class C, int BX>
struct StridedLoader {
  static constexpr int S = BX + C::kPad;                  // smem row stride (SA or SB)
  static constexpr int kRowsK = BX / (C::kThreads / 8);   // rows per thread, k_contig
  static constexpr int kQK = C::BK / 8;                   // k groups per thread, k_contig
  static constexpr int kQX = C::BK / (C::kThreads / BX);  // k per thread, x-contig
  static_assert(kRowsK >= 1 && kQX >= 1, "tile too small for the thread count");
  const float* base;
  int64_t ld;
  int X, K, x0, tid;
  bool k_contig;

  __device__ __forceinline__ StridedLoader(const float* base_, int64_t ld_, bool k_contig_, int X_,
                                           int K_, int x0_, int tid_)
      : base(base_), ld(ld_), X(X_), K(K_), x0(x0_), tid(tid_), k_contig(k_contig_) {}

  __device__ __forceinline__ void load(float* s, int k0) const {
    // Sources first, then the copies back to back.
    if (k_contig) {
      const int kl = tid % 8, xl = tid / 8;
      const float* src[kRowsK][kQK];
      bool v[kRowsK][kQK];
#pragma unroll
      for (int r = 0; r < kRowsK; ++r) {
        const int x = xl + r * (C::kThreads / 8);
        const bool xv = x0 + x < X;
        const float* row = base + (x0 + x) * ld + k0;
#pragma unroll
        for (int q = 0; q < kQK; ++q) {
          const int k = kl + 8 * q;
          v[r][q] = xv && (k0 + k < K);
          src[r][q] = v[r][q] ? row + k : base;
        }
      }
#pragma unroll
      for (int r = 0; r < kRowsK; ++r)
#pragma unroll
        for (int q = 0; q < kQK; ++q)
          cp_async4(s + (kl + 8 * q) * S + xl + r * (C::kThreads / 8), src[r][q], v[r][q]);
    } else {
      const int x = tid % BX, kl = tid / BX;
      const bool xv = x0 + x < X;
      const float* src[kQX];
      bool v[kQX];
#pragma unroll
      for (int q = 0; q < kQX; ++q) {
        const int k = kl + q * (C::kThreads / BX);
        v[q] = xv && (k0 + k < K);
        src[q] = v[q] ? base + (int64_t)(k0 + k) * ld + (x0 + x) : base;
      }
#pragma unroll
      for (int q = 0; q < kQX; ++q)
        cp_async4(s + (kl + q * (C::kThreads / BX)) * S + x, src[q], v[q]);
    }
  }

  // Packed BF16 tiles (C::kPacked): the same elements through registers. Element e: k_contig
  // (r, q) = (e / kQK, e % kQK), else q = e.
  struct Regs {
    float v[kRowsK * kQK];
  };
  static_assert(kRowsK * kQK == kQX, "both layouts move BX BK / T elements a thread");
  __device__ __forceinline__ void fetch(Regs& rg, int k0) const {
    if (k_contig) {
      const int kl = tid % 8, xl = tid / 8;
#pragma unroll
      for (int r = 0; r < kRowsK; ++r) {
        const int x = xl + r * (C::kThreads / 8);
        const bool xv = x0 + x < X;
        const float* row = base + (x0 + x) * ld + k0;
#pragma unroll
        for (int q = 0; q < kQK; ++q) {
          const int k = kl + 8 * q;
          const bool v = xv && (k0 + k < K);
          rg.v[r * kQK + q] = load_or_zero(v ? row + k : base, v);
        }
      }
    } else {
      const int x = tid % BX, kl = tid / BX;
      const bool xv = x0 + x < X;
#pragma unroll
      for (int q = 0; q < kQX; ++q) {
        const int k = kl + q * (C::kThreads / BX);
        const bool v = xv && (k0 + k < K);
        rg.v[q] = load_or_zero(v ? base + (int64_t)(k0 + k) * ld + (x0 + x) : base, v);
      }
    }
  }
  __device__ __forceinline__ void store(uint32_t* s, const Regs& rg) const {
    if (k_contig) {
      const int kl = tid % 8, xl = tid / 8;
#pragma unroll
      for (int r = 0; r < kRowsK; ++r)
#pragma unroll
        for (int q = 0; q < kQK; ++q)
          store_bf16(s, S, kl + 8 * q, xl + r * (C::kThreads / 8), rg.v[r * kQK + q]);
    } else {
      store_mlane<S, kQX, C::kThreads / BX>(s, tid / BX, tid % BX, rg.v);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Whether P stacks several GEMMs along M (P::kStackedAlongM, see the top of the file).
template <class P, class = void>
struct StackedAlongM : std::false_type {};
template <class P>
struct StackedAlongM<P, std::void_t<decltype(P::kStackedAlongM)>>
    : std::integral_constant<bool, P::kStackedAlongM> {};

// The main loop that igemm_kernel and the 16-byte path's vec_gemm_kernel (gemm_tile_vec.cuh)
// share.

// The k-tiles of block split `split` of `splits`: ceil(K / bk) k-tiles cut into equal runs,
// [kt0, kt0 + nk) (nk may be 0 for the last splits).
struct KTileRun {
  int kt0, nk;
};
__device__ __forceinline__ KTileRun k_tile_run(int K, int bk, int split, int splits) {
  const int ktiles = (K + bk - 1) / bk;
  const int per = (ktiles + splits - 1) / splits;
  const int kt0 = min(split * per, ktiles);
  return {kt0, min(kt0 + per, ktiles) - kt0};
}

// A kStages-deep cp.async pipeline over the run: al / bl copy the A / B tile of a k offset into
// a stage's buffers (stage_a(s), stage_b(s)), and math.compute consumes tile i while the copies of
// tile i + kStages - 1 are in flight. Returns with every copy landed and the block synchronized,
// so the pipeline buffers may be reused (the epilogue's staging tile).
template <class C, class ALoader, class BLoader, class Math, class StageA, class StageB>
__device__ __forceinline__ void run_k_pipeline(const ALoader& al, const BLoader& bl, Math& math,
                                               KTileRun run, StageA stage_a, StageB stage_b) {
  const int kt0 = run.kt0, nk = run.nk;
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < nk) {
      al.load(stage_a(s), (kt0 + s) * C::BK);
      bl.load(stage_b(s), (kt0 + s) * C::BK);
    }
    cp_async_commit();
  }
  for (int i = 0; i < nk; ++i) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();  // tile i visible to all; everyone is done with tile i - 1's buffer
    const int nx = i + C::kStages - 1;
    if (nx < nk) {
      al.load(stage_a(nx % C::kStages), (kt0 + nx) * C::BK);
      bl.load(stage_b(nx % C::kStages), (kt0 + nx) * C::BK);
    }
    cp_async_commit();
    math.compute(stage_a(i % C::kStages), stage_b(i % C::kStages));
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline buffers become the staging tile
}

// The packed-BF16 main loop: two shared-memory stages and one k-tile in registers. Iteration i
// computes tile i from stage i % 2 while the global loads of tile i + 1 (issued one iteration
// earlier) land in registers; then the thread rounds and stores tile i + 1 into the other stage
// (last read by tile i - 1, which every thread finished before this iteration's barrier) and
// issues the loads of tile i + 2. One barrier per k-tile; the loads have a whole tile's math to
// arrive. Returns with the block synchronized (the staging tile reuses the stages).
template <class C, class ALoader, class BLoader, class Math>
__device__ __forceinline__ void run_k_pipeline_packed(const ALoader& al, const BLoader& bl,
                                                      Math& math, KTileRun run, uint32_t* smem) {
  constexpr int kAWords = C::BK / 2 * C::SA;
  auto stage_a = [&](int s) { return smem + s * C::kStageFloats; };
  auto stage_b = [&](int s) { return smem + s * C::kStageFloats + kAWords; };
  const int kt0 = run.kt0, nk = run.nk;
  typename ALoader::Regs ra;
  typename BLoader::Regs rb;
  if (nk > 0) {
    al.fetch(ra, kt0 * C::BK);
    bl.fetch(rb, kt0 * C::BK);
    al.store(stage_a(0), ra);
    bl.store(stage_b(0), rb);
  }
  if (nk > 1) {
    al.fetch(ra, (kt0 + 1) * C::BK);
    bl.fetch(rb, (kt0 + 1) * C::BK);
  }
  for (int i = 0; i < nk; ++i) {
    __syncthreads();  // tile i stored by all; everyone is done with tile i - 1's stage
    math.compute(reinterpret_cast<const float*>(stage_a(i % 2)),
                 reinterpret_cast<const float*>(stage_b(i % 2)));
    if (i + 1 < nk) {
      al.store(stage_a((i + 1) % 2), ra);
      bl.store(stage_b((i + 1) % 2), rb);
    }
    if (i + 2 < nk) {
      al.fetch(ra, (kt0 + i + 2) * C::BK);
      bl.fetch(rb, (kt0 + i + 2) * C::BK);
    }
  }
  __syncthreads();  // the stages become the staging tile
}

// ---------------------------------------------------------------------------------------------
// The kernel. Block (bx, by, bz) computes tile (bx, by) over the bz-th of gridDim.z equal runs
// of k-tiles. Thread mapping: the math classes above (each thread a register micro-tile, or a
// warp an MMA warp tile); in the epilogue thread tid owns staged elements tid, tid + T, ...
// (m- or n-fastest as the problem asks). P::kClusterSplit with gridDim.z > 1: the splits of a
// tile form one thread-block cluster and are summed through distributed shared memory before
// apply(); otherwise apply() sees each split's partial sums.
template <class C, class P>
__device__ __forceinline__ void igemm_body(const P& p) {
  extern __shared__ float4 smem_f4[];
  float* smem = reinterpret_cast<float*>(smem_f4);
  const int tid = threadIdx.x;
  const int m0 = blockIdx.x * C::BM, n0 = blockIdx.y * C::BN;
  const int split = blockIdx.z, splits = gridDim.z;
  int K = p.K;
  if constexpr (StackedAlongM<P>::value) K = p.k_of(m0);
  const KTileRun run = k_tile_run(K, C::BK, split, splits);

  // Optional per-block lookup table (e.g. the k -> tap offsets of a convolution's gather),
  // placed after the pipeline / staging buffers.
  const int* table = nullptr;
  if constexpr (P::kHasTable) {
    if (p.table_ints > 0) {
      int* t = reinterpret_cast<int*>(smem + C::kSmemBytes / sizeof(float));
      if constexpr (StackedAlongM<P>::value)
        p.build_table_of(t, tid, C::kThreads, m0);
      else
        p.build_table(t, tid, C::kThreads);
      __syncthreads();
      table = t;
    }
  }
  const typename P::template ALoader<C> al(p, m0, tid, table);
  const typename P::template BLoader<C> bl(p, n0, tid, table);
  MathOf<C> math(tid);

  auto stage_a = [&](int s) { return smem + s * C::kStageFloats; };
  auto stage_b = [&](int s) { return smem + s * C::kStageFloats + C::BK * C::SA; };

  if constexpr (C::kPacked)
    run_k_pipeline_packed<C>(al, bl, math, run, reinterpret_cast<uint32_t*>(smem));
  else
    run_k_pipeline<C>(al, bl, math, run, stage_a, stage_b);

  constexpr bool kMFast = P::kMFastOut;
  float* Cs = smem;
  math.stage(Cs, kMFast);
  constexpr int kElems = C::BM * C::BN;
  auto coords = [](int e, int& m, int& n, int& idx) {
    if (kMFast) {
      m = e % C::BM;
      n = e / C::BM;
      idx = n * (C::BM + 4) + m;
    } else {
      n = e % C::BN;
      m = e / C::BN;
      idx = m * (C::BN + 4) + n;
    }
  };

  if (P::kClusterSplit && splits > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every split's tile staged
    const int rank = static_cast<int>(cluster.block_rank());
    const int chunk = ((kElems + splits - 1) / splits + 31) / 32 * 32;
    const int e_end = min(kElems, (rank + 1) * chunk);
    for (int e = rank * chunk + tid; e < e_end; e += C::kThreads) {
      int m, n, idx;
      coords(e, m, n, idx);
      float v = 0.f;
      for (int q = 0; q < splits; ++q) v += cluster.map_shared_rank(Cs, q)[idx];  // fixed order
      if (m0 + m < p.M && n0 + n < p.N) p.apply(m0 + m, n0 + n, v, 0);
    }
    cluster.sync();  // keep this block's shared memory alive until every reader is done
#else
    __trap();  // the launcher never asks for clusters below sm_90
#endif
  } else {
    __syncthreads();
    for (int e = tid; e < kElems; e += C::kThreads) {
      int m, n, idx;
      coords(e, m, n, idx);
      if (m0 + m < p.M && n0 + n < p.N) p.apply(m0 + m, n0 + n, Cs[idx], split);
    }
  }
}

template <class C, class P>
__global__ void __launch_bounds__(C::kThreads) igemm_kernel(const __grid_constant__ P p) {
  ptx::griddep_enter();
  igemm_body<C>(p);
}

// Packed tiles: the registers that hold the k-tile in flight would otherwise leave room for only
// two blocks (8 warps) per SM; the bound keeps three.
template <class C, class P>
__global__ void __launch_bounds__(C::kThreads, 3) igemm_packed_kernel(const __grid_constant__ P p) {
  ptx::griddep_enter();
  igemm_body<C>(p);
}

// ---------------------------------------------------------------------------------------------
// Host side.

struct DeviceInfo {
  int sms = 132;
  bool clusters = false;  // sm_90+: thread-block clusters for the split-K reduction
};

inline DeviceInfo device_info() {
  int dev = 0, sms = 0, major = 0;
  CNN_CUDA_CHECK(cudaGetDevice(&dev));
  CNN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CNN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return DeviceInfo{sms, major >= 9};
}

// Launches igemm_kernel<C, P> over a (ceil(M/BM), ceil(N/BN), splits) grid on `stream`. With
// P::kClusterSplit and splits > 1 the splits of a tile form a cluster (splits <= 8, sm_90).
template <class C, class P>
void launch(const P& p, int splits, cudaStream_t stream, const char* name) {
  const int64_t tiles_m = ceil_div<int64_t>(p.M, C::BM), tiles_n = ceil_div<int64_t>(p.N, C::BN);
  CNN_CHECK(tiles_m <= 0x7fffffff && tiles_n <= 65535 && splits >= 1 && splits <= 65535,
            "{}: grid ({}, {}, {}) exceeds the CUDA limits", name, tiles_m, tiles_n, splits);
  const bool use_cluster = P::kClusterSplit && splits > 1;
  CNN_CHECK(!use_cluster || splits <= 8, "{}: cluster split-K of {} > 8", name, splits);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(tiles_m), static_cast<unsigned>(tiles_n),
                     static_cast<unsigned>(splits));
  cfg.blockDim = dim3(C::kThreads);
  std::size_t smem_bytes = C::kSmemBytes;
  if constexpr (P::kHasTable) smem_bytes += sizeof(int) * static_cast<std::size_t>(p.table_ints);
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if (use_cluster) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = static_cast<unsigned>(splits);
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  void (*kern)(P) = nullptr;
  if constexpr (C::kPacked)
    kern = igemm_packed_kernel<C, P>;
  else
    kern = igemm_kernel<C, P>;
  if (smem_bytes > 48 * 1024)
    CNN_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem_bytes)));
  CNN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, p));
  CNN_LAUNCH_CHECK(name);
}

// Largest power-of-two split (<= max_split) that keeps at least min_ktiles k-tiles per split,
// stopping once tiles * split reaches target_blocks.
inline int pick_splits(int64_t tiles, int ktiles, int64_t target_blocks, int max_split,
                       int min_ktiles) {
  int s = 1;
  while (s * 2 <= max_split && tiles * s < target_blocks && ktiles / (s * 2) >= min_ktiles) s *= 2;
  return s;
}

}  // namespace cnn::igemm
