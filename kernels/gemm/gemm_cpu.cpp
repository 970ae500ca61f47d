#include "kernels/gemm/gemm_cpu.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/env_switches.h"
#include "runtime/error.h"
#include "runtime/math_util.h"
#include "runtime/thread_pool.h"

namespace cnn {
namespace {

// Blocking (BLIS-style): a (kKC, nc) block of packed B is shared by the micro-kernels of all
// (mc, kKC) blocks of packed A below it; one (kKC, NR) micro-panel of B stays in L1 while the
// micro-kernel walks every (MR, kKC) panel of the A block in L2. The K block is fixed for every
// instruction set and every split, which is what makes results independent of the split.
constexpr int64_t kKC = 256;
constexpr int64_t kMC = 128;   // rows of A per packed block (rounded to MR): 128 KiB at kKC
constexpr int64_t kNC = 1024;  // columns of B per packed block (rounded to NR): 1 MiB at kKC

// Micro-kernel: c (MR, NR, row stride ldc) = alpha * a_panel * b_panel + beta * c, where
// a_panel is (kc, MR) and b_panel (kc, NR), both packed k-major. beta == 0 does not read c.
using MicroFn = void (*)(int64_t kc, const float* a, const float* b, float* c, int64_t ldc,
                         float alpha, float beta);

// ---- Portable micro-kernel: plain loops the compiler vectorizes with the baseline ISA. ----
constexpr int kScalarMR = 4, kScalarNR = 8;

void micro_scalar(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
                  float beta) {
  float acc[kScalarMR][kScalarNR] = {};
  for (int64_t p = 0; p < kc; ++p) {
    for (int i = 0; i < kScalarMR; ++i)
      for (int j = 0; j < kScalarNR; ++j) acc[i][j] += a[i] * b[j];
    a += kScalarMR;
    b += kScalarNR;
  }
  for (int i = 0; i < kScalarMR; ++i) {
    float* ci = c + i * ldc;
    for (int j = 0; j < kScalarNR; ++j) {
      const float t = alpha * acc[i][j];
      ci[j] = beta == 0.f ? t : (beta == 1.f ? ci[j] + t : beta * ci[j] + t);
    }
  }
}

// ---- AVX2 + FMA: 6 x 16 tile, 12 ymm accumulators, 2 B loads and 6 broadcasts per k. ----
constexpr int kAvx2MR = 6, kAvx2NR = 16;

__attribute__((target("avx2,fma"))) void micro_avx2(int64_t kc, const float* a, const float* b,
                                                    float* c, int64_t ldc, float alpha,
                                                    float beta) {
  __m256 acc[kAvx2MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < kAvx2MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t p = 0; p < kc; ++p) {
    const __m256 b0 = _mm256_loadu_ps(b);
    const __m256 b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 8
    for (int i = 0; i < kAvx2MR; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + i);
      acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
    }
    a += kAvx2MR;
    b += kAvx2NR;
  }
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
#pragma GCC unroll 8
  for (int i = 0; i < kAvx2MR; ++i) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      float* ci = c + i * ldc + 8 * h;
      const __m256 t = _mm256_mul_ps(va, acc[i][h]);
      if (beta == 0.f)
        _mm256_storeu_ps(ci, t);
      else if (beta == 1.f)
        _mm256_storeu_ps(ci, _mm256_add_ps(_mm256_loadu_ps(ci), t));
      else
        _mm256_storeu_ps(ci, _mm256_fmadd_ps(vb, _mm256_loadu_ps(ci), t));
    }
  }
}

// ---- AVX-512: 8 x 32 tile, 16 zmm accumulators, 2 B loads and 8 broadcasts per k. ----
constexpr int kAvx512MR = 8, kAvx512NR = 32;

