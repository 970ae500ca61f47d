#pragma once
// The layout change that lets a grouped convolution run on the dense kernels one group at a
// time (conv2d_grouped_dense.h): an NCHW tensor (N, G * Cg, H, W) is (N, G, L) with L = Cg * H * W
// contiguous floats, and its group-major copy is (G, N, L), in which group g's (N, Cg, H, W) is
// one dense NCHW tensor at offset g * N * L.
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

}  // namespace cnn
