// ./bench's per-op walk (app/bench/bench_op_layers.h): residual blocks opened up, each layer of a
// block's branch and of its shortcut fed the block's input shape onward, named as the layer graph
// (and so ./train --dry-run) names it, a relu reading a batchnorm folded into its rows' name, the
// add left out; and the plain reference network walked as before.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "app/bench/bench_op_layers.h"
#include "app/config/config.h"
#include "tests/test_util.h"

using namespace cnn;
using cnn::bench::op_layers;
using cnn::bench::OpLayer;

namespace {

const OpLayer& find(const std::vector<OpLayer>& layers, const std::string& name) {
  for (const OpLayer& l : layers)
    if (l.name == name) return l;
  ADD_FAILURE() << "no op layer named " << name;
  static const OpLayer none;
  return none;
}

std::vector<std::string> names(const std::vector<OpLayer>& layers) {
  std::vector<std::string> out;
  for (const OpLayer& l : layers) out.push_back(l.name);
  return out;
}

TEST(BenchOpLayers, ResnetFashionOpensItsBlocks) {
  const TrainConfig c = load_config(test::source_dir() + "/configs/resnet_fashion.yaml");
  const std::vector<OpLayer> layers = op_layers(c.model.layers, c.model.input_chw, 128);

  // Every layer of the graph but the adds, in the graph's order and under its names.
  std::vector<std::string> graph_names;
  for (const GraphNode& g : layer_graph(c.model.layers))
    if (g.spec.kind != LayerKind::Residual) graph_names.push_back(g.spec.name);
  std::vector<std::string> walked;
  for (const OpLayer& l : layers) walked.push_back(l.spec.name);
  EXPECT_EQ(walked, graph_names);

  // Stage 1: the block convs see the stem's output.
  const OpLayer& conv2 = find(layers, "conv2");
  EXPECT_EQ(conv2.spec.kind, LayerKind::Conv2d);
  EXPECT_EQ(conv2.in, (Shape{128, 32, 28, 28}));
  EXPECT_TRUE(conv2.input_grad_needed);
  EXPECT_EQ(find(layers, "conv3").in, (Shape{128, 32, 28, 28}));
  // Stage 2's first block: the stride-2 branch conv and the 1x1 stride-2 shortcut conv both read
  // the block's input; the branch's second conv reads the halved size.
  const OpLayer& conv6 = find(layers, "conv6");
  EXPECT_EQ(conv6.in, (Shape{128, 32, 28, 28}));
  EXPECT_EQ(conv6.spec.stride_h, 2);
  EXPECT_EQ(find(layers, "conv7").in, (Shape{128, 64, 14, 14}));
  const OpLayer& conv8 = find(layers, "conv8");
  EXPECT_EQ(conv8.in, (Shape{128, 32, 28, 28}));
  EXPECT_EQ(conv8.spec.kernel_h, 1);
  EXPECT_EQ(conv8.spec.stride_h, 2);
  EXPECT_EQ(find(layers, "bn8").in, (Shape{128, 64, 14, 14}));
  // Stage 3's shortcut, and the last block's convs.
  EXPECT_EQ(find(layers, "conv13").in, (Shape{128, 64, 14, 14}));
  EXPECT_EQ(find(layers, "conv15").in, (Shape{128, 128, 7, 7}));
  // After the last add: the relu, the pooling and the classifier.
  EXPECT_EQ(find(layers, "relu13").in, (Shape{128, 128, 7, 7}));
  EXPECT_EQ(find(layers, "fc1").in, (Shape{128, 128}));
  EXPECT_EQ(find(layers, "loss").in, (Shape{128, 10}));

  // A relu reading only a batchnorm is folded into its rows (the stem's, the branch's first);
  // the batchnorm ending a branch or a shortcut feeds the add and keeps its own name.
  const OpLayer& bn2 = find(layers, "bn2+relu2");
  EXPECT_TRUE(bn2.folds_relu);
  EXPECT_EQ(bn2.spec.name, "bn2");
  EXPECT_EQ(bn2.in, (Shape{128, 32, 28, 28}));
  EXPECT_TRUE(find(layers, "bn1+relu1").folds_relu);
  for (const char* n : {"bn3", "bn5", "bn7", "bn8", "bn13", "bn15"})
    EXPECT_FALSE(find(layers, n).folds_relu) << n;

  // Only the stem reads the network input: its input gradient is not needed.
  EXPECT_FALSE(find(layers, "conv1").input_grad_needed);
  for (const OpLayer& l : layers) {
    if (l.spec.name != "conv1") {
      EXPECT_TRUE(l.input_grad_needed) << l.name;
    }
    EXPECT_TRUE(l.relu_pool.empty()) << l.name;  // no maxpool after the stem
  }
}

// The reference network (no blocks): every layer once, in order, the first conv marked for the
// fused conv-relu-pool.
TEST(BenchOpLayers, PlainNetworkWalksEveryLayer) {
  const std::vector<LayerSpec> specs = conv_net_specs();
  const std::vector<OpLayer> layers = op_layers(specs, Shape{1, 28, 28}, 64);
  EXPECT_EQ(names(layers),
            (std::vector<std::string>{"conv1", "relu1", "pool1", "conv2", "relu2", "pool2",
                                      "flatten1", "fc1", "relu3", "fc2", "loss"}));
  EXPECT_EQ(layers[0].in, (Shape{64, 1, 28, 28}));
  EXPECT_EQ(layers[0].relu_pool, "conv1+relu1+pool1");
  EXPECT_FALSE(layers[0].input_grad_needed);
  EXPECT_EQ(find(layers, "conv2").in, (Shape{64, 32, 14, 14}));
  EXPECT_TRUE(find(layers, "conv2").relu_pool.empty());
  EXPECT_EQ(find(layers, "fc1").in, (Shape{64, 3136}));
}

// A relu that a block's branch starts with reads a batchnorm that the identity shortcut reads
// too: the Network keeps them apart, and so do the rows. Inside the branch, the batchnorm's next
// layer is the branch's next.
TEST(BenchOpLayers, BatchnormReadTwiceKeepsItsRelu) {
  std::vector<LayerSpec> specs = {
      conv2d_spec("c1", 4, 3, 3, 1, 1),
      batchnorm_spec(LayerKind::BatchNorm2d, "b1"),
      residual_spec("res1", {layer_spec(LayerKind::Relu, "r1"), conv2d_spec("c2", 4, 3, 3, 1, 1),
                             batchnorm_spec(LayerKind::BatchNorm2d, "b2"),
                             layer_spec(LayerKind::Relu, "r2"), conv2d_spec("c3", 4, 3, 3, 1, 1)}),
      layer_spec(LayerKind::Flatten, "f"),
      linear_spec("fc", 3),
      layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
  const std::vector<OpLayer> layers = op_layers(specs, Shape{2, 5, 5}, 8);
  EXPECT_EQ(names(layers), (std::vector<std::string>{"c1", "b1", "r1", "c2", "b2+r2", "r2", "c3",
                                                     "f", "fc", "loss"}));
  EXPECT_EQ(find(layers, "r1").in, (Shape{8, 4, 5, 5}));
}

}  // namespace
