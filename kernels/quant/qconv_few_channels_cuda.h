#pragma once
// The few-channel int8 convolution's block tiling (computed on the host, shared by the
// support check and the launcher) and its CUDA launchers (qconv_few_channels.cu).
#include <cstdint>

#include "kernels/quant/qconv.h"
#include "runtime/stream.h"

namespace cnn {

struct QFewTiling {
  int oh, ow, ph, pw;      // the shape's conv and pooled output sizes
  int tph, tpw;            // pooled outputs per block tile
  int tiles_h, tiles_w;    // tiles per image
  int ocb, chunks;         // output channels per block (a multiple of 8) and blocks per tile
  int taps_per_word, kww;  // a word holds 4 taps of a row (C == 1) or 1 tap; words per row
  int in_rows, in_words;   // the input tile in shared memory: rows, words per row
  int64_t smem_bytes;      // weights (KH, KWW, OCB), mult and add (OCB), the input tile (+ its
                           // bytes with one channel)
};
constexpr int64_t kQFewMaxSmem = 48 * 1024;
QFewTiling qconv_few_channels_tiling(const QConvShape& s);

// x int8 (N, H, W, CP) or, for _quantize, float (N, C, H, W) with inv_scale.
void qconv_few_channels_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w,
                                     const QEpilogue& ep, int8_t* d_y, cudaStream_t stream);
void qconv_few_channels_forward_float_cuda(const QConvShape& s, const int8_t* d_x,
                                           const int8_t* d_w, const QEpilogue& ep, float* d_y,
                                           cudaStream_t stream);
void qconv_few_channels_forward_quantize_cuda(const QConvShape& s, const float* d_x,
                                              float inv_scale, const int8_t* d_w,
                                              const QEpilogue& ep, int8_t* d_y,
                                              cudaStream_t stream);

}  // namespace cnn
