#pragma once
// Op mode of ./bench: every conv and linear layer of the network (forward, input gradient, weight
// gradient), every relu and maxpool layer (forward, backward; the backward also with the fused
// ReLU mask), every batchnorm layer's training forward and backward (with the relu reading it
// folded in, as the Network runs it: bn<i>+relu<j>.fwd / .bwd), the wgmma-nhwc convolution's
// NCHW -> NHWC pre-pass alone (conv<i>.fwd.to_nhwc, conv<i>.dgrad.to_nhwc) and its whole
// pre-pass, weights and copy, fused and as two launches (conv<i>.fwd.prepass, .dgrad.prepass),
// the softmax cross-entropy and the optimizer update. Residual blocks are opened up (op_layers):
// the layers of a block and of its shortcut get rows under the names ./train --dry-run shows, each
// fed the shape it sees; the add itself has no row (the step times it). Each of our variants and
// the library call is first checked against the CPU reference on the same random input (a wrong
// one is not timed), then timed by graph replay.
#include <vector>

#include "app/bench/bench_common.h"

namespace cnn::bench {

std::vector<BenchRow> bench_ops(const BenchContext& ctx, const NetDesc& net);

// True when `op` (e.g. "conv2.wgrad") passes the --ops filters (any filter a substring of it).
bool op_selected(const BenchOptions& opt, const std::string& op);

}  // namespace cnn::bench
