// A relu folded into the batchnorm before it (conv -> batchnorm2d -> relu, linear -> batchnorm1d ->
// relu): which pairs the Network folds (not where the batchnorm's output also feeds a residual
// shortcut), the fusion note, the switches (fuse_relu, fuse_batchnorm_relu, CNN_FUSE_BN_RELU), and
// one training step plus eval giving the bits of the unfolded network. Bitwise, not to a
// tolerance: the folded passes run the same float operations on the same values (the relu's
// max(y, 0) on the batchnorm's y, its y > 0 mask on dy), only without the relu's own pass.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "app/config/config.h"
#include "layers/network.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

struct Step {
  test::NetworkRun run;
  std::vector<std::string> folded;  // batchnorm layers with the relu folded in
};

Step run(const std::vector<LayerSpec>& specs, const Shape& chw, bool fold, uint64_t seed, int n) {
  NetworkOptions o;
  o.max_batch = n + 1;  // a partial batch
  o.seed = seed;
  o.fuse_batchnorm_relu = fold;
  Step s;
  s.run = test::run_network(specs, chw, Exec{}, o, n, 1, [&](const Network& net) {
    for (const auto& l : net.layers())
      if ((l->spec().kind == LayerKind::BatchNorm2d || l->spec().kind == LayerKind::BatchNorm1d) &&
          l->fused_relu())
        s.folded.push_back(l->name());
  });
  return s;
}

void expect_same_bits(const std::vector<LayerSpec>& specs, const Shape& chw,
                      const std::vector<std::string>& want_folded) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Step apart = run(specs, chw, false, seed, 5);
  const Step folded = run(specs, chw, true, seed, 5);
  EXPECT_TRUE(apart.folded.empty());
  EXPECT_EQ(folded.folded, want_folded);
  EXPECT_FALSE(test::any_nan(folded.run.grads));
  EXPECT_EQ(folded.run.logits, apart.run.logits);
  EXPECT_EQ(folded.run.loss, apart.run.loss);
  EXPECT_EQ(folded.run.grads, apart.run.grads);
  EXPECT_EQ(folded.run.buffers, apart.run.buffers);  // running statistics
  EXPECT_EQ(folded.run.eval_logits, apart.run.eval_logits);
}

LayerSpec conv(const std::string& name, int oc) {
  LayerSpec s = conv2d_spec(name, oc, 3, 3, 1, 1);
  s.bias = false;  // as before a batchnorm in real nets
  return s;
}
LayerSpec relu(const std::string& name) {
  return layer_spec(LayerKind::Relu, name);
}
LayerSpec bn2d(const std::string& name) {
  return batchnorm_spec(LayerKind::BatchNorm2d, name);
}

}  // namespace

