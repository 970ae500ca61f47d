#pragma once
// CUDA launchers of the 2-D convolution (conv2d.cu). Called by conv2d.cpp after the shape check;
// all pointers are device pointers and every launch is asynchronous on `stream`.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_wgrad_direct_plan.h"
#include "runtime/stream.h"

namespace cnn {

// The weight-gradient reduction runs over P = N*OH*OW output positions. The tiled kernel splits P
// into fixed chunks of kConv2dWgradChunk positions; in deterministic mode each chunk writes its
// partial sums to scratch, laid out (chunks, OC*C*KH*KW + OC): the weights, then one slot per bias.
// The chunking depends on the shape only, so the scratch size is known without a device.
constexpr int64_t kConv2dWgradChunk = 4096;

inline int64_t conv2d_wgrad_chunks(const Conv2dShape& s) {
  const int64_t positions = static_cast<int64_t>(s.n) * s.oh() * s.ow();
  return (positions + kConv2dWgradChunk - 1) / kConv2dWgradChunk;
}

inline int64_t conv2d_wgrad_slots(const Conv2dShape& s) {
  return static_cast<int64_t>(s.oc) * s.c * s.kh * s.kw + s.oc;
}

// Floats of scratch that conv2d_backward_weight_cuda needs (0 unless deterministic): the tiled
// kernel's chunks or the direct 3x3 kernel's splits (conv2d_wgrad_direct_plan.h).
inline std::size_t conv2d_backward_weight_scratch_floats_cuda(const Conv2dShape& s,
                                                              bool deterministic) {
  if (!deterministic) return 0;
  return std::max(static_cast<std::size_t>(conv2d_wgrad_chunks(s) * conv2d_wgrad_slots(s)),
                  wgrad_direct_scratch_floats(s, deterministic));
}

void conv2d_forward_cuda(const Conv2dShape& s, const float* d_x, const float* d_w, const float* d_b,
                         float* d_y, bool relu, Algo algo, cudaStream_t stream);
void conv2d_backward_data_cuda(const Conv2dShape& s, const float* d_dy, const float* d_w,
                               float* d_dx, Algo algo, cudaStream_t stream);
void conv2d_backward_weight_cuda(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                 float* d_dw, float* d_db, float* d_scratch, Algo algo,
                                 bool deterministic, cudaStream_t stream);

}  // namespace cnn
