#pragma once
// The halo instance of the BF16 channels-last weight gradient (conv2d_wgmma_wgrad_nhwc.h's
// contract, stride 1): one TMA box of dy and one of x per k-tile serve every filter tap, each tap
// reading the x box at a row offset (conv2d_wgrad_halo_layout.h). Called by
// conv2d_backward_weight_wgmma_nhwc after it wrote the channels-last copies.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_wgrad_halo_layout.h"

namespace cnn {

// Blocks a column of output tiles (64 output x 64 input channels x one group of taps) for a wave
// of one block an SM over `sms` SMs (split_k.h); each split at least 3 k-tiles, at most 65535.
int wgrad_halo_pick_splits(const Conv2dShape& s, const WgradHaloGeometry& h, int sms);

// dw += the weight gradient from the copies: d_xc (N, H, W, c_pad) and d_dyc (N, OH, OW, oc_pad)
// bf16, c_pad and oc_pad multiples of 64, on `splits` blocks per output tile (at most the
// k-tiles; atomics add them).
void conv2d_wgrad_halo_launch(const Conv2dShape& s, const WgradHaloGeometry& h,
                              const uint16_t* d_xc, int c_pad, const uint16_t* d_dyc, int oc_pad,
                              float* d_dw, int splits, cudaStream_t stream);

}  // namespace cnn
