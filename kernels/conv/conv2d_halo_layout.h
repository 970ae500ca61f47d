#pragma once
// The halo tile of the channels-last wgmma convolution (conv2d_wgmma_halo.cuh), as plain host
// code so that it is tested on any machine. For a stride-1 convolution `g` (a GEMM view, as
// conv2d_nhwc_layout.h's: the input gradient is the convolution of dy with the flipped weights)
// a tile of T = 128 or 256 GEMM rows is `rows` consecutive output rows of one image, computed on
// a row pitch of
//   wp = OW + KW - 1 = W + 2 pad_w
// pixels: tile row r is output pixel (oy0 + r / wp, r % wp), valid where r / wp < rows,
// oy0 + r / wp < OH and r % wp < OW (the other rows of the T are computed and dropped). The
// producer loads the tile's input once per channel chunk, as ONE tiled TMA box of the
// channels-last copy: box_h = rows + KH - 1 input rows from oy0 - pad_h, wp columns from -pad_w,
// zero outside the image, landing as pixel (i, j) at row i wp + j of a halo slot. Filter tap
// (ky, kx) of tile row r then reads halo row r + ky wp + kx: the A operand of every tap is the
// slot itself, shifted by ky wp + kx rows, so the wgmma descriptor of a tap just starts there.
// The im2col kernel instead issues one 128-pixel copy per tap and chunk (25 for LeNet's 5x5
// conv2).
#include <string>

#include "kernels/conv/conv2d.h"

#if defined(__CUDACC__)
#define CNN_HALO_HD __host__ __device__
#else
#define CNN_HALO_HD
#endif

namespace cnn {

constexpr int kHaloMaxSlotRows = 512;  // a slot of at most 64 KB (two live: double buffering)

struct HaloGeometry {
  int tile_rows = 0;             // T: GEMM rows a tile multiplies, 128 or 256 (64-row wgmma blocks)
  int wp = 0;                    // row pitch in pixels: OW + KW - 1
  int rows = 0;                  // output rows a tile: min(OH, T / wp)
  int tiles_per_image = 0;       // ceil(OH / rows)
  int box_w = 0, box_h = 0;      // the TMA box: wp columns x (rows + KH - 1) input rows
  int lower_w = 0, lower_h = 0;  // the box's first column, and its first row less oy0: -pad
  int slot_rows = 0;  // 128-byte rows a slot holds: the box, and every row a tap reads, to 8s
};

// Why the halo tile of tile_rows (128 or 256) GEMM rows cannot run `g` (stride > 1, a row pitch
// above tile_rows pixels, a box taller than the TMA's 256 rows, a slot above kHaloMaxSlotRows),
// or empty when it can.
std::string halo_refusal(const Conv2dShape& g, int tile_rows = 128);

// The geometry of `g`; throws cnn::Error (one line naming `what` and halo_refusal's reason) where
// it cannot run.
HaloGeometry halo_geometry(const Conv2dShape& g, const char* what, int tile_rows = 128);

// The fraction of the grid's tile rows that are output pixels: OH OW / (tiles an image x T).
double halo_useful_fraction(const Conv2dShape& g, const HaloGeometry& h);

// The output pixel (within its image: oy OW + ox) of tile row r of the tile starting at output
// row oy0, with row pitch wp and `rows` rows a tile, or -1 where the row is dropped (past the
// tile's rows, past OH, or past OW). The kernel's epilogue calls it too.
CNN_HALO_HD inline int halo_row_pixel(int wp, int rows, int oh, int ow, int oy0, int r) {
  const int i = r / wp, j = r - i * wp;
  if (i >= rows || oy0 + i >= oh || j >= ow) return -1;
  return (oy0 + i) * ow + j;
}

}  // namespace cnn