__attribute__((target("avx512f,avx2,fma"))) void micro_avx512(int64_t kc, const float* a,
                                                              const float* b, float* c, int64_t ldc,
                                                              float alpha, float beta) {
  __m512 acc[kAvx512MR][2];
#pragma GCC unroll 16
  for (int i = 0; i < kAvx512MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kc; ++p) {
    const __m512 b0 = _mm512_loadu_ps(b);
    const __m512 b1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 16
    for (int i = 0; i < kAvx512MR; ++i) {
      const __m512 ai = _mm512_set1_ps(a[i]);
      acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
    }
    a += kAvx512MR;
    b += kAvx512NR;
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 16
  for (int i = 0; i < kAvx512MR; ++i) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      float* ci = c + i * ldc + 16 * h;
      const __m512 t = _mm512_mul_ps(va, acc[i][h]);
      if (beta == 0.f)
        _mm512_storeu_ps(ci, t);
      else if (beta == 1.f)
        _mm512_storeu_ps(ci, _mm512_add_ps(_mm512_loadu_ps(ci), t));
      else
        _mm512_storeu_ps(ci, _mm512_fmadd_ps(vb, _mm512_loadu_ps(ci), t));
    }
  }
}

// ---- Packing. ----
// Two primitives cover the four cases: a straight copy (the source rows already run along k) and
// a transposing copy (the source rows run along m or n). Both write (kc, width) panels with the
// entries past the valid ones zero, so that edge tiles need no special micro-kernel.

// dst[p * W + r] = src[p * lds + r] for r < ncols, zero for ncols <= r < W. A full panel copies
// a compile-time number of floats per k, which the compiler turns into plain vector moves.
template <int W>
__attribute__((always_inline)) inline void copy_panel(const float* src, int64_t lds, int ncols,
                                                      int64_t kc, float* dst) {
  if (ncols == W) {
    for (int64_t p = 0; p < kc; ++p)
      for (int r = 0; r < W; ++r) dst[p * W + r] = src[p * lds + r];
    return;
  }
  for (int64_t p = 0; p < kc; ++p) {
    for (int r = 0; r < ncols; ++r) dst[p * W + r] = src[p * lds + r];
    for (int r = ncols; r < W; ++r) dst[p * W + r] = 0.f;
  }
}

// dst[p * ldd + r] = src[r * lds + p] for r < nrows (<= 8), p < kc; zero for nrows <= r < width.
void transpose_panel_scalar(const float* src, int64_t lds, int nrows, int64_t kc, float* dst,
                            int64_t ldd, int width) {
  for (int r = 0; r < width; ++r) {
    float* d = dst + r;
    if (r >= nrows) {
      for (int64_t p = 0; p < kc; ++p) d[p * ldd] = 0.f;
      continue;
    }
    const float* s = src + r * lds;
    for (int64_t p = 0; p < kc; ++p) d[p * ldd] = s[p];  // reads contiguous, writes into L1
  }
}

// The same through 8x8 register transposes: 8 loads and 8 stores per 64 floats instead of 64
// scalar moves. width is 8, or 6 for the AVX2 (6, 16) tile (masked stores).
__attribute__((target("avx2,fma"))) void transpose_panel_avx2(const float* src, int64_t lds,
                                                              int nrows, int64_t kc, float* dst,
                                                              int64_t ldd, int width) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(width), lane);
  int64_t p = 0;
  for (; p + 8 <= kc; p += 8) {
    __m256 r[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i)
      r[i] = i < nrows ? _mm256_loadu_ps(src + i * lds + p) : _mm256_setzero_ps();
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    // s_q holds column q of rows 0-3 in its low half and column q+4 in its high half; rows 4-7
    // likewise in s_{q+4}.
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    const __m256 c[8] = {
        _mm256_permute2f128_ps(s0, s4, 0x20), _mm256_permute2f128_ps(s1, s5, 0x20),
        _mm256_permute2f128_ps(s2, s6, 0x20), _mm256_permute2f128_ps(s3, s7, 0x20),
        _mm256_permute2f128_ps(s0, s4, 0x31), _mm256_permute2f128_ps(s1, s5, 0x31),
        _mm256_permute2f128_ps(s2, s6, 0x31), _mm256_permute2f128_ps(s3, s7, 0x31)};
    if (width == 8) {
#pragma GCC unroll 8
      for (int q = 0; q < 8; ++q) _mm256_storeu_ps(dst + (p + q) * ldd, c[q]);
    } else {
#pragma GCC unroll 8
      for (int q = 0; q < 8; ++q) _mm256_maskstore_ps(dst + (p + q) * ldd, mask, c[q]);
    }
  }
  for (; p < kc; ++p)
    for (int i = 0; i < width; ++i) dst[p * ldd + i] = i < nrows ? src[i * lds + p] : 0.f;
}

