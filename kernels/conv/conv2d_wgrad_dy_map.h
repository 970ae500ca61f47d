#pragma once
// The dy operand of the TF32 wgmma weight gradients (conv2d_wgmma_wgrad.cu's boxes per image,
// conv2d_wgmma_wgrad_tf32_halo.cu): the FP32 dy (N, OC, OH OW) as a 3-D TMA map, boxes of 32
// pixels x `rows` output channels x 1 image in the 128-byte swizzle (K-major rows of 32 tf32),
// zero fill past OH OW and OC. Defined in conv2d_wgmma_wgrad.cu.
#include <cuda.h>

#include "kernels/conv/conv2d.h"

namespace cnn {

CUtensorMap wgrad_dy_tf32_map(const float* d_dy, const Conv2dShape& s, int rows);

}  // namespace cnn
