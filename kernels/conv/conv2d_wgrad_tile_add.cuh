#pragma once
// The epilogue the halo weight-gradient kernels share (conv2d_wgmma_wgrad_halo.cu, BF16, and
// conv2d_wgmma_wgrad_tf32_halo.cu): a block's FP32 tile, gathered in shared memory once every
// consumer is done with the ring, added to dw with atomics (K is split across blocks).
#include <cstdint>

#include "kernels/gemm/wgmma_ptx.cuh"

namespace cnn {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Where a block's tile goes in dw (OC, C, taps): output channels oc0.. (rows of the tile), input
// channels c0.. at taps group_first.. (column q = c group_count + t of the tile).
struct WgradTileAt {
  float* dw;
  int oc, c, taps;
  int oc0, c0, group_first, group_count;
};

// Adds the gathered tile (64 rows of 64 group_count columns on `pitch` floats, at shared address
// `tile`) to dw, rows and columns past OC and C left out. Thread `tid` of `threads` owns columns
// tid, tid + threads, ... (one division each) and walks their rows; consecutive threads take
// consecutive columns, so each warp's atomic instruction covers 32 consecutive floats of dw where
// the group holds every tap (runs of group_count otherwise).
__device__ __forceinline__ void add_wgrad_tile(uint32_t tile, int pitch, const WgradTileAt& at,
                                               int tid, int threads) {
  const int row_len = 64 * at.group_count;
  const int rows = min(64, at.oc - at.oc0), cols = min(64, at.c - at.c0);
  const int64_t row_stride = int64_t(at.c) * at.taps;
  for (int q = tid; q < row_len; q += threads) {
    const int c = q / at.group_count, t = q - c * at.group_count;
    if (c >= cols) continue;
    float* out = at.dw + (int64_t(at.oc0) * at.c + at.c0 + c) * at.taps + at.group_first + t;
    for (int r = 0; r < rows; ++r, out += row_stride)
      atomicAdd(out, wgmma::ld_shared_f32(tile + 4u * uint32_t(r * pitch + q)));
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace cnn