// op(A) rows [i0, i0+mlen), columns [p0, p0+kc) -> ceil(mlen/MR) panels of (kc, MR).
template <int MR, bool kAvx2>
__attribute__((always_inline)) inline void pack_a(bool trans, const float* a, int64_t lda,
                                                  int64_t i0, int64_t mlen, int64_t p0, int64_t kc,
                                                  float* out) {
  for (int64_t ip = 0; ip < mlen; ip += MR) {
    const int rows = static_cast<int>(std::min<int64_t>(MR, mlen - ip));
    float* dst = out + ip * kc;  // panel ip/MR starts at (ip/MR) * MR * kc
    if (trans) {                 // op(A)(i, p) = a[p * lda + i]: k rows contiguous in i
      copy_panel<MR>(a + p0 * lda + i0 + ip, lda, rows, kc, dst);
      continue;
    }
    // op(A)(i, p) = a[i * lda + p]: rows contiguous in p, transposed 8 rows at a time.
    for (int g = 0; g < MR; g += 8) {
      const int nrows = std::clamp(rows - g, 0, 8), width = std::min(8, MR - g);
      const float* src = nrows > 0 ? a + (i0 + ip + g) * lda + p0 : a;  // a: not read
      if (kAvx2)
        transpose_panel_avx2(src, lda, nrows, kc, dst + g, MR, width);
      else
        transpose_panel_scalar(src, lda, nrows, kc, dst + g, MR, width);
    }
  }
}

// op(B) rows [p0, p0+kc), columns [j0, j0+nlen) -> ceil(nlen/NR) panels of (kc, NR).
template <int NR, bool kAvx2>
__attribute__((always_inline)) inline void pack_b(bool trans, const float* b, int64_t ldb,
                                                  int64_t p0, int64_t kc, int64_t j0, int64_t nlen,
                                                  float* out) {
  for (int64_t jp = 0; jp < nlen; jp += NR) {
    const int cols = static_cast<int>(std::min<int64_t>(NR, nlen - jp));
    float* dst = out + jp * kc;
    if (!trans) {  // op(B)(p, j) = b[p * ldb + j]
      copy_panel<NR>(b + p0 * ldb + j0 + jp, ldb, cols, kc, dst);
      continue;
    }
    // op(B)(p, j) = b[j * ldb + p]
    for (int g = 0; g < NR; g += 8) {
      const int nrows = std::clamp(cols - g, 0, 8), width = std::min(8, NR - g);
      const float* src = nrows > 0 ? b + (j0 + jp + g) * ldb + p0 : b;  // b: not read
      if (kAvx2)
        transpose_panel_avx2(src, ldb, nrows, kc, dst + g, NR, width);
      else
        transpose_panel_scalar(src, ldb, nrows, kc, dst + g, NR, width);
    }
  }
}

using PackAFn = void (*)(bool trans, const float* a, int64_t lda, int64_t i0, int64_t mlen,
                         int64_t p0, int64_t kc, float* out);
using PackBFn = void (*)(bool trans, const float* b, int64_t ldb, int64_t p0, int64_t kc,
                         int64_t j0, int64_t nlen, float* out);

// The packing loops compiled for each instruction set (inlined into these wrappers), so that the
// straight copies move whole 256- or 512-bit vectors.
#define CNN_PACK_WRAPPERS(name, target_isa, MR, NR, simd)                                         \
  __attribute__((target(target_isa))) void pack_a_##name(bool trans, const float* a, int64_t lda, \
                                                         int64_t i0, int64_t mlen, int64_t p0,    \
                                                         int64_t kc, float* out) {                \
    pack_a<MR, simd>(trans, a, lda, i0, mlen, p0, kc, out);                                       \
  }                                                                                               \
  __attribute__((target(target_isa))) void pack_b_##name(bool trans, const float* b, int64_t ldb, \
                                                         int64_t p0, int64_t kc, int64_t j0,      \
                                                         int64_t nlen, float* out) {              \
    pack_b<NR, simd>(trans, b, ldb, p0, kc, j0, nlen, out);                                       \
  }
CNN_PACK_WRAPPERS(avx512, "avx512f,avx2,fma", kAvx512MR, kAvx512NR, true)
CNN_PACK_WRAPPERS(avx2, "avx2,fma", kAvx2MR, kAvx2NR, true)
#undef CNN_PACK_WRAPPERS

