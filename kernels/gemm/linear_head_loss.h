#pragma once
// The tail of a classifier's training step in one launch: the forward of its last linear layer
// (few outputs: the logits), softmax cross-entropy on those logits and, where no grid-wide sync
// is needed for it, that layer's whole backward (linear_head.h). Each is a latency-bound launch
// of little work on its own (LeNet, batch 128: the fc2 forward, the loss and fc2's backward).
// A block owns a few rows of the batch and every column: a warp computes a row's logits, its
// loss and its dlogits in lane registers, and the block then runs the backward of its rows. In
// deterministic mode the backward needs one owner per output of dw, so beyond one block's rows
// it stays a second launch (linear_head_backward's deterministic kernel). Arithmetic is FP32
// whatever ex.precision says.
#include <cstdint>

#include "kernels/gemm/linear.h"
#include "kernels/gemm/linear_head.h"
#include "kernels/loss/softmax_xent.h"
#include "runtime/exec.h"

namespace cnn {

// y (N, OUT) = x w^T + b (b may be null: no bias); then, as softmax_xent(s.n, s.out) on y with
// t's labels, smoothing and grad_scale: t.loss_rows, t.pred and dy (N, OUT) = dlogits; then, as
// linear_head_backward(s, x, dy, w, dw, db, dx, mask_input_relu, input_db): dw, db and input_db
// ACCUMULATE, dx (may be null) is written. The loss, prediction and dlogits have exactly the bits
// softmax_xent gives for the y written. x (N, IN), w (OUT, IN); no two buffers overlap.
// s.out <= kLinearHeadMaxOut.
void linear_head_loss_step(const LinearShape& s, const float* x, const float* w, const float* b,
                           float* y, const XentTargets& t, float* dy, float* dw, float* db,
                           float* dx, bool mask_input_relu, float* input_db, const Exec& ex);

// The CPU twin: linear_forward_cpu, softmax_xent_cpu and linear_head_backward_cpu, one after
// another.
void linear_head_loss_step_cpu(const LinearShape& s, const float* x, const float* w, const float* b,
                               float* y, const XentTargets& t, float* dy, float* dw, float* db,
                               float* dx, bool mask_input_relu, float* input_db);

}  // namespace cnn
