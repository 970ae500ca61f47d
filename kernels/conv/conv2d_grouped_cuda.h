#pragma once
// CUDA launchers of the grouped convolution (conv2d_grouped.cu), called by conv2d_grouped.cpp
// after the shape check. Device pointers; every launch is asynchronous on `stream`.
//
// Deterministic weight gradients write per-partial sums into scratch laid out (partials, slots),
// slots = OC*(C/G)*KH*KW weights then OC biases, and a second kernel adds them in partial order.
// The partials depend on the shape only (never on the device), so the scratch size is known
// without a device.
#include <cstddef>
#include <cstdint>

#include "kernels/conv/conv2d_grouped.h"
#include "runtime/stream.h"

namespace cnn {

// Tiled wgrad: chunks of this many output positions (n, oy, ox) per partial.
constexpr int64_t kGroupedWgradChunk = 4096;

// The fast depthwise kernels' block geometry: blockDim (tx, ty); each thread owns 4 adjacent
// outputs along W and `rows` rows, so a block covers a (ty*rows) x (4*tx) output tile.
struct DepthwiseTiling {
  int tx = 32, ty = 8, rows = 1;
  int tiles_x = 1, tiles_y = 1;
  int tile_w() const { return 4 * tx; }
  int tile_h() const { return ty * rows; }
};
// `planes` blocks' worth of (image, channel) planes are tiled; max_rows: the forward and
// input-gradient kernels hold kDepthwiseFwdRows rows of accumulators, the weight gradient walks
// up to kDepthwiseWgradRows rows per thread. Tiles shrink for small images and small problems so
// that the grid still fills the device. A function of the shape only.
DepthwiseTiling depthwise_tiling(const Conv2dGroupedShape& s, int max_rows, int64_t planes);
// The rows kernel's threads per block (fewer where a plane has fewer quads of 4 outputs).
constexpr int kDepthwiseRowsThreads = 256;
constexpr int kDepthwiseFwdRows = 2;
constexpr int kDepthwiseWgradRows = 4;

// The streaming kernels' geometry: blockDim (tx, ty); thread (tx, ty) owns the 4 columns
// tile_x * 4tx + 4tx .. +3 of rows [(strip * ty + ty) * rows, + rows) of one plane, so a block
// covers a (ty * rows) x (4 * tx) part of a plane, and a plane takes tiles_x * strips blocks.
// A function of the shape only (the weight gradient's partials are (n, strip, tile x)).
struct DepthwiseStreamTiling {
  int tx = 32, ty = 8, rows = 16;
  int tiles_x = 1, strips = 1;
  int tile_w() const { return 4 * tx; }
  int tile_h() const { return ty * rows; }
};
constexpr int kDepthwiseStreamThreads = 256;
// How the stream kernels cut their planes into strips (the rows per thread):
//   Fill  halve the rows from 32 (down to 4) until the grid has kDepthwiseStreamFillThreads
//         threads: several waves of blocks, so the last, partial wave is a small part of the run.
//   Long  the weight gradient's: as Fill where that keeps at least kDepthwiseStreamMinRows rows;
//         where Fill would go shorter (too few planes for several waves of long strips, as the
//         seed's 1x256x128x128), the shortest strips of at least that many rows whose grid
//         fits in kDepthwiseStreamWaveThreads threads: one wave, every block resident from the
//         start, no partial last wave. Each weight-gradient thread ends with a fixed cost (the
//         register ring's first loads in flight with nothing to compute, and its share of the
//         block reduction of K*K + 1 sums with one atomicAdd or scratch store each); 4-row
//         strips paid it once per 4 rows, and doubled the blocks.
// A function of the shape (and the plan) only, so the deterministic reduction order is too.
enum class DepthwiseStreamStrips { Fill, Long };
constexpr int64_t kDepthwiseStreamFillThreads = int64_t(1) << 18;
// What an H200 holds at once of the stream weight-gradient kernels: 132 SMs x 2 blocks of 256
// threads (their 80-128 registers, sm_90 ptxas -v, for 3x3 and 5x5) = 67584 >= 2^16.
constexpr int64_t kDepthwiseStreamWaveThreads = int64_t(1) << 16;
constexpr int kDepthwiseStreamMinRows = 8;
const char* depthwise_stream_strips_name(DepthwiseStreamStrips p);  // "fill", "long"
// The plan a pass runs: CNN_DEPTHWISE_STREAM_STRIPS's (fill or long, every pass), else Long for
// the weight gradient and Fill for the forward and input gradient.
DepthwiseStreamStrips depthwise_stream_strips(bool weight_gradient);
// rows > 0 forces the rows per thread (the tests' long strips, which wrap the register ring).
DepthwiseStreamTiling depthwise_stream_tiling(const Conv2dGroupedShape& s, int rows = 0,
                                              DepthwiseStreamStrips plan =
                                                  DepthwiseStreamStrips::Fill);

inline int64_t conv2d_grouped_wgrad_slots(const Conv2dGroupedShape& s) {
  return static_cast<int64_t>(s.oc) * s.cg() * s.kh * s.kw + s.oc;
}

std::size_t conv2d_grouped_backward_weight_scratch_floats_cuda(const Conv2dGroupedShape& s,
                                                               bool deterministic);

// The fast variant's forward and input gradient run the kernel `kernel` names (Auto: the one
// CNN_DEPTHWISE_KERNEL forces, else the one conv2d_grouped_fast_kernel picks; the tests force
// each). Rows falls back to Tile where its block count would reach 2^30 (depthwise_rows_fits).
// The weight gradient likewise (Rows there means Tile). stream_rows > 0 forces the stream
// kernels' rows per thread (the deterministic weight gradient only where that needs no more
// scratch than the Fill plan, which cuts the most strips; else it runs its plan's rows).
void conv2d_grouped_forward_cuda(const Conv2dGroupedShape& s, const float* d_x, const float* d_w,
                                 const float* d_b, float* d_y, bool relu, Algo algo,
                                 cudaStream_t stream,
                                 DepthwiseKernel kernel = DepthwiseKernel::Auto,
                                 int stream_rows = 0);
void conv2d_grouped_backward_data_cuda(const Conv2dGroupedShape& s, const float* d_dy,
                                       const float* d_w, float* d_dx, Algo algo,
                                       cudaStream_t stream,
                                       DepthwiseKernel kernel = DepthwiseKernel::Auto,
                                       int stream_rows = 0);
void conv2d_grouped_backward_weight_cuda(const Conv2dGroupedShape& s, const float* d_x,
                                         const float* d_dy, float* d_dw, float* d_db,
                                         float* d_scratch, Algo algo, bool deterministic,
                                         cudaStream_t stream,
                                         DepthwiseKernel kernel = DepthwiseKernel::Auto,
                                         int stream_rows = 0);

}  // namespace cnn
