#pragma once
// The scratch of one TMA-im2col convolution call (conv2d_wgmma_nhwc.h): where its packed weights
// and its channels-last copy lie and how many floats they take. Plain host code, compiled in
// every build, so that the sizes that conv2d_forward_scratch_floats / the layers / the Network
// allocate from are the ones the kernels write, and are tested on any machine.
#include <cstddef>
#include <cstdint>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_nhwc_layout.h"
#include "runtime/exec.h"

namespace cnn {

// The channels of one k-tile at `precision`: kNhwcChannelBlock (FP32 as 3xTF32, TF32) or
// kNhwcChannelBlockBf16. Throws naming `what` for any other precision.
int nhwc_channel_block(Precision precision, const char* what);

// One call's scratch, 16-byte aligned (128-byte aligned in practice: cudaMalloc's), elements of
// elem_bytes each: first the packed weights (rows, taps, k_pad), rounded up to whole 128-byte rows
// so that what follows stays 128-byte aligned (at FP32 two such packs, the TF32 weights and their
// TF32 residuals), then the copy (N, H, W, c_pad) of the GEMM view's input (x for the forward, dy
// for the input gradient; grouped: (G, N, H, W, c_pad), c_pad a group's channels rounded up); at
// FP32 room for two copies (the 3xTF32 kernel at two blocks an SM splits x into its TF32 part and
// residual; at one an SM it uses the first, unrounded).
struct NhwcScratchLayout {
  int64_t pack_elems = 0;    // one weight pack, rounded up to whole 128-byte rows
  int64_t weight_elems = 0;  // every pack: pack_elems, or 2 pack_elems at FP32
  int64_t copy_elems = 0;    // one NHWC copy (a multiple of 32 elements: 128-byte aligned)
  int copies = 1;            // 2 at FP32
  int elem_bytes = 4;        // 4: TF32 in float storage; 2: BF16 bit patterns
  std::size_t floats() const;
};
// g: the GEMM view (the convolution itself, or backward_data_as_forward of it); wp: its packing
// at the channel block of `precision` (FP32, TF32 or BF16).
NhwcScratchLayout nhwc_scratch_layout(const Conv2dShape& g, const WeightPack& wp,
                                      Precision precision);

// The floats of the forward / input-gradient call at `precision`. At BF16 never more than at
// TF32, at TF32 never more than at FP32 (so a scratch sized for FP32 serves every precision).
std::size_t conv2d_forward_wgmma_nhwc_scratch_floats(const Conv2dShape& s,
                                                     Precision precision = Precision::TF32);
std::size_t conv2d_backward_data_wgmma_nhwc_scratch_floats(const Conv2dShape& s,
                                                           Precision precision = Precision::TF32);
// The floats of the input gradient's weight pack alone at BF16 (the start of its scratch), for
// conv2d_backward_data_wgmma_nhwc_from_copy.
std::size_t conv2d_backward_data_wgmma_nhwc_pack_floats(const Conv2dShape& s);

}  // namespace cnn
