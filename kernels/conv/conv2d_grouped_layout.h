#pragma once
// The layout changes that let a grouped convolution run on the dense kernels
// (conv2d_grouped_dense.h), in its two forms:
//   one group at a time: an NCHW tensor (N, G * Cg, H, W) is (N, G, L) with L = Cg * H * W
//     contiguous floats, and its group-major copy is (G, N, L), in which group g's (N, Cg, H, W)
//     is one dense NCHW tensor at offset g * N * L;
//   all groups at once: the grouped weights (OC, Cg, KH, KW) as the block-diagonal dense weights
//     (OC, C, KH, KW) (zero where input and output channel are of different groups), and back:
//     the dense weight gradient's diagonal blocks added into the grouped one.
#include <cstdint>

#include "runtime/exec.h"

namespace cnn {

// to_group_major: dst (G, N, L) = src (N, G, L); else dst (N, G, L) = src (G, N, L).
// src and dst must not overlap. n, groups >= 1, plane (L) >= 1.
void group_major_copy(const float* src, float* dst, int n, int groups, int64_t plane,
                      bool to_group_major, const Exec& ex);

// CPU reference, same contract.
void group_major_copy_cpu(const float* src, float* dst, int n, int groups, int64_t plane,
                          bool to_group_major);

// The block-diagonal weights' shape: oc output channels in `groups` groups, c input channels,
// taps = KH * KW. groups divides oc and c.
struct BlockDiagonal {
  int oc = 1, c = 1, groups = 1, taps = 1;
  int64_t dense_floats() const { return int64_t(oc) * c * taps; }
};

// wd (OC, C, taps) = w (OC, C/G, taps) on the diagonal blocks, 0 elsewhere.
void block_diagonal_expand(const BlockDiagonal& b, const float* w, float* wd, const Exec& ex);
// dw (OC, C/G, taps) += the diagonal blocks of dwd (OC, C, taps).
void block_diagonal_add_back(const BlockDiagonal& b, const float* dwd, float* dw, const Exec& ex);
// p[0, count) = 0 (the dense weight gradient accumulates into its buffer).
void zero_floats(float* p, int64_t count, const Exec& ex);

void block_diagonal_expand_cpu(const BlockDiagonal& b, const float* w, float* wd);
void block_diagonal_add_back_cpu(const BlockDiagonal& b, const float* dwd, float* dw);

}  // namespace cnn
