#pragma once
// PTX wrappers shared by the Hopper (sm_90a) wgmma kernels: mbarriers, TMA tile loads, proxy
// fences, cluster/distributed shared memory, the 128-byte-swizzle K-major layout and its wgmma
// descriptor, the TF32 and BF16 wgmmas themselves, FP32 -> BF16 packing; and the host's
// cuTensorMapEncodeTiled. The
// device functions exist only in the sm_90a compilation (__CUDA_ARCH_FEAT_SM90_ALL), where the
// callers' kernels are compiled too.
// <cuda.h> gives CUtensorMap and its enums only: the encoder comes from the runtime's driver
// entry point, so nothing links libcuda.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "kernels/common/ptx.cuh"
#include "runtime/cuda_check.h"
#include "runtime/device.h"

namespace cnn {
namespace wgmma {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives and announces `bytes` still to come from the copy engine on this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// A ring of `stages` stages' barriers at `bars`: full[s] at bars + 8 s, empty[s] after them,
// expecting full_count and empty_count arrivals a phase; by one thread, then the fence that makes
// the initialization visible to the async proxy (the caller syncs the block after it).
__device__ __forceinline__ void mbar_init_ring(uint32_t bars, int stages, uint32_t full_count,
                                               uint32_t empty_count) {
  for (int s = 0; s < stages; ++s) {
    mbar_init(bars + 8u * s, full_count);
    mbar_init(bars + 8u * (stages + s), empty_count);
  }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

// A wait that should last microseconds; one that lasts 10 s (a pipeline bug: a phase or byte
// count that never completes) traps, so that the launch fails with an error instead of hanging
// the device call.
constexpr uint64_t kWaitLimitNs = 10'000'000'000ull;

// Waits until the phase with the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  if (mbar_try_wait(bar, parity)) return;
  const uint64_t start = global_ns();
  for (uint32_t spin = 1;; ++spin) {
    if (mbar_try_wait(bar, parity)) return;
    if ((spin & 1023u) == 0 && global_ns() - start > kWaitLimitNs) __trap();
  }
}

// 2-D tile load (coordinates: k, then row) into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int k, int row,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(bar)
      : "memory");
}

// 3-D tile load (coordinates innermost first), completing on `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// 4-D tile load (coordinates innermost first; negative or past the end: zero filled), completing
// on `bar`. The innermost coordinate, in bytes, must be a multiple of 16.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, int c3, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// tma_load_4d into the same shared-memory offset `dst` of every cluster block in `mask` (bit r:
// cluster rank r), each completing on its own barrier at offset `bar`.
__device__ __forceinline__ void tma_load_4d_multicast(uint32_t dst, const CUtensorMap* map, int c0,
                                                      int c1, int c2, int c3, uint32_t bar,
                                                      uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "h"(mask)
      : "memory");
}

