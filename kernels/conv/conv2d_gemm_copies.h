#pragma once
// What the passes that run one wgmma GEMM on explicit copies share (conv2d_wgrad_im2col.h,
// conv2d_dgrad_col2im.h): the shapes they take, and the one-line reason where they do not.
#include <cstddef>
#include <string>

#include "kernels/conv/conv2d.h"

namespace cnn {

// Why `what` (e.g. "conv2d_backward_weight: the weight gradient") cannot run s on copies of
// `floats` floats, or "": a dilated or grouped shape, more than max_pixels output pixels a plane,
// copies past max_floats or sizes past the GEMM's int arguments (!fits), no wgmma GEMM on this
// device. Host code.
std::string gemm_copies_refusal(const Conv2dShape& s, const char* what, int max_pixels,
                                std::size_t floats, std::size_t max_floats, bool fits);

}  // namespace cnn
