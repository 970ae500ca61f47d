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
//   B = the copies of x viewed (Wc, C, Hc, R N): the tile's 128 columns are pieces of `run`
//       consecutive channels of one tap (run in {8, 16, 32, 64, 128}, conv2d_wgrad_box.h), one
//       or br boxes a piece (WgradBoxBLayout below).
// Measured on the H200 (scripts/tma_coordinate_probe.cu): dimensions listed out of memory order
// land with the first listed innermost ([r][row][bw]); a box row as wide as the swizzle span
// lands dense, the 16-byte chunk bits of the shared-memory address (4..) XORed with its bits
// 7.. (as many bits as the span has chunks: Swizzle<1,4,3>, <2,4,3>, <3,4,3>); a box row
// narrower than the span would take the whole span (rows span bytes apart), which is why the
// span follows bw. Every slab is a whole number of swizzle atoms (8 rows of the span: 256, 512
// or 1024 bytes) and starts on one, so address bits and slab-relative bits swizzle alike.
//
// B's two layouts. wgmma reads the 128 rows of B through one descriptor: 8-row core-matrix
// groups a constant stride byte offset (SBO) apart. A box (bw, run, rows, 1) lands as `rows`
// slabs of [run][bw floats], so
//   run 8 (the group layout): one box (bw, 8, br, 1) a piece, 1 KB, pieces 1 KB apart: every
//     8-row group is the next box, SBO 1024, slabs of 8 rows within a box;
//   run 128: one box (bw, 128, br, 1) for the whole tile, landing as A's box of 128 rows does:
//     br slabs of [128 columns][bw floats], SBO 8 rows of the span;
//   run 16, 32, 64 with br = 1 (bw = 32): one box (bw, run, 1, 1) a piece, pieces run rows on in
//     the one slab of 128 rows (SBO 8 rows of the span = 1024, the group layout's too);
//   run 16, 32, 64 with br > 1: one box a piece would put row run of the tile br run rows of the
//     span on, not run rows (the descriptor's one stride cannot follow), so the piece comes as
//     br boxes (bw, run, 1, 1), box r into slab r of the run-128 layout at the piece's rows.
// The slab layouts (slab_rows 128) and the group layout (slab_rows 8) differ only in where an
// 8-row group is: wgrad_box_b_offset says where element (column j, pixel q) lands in either.
//
// The 4 k8 steps of a stage: step s reads pixels 8 s .. 8 s + 7, i.e. row r = 8 s / bw of the
// k-tile at byte (8 s % bw) 4 of its slab rows. Its descriptor: start = slab r's base + that
// offset (+ the warpgroup's first row), the swizzle's layout type, stride byte offset = the
// distance between 8-row core-matrix groups (A: 8 rows of bw 4 bytes within a slab; B: that too
// in a slab layout, 1024 bytes in the group layout), leading byte offset unused for swizzled
// K-major (1). With bw = 32 all of this is the gathered layout (rows of 128 bytes, 128-byte
// swizzle, SBO 1024).
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

// The stride byte offsets: A's 8-row groups lie in one slab; B's too in a slab layout
// (slab_rows 128), in the group layout (slab_rows 8) each is the next 1 KB box.
CNN_WGRAD_HD inline uint32_t wgrad_a_sbo(int bw) {
  return 8u * wgrad_span_bytes(bw);
}
CNN_WGRAD_HD inline uint32_t wgrad_b_sbo(int bw, int slab_rows) {
  return slab_rows == 8 ? uint32_t(kWgradGroupBytes) : 8u * wgrad_span_bytes(bw);
}

// How the boxes of B fill a stage for pieces of `run` channels (the file comment's layouts).
struct WgradBoxBLayout {
  int run = 8;              // channels a piece: 8, 16, 32, 64 or 128
  int slab_rows = 8;        // rows of B in one slab: 8 (group layout) or 128
  int box_rows = 1;         // output rows a box of B covers: br, or 1 (pieces split by slab)
  int boxes_per_piece = 1;  // br / box_rows
};
CNN_WGRAD_HD inline WgradBoxBLayout wgrad_box_b_layout(int bw, int run) {
  const int br = 32 / bw;
  WgradBoxBLayout l;
  l.run = run;
  l.slab_rows = run == 8 ? 8 : 128;
  l.box_rows = run == 8 || run == 128 ? br : 1;
  l.boxes_per_piece = br / l.box_rows;
  return l;
}

// Byte offset, from B's base, of element (tile column j, pixel q) in the layout of slab_rows:
// group j / 8's box (1 KB each) in the group layout, the one set of slabs in a slab layout.
CNN_WGRAD_HD inline uint32_t wgrad_box_b_offset(int bw, int slab_rows, int j, int q) {
  const int group = j / slab_rows;
  return uint32_t(group) * uint32_t(slab_rows) * 128u +
         wgrad_box_smem_offset(bw, slab_rows, j - group * slab_rows, q);
}

// Where box r (< boxes_per_piece) of the tile's piece `piece` lands, bytes from B's base: the
// piece's first row (run rows of the span a piece; a whole box of br slabs when one box covers
// the piece), then slab r.
CNN_WGRAD_HD inline uint32_t wgrad_box_b_dst(int bw, const WgradBoxBLayout& l, int piece, int r) {
  const uint32_t span = wgrad_span_bytes(bw);
  return uint32_t(piece) * uint32_t(l.run) * span * uint32_t(l.box_rows) +
         uint32_t(r) * uint32_t(l.slab_rows) * span;
}

}  // namespace cnn
