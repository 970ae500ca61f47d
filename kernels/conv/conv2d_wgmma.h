#pragma once
// Convolution forward and input gradient on the Hopper (sm_90a) wgmma tensor cores, TF32 in, FP32
// accumulate (conv2d_wgmma.cu). Implicit GEMM: M = output pixels, K = (input channel, tap), the
// GEMM's columns the output channels. A warp-specialized block (one producer warpgroup, two
// consumer warpgroups) computes a 128 x BN tile (BN = 64 or 128) over a ring of shared-memory
// stages; the producer gathers im2col straight into the 128-byte-swizzled K-major layout with
// 4-byte cp.async (zero fill for padding) and kStages - 1 stages in flight; the weights arrive by
// TMA when K-contiguous and aligned, else by the same gather. K may be split across a thread-block
// cluster, the partial tiles summed in rank order: no atomics, bitwise repeatable.
//
// The input gradient (stride 1 only) is the forward of dy with the flipped, transposed weights,
//   dx = conv(dy, w'), w'[c][oc][kh][kw] = w[oc][c][KH-1-kh][KW-1-kw], padding KH-1-ph,
// with w' never written anywhere: the producer reads w at the flipped index, so nothing is cached
// and weights that change every step are always read fresh.
//
// Only the build's sm_90a cubin holds the kernel; every entry throws cnn::Error (one line, the
// reason) when it cannot run: no compute capability 9.0 device / no sm_90a build, a stride > 1
// input gradient, tensors past 2^31-1 elements.
#include "kernels/conv/conv2d.h"
#include "runtime/stream.h"

namespace cnn {

// How the producer fills the im2col stages (CNN_WGMMA_CONV_GATHER; Default reads it):
//   Async: cp.async, each stage announced by cp.async.mbarrier.arrive.noinc (the fast one);
//   WaitGroup: cp.async in commit groups, the producer waits for the oldest group, fences and
//     arrives (the Ampere-style pipeline, kStages - 2 stages in flight);
//   Sync: ordinary loads and st.shared, one stage at a time (the slow, simplest reference).
enum class WgmmaConvGather { Default, Async, WaitGroup, Sync };

struct WgmmaConvOptions {
  int splits = 0;   // K split across a cluster: 0 picks (1..8), else 1, 2, 4 or 8
  int block_n = 0;  // 0 picks (conv2d_wgmma_pick_block_n), else 64 or 128
  WgmmaConvGather gather = WgmmaConvGather::Default;
  bool force_b_gather = false;  // gather the forward's weights too, never TMA (tests)
};

// True when this build has the sm_90a kernels and the current device is compute capability 9.0.
bool conv2d_wgmma_available();

// The block tile width for a GEMM of m rows and n (output channel) columns: 64 when n <= 64 or
// when 64-wide tiles waste fewer columns; else 128 (m does not decide it: split-K fills SMs).
int conv2d_wgmma_pick_block_n(int64_t m, int n);

// y (N, OC, OH, OW) = relu?(conv(x, w) + b), as conv2d_forward; b may be null.
void conv2d_forward_wgmma(const Conv2dShape& s, const float* d_x, const float* d_w,
                          const float* d_b, float* d_y, bool relu, cudaStream_t stream,
                          const WgmmaConvOptions& opt = WgmmaConvOptions{});

// dx (N, C, H, W) = conv_transpose(dy, w), as conv2d_backward_data (overwrites dx). Stride 1.
void conv2d_backward_data_wgmma(const Conv2dShape& s, const float* d_dy, const float* d_w,
                                float* d_dx, cudaStream_t stream,
                                const WgmmaConvOptions& opt = WgmmaConvOptions{});

}  // namespace cnn
