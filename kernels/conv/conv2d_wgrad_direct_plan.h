#pragma once
// The plan of the direct FP32 weight gradient (conv2d_wgrad_direct.cu), plain C++ so that the CPU
// build can test it: how the output rows are cut into bands, the shared-memory strides, the split
// of the bands over blocks, and the scratch of the deterministic path.
//
// The kernel, for stride-1 3x3 convolutions, in FP32 FFMA (exact products, FP32 sums):
//   dw[oc][c][ky][kx] (+ db[oc]) = sum over units u = (image n, band of `rows` output rows) of
//   sum over the band's positions (r, ox) of dy[n][oc][oy0 + r][ox] * x[n][c][oy0 + r + ky - ph]
//   [ox + kx - pw].
// A block owns a tile of 32 output x 32 input channels (grid y) and a contiguous run of units
// (grid x). Per unit it stages the band's dy rows and the input rows under them (with the halo,
// zero outside the image) in shared memory, then each thread multiplies runs of 4 output
// positions: its 4 output channels' dy (4 float4) against its 2 input channels' 3 input rows (a
// float4 and a float2 each) into 4 x 2 x 9 register sums. Two thread groups take alternate runs;
// at the end the block adds them in shared memory and adds its tile into dw/db with atomics, or,
// deterministic, stores it to its split's scratch row for a fixed-order second pass.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/conv/conv2d.h"

namespace cnn {

constexpr int kWgradDirectThreads = 256;  // two groups of 128: 8 x 16 threads of (4 oc, 2 c)
constexpr int kWgradDirectOcTile = 32;    // output channels a block
constexpr int kWgradDirectCTile = 32;     // input channels a block
constexpr int kWgradDirectMaxRows = 8;    // output rows a unit, at most
// Blocks to aim for: two resident blocks on each SM of an H200 (132 SMs). A tuning constant, not
// a device query, so that the deterministic scratch is a function of the shape alone; on a
// smaller GPU the grid runs in more waves.
constexpr int kWgradDirectTargetBlocks = 2 * 132;
// One stage of shared memory at most: two stages and the registers (128 a thread) leave room for
// two blocks an SM (228 KB).
constexpr std::size_t kWgradDirectMaxStageBytes = 52 * 1024;

struct WgradDirectPlan {
  int rows = 0;          // output rows a unit
  int bands = 0;         // ceil(OH / rows)
  int runs = 0;          // runs of 4 output positions a row: ceil(OW / 4)
  int dy_row = 0;        // floats a staged dy row: 4 * runs (zeros past OW)
  int x_row = 0;         // floats a staged input row: 4 * runs + 4 (the 6 floats of a run's last
                         // taps fit; zeros outside the image)
  int x_rows = 0;        // staged input rows: rows + 2
  int x_chan = 0;        // floats between two staged input channels: x_rows * x_row, rounded so
                         // that it is an odd number of 16-byte words (no bank conflicts)
  int dy_chan = 0;       // floats between two staged dy channels, likewise
  int stage_floats = 0;  // 32 * x_chan + 32 * dy_chan
  int tiles_oc = 0, tiles_c = 0;
  int64_t units = 0;     // N * bands
  int splits = 0;        // blocks a tile: grid x
  std::size_t smem = 0;  // bytes: two stages, or the epilogue's tile if larger
  int64_t slots = 0;     // a split's scratch row: OC*C*9 + OC
};

// Empty when the kernel takes the shape, else why not (one phrase): stride 1, a 3x3 kernel, a
// band of one row within the shared-memory limit (output rows up to 100 wide), at most 65535
// tiles of 32 x 32 channels, tensors under 2^31 elements.
std::string wgrad_direct_refusal(const Conv2dShape& s);
inline bool wgrad_direct_supported(const Conv2dShape& s) {
  return wgrad_direct_refusal(s).empty();
}

// The plan of a supported shape. The band height is the one with the least estimated time: each
// block's share of units (the busiest block's) times a unit's rows plus a fixed cost a unit.
WgradDirectPlan wgrad_direct_plan(const Conv2dShape& s);

// Scratch floats of the deterministic path (splits * slots); 0 when not deterministic or when the
// kernel does not take the shape.
std::size_t wgrad_direct_scratch_floats(const Conv2dShape& s, bool deterministic);

// The kernel's index scheme on the CPU, in FP32: every block (split, tile) stages its units into
// buffers laid out as the kernel's shared memory (NaN in every cell the staging never writes, so a
// read of one shows in the result), walks the two groups' runs, reads the same offsets for each
// thread's channels and taps, and adds its tile to dw (and db from the first channel tile) at the
// slots the epilogue names. dw/db accumulate; db may be null.
void wgrad_direct_model_cpu(const Conv2dShape& s, const float* x, const float* dy, float* dw,
                            float* db);

}  // namespace cnn
