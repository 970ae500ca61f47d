#pragma once
// The inline-PTX wrappers and the fast integer division that every tiled kernel shares (dense
// GEMM, implicit-GEMM convolution and its dedicated gradient kernels): one copy, so a fix or a new
// architecture's variant lands everywhere. Device code only; sm_80+ (cp.async, mma.sync TF32 and
// BF16), the cluster functions sm_90+.
#include <cuda_runtime.h>

#include <cstdint>

namespace cnn::ptx {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ldmatrix .x4 .b16: four 8 x 8 matrices of 16-bit elements, each 8 rows of 16 bytes (4 words).
// Lanes 8q .. 8q + 7 give the shared addresses (16-byte aligned) of matrix q's rows; lane l
// receives word l % 4 of row l / 4 of matrix q in r[q]. On a tile of 32-bit values a matrix is
// 8 rows x 4 values, so one load gives a thread the value (row g, column t) of four 8 x 4 blocks
// (g = lane / 4, t = lane % 4): the m16n8k8 TF32 fragment layout.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(row_addr)));
}

// 4-byte asynchronous copy global -> shared; valid == false writes a zero and reads nothing
// (src must still be a mapped address, so callers pass a base pointer then).
__device__ __forceinline__ void cp_async4(float* dst, const float* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}

// 16-byte asynchronous copy global -> shared, L1 bypassed; reads `bytes` (0, 4, 8, 12 or 16)
// and zero-fills the rest. src must be 16-byte aligned (and mapped, even when bytes == 0).
__device__ __forceinline__ void cp_async16(float* dst, const float* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Rounds to TF32 (10-bit mantissa, round to nearest, ties away), as cuBLAS/cuDNN's TF32 mode.
__device__ __forceinline__ uint32_t to_tf32(float f) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(f));
  return r;
}

// v as two TF32 values (bit patterns) for 3xTF32: big = TF32(v), small = TF32(v - big); big +
// small holds v to about 2^-22 of it (nearest rounding twice).
struct Tf32Split {
  uint32_t big, small;
};
__device__ __forceinline__ Tf32Split split_tf32(float v) {
  const uint32_t big = to_tf32(v);
  return {big, to_tf32(v - __uint_as_float(big))};
}

// The n values of a TF32 fragment split for 3xTF32 (split_tf32 each).
template <int N>
__device__ __forceinline__ void split_tf32_frag(const float (&v)[N], uint32_t (&big)[N],
                                                uint32_t (&small)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const Tf32Split sp = split_tf32(v[i]);
    big[i] = sp.big;
    small[i] = sp.small;
  }
}