struct Kernel {
  int mr, nr;
  MicroFn micro;
  PackAFn pack_a;
  PackBFn pack_b;
};

Kernel kernel_for(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx512:
      return {kAvx512MR, kAvx512NR, micro_avx512, pack_a_avx512, pack_b_avx512};
    case CpuIsa::Avx2:
      return {kAvx2MR, kAvx2NR, micro_avx2, pack_a_avx2, pack_b_avx2};
    default:
      return {kScalarMR, kScalarNR, micro_scalar, pack_a<kScalarMR, false>,
              pack_b<kScalarNR, false>};
  }
}

// Grow-only, 64-byte aligned packing buffers, one pair per thread. They carry no values from one
// call to the next (every use packs before it reads), so they are scratch, not state.
struct PackBuffers {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> a, b;
  int64_t a_cap = 0, b_cap = 0;

  static float* grow(std::unique_ptr<float, Free>& p, int64_t& cap, int64_t need) {
    if (need > cap) {
      const int64_t bytes = ceil_div<int64_t>(need * 4, 64) * 64;
      p.reset(static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(bytes))));
      CNN_CHECK(p != nullptr, "gemm_cpu: out of memory allocating {} bytes of packing buffer",
                bytes);
      cap = need;
    }
    return p.get();
  }
};
thread_local PackBuffers t_pack;

struct GemmArgs {
  bool trans_a, trans_b;
  int64_t m, n, k;
  float alpha;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  float beta;
  float* c;
  int64_t ldc;
};

// C rows [i_lo, i_hi) x columns [j_lo, j_hi), all of K, on the calling thread.
void gemm_region(const Kernel& kern, const GemmArgs& g, int64_t i_lo, int64_t i_hi, int64_t j_lo,
                 int64_t j_hi) {
  const int mr = kern.mr, nr = kern.nr;
  const int64_t mc = ceil_div<int64_t>(kMC, mr) * mr;
  const int64_t nc = ceil_div<int64_t>(kNC, nr) * nr;
  float* pa = PackBuffers::grow(t_pack.a, t_pack.a_cap, mc * kKC);  // (mc/MR) panels (kc, MR)
  float* pb = PackBuffers::grow(t_pack.b, t_pack.b_cap, nc * kKC);  // (nc/NR) panels (kc, NR)
  alignas(64) float edge[16 * 32];  // (MR, NR) tile for partial tiles at the C border
  for (int64_t jc = j_lo; jc < j_hi; jc += nc) {
    const int64_t nlen = std::min(nc, j_hi - jc);
    for (int64_t pc = 0; pc < g.k; pc += kKC) {
      const int64_t kc = std::min(kKC, g.k - pc);
      // The first K block applies the caller's beta; later ones accumulate onto it.
      const float beta = pc == 0 ? g.beta : 1.f;
      kern.pack_b(g.trans_b, g.b, g.ldb, pc, kc, jc, nlen, pb);
      for (int64_t ic = i_lo; ic < i_hi; ic += mc) {
        const int64_t mlen = std::min(mc, i_hi - ic);
        kern.pack_a(g.trans_a, g.a, g.lda, ic, mlen, pc, kc, pa);
        for (int64_t jr = 0; jr < nlen; jr += nr) {
          const int cols = static_cast<int>(std::min<int64_t>(nr, nlen - jr));
          for (int64_t ir = 0; ir < mlen; ir += mr) {
            const int rows = static_cast<int>(std::min<int64_t>(mr, mlen - ir));
            float* ct = g.c + (ic + ir) * g.ldc + jc + jr;
            const float* ap = pa + ir * kc;
            const float* bp = pb + jr * kc;
            if (rows == mr && cols == nr) {
              kern.micro(kc, ap, bp, ct, g.ldc, g.alpha, beta);
              continue;
            }
            // Same micro-kernel on a copy, so border elements round exactly like inner ones.
            std::fill(edge, edge + mr * nr, 0.f);
            if (beta != 0.f)
              for (int i = 0; i < rows; ++i)
                std::memcpy(edge + i * nr, ct + i * g.ldc, sizeof(float) * cols);
            kern.micro(kc, ap, bp, edge, nr, g.alpha, beta);
            for (int i = 0; i < rows; ++i)
              std::memcpy(ct + i * g.ldc, edge + i * nr, sizeof(float) * cols);
          }
        }
      }
    }
  }
}

