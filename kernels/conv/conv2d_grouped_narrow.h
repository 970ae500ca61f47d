#pragma once
// The narrow-group kernels (kernels/conv/conv2d_grouped_narrow.cu): grouped convolutions whose
// groups have few channels (ResNeXt's 32 groups of 4, a 32-group 3x3 of 8). There the dense
// kernels run block-diagonal weights (G times the multiplies, nearly all of them by zero) or a
// group a block (its 4-8 channels padded to a 32-wide k-tile), and the plain tiled kernels stage
// one channel at a time for one output channel. These read each group's input tile once for
// 4 or 8 of its output channels and keep the sums in registers. FP32 FFMA at every precision,
// as the other grouped kernels (the useful work is G times smaller than the dense form's).
//   forward         a block: one group's 4 or 8 output channels (OCT) over tz images x ty rows
//                   x 4 tx columns of output; it stages the group's input channels, 4 at a time
//                   with their halo, and their weights (OCT per tap as float4s read by every
//                   thread at once) in shared memory (zero-filled outside the image; rows as
//                   float4 loads where W is a multiple of 4, else a cp.async a float); each
//                   thread sums 4 adjacent outputs of each of the OCT channels.
//   input gradient  the forward kernel on dy, the group's weights transposed as they are
//                   staged: at stride 1 flipped, padding K - 1 - p; at stride 2 per phase of dx
//                   (row and column parity, a block each), the stride-1 convolution of dy with
//                   the taps that reach that phase (ceil(K / 2) each way at most; a phase with
//                   fewer gets zero weights), its outputs written to every other pixel.
//   weight gradient a block: one group's 4 output channels and up to 8 of its input channels,
//                   one warp each, over a run of output tiles of 32 row segments of 8 positions;
//                   lane = segment, summing the 4 x K x K products of its channel in registers
//                   while the next tile streams into a second buffer (cp.async, 16 bytes a
//                   copy where W and OW are multiples of 4 and the padding keeps the size;
//                   planes of few rows several images a tile); at the end
//                   each warp adds its lanes in a fixed shuffle order and publishes by
//                   atomicAdd or, deterministic, into one scratch row per run of tiles
//                   (backward_weight_finish adds the rows in order).
// Square 1x1, 3x3, 5x5, 7x7 kernels (the weight gradient 1x1 and 3x3), stride 1 or 2, equal
// padding along both axes, dilation 1. The caller has checked the shape.
#include <cstdint>

#include "kernels/conv/conv2d_grouped.h"
#include "runtime/stream.h"

namespace cnn {

// Groups of 2 to this many input channels run here (the forward and the weight gradient)...
constexpr int kNarrowMaxGroupChannels = 16;
// ...and the input gradient of groups of at most this many output channels (the channels of dy
// it reads, 4 at a time; its output channels are the forward's input channels, any number).
constexpr int kNarrowMaxGradGroupChannels = 32;

bool grouped_narrow_forward_applicable(const Conv2dGroupedShape& s);
bool grouped_narrow_backward_data_applicable(const Conv2dGroupedShape& s);
bool grouped_narrow_backward_weight_applicable(const Conv2dGroupedShape& s);

// The weight gradient's work split, a function of the shape only (so is the deterministic
// reduction order): an output tile is th rows x tw = 8 segs_x columns (th x segs_x = 32 lane
// segments): `rows` rows of each of ipt images (ipt = th / OH where OH <= th / 2, rows = OH;
// else ipt = 1, rows = th); a unit is (ipt images, tile row, tile column); each block walks
// chunk_units consecutive units of one (group, output-channel quad, input-channel block of
// `warps`).
struct NarrowWgradPlan {
  int segs_x = 4, th = 8, tw = 32, ipt = 1, rows = 8;
  int tiles_x = 1, tiles_y = 1;
  int warps = 1, c_blocks = 1, oc_chunks = 1;
  int64_t units = 1, chunk_units = 1, chunks = 1;
};
NarrowWgradPlan grouped_narrow_wgrad_plan(const Conv2dGroupedShape& s);
// Scratch floats of the deterministic weight gradient: chunks rows of the op's slots.
int64_t grouped_narrow_wgrad_scratch_floats(const Conv2dGroupedShape& s);

// Device pointers; asynchronous on `stream`. Each returns false, having launched nothing, where
// its tiles do not fit the device's shared memory (the caller then runs another kernel).
bool grouped_narrow_forward_cuda(const Conv2dGroupedShape& s, const float* d_x, const float* d_w,
                                 const float* d_b, float* d_y, bool relu, cudaStream_t stream);
bool grouped_narrow_backward_data_cuda(const Conv2dGroupedShape& s, const float* d_dy,
                                       const float* d_w, float* d_dx, cudaStream_t stream);
// ACCUMULATES into dw (and db when not null); deterministic needs
// grouped_narrow_wgrad_scratch_floats(s) floats of scratch.
bool grouped_narrow_backward_weight_cuda(const Conv2dGroupedShape& s, const float* d_x,
                                         const float* d_dy, float* d_dw, float* d_db,
                                         float* d_scratch, bool deterministic, cudaStream_t stream);

}  // namespace cnn