// d[0..3] += a * b for one 16x8x8 TF32 tile, FP32 accumulation.
__device__ __forceinline__ void mma_tf32(float* d, const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Packs two floats into a bf16x2 register, each rounded to nearest even (8 significant bits):
// `lo` lands in bits 0..15, the element of the lower k index in the mma.sync fragment layouts.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// d[0..3] += a * b at about FP32 accuracy from split fragments (split_tf32_frag): small_A big_B +
// big_A small_B + big_A big_B, three m16n8k8 TF32 MMAs (small_A small_B, about 2^-22 of the
// product, is left out).
__device__ __forceinline__ void mma_3xtf32(float* d, const uint32_t (&a)[4],
                                           const uint32_t (&a_small)[4], const uint32_t (&b)[2],
                                           const uint32_t (&b_small)[2]) {
  mma_tf32(d, a_small, b);
  mma_tf32(d, a, b_small);
  mma_tf32(d, a, b);
}

// d[0..3] += a * b for one 16x8x16 BF16 tile, FP32 accumulation. Fragments (g = lane / 4,
// t = lane % 4; each register a bf16 pair, lower k in the low half): a0 (row g, k 2t..2t+1),
// a1 (row g+8, same k), a2 (row g, k 2t+8..2t+9), a3 (row g+8, k 2t+8..); b0 (k 2t..2t+1,
// col g), b1 (k 2t+8..2t+9, col g). Accumulators as in mma_tf32.
__device__ __forceinline__ void mma_bf16(float* d, const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Programmatic dependent launch (sm_90; no-ops on older devices and for a grid launched without
// the programmatic-serialization attribute). griddep_wait: blocks until the grid this one depends
// on has completed and its memory writes are visible (place it before the first read of anything
// that grid writes). griddep_launch_dependents: this block no longer holds back the launch of a
// dependent grid (the dependent still waits for this grid's completion in its griddep_wait).
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The first statement of every kernel of the project (tests/test_kernel_entry.cpp checks it): wait
// until the grid before this one in the stream has finished and its writes are visible (a no-op
// unless launched as a programmatic dependent). A captured training step makes its kernel ->
// kernel edges programmatic (runtime/graph_overlap.h): the kernel after this one is launched
// when this one's blocks have all exited, or have all begun (the graph's choice; only the int8
// linear kernel signals it itself, after its main loop), and its blocks wait here while this
// one drains, which hides the launch gap. Waiting first keeps every read and write of the kernel
// after the previous grid's completion: no hazard, even write after read.
__device__ __forceinline__ void griddep_enter() {
  griddep_wait();
}

// A load of data the grid this one depends on writes, issued after griddep_wait: a plain
// coherent load (ld.global.cg, cached in L2 only, where that grid's writes are once griddep_wait
// returns). Not __ldg / ld.global.nc: the non-coherent path assumes the data is read-only for the
// kernel's whole lifetime, which an overlapped launch breaks (the writer still runs when this
// kernel starts): on the H200 the overlapped int8 classifier read wrong values of x through __ldg
// and the right ones through these loads.
__device__ __forceinline__ int ld_after_griddep(const int* p) {
  int v;
  asm volatile("ld.global.cg.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int4 ld_after_griddep(const int4* p) {
  int4 v;
  asm volatile("ld.global.cg.v4.s32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Thread-block clusters (sm_90, no arch-specific features): the rank of this block in its
// cluster, the cluster's block count (1 when launched without clusters), a barrier of every
// thread of every block of the cluster that orders shared-memory writes before it with reads
// after it, and 16-byte reads of another block's shared memory (floats, ints, double pairs).
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_size() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}
// A cluster barrier that orders no memory: for keeping a block's shared memory alive until the
// other blocks' reads of it have returned (their values used before the arrive), where a
// release arrive would also fence every global store of the block at GPU scope.
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile(
      "barrier.cluster.arrive.relaxed.aligned;\n"
      "barrier.cluster.wait.aligned;\n" ::
          : "memory");
}
// The cluster and block barriers without .aligned: the threads of a warp may reach them apart,
// where an .aligned barrier (cluster_sync, __syncthreads) reached by a diverged warp is undefined.
// For code after data-dependent branches, where the compiler need not have reconverged the warp.
// compute-sanitizer's synccheck still reports a warp that arrives split, so such code should
// keep its warps converged too (branch-free loads: batchnorm_one_pass.cu).
__device__ __forceinline__ void cluster_sync_divergent() {
  asm volatile(
      "barrier.cluster.arrive.release;\n"
      "barrier.cluster.wait.acquire;\n" ::
          : "memory");
}
__device__ __forceinline__ void block_sync_divergent() {
  asm volatile("barrier.sync 0;\n" ::: "memory");
}
// The address of `local` (a shared::cta address) in the shared memory of cluster block `rank`.
__device__ __forceinline__ uint32_t map_rank(uint32_t local, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(local), "r"(rank));
  return r;
}
__device__ __forceinline__ float4 ld_cluster_v4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ int4 ld_cluster_s32x4(uint32_t addr) {
  int4 v;
  asm volatile("ld.shared::cluster.v4.s32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ double2 ld_cluster_f64x2(uint32_t addr) {
  double2 v;
  asm volatile("ld.shared::cluster.v2.f64 {%0, %1}, [%2];\n"
               : "=d"(v.x), "=d"(v.y)
               : "r"(addr)
               : "memory");
  return v;
}
#endif

// Division by a run-time constant with a multiply and a shift (0 <= n < 2^31), for the index
// decompositions of the gathers (k -> channel, tap, ...), which would otherwise cost ~20
// instructions each. Round-up method: m = floor(2^32 (2^l - d) / d) + 1, q = (hi(n m) + n) >> l.
struct FastDiv {
  uint32_t d = 1, mul = 0, shift = 0;
  FastDiv() = default;
  explicit FastDiv(int divisor) : d(static_cast<uint32_t>(divisor)) {
    while ((uint64_t{1} << shift) < d) ++shift;
    mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ int div(int n) const {
    return static_cast<int>((__umulhi(static_cast<uint32_t>(n), mul) + static_cast<uint32_t>(n)) >>
                            shift);
  }
};

}  // namespace cnn::ptx
