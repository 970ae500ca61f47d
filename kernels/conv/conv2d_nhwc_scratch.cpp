#include "kernels/conv/conv2d_nhwc_scratch.h"

#include "runtime/error.h"

namespace cnn {

namespace {
constexpr int64_t kRowBytes = 128;  // one 128-byte swizzle row: a k-tile's channels
}  // namespace

int nhwc_channel_block(Precision precision, const char* what) {
  CNN_CHECK(
      precision == Precision::FP32 || precision == Precision::TF32 || precision == Precision::BF16,
      "{}: algo wgmma-nhwc multiplies in FP32 (3xTF32), TF32 or BF16 only (got precision "
      "{})",
      what, precision_name(precision));
  return precision == Precision::BF16 ? kNhwcChannelBlockBf16 : kNhwcChannelBlock;
}

std::size_t NhwcScratchLayout::floats() const {
  const int64_t bytes = (weight_elems + copies * copy_elems) * elem_bytes;
  return std::size_t((bytes + 3) / 4);
}

// BF16 never needs more than TF32: 64-channel rows of 2 bytes <= 32-channel rows of 4 bytes,
// doubled. FP32 (3xTF32) takes two of TF32's copies and two weight packs (big, then small).
NhwcScratchLayout nhwc_scratch_layout(const Conv2dShape& g, const WeightPack& wp,
                                      Precision precision) {
  const int block = nhwc_channel_block(precision, "wgmma-nhwc scratch");
  NhwcScratchLayout l;
  l.elem_bytes = precision == Precision::BF16 ? 2 : 4;
  const int64_t per_row = kRowBytes / l.elem_bytes;
  l.pack_elems = (int64_t(wp.rows) * wp.taps * wp.k_pad + per_row - 1) / per_row * per_row;
  l.weight_elems = precision == Precision::FP32 ? 2 * l.pack_elems : l.pack_elems;
  const int64_t c_pad = (int64_t(g.cg()) + block - 1) / block * block;  // a group's
  l.copy_elems = int64_t(g.n) * g.groups * g.h * g.w * c_pad;
  l.copies = precision == Precision::FP32 ? 2 : 1;
  return l;
}

std::size_t conv2d_forward_wgmma_nhwc_scratch_floats(const Conv2dShape& s, Precision precision) {
  const int block = nhwc_channel_block(precision, "conv2d_forward");
  return nhwc_scratch_layout(s, forward_weight_pack(s, block), precision).floats();
}

std::size_t conv2d_backward_data_wgmma_nhwc_scratch_floats(const Conv2dShape& s,
                                                           Precision precision) {
  const int block = nhwc_channel_block(precision, "conv2d_backward_data");
  return nhwc_scratch_layout(backward_data_as_forward(s), backward_data_weight_pack(s, block),
                             precision)
      .floats();
}

std::size_t conv2d_backward_data_wgmma_nhwc_pack_floats(const Conv2dShape& s) {
  const NhwcScratchLayout l =
      nhwc_scratch_layout(backward_data_as_forward(s),
                          backward_data_weight_pack(s, kNhwcChannelBlockBf16), Precision::BF16);
  return std::size_t((l.weight_elems * l.elem_bytes + 3) / 4);
}

}  // namespace cnn
