#pragma once
// The whole backward of a linear layer with few outputs (a classifier head: 10 classes from 1024
// features) in one launch: dw += dy^T x, db += column sums of dy, dx = dy w, and optionally dx
// masked by the ReLU of the layer before and that layer's bias gradient (the column sums of the
// masked dx, which is its output gradient). At such shapes each separate pass (weight gradient,
// bias gradient, input gradient, the previous layer's ReLU backward and bias gradient) is a
// launch that waits on latency for almost no work; one kernel reads x once for both products and
// writes dx once.
// Arithmetic is FP32 whatever ex.precision says (a head is bound by latency, not by FFMA).
#include "kernels/gemm/linear.h"
#include "runtime/device.h"
#include "runtime/exec.h"

namespace cnn {

// The most outputs the fused kernel takes: one output per lane of a warp, so that a row of dy is
// one load across the lanes, broadcast by shuffles, and each thread keeps its column's w and dw
// partials in 2 x 32 registers (more would spill, or leave too few threads an SM).
constexpr int kLinearHeadMaxOut = 32;

// Whether linear_head_backward is the backward to run for this shape on dev: a CUDA build and
// device, out <= kLinearHeadMaxOut, and CNN_LINEAR_HEAD not 0 (runtime/env_switches.h: the
// switch that runs the separate passes instead, to bisect a wrong answer). The linear layer asks
// this; the op itself runs whatever it is given, on either device.
bool linear_head_backward_applies(const LinearShape& s, Device dev);

// dw (OUT, IN) += dy^T x; db (OUT) += column sums of dy (db may be null); dx (N, IN) = dy w (dx may
// be null: no input gradient), and with mask_input_relu dx = 0 wherever x <= 0 (x is then the
// output of a ReLU, and the result has the bits relu_backward(x, dy w) gives: a NaN x masks).
// input_db (IN) += column sums of that masked dx (may be null; needs dx and the mask): the bias
// gradient of the linear layer whose ReLU output x is, so that layer needs no pass of its own for
// it. ACCUMULATES dw, db and input_db. x (N, IN), dy (N, OUT), w (OUT, IN); no two buffers
// overlap. Normal mode splits the batch over blocks where that fills the GPU and adds their
// partial sums with atomicAdd; deterministic mode gives every output of dw, db and input_db one
// owner that sums in a fixed order (bitwise repeatable, no scratch, so nothing to size; input_db
// then has the bits of the bias-gradient pass it replaces for batches up to 1024).
// s.out <= kLinearHeadMaxOut.
void linear_head_backward(const LinearShape& s, const float* x, const float* dy, const float* w,
                          float* dw, float* db, float* dx, bool mask_input_relu, float* input_db,
                          const Exec& ex);

// The CPU twin: the CPU references of the weight gradient, the input gradient, relu_backward and
// the bias gradient of the masked dx, one after another.
void linear_head_backward_cpu(const LinearShape& s, const float* x, const float* dy, const float* w,
                              float* dw, float* db, float* dx, bool mask_input_relu,
                              float* input_db);

}  // namespace cnn
