// Where the narrow-group kernels apply, and the weight gradient's work split (host code, the
// same answer with or without a device: the deterministic scratch is sized from it).
#include "kernels/conv/conv2d_grouped_narrow.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/conv/conv2d_grouped_cuda.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {
// Square kernels of an odd size up to 7, equal stride 1 or 2 and padding on both axes,
// dilation 1, at least two groups of at least two channels (depthwise convolutions have their
// own kernels; here their one channel a group would leave 3 of 4 sums of a quad idle).
// x and y below 2^31 elements: the kernels number their blocks, tiles and weight-gradient
// units with int (each covers at least one element), which costs a fraction of int64 divisions.
bool narrow_window(const Conv2dGroupedShape& s) {
  constexpr int64_t kMaxElements = INT32_MAX;
  return s.groups >= 2 && s.cg() >= 2 && s.kh == s.kw && s.kh % 2 == 1 && s.kh <= 7 &&
         s.stride_h == s.stride_w && (s.stride_h == 1 || s.stride_h == 2) && s.pad_h == s.pad_w &&
         s.dil_h == 1 && s.dil_w == 1 && int64_t(s.n) * s.c * s.h * s.w <= kMaxElements &&
         int64_t(s.n) * s.oc * s.oh() * s.ow() <= kMaxElements;
}
}  // namespace

bool grouped_narrow_forward_applicable(const Conv2dGroupedShape& s) {
  return narrow_window(s) && s.cg() <= kNarrowMaxGroupChannels;
}

bool grouped_narrow_backward_data_applicable(const Conv2dGroupedShape& s) {
  // The forward kernel on dy: at stride 1 padded by K - 1 - p >= 0 (the stride-2 phases need no
  // such bound; one rule for both).
  return narrow_window(s) && s.ocg() <= kNarrowMaxGradGroupChannels && s.pad_h <= s.kh - 1;
}

bool grouped_narrow_backward_weight_applicable(const Conv2dGroupedShape& s) {
  // 4 x K x K sums a lane: 36 registers at 3x3, 100 at 5x5 (which would spill).
  return narrow_window(s) && s.kh <= 3 && s.cg() <= kNarrowMaxGroupChannels;
}

NarrowWgradPlan grouped_narrow_wgrad_plan(const Conv2dGroupedShape& s) {
  // About this many blocks in all: 8 per SM of a 132-SM H100/H200, so that the runs of tiles
  // are long (one reduction each) while the grid still fills the device. A constant rather than
  // the device's count: the split, and with it the deterministic reduction order, is a function
  // of the shape.
  constexpr int64_t kTargetBlocks = 1024;
  constexpr int kSeg = 8, kMaxWarps = 8;
  NarrowWgradPlan p;
  const int ow = s.ow(), oh = s.oh();
  p.segs_x = 1;
  while (p.segs_x < 32 && p.segs_x * kSeg < ow) p.segs_x *= 2;
  p.th = 32 / p.segs_x;
  p.tw = p.segs_x * kSeg;
  // Planes of at most th / 2 rows: several images a tile, so that the lanes have rows to sum.
  p.ipt = oh * 2 <= p.th ? p.th / oh : 1;
  p.rows = p.ipt > 1 ? oh : p.th;
  p.tiles_x = ceil_div(ow, p.tw);
  p.tiles_y = ceil_div(oh, p.rows);
  p.warps = std::min(s.cg(), kMaxWarps);
  p.c_blocks = ceil_div(s.cg(), p.warps);
  p.oc_chunks = ceil_div(s.ocg(), 4);
  p.units = ceil_div<int64_t>(s.n, p.ipt) * p.tiles_y * p.tiles_x;
  const int64_t per_chunk = int64_t(s.groups) * p.oc_chunks * p.c_blocks;
  const int64_t want = std::clamp<int64_t>(ceil_div(kTargetBlocks, per_chunk), 1, p.units);
  p.chunk_units = ceil_div(p.units, want);
  p.chunks = ceil_div(p.units, p.chunk_units);
  return p;
}

int64_t grouped_narrow_wgrad_scratch_floats(const Conv2dGroupedShape& s) {
  return grouped_narrow_wgrad_plan(s).chunks * conv2d_grouped_wgrad_slots(s);
}

}  // namespace cnn