// An arrival on the barrier at shared::cluster address `bar` (map_rank: another cluster block's),
// with the default semantics (release at CTA scope): a consumer handing a stage back whose
// wgmma reads it has waited for, as CUTLASS's multicast pipelines do. A release at cluster scope
// (.release.cluster) made the boxed weight gradient 2.1x slower on the H100.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// 4-byte asynchronous copy global -> shared (cached in L1) that reads `src_bytes` (4 or 0) and
// zero-fills the rest; src must be a mapped address even when nothing is read.
__device__ __forceinline__ void cp_async4_zfill(uint32_t dst, const float* src,
                                                uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
// An arrival on `bar` once every cp.async this thread has issued so far has landed. noinc: the
// arrival counts against the barrier's expected count (init it with the number of such threads).
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Waits for every cp.async this thread has issued.
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// Generic-proxy shared-memory writes made visible to the async proxy (wgmma reads).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void st_shared_v4(uint32_t addr, float x, float y, float z, float w) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(x), "f"(y), "f"(z),
               "f"(w)
               : "memory");
}
__device__ __forceinline__ void st_shared_v2(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

// Thread-block clusters: the shared sm_90 wrappers (kernels/common/ptx.cuh).
using ptx::cluster_rank;
using ptx::cluster_size;
using ptx::cluster_sync;
using ptx::cluster_sync_divergent;
using ptx::ld_cluster_v4;
using ptx::map_rank;

// Shared-memory matrix descriptor for a K-major operand in the 128-byte swizzle layout:
// start address >> 4 in bits 0-13; leading byte offset (unused for swizzled K-major, 1 by
// convention) in 16-29; stride byte offset 1024 >> 4 (between 8-row core-matrix groups) in
// 32-45; base offset 0 (tiles are 1024-byte aligned) in 49-51; swizzle mode 1 = 128B in 62-63.
// Adding 2 (32 bytes) to the descriptor moves the start by k = 8 tf32 within the swizzle row:
// the hardware applies the XOR on the absolute address bits, as TMA did when writing.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t tile_addr) {
  return static_cast<uint64_t>((tile_addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// Descriptor for an MN-major operand in the 128-byte swizzle layout, as a TMA box of rows of 128
// bytes (64 bf16 along M or N) lands: k row r at r * 128 bytes, 16-byte chunk c at c ^ (r % 8).
// The swizzle atom is 8 k rows x 128 bytes; stride byte offset = 1024 between atoms along k
// (8-row groups), leading byte offset = `mn_stride` bytes between atoms along M/N (the next 64
// elements; unused when the operand is 64 wide). A k16 step is 16 rows: start + 2048 bytes.
__device__ __forceinline__ uint64_t sw128_mn_desc(uint32_t tile_addr, uint32_t mn_stride) {
  return static_cast<uint64_t>((tile_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((mn_stride >> 4) & 0x3FFF) << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across the asynchronous wgmma.
__device__ __forceinline__ void fence_acc(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The wgmmas: d (64 x N per warpgroup) += A (64 x K) * B (K x N), both K-major from shared memory
// through descriptors, FP32 accumulate. The accumulator operands are N / 2 registers per thread,
// spelled out by the macros below (inline PTX needs one operand per register). Thread (warp w,
// lane l) holds, for j < N / 8: d[4j + 0, 1] = D[16 w + l / 4][8 j + 2 (l % 4) + 0, 1] and
// d[4j + 2, 3] the same columns of row 16 w + l / 4 + 8. The trailing immediates: scale-d 1 (add
// to d), scale-a/b 1; BF16 also takes the two transpose flags, 0 (both K-major). TF32 k8 and
// BF16 k16 both step 32 bytes of a swizzle row.
#define CNN_WGMMA_D8(i)                                                                       \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define CNN_WGMMA_D16 CNN_WGMMA_D8(0), CNN_WGMMA_D8(8)
#define CNN_WGMMA_D32 CNN_WGMMA_D8(0), CNN_WGMMA_D8(8), CNN_WGMMA_D8(16), CNN_WGMMA_D8(24)
#define CNN_WGMMA_D64 \
  CNN_WGMMA_D32, CNN_WGMMA_D8(32), CNN_WGMMA_D8(40), CNN_WGMMA_D8(48), CNN_WGMMA_D8(56)
#define CNN_WGMMA_R16 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17"
#define CNN_WGMMA_R32                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33"
#define CNN_WGMMA_R64                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}, %64, %65"

__device__ __forceinline__ void wgmma_m64n128k8_tf32(float (&d)[64], uint64_t desc_a,
                                                     uint64_t desc_b) {
  asm volatile("{\nwgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 " CNN_WGMMA_R64
               ", 1, 1, 1;\n}\n"
               : CNN_WGMMA_D64
               : "l"(desc_a), "l"(desc_b));
}
__device__ __forceinline__ void wgmma_m64n64k8_tf32(float (&d)[32], uint64_t desc_a,
                                                    uint64_t desc_b) {
  asm volatile("{\nwgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 " CNN_WGMMA_R32
               ", 1, 1, 1;\n}\n"
               : CNN_WGMMA_D32
               : "l"(desc_a), "l"(desc_b));
}
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a,
                                                      uint64_t desc_b) {
  asm volatile("{\nwgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " CNN_WGMMA_R64
               ", 1, 1, 1, 0, 0;\n}\n"
               : CNN_WGMMA_D64
               : "l"(desc_a), "l"(desc_b));
}
__device__ __forceinline__ void wgmma_m64n64k16_bf16(float (&d)[32], uint64_t desc_a,
                                                     uint64_t desc_b) {
  asm volatile("{\nwgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " CNN_WGMMA_R32
               ", 1, 1, 1, 0, 0;\n}\n"
               : CNN_WGMMA_D32
               : "l"(desc_a), "l"(desc_b));
}
// The same BF16 wgmma with both operands MN-major (transpose flags 1, 1): A stored M-contiguous,
// B N-contiguous, each as sw128_mn_desc describes (the weight gradient from channels-last copies,
// conv2d_wgmma_wgrad_nhwc.cu, whose pixel-major tiles are A^T and B as they lie).
__device__ __forceinline__ void wgmma_m64n64k16_bf16_mn(float (&d)[32], uint64_t desc_a,
                                                        uint64_t desc_b) {
  asm volatile("{\nwgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " CNN_WGMMA_R32
               ", 1, 1, 1, 1, 1;\n}\n"
               : CNN_WGMMA_D32
               : "l"(desc_a), "l"(desc_b));
}
__device__ __forceinline__ void wgmma_m64n128k16_bf16_mn(float (&d)[64], uint64_t desc_a,
                                                         uint64_t desc_b) {
  asm volatile("{\nwgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " CNN_WGMMA_R64
               ", 1, 1, 1, 1, 1;\n}\n"
               : CNN_WGMMA_D64
               : "l"(desc_a), "l"(desc_b));
}
// The 32-column ones (16 accumulators a thread), for narrow GEMMs (conv2d_wgmma_nhwc.cu's
// 128 x 32 tiles: a convolution with 32 output channels, or 32 input channels' gradient).
__device__ __forceinline__ void wgmma_m64n32k8_tf32(float (&d)[16], uint64_t desc_a,
                                                    uint64_t desc_b) {
  asm volatile("{\nwgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 " CNN_WGMMA_R16
               ", 1, 1, 1;\n}\n"
               : CNN_WGMMA_D16
               : "l"(desc_a), "l"(desc_b));
}
__device__ __forceinline__ void wgmma_m64n32k16_bf16(float (&d)[16], uint64_t desc_a,
                                                     uint64_t desc_b) {
  asm volatile("{\nwgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " CNN_WGMMA_R16
               ", 1, 1, 1, 0, 0;\n}\n"
               : CNN_WGMMA_D16
               : "l"(desc_a), "l"(desc_b));
}
// The same TF32 wgmmas with A from registers (the 3xTF32 kernels split A in registers): a[0..3]
// hold A (64 x 8 per warpgroup) as mma.sync's m16n8k8 fragment, warp w's rows 16 w .. 16 w + 15:
// lane l holds a[0] = A[16 w + l / 4][l % 4], a[1] = row + 8, a[2] = column + 4, a[3] = both.
// The registers are read asynchronously: they must keep their values until the wgmma group that
// reads them has been waited for (fence_regs keeps the compiler from reusing them earlier).
__device__ __forceinline__ void wgmma_m64n128k8_tf32_rs(float (&d)[64], const uint32_t (&a)[4],
                                                        uint64_t desc_b) {
  asm volatile(
      "{\nwgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1;\n}\n"
      : CNN_WGMMA_D64
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
__device__ __forceinline__ void wgmma_m64n64k8_tf32_rs(float (&d)[32], const uint32_t (&a)[4],
                                                       uint64_t desc_b) {
  asm volatile(
      "{\nwgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, "
      "1, 1;\n}\n"
      : CNN_WGMMA_D32
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
__device__ __forceinline__ void wgmma_m64n32k8_tf32_rs(float (&d)[16], const uint32_t (&a)[4],
                                                       uint64_t desc_b) {
  asm volatile(
      "{\nwgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, "
      "%19}, %20, 1, 1, 1;\n}\n"
      : CNN_WGMMA_D16
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
#undef CNN_WGMMA_D8
#undef CNN_WGMMA_D16
#undef CNN_WGMMA_R16
#undef CNN_WGMMA_D32
#undef CNN_WGMMA_D64
#undef CNN_WGMMA_R32
#undef CNN_WGMMA_R64

// Byte offset of element (r, k) (k < 32) in a K-major 128-byte-swizzled tile.
__device__ __forceinline__ uint32_t sw128_offset(int r, int chunk) {
  return static_cast<uint32_t>(r * 128 + ((chunk ^ (r & 7)) << 4));
}

__device__ __forceinline__ float4 ld_shared_v4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// The split-K epilogue's sum: four floats at `local` of every cluster rank's partial tile,
// added in rank order (any split count bitwise repeatable); one rank reads its own tile.
__device__ __forceinline__ float4 sum_over_ranks(uint32_t local, uint32_t nsplit) {
  float4 sum = nsplit == 1 ? ld_shared_v4(local) : ld_cluster_v4(map_rank(local, 0));
  for (uint32_t q = 1; q < nsplit; ++q) {
    const float4 v = ld_cluster_v4(map_rank(local, q));
    sum.x += v.x;
    sum.y += v.y;
    sum.z += v.z;
    sum.w += v.w;
  }
  return sum;
}

__device__ __forceinline__ void fence_acc(float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void fence_acc(float (&d)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The tail of a consumer's k step in a ring of stages: commits the group just issued, waits until
// at most that group is in flight (the previous stage's products are done) and, where `release`
// (a previous stage exists, and this thread is one of those the barrier counts), arrives on that
// stage's empty barrier `empty_prev`. fence: fence_acc on every accumulator the wgmmas write.
template <class Fence>
__device__ __forceinline__ void commit_and_release_previous(Fence fence, bool release,
                                                            uint32_t empty_prev) {
  wgmma_commit();
  fence();
  wgmma_wait<1>();
  fence();
  if (release) mbar_arrive(empty_prev);
}

// Keeps register A operands of an in-flight wgmma (the _rs forms) alive and unchanged up to here.
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

// One arrival on `bar` once every cp.async this thread issued before it has landed; .noinc: the
// arrival counts against the barrier's expected count (mbar_init must include it).
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void st_shared_f32(uint32_t addr, float x) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(x) : "memory");
}
__device__ __forceinline__ int4 ld_shared_s32x4(uint32_t addr) {
  int4 v;
  asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_s32x4(uint32_t addr, int4 v) {
  asm volatile("st.shared.v4.s32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

// Two FP32 values rounded to BF16 (nearest, ties to even, as __float2bfloat16_rn) and packed:
// `lo` in bits 0-15, `hi` in 16-31 (the lower k first, as a K-major BF16 row holds them).
__device__ __forceinline__ uint32_t cvt_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Asks for the 128-byte line holding `p` to be brought into L2 (no register, no wait).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// Named barrier of the producer warpgroup only (id 1; 0 is __syncthreads).
__device__ __forceinline__ void producer_sync() {
  asm volatile("bar.sync 1, 128;\n" ::: "memory");
}
// Named barrier of the consumer warpgroups only (id 2), `threads` of them (a multiple of 32).
__device__ __forceinline__ void consumer_sync(int threads) {
  asm volatile("bar.sync 2, %0;\n" ::"r"(threads) : "memory");
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CNN_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                    cudaEnableDefault, &q));
    CNN_CHECK(f && q == cudaDriverEntryPointSuccess,
              "gemm_wgmma: the driver has no cuTensorMapEncodeTiled (query result {})", int(q));
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// The device's SM count (the split-K pickers size their grids by it).
inline int sm_count() {
  return current_device_sm_count();
}

// How many clusters of (cluster_x, 1, cluster_z) blocks of `kernel` the device holds at once
// with this block size and dynamic shared memory (cudaOccupancyMaxActiveClusters; a cluster
// needs that many free block slots in one GPC). Asked once per device and shape, then kept;
// thread-safe.
inline int max_active_clusters(const void* kernel, int cluster_x, int cluster_z, int threads,
                               int smem_bytes) {
  int dev = 0;
  CNN_CUDA_CHECK(cudaGetDevice(&dev));
  using Key = std::tuple<const void*, int, int, int, int, int>;
  static std::mutex mu;
  static std::map<Key, int> known;
  const Key key{kernel, dev, cluster_x, cluster_z, threads, smem_bytes};
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = known.find(key);
    if (it != known.end()) return it->second;
  }
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1];
  cfg.gridDim = dim3(static_cast<unsigned>(cluster_x), 1, static_cast<unsigned>(cluster_z));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cluster_x);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = static_cast<unsigned>(cluster_z);
  int clusters = 0;
  CNN_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
  std::lock_guard<std::mutex> lock(mu);
  known[key] = clusters;
  return clusters;
}
// Clusters of (1, 1, cluster) blocks.
inline int max_active_clusters(const void* kernel, int cluster, int threads, int smem_bytes) {
  return max_active_clusters(kernel, 1, cluster, threads, smem_bytes);
}

// The largest split count, `splits` halved, of which the device can place a cluster of (1, 1,
// splits) blocks of `kernel` with this block size and dynamic shared memory (a cluster needs that
// many free block slots in one GPC: fewer on a partitioned GPU, or with blocks of ~130 KB).
inline int placeable_splits(const void* kernel, int splits, int threads, int smem_bytes) {
  int placed = splits;
  while (placed > 1 && max_active_clusters(kernel, placed, threads, smem_bytes) == 0) placed /= 2;
  return placed;
}

// Launches a split-K kernel on (tiles.x, tiles.y, groups * splits) blocks in thread-block
// clusters of (1, 1, splits), the split count read by the kernel from its cluster; fewer splits
// where the device cannot place such a cluster (placeable_splits).
template <typename... Params, typename... Args>
void launch_split_k_cluster_groups(void (*kernel)(Params...), dim3 tiles, int splits, int groups,
                                   int threads, int smem_bytes, cudaStream_t stream,
                                   const char* what, Args&&... args) {
  CNN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  // Clusters of more than 8 blocks (16 splits) are non-portable: the kernel has to allow them.
  if (splits > 8)
    CNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  splits = placeable_splits(reinterpret_cast<const void*>(kernel), splits, threads, smem_bytes);
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1];
  cfg.gridDim = dim3(tiles.x, tiles.y, static_cast<unsigned>(splits * groups));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = static_cast<unsigned>(splits);
  CNN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
  CNN_LAUNCH_CHECK(what);
}

// One group: the kernel's k splits are its cluster's.
template <typename... Params, typename... Args>
void launch_split_k_clusters(void (*kernel)(Params...), dim3 tiles, int splits, int threads,
                             int smem_bytes, cudaStream_t stream, const char* what,
                             Args&&... args) {
  launch_split_k_cluster_groups(kernel, tiles, splits, 1, threads, smem_bytes, stream, what,
                                std::forward<Args>(args)...);
}

// The same on a one-dimensional grid of `tiles` tiles.
template <typename... Params, typename... Args>
void launch_split_k_clusters(void (*kernel)(Params...), int64_t tiles, int splits, int threads,
                             int smem_bytes, cudaStream_t stream, const char* what,
                             Args&&... args) {
  CNN_CHECK(tiles <= 0x7fffffff, "{}: {} tiles exceed the grid limit", what, tiles);
  launch_split_k_clusters(kernel, dim3(static_cast<unsigned>(tiles)), splits, threads, smem_bytes,
                          stream, what, std::forward<Args>(args)...);
}

}  // namespace wgmma
}  // namespace cnn
