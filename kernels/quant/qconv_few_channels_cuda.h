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

// The tensor-core kernel's layout of the same tiles: the GEMM's reduction runs over the words
// (r, j) of the kernel (KH x KWW of them, zero padded to k_steps 8-word mma k steps), its rows are
// pool-window slots (a window's outputs rounded up to `slots`, a power of two dividing the 16 rows
// of an mma tile), its columns the n_tiles x 8 output channels of the block.
struct QFewMmaTiling {
  QFewTiling few;
  int n_tiles;            // ocb / 8
  int k_steps;            // ceil(KH * KWW / 8)
  int slots, slot_shift;  // rows a pool window takes (1, 2, 4, 8, 16) and its log2
  int m_tiles;            // 16-row mma tiles of the block's windows
  int row_words;          // the input tile's row stride in shared memory (>= in_words; see .cpp)
  int word_groups;        // C == 1: a row's words in groups of 4 (a thread stages one); else 0
  int64_t smem_bytes;     // weight fragments, word offsets, window slots, mult and add, input tile
};
QFewMmaTiling qconv_few_channels_mma_tiling(const QConvShape& s);

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

// The tensor-core kernel (qconv_few_channels_mma.cu), same arguments.
void qconv_few_channels_mma_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w,
                                         const QEpilogue& ep, int8_t* d_y, cudaStream_t stream);
void qconv_few_channels_mma_forward_float_cuda(const QConvShape& s, const int8_t* d_x,
                                               const int8_t* d_w, const QEpilogue& ep, float* d_y,
                                               cudaStream_t stream);
void qconv_few_channels_mma_forward_quantize_cuda(const QConvShape& s, const float* d_x,
                                                  float inv_scale, const int8_t* d_w,
                                                  const QEpilogue& ep, int8_t* d_y,
                                                  cudaStream_t stream);

}  // namespace cnn