// C = beta * C, for k == 0 (no product to add).
void scale_c(const GemmArgs& g) {
  for (int64_t i = 0; i < g.m; ++i) {
    float* ci = g.c + i * g.ldc;
    for (int64_t j = 0; j < g.n; ++j) ci[j] = g.beta == 0.f ? 0.f : g.beta * ci[j];
  }
}

CpuIsa detect_isa() {
  CpuIsa best = CpuIsa::Scalar;
  if (cpu_isa_supported(CpuIsa::Avx512))
    best = CpuIsa::Avx512;
  else if (cpu_isa_supported(CpuIsa::Avx2))
    best = CpuIsa::Avx2;
  CpuIsa want = best;
  switch (process_env_switches().cpu_isa) {
    case CpuIsaSwitch::Best:
      return best;
    case CpuIsaSwitch::Scalar:
      want = CpuIsa::Scalar;
      break;
    case CpuIsaSwitch::Avx2:
      want = CpuIsa::Avx2;
      break;
    case CpuIsaSwitch::Avx512:
      want = CpuIsa::Avx512;
      break;
  }
  return static_cast<int>(want) < static_cast<int>(best) ? want : best;
}

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Best:
      return "best";
    case CpuIsa::Scalar:
      return "scalar";
    case CpuIsa::Avx2:
      return "avx2";
    case CpuIsa::Avx512:
      return "avx512";
  }
  return "?";
}

bool cpu_isa_supported(CpuIsa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case CpuIsa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
             __builtin_cpu_supports("fma");
    case CpuIsa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    default:
      return true;
  }
}

CpuIsa gemm_cpu_best_isa() {
  static const CpuIsa isa = detect_isa();  // the CPU and the environment do not change
  return isa;
}

void gemm_cpu(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc, const GemmOptions& opt) {
  CNN_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm_cpu: sizes m={} n={} k={} must be >= 0", m, n, k);
  if (m == 0 || n == 0) return;
  CNN_CHECK(ldc >= n, "gemm_cpu: ldc={} must be >= n={}", ldc, n);
  if (k > 0) {
    CNN_CHECK(lda >= (trans_a ? m : k), "gemm_cpu: lda={} must be >= {} (trans_a={})", lda,
              trans_a ? m : k, trans_a);
    CNN_CHECK(ldb >= (trans_b ? k : n), "gemm_cpu: ldb={} must be >= {} (trans_b={})", ldb,
              trans_b ? k : n, trans_b);
  }
  const CpuIsa isa = opt.isa == CpuIsa::Best ? gemm_cpu_best_isa() : opt.isa;
  CNN_CHECK(cpu_isa_supported(isa), "gemm_cpu: this CPU does not support {}", cpu_isa_name(isa));
  const GemmArgs g{trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc};
  if (k == 0) {
    scale_c(g);
    return;
  }
  const Kernel kern = kernel_for(isa);
  const int threads = opt.parallel ? cpu_thread_count() : 1;
  // Split N first (each task then packs A once per K block, which is cheap next to its share of
  // the product), and M only when N has too few micro-panels to go round.
  const int64_t n_panels = ceil_div<int64_t>(n, kern.nr), m_panels = ceil_div<int64_t>(m, kern.mr);
  const int64_t flops = 2 * m * n * k;
  const int64_t max_tasks = std::max<int64_t>(1, std::min<int64_t>(threads, flops / (1 << 18)));
  const int64_t tn = std::min(max_tasks, n_panels);
  const int64_t tm = std::min(ceil_div(max_tasks, tn), m_panels);
  parallel_tasks(tm * tn, [&](int64_t t) {
    const int64_t ti = t / tn, tj = t % tn;
    const int64_t i_lo = m_panels * ti / tm * kern.mr,
                  i_hi = std::min(m, m_panels * (ti + 1) / tm * kern.mr);
    const int64_t j_lo = n_panels * tj / tn * kern.nr,
                  j_hi = std::min(n, n_panels * (tj + 1) / tn * kern.nr);
    gemm_region(kern, g, i_lo, i_hi, j_lo, j_hi);
  });
}

}  // namespace cnn
