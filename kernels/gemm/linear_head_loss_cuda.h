#pragma once
// CUDA launcher for linear_head_loss.h (kernels/gemm/linear_head_loss.cu). Called by
// linear_head_loss.cpp after the checks.
#include "kernels/gemm/linear.h"
#include "kernels/loss/softmax_xent.h"
#include "runtime/stream.h"

namespace cnn {

// The most rows a block of the fused kernel owns: their dlogits stay in shared memory for the
// backward, and a block's every thread walks all of its rows for each column it owns.
constexpr int kLinearHeadLossMaxRows = 32;
// The rows a block owns in normal mode: the batch's blocks each add their dw partials with
// atomicAdd (OUT x IN a block), so fewer rows a block means more atomics but more blocks at work.
constexpr int kLinearHeadLossRows = 16;

// How the fused kernel cuts the batch: rows_per_block rows a block; fused_backward: the block
// also runs the backward of its rows (else linear_head_backward runs it, a second launch).
struct LinearHeadLossPlan {
  int rows_per_block = 1;
  bool fused_backward = true;
};

// Normal mode: kLinearHeadLossRows rows a block (fewer when the batch has fewer), backward
// fused. Deterministic mode: one block of the whole batch, backward fused (one owner for every
// output), where the batch fits kLinearHeadLossMaxRows; beyond that, one row a warp for the
// forward and the loss, and the backward apart (its deterministic kernel). rows_per_block > 0
// asks for that many rows a block (at most kLinearHeadLossMaxRows); the backward is then fused
// unless deterministic mode would need more than one block. Plain C++ (linear_head_loss.cpp),
// to be tested without a GPU.
LinearHeadLossPlan linear_head_loss_plan(const LinearShape& s, bool deterministic,
                                         int rows_per_block = 0);

void linear_head_loss_step_cuda(const LinearShape& s, const float* d_x, const float* d_w,
                                const float* d_b, float* d_y, const XentTargets& t, float* d_dy,
                                float* d_dw, float* d_db, float* d_dx, bool mask_input_relu,
                                float* d_input_db, bool deterministic, cudaStream_t stream,
                                int rows_per_block = 0);

}  // namespace cnn
