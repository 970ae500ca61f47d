#pragma once
// Where a stage of the TMA-box wgmma weight gradient (conv2d_wgmma_wgrad.cu, B by boxes) keeps
// its operands in shared memory, and the wgmma descriptors its consumers read them with: one
// set of functions for the kernel (device) and for the CPU test that emulates TMA's landing and
// wgmma's reads element by element (tests/test_conv_wgrad_box.cpp, SmemAddressing).
//
// A k-tile is br rows of bw output pixels (bw br = 32, bw in {8, 16, 32}). Both operands come as
// boxes whose innermost dimension is the bw pixels of one output row, the swizzle span equal to
// that row (bw 4 bytes: 32B, 64B or 128B swizzle), and the output row dimension outermost:
//   A = dy viewed (OW, OC, OH, N), box (bw, BM, br, 1): br slabs of [BM rows][bw floats];
//   B = the copies of x viewed (Wc, C, Hc, R N), box (bw, 8, br, 1), one 1 KB box per 8-column
//       group: br slabs of [8 channels][bw floats].
// Measured on the H200 (scripts/tma_coordinate_probe.cu): dimensions listed out of memory order
// land with the first listed innermost ([r][row][bw]); a box row as wide as the swizzle span
// lands dense, the 16-byte chunk bits of the shared-memory address (4..) XORed with its bits
// 7.. (as many bits as the span has chunks: Swizzle<1,4,3>, <2,4,3>, <3,4,3>); a box row
// narrower than the span would take the whole span (rows span bytes apart), which is why the
// span follows bw. Every slab is a whole number of swizzle atoms (8 rows of the span: 256, 512
// or 1024 bytes) and starts on one, so address bits and slab-relative bits swizzle alike.
//
// The 4 k8 steps of a stage: step s reads pixels 8 s .. 8 s + 7, i.e. row r = 8 s / bw of the
// k-tile at byte (8 s % bw) 4 of its slab rows. Its descriptor: start = slab r's base + that
// offset (+ the warpgroup's first row), the swizzle's layout type, stride byte offset = the
// distance between 8-row core-matrix groups (A: 8 rows of bw 4 bytes within a slab; B: 1024
// bytes, the next group's box), leading byte offset unused for swizzled K-major (1). With bw =
// 32 all of this is the gathered layout (rows of 128 bytes, 128-byte swizzle, SBO 1024).
#include <cstdint>

#if defined(__CUDACC__)
#define CNN_WGRAD_HD __host__ __device__
#else
#define CNN_WGRAD_HD
#endif

namespace cnn {

constexpr int kWgradGroupBytes = 1024;  // one B box: 8 channels x 32 pixels of fp32

// The swizzle span (bytes) of a box row of bw floats: 32, 64 or 128.
CNN_WGRAD_HD inline uint32_t wgrad_span_bytes(int bw) {
  return uint32_t(bw) * 4u;
}

// The swizzle of `span` bytes applied to a shared-memory address (or an offset from an
// atom-aligned base): 16-byte chunk bits 4.. ^= bits 7.. (span / 16 chunks a row).
CNN_WGRAD_HD inline uint32_t wgrad_swizzle(uint32_t addr, uint32_t span) {
  return addr ^ (((addr >> 7) & (span / 16u - 1u)) << 4);
}

// Byte offset, from the operand's atom-aligned base, of element (row, pixel q) of a box operand
// whose rows come in slabs of `slab_rows` (A: BM; B: one group's 8 channels), swizzle included.
CNN_WGRAD_HD inline uint32_t wgrad_box_smem_offset(int bw, int slab_rows, int row, int q) {
  const int r = q / bw, col = q - r * bw;
  const uint32_t span = wgrad_span_bytes(bw);
  return wgrad_swizzle(uint32_t(r * slab_rows + row) * span + uint32_t(col) * 4u, span);
}

// The start offset (bytes from the operand's base) of k8 step s: slab 8 s / bw, byte (8 s % bw)
// 4 within its rows.
CNN_WGRAD_HD inline uint32_t wgrad_box_step_offset(int bw, int slab_rows, int s) {
  const int q0 = 8 * s, r = q0 / bw;
  return uint32_t(r * slab_rows) * wgrad_span_bytes(bw) + uint32_t(q0 - r * bw) * 4u;
}

// The wgmma descriptor's layout type (bits 62-63) for a swizzle span: 1 = 128B, 2 = 64B, 3 = 32B
// (PTX ISA, "Matrix Descriptor Format").
CNN_WGRAD_HD inline uint64_t wgrad_desc_layout(uint32_t span) {
  return span == 128u ? 1u : span == 64u ? 2u : 3u;
}

// Shared-memory matrix descriptor of a K-major swizzled operand: start >> 4 in bits 0-13, leading
// byte offset 1 (unused) in 16-29, stride byte offset >> 4 in 32-45, base offset 0 (the slabs are
// atom-aligned) in 49-51, layout type in 62-63.
CNN_WGRAD_HD inline uint64_t wgrad_smem_desc(uint32_t start, uint32_t span, uint32_t sbo) {
  return uint64_t((start & 0x3FFFFu) >> 4) | (uint64_t{1} << 16) | (uint64_t(sbo >> 4) << 32) |
         (wgrad_desc_layout(span) << 62);
}

// The stride byte offsets: A's 8-row groups lie in one slab; B's are the next group's box.
CNN_WGRAD_HD inline uint32_t wgrad_a_sbo(int bw) {
  return 8u * wgrad_span_bytes(bw);
}
CNN_WGRAD_HD inline uint32_t wgrad_b_sbo() {
  return uint32_t(kWgradGroupBytes);
}

}  // namespace cnn
