#pragma once
// Plain description of one layer, as the config lists it. Layers know no YAML: the app fills
// these in from the config file.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/exec.h"
#include "runtime/tensor.h"

namespace cnn {

enum class LayerKind {
  Conv2d,
  Relu,
  MaxPool2d,
  Flatten,
  Linear,
  SoftmaxCrossEntropy,
  BatchNorm2d,    // per channel of (N, C, H, W)
  BatchNorm1d,    // per feature of (N, F)
  AvgPool2d,      // torch's count_include_pad=True
  GlobalAvgPool,  // (N, C, H, W) -> (N, C, 1, 1)
  Dropout,
  Residual,  // output = branch(x) + shortcut(x) (identity when the shortcut is empty)
};

const char* layer_kind_name(LayerKind k);  // "conv2d", "relu", ...

struct LayerSpec {
  LayerKind kind = LayerKind::Relu;
  std::string name;  // unique, e.g. "conv1", "fc1"; used for checkpoint tensor names
  // conv2d
  int out_channels = 0;
  int kernel_h = 0, kernel_w = 0;  // also maxpool2d window
  int stride_h = 1, stride_w = 1;  // maxpool2d: defaults to its kernel size
  int pad_h = 0, pad_w = 0;
  int dil_h = 1, dil_w = 1;  // conv2d: dilation
  int groups = 1;            // conv2d: channel groups (depthwise when == in_channels)
  // linear
  int out_features = 0;
  // conv2d, linear
  bool bias = true;
  Algo algo = Algo::Auto;
  // batchnorm2d, batchnorm1d: torch.nn's defaults
  double momentum = 0.1, eps = 1e-5;
  // dropout: probability of zeroing an element in training, in [0, 1)
  double dropout_p = 0.5;
  int line = 0;  // line of this layer in the config, for error messages
  // residual: output = branch(x) + shortcut(x), an empty shortcut being the identity. Blocks do
  // not nest (a block inside a block is refused).
  std::vector<LayerSpec> branch, shortcut;
};

// Specs for a network written in code rather than read from a config (the gradient checks, the
// bench's built-in reference network, tests). Square kernels where one size is given.
LayerSpec layer_spec(LayerKind kind, const std::string& name);  // relu, flatten, loss, ...
LayerSpec conv2d_spec(const std::string& name, int out_channels, int kh, int kw, int stride,
                      int pad);
LayerSpec maxpool2d_spec(const std::string& name, int kernel, int stride, int pad = 0);
LayerSpec linear_spec(const std::string& name, int out_features);
LayerSpec batchnorm_spec(LayerKind kind, const std::string& name);  // BatchNorm2d or BatchNorm1d
LayerSpec avgpool2d_spec(const std::string& name, int kernel, int stride, int pad = 0);
LayerSpec dropout_spec(const std::string& name, double p);

// conv -> relu -> maxpool 2x2 -> conv -> relu -> maxpool 2x2 -> flatten -> linear -> relu ->
// linear -> softmax_cross_entropy, named as a config's defaults name them (conv1, relu1, pool1,
// ..., flatten1, fc1, relu3, fc2, loss). The default sizes are configs/mnist.yaml's network.
struct ConvNetSizes {
  int conv1 = 32, kernel1 = 5, pad1 = 2;
  int conv2 = 64, kernel2 = 5, pad2 = 2;
  int fc1 = 1024, classes = 10;
};
std::vector<LayerSpec> conv_net_specs(const ConvNetSizes& sizes = {});

// Output shape (N, ...) of a layer for the given input shape. Throws naming the layer (and its
// config line when known) and what was expected, e.g. a linear layer after an unflattened input.
Shape layer_output_shape(const LayerSpec& spec, const Shape& in);

// Number of trainable parameters and forward FLOPs (multiply-add = 2) for one image.
int64_t layer_param_count(const LayerSpec& spec, const Shape& in);
int64_t layer_forward_flops(const LayerSpec& spec, const Shape& in);

// A residual block: output = branch(x) + shortcut(x); shortcut empty = identity.
LayerSpec residual_spec(const std::string& name, std::vector<LayerSpec> branch,
                        std::vector<LayerSpec> shortcut = {});

// One node of the layer graph: the specs with every residual block opened up into its layers,
// its shortcut's layers and the add that joins them, in an order where a node's inputs come
// before it (the parameter order, the forward order; backward runs it in reverse).
struct GraphNode {
  LayerSpec spec;  // the add of a block carries the block's spec (name, line), branches cleared
  int input = -1;  // the node whose output this node reads; -1: the network input
  // The add of a block (spec.kind == Residual) reads `input` (the branch's last node) and this
  // one: the shortcut's last node, or the block's input for the identity.
  int shortcut_input = -1;
  int depth = 0;  // 1 inside a block, for display
  bool in_shortcut = false;
};
std::vector<GraphNode> layer_graph(const std::vector<LayerSpec>& specs);

// Fills in default names ("conv1", "relu1", "pool1", "fc1", ...) for layers without one and
// checks that names are unique and the last layer is softmax_cross_entropy.
void finalize_layer_specs(std::vector<LayerSpec>& specs);

struct NetworkSummaryRow {
  std::string name, kind;
  Shape out;  // per image, without the batch dimension
  int64_t params = 0, flops = 0;
  // 1 for the rows inside a residual block (its layers, its shortcut, its add); the block's own
  // row (depth 0) carries the block's totals.
  int depth = 0;
};
struct NetworkSummary {
  std::vector<NetworkSummaryRow> rows;
  int64_t total_params = 0, total_flops = 0;
};
// Chains the shapes from one input image (C, H, W); throws at the first layer that does not fit.
NetworkSummary summarize_network(const std::vector<LayerSpec>& specs, const Shape& input_chw);
std::string format_network_summary(const NetworkSummary& s);  // the --dry-run table

}  // namespace cnn
