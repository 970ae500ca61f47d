#pragma once
// The pieces the int8 tensor-core GEMMs (qconv_igemm.cu, the implicit-GEMM convolution, and
// qconv_linear_mma.cu, the linear tiles) share: their cp.async copies into shared memory, the
// mma.sync int8 tile, and the swizzle of their 64-byte shared-memory rows.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"

namespace cnn::qmma {

// A 4-byte / 16-byte copy global -> shared, zero-filled when !valid (src-size 0).
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(ptx::smem_u32(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(ptx::smem_u32(dst)),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

// d[0..3] += a * b for one 16x8x32 int8 tile. Fragments (g = lane / 4, t = lane % 4; each
// register four int8, lower k in the low byte): a0 (row g, k 4t..4t+3), a1 (row g+8, same k),
// a2 (row g, k 4t+16..), a3 (row g+8, k 4t+16..); b0 (k 4t..4t+3, col g), b1 (k 4t+16.., col g);
// d0, d1 (row g, cols 2t, 2t+1), d2, d3 (row g+8, same cols).
__device__ __forceinline__ void mma_s8(int32_t* d, const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Byte offset of 4-byte word `word` (0..15) of tile row `row` in rows of 64 bytes, the 16-byte
// chunks XOR-swizzled by (row / 2) % 4 so that a warp's fragment loads hit 32 different banks.
constexpr int kRowBytes = 64;
__device__ __forceinline__ int swizzle(int row, int word) {
  return row * kRowBytes + ((((word >> 2) ^ (row >> 1)) & 3) << 4) + (word & 3) * 4;
}

}  // namespace cnn::qmma
