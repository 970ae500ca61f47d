#pragma once
// The layers that ./bench's op mode gives rows, and the input each sees: the network's layers in
// the Network's order with every residual block opened up (layer_graph: the block's layers from
// the block's input, then its shortcut's, also from the block's input; the add gets no row), named
// as ./train --dry-run names them, so that --ops conv5.wgrad selects the layer a user sees there.
// Plain C++ (no CUDA), so the walk is tested on the CPU; bench_ops measures each entry.
#include <string>
#include <vector>

#include "layers/layer_spec.h"
#include "runtime/tensor.h"

namespace cnn::bench {

struct OpLayer {
  LayerSpec spec;  // one layer (never a residual block)
  Shape in;        // its input (N, ...) at the bench's batch
  // The rows' name: spec.name, or "bn2+relu2" for a batchnorm that the Network runs with the
  // relu reading it folded in (that relu's only input is the batchnorm, nothing else reads the
  // batchnorm: inside a block, the next layer of the branch).
  std::string name;
  bool folds_relu = false;
  // False where no parameter lies before the layer (it reads the network input): training
  // computes no input gradient there, as the Network skips it.
  bool input_grad_needed = true;
  // "conv1+relu1+pool1" for a first conv followed by a relu and a 2x2 / stride-2 maxpool that
  // read only their predecessor, which the Network runs as one pass on CUDA where the kernel
  // applies (the bench checks that); empty elsewhere.
  std::string relu_pool;
};

// Throws (naming the layer) where a layer does not fit the shape before it.
std::vector<OpLayer> op_layers(const std::vector<LayerSpec>& specs, const Shape& input_chw,
                               int batch);

}  // namespace cnn::bench
