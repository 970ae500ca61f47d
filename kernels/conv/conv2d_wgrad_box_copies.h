#pragma once
// The pre-pass of the TMA-box wgmma weight gradient on the GPU: writes the tap-class copies of x
// that B's boxes read (kernels/conv/conv2d_wgrad_box.h says which and why; its CPU twin is
// wgrad_box_copies_cpu). Device pointers; asynchronous on `stream`.
#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_wgrad_box.h"
#include "runtime/stream.h"

namespace cnn {

// Writes all g.copy_floats floats of d_copies (R, N, C, Hc, Wc), padding zeros included, from
// d_x (N, C, H, W), except copy `skip` (-1: none; the direct class whose boxes read x), whose
// floats stay as they are; nothing when g.reads_x. d_copies must be 16-byte aligned (float4
// stores).
void wgrad_box_copies_cuda(const Conv2dShape& s, const WgradBoxGeometry& g, const float* d_x,
                           float* d_copies, cudaStream_t stream, int skip = -1);

}  // namespace cnn
