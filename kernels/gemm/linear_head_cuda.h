#pragma once
// CUDA launcher for linear_head.h (kernels/gemm/linear_head.cu). Called by linear_head.cpp after
// the checks.
#include "kernels/gemm/linear.h"
#include "runtime/stream.h"

namespace cnn {

// A block of the fused kernel owns 32 columns of x (one a lane) and a range of rows, which its
// warps share.
constexpr int kLinearHeadColumns = 32;
constexpr int kLinearHeadWarps = 8;
// A split of the batch leaves each warp at least this many rows: fewer would spend more on the
// block's fixed costs (loading w, the reduction, the atomics) than the split saves.
constexpr int kLinearHeadMinRowsPerWarp = 4;

// Blocks the batch of s.n rows is split over on a GPU of `sms` SMs: 1 when deterministic (each
// output then has one owner), else enough column-block x row-split blocks for about one a SM,
// each warp keeping kLinearHeadMinRowsPerWarp rows. Plain C++ (linear_head.cpp), to be tested
// without a GPU.
int linear_head_pick_row_splits(const LinearShape& s, bool deterministic, int sms);

// row_splits: 0 picks (linear_head_pick_row_splits); deterministic mode takes 1 only.
void linear_head_backward_cuda(const LinearShape& s, const float* d_x, const float* d_dy,
                               const float* d_w, float* d_dw, float* d_db, float* d_dx,
                               bool mask_input_relu, float* d_input_db, bool deterministic,
                               cudaStream_t stream, int row_splits = 0);

}  // namespace cnn
