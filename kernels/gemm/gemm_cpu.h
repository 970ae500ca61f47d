#pragma once
// Single-precision GEMM on the CPU, row-major: C (m, n) = alpha * op(A) * op(B) + beta * C.
// Cache-blocked and packed, with a register micro-kernel picked at run time for the CPU at hand
// (AVX-512, AVX2+FMA, or portable C++), so one binary runs on any x86-64.
//
// Results are bitwise independent of the thread count and of how the work is split: every C
// element is accumulated by one thread in the same order (K blocks of fixed size, in order).
// They do depend on the instruction set (FMA contracts rounding), so CNN_CPU_ISA pins it when
// results must match across machines.
#include <cstdint>

namespace cnn {

enum class CpuIsa { Best, Scalar, Avx2, Avx512 };

// The micro-kernel CpuIsa::Best resolves to here: the best the CPU supports, lowered (never
// raised) by CNN_CPU_ISA=scalar|avx2|avx512. Throws on another value of CNN_CPU_ISA.
CpuIsa gemm_cpu_best_isa();
const char* cpu_isa_name(CpuIsa isa);
bool cpu_isa_supported(CpuIsa isa);  // Best and Scalar: always

struct GemmOptions {
  bool parallel = true;       // false: run on the calling thread only (callers already in parallel)
  CpuIsa isa = CpuIsa::Best;  // a specific one must be supported (tests run each path)
};

// op(A) is (m, k): A is stored (m, k) with row stride lda, or, with trans_a, (k, m).
// op(B) is (k, n): B is stored (k, n) with row stride ldb, or, with trans_b, (n, k).
// C is (m, n) with row stride ldc. beta == 0 writes C without reading it (NaN there is
// overwritten, as in BLAS). k == 0 gives C = beta * C. m or n == 0: nothing.
void gemm_cpu(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc, const GemmOptions& opt = {});

}  // namespace cnn