// VGG's stage: conv -> bn -> relu -> conv -> bn -> relu -> max-pool (the second relu's mask
// applied by the pool), then linear -> batchnorm1d -> relu -> dropout -> linear.
TEST(BatchNormRelu, VggStageAndLinearBlockGiveTheUnfoldedBits) {
  LayerSpec fc1 = linear_spec("fc1", 7);
  fc1.bias = false;
  expect_same_bits(
      {conv("conv1", 4), bn2d("bn1"), relu("relu1"), conv("conv2", 5), bn2d("bn2"), relu("relu2"),
       maxpool2d_spec("pool", 2, 2, 0), layer_spec(LayerKind::Flatten, "flatten"), fc1,
       batchnorm_spec(LayerKind::BatchNorm1d, "bn3"), relu("relu3"), dropout_spec("drop", 0.25),
       linear_spec("fc2", 3), layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")},
      {3, 9, 7}, {"bn1", "bn2", "bn3"});
}

// An overlapping max-pool (3x3, stride 2) after the folded pair: an input position can win several
// windows, and the pool's mask must still agree with the relu's.
TEST(BatchNormRelu, OverlappingPoolMaskGivesTheUnfoldedBits) {
  expect_same_bits({conv("conv1", 3), bn2d("bn1"), relu("relu1"), maxpool2d_spec("pool", 3, 2, 1),
                    layer_spec(LayerKind::Flatten, "flatten"), linear_spec("fc", 4),
                    layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")},
                   {2, 9, 8}, {"bn1"});
}

// test::norm_net: relus after batchnorms followed by an avgpool, a global avgpool and dropout.
TEST(BatchNormRelu, NormNetGivesTheUnfoldedBits) {
  expect_same_bits(test::norm_net(), {3, 9, 7}, {"bn1", "bn2", "bn3"});
}

// A ResNet basic block behind a stem: bn1's output feeds the block's relu AND the identity
// shortcut, so the relu must stay apart (folding it would hand the shortcut the ReLU'd values);
// inside the branch, bn_a -> relu_a folds; bn_b feeds the add; the relu after the add reads the
// add, not a batchnorm.
TEST(BatchNormRelu, ResidualShortcutReaderKeepsTheReluApart) {
  const std::vector<LayerSpec> specs = {
      conv("conv1", 3),
      bn2d("bn1"),
      residual_spec("res", {relu("relu_in"), conv("conv_a", 3), bn2d("bn_a"), relu("relu_a"),
                            conv("conv_b", 3), bn2d("bn_b")}),
      relu("relu_out"),
      layer_spec(LayerKind::Flatten, "flatten"),
      linear_spec("fc", 4),
      layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
  expect_same_bits(specs, {3, 6, 5}, {"bn_a"});
}

TEST(BatchNormRelu, FusionNoteAndSwitches) {
  const std::vector<LayerSpec> specs = test::norm_net();
  const Shape chw = {3, 9, 7};
  NetworkOptions o;
  o.max_batch = 2;
  const auto folded_count = [&](const NetworkOptions& opt) {
    Network net(specs, chw, opt, Exec{});
    int folded = 0;
    for (const auto& l : net.layers()) folded += l->fused_relu() ? 1 : 0;
    return std::make_pair(folded, net.fusion_notes());
  };
  {
    test::ScopedEnv no_switch("CNN_FUSE_BN_RELU", nullptr);
    const auto [folded, notes] = folded_count(with_env_switches(o, read_env_switches()));
    EXPECT_EQ(folded, 3);  // bn1, bn2, bn3: every relu here follows a batchnorm
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_TRUE(test::contains(notes[0], "bn1 + relu1, bn2 + relu2, bn3 + relu3")) << notes[0];
    EXPECT_TRUE(test::contains(notes[0], "CNN_FUSE_BN_RELU=0")) << notes[0];
  }
  {
    test::ScopedEnv env("CNN_FUSE_BN_RELU", "0");
    const auto [folded, notes] = folded_count(with_env_switches(o, read_env_switches()));
    EXPECT_EQ(folded, 0);
    EXPECT_TRUE(notes.empty());
  }
  NetworkOptions no_relu_fold = o;
  no_relu_fold.fuse_relu = false;  // turns every relu fold off, the batchnorm's too
  EXPECT_EQ(folded_count(no_relu_fold).first, 0);
}

// The model zoo's conv -> batchnorm -> relu pairs all fold: VGG's six and its batchnorm1d, ResNet's
// stem and the first half of each of its six blocks (the second half's batchnorm feeds the add).
TEST(BatchNormRelu, ZooConfigsFoldEveryBatchnormRelu) {
  for (const auto& [name, want] : {std::pair<const char*, int>{"vgg_cifar", 7},
                                   std::pair<const char*, int>{"resnet_fashion", 7}}) {
    SCOPED_TRACE(name);
    const TrainConfig c =
        load_config(test::source_dir() + "/configs/" + std::string(name) + ".yaml");
    NetworkOptions o;
    o.max_batch = 2;
    Network net(c.model.layers, c.model.input_chw, o, Exec{});
    int folded = 0;
    for (const auto& l : net.layers())
      if (l->spec().kind == LayerKind::BatchNorm2d || l->spec().kind == LayerKind::BatchNorm1d)
        folded += l->fused_relu() ? 1 : 0;
    EXPECT_EQ(folded, want);
  }
}
