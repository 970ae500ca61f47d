// A residual block's add (and the relu after it) run inside the batchnorm that ends the block's
// branch (NetworkOptions::fuse_residual, CNN_FUSE_RESIDUAL): which blocks the Network fuses (not
// one whose branch ends in a conv), the fusion note and switch, and two training steps plus eval
// giving the bits of the unfused network: identity and projection shortcuts, a block without a
// relu after it whose output two readers share, a branch that starts with a relu. Bitwise: the
// fused pass rounds the normalized value, then the sum, as the separate passes do.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "app/config/config.h"
#include "layers/layer.h"
#include "layers/network.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

// Two steps: the second starts from the running statistics and gradients the first left.
test::NetworkRun run(const std::vector<LayerSpec>& specs, const Shape& chw, bool fuse,
                     uint64_t seed, int n) {
  NetworkOptions o;
  o.max_batch = n + 1;  // a partial batch
  o.seed = seed;
  o.fuse_residual = fuse;
  return test::run_network(specs, chw, Exec{}, o, n, 2);
}

std::string residual_note(const std::vector<std::string>& notes) {
  for (const std::string& n : notes)
    if (test::contains(n, "CNN_FUSE_RESIDUAL")) return n;
  return "";
}

// The fused and unfused networks give the same bits; the note names `want` (empty: no fusion).
void expect_same_bits(const std::vector<LayerSpec>& specs, const Shape& chw,
                      const std::string& want) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const test::NetworkRun apart = run(specs, chw, false, seed, 5);
  const test::NetworkRun fused = run(specs, chw, true, seed, 5);
  EXPECT_EQ(residual_note(apart.notes), "");
  if (want.empty())
    EXPECT_EQ(residual_note(fused.notes), "");
  else
    EXPECT_TRUE(test::contains(residual_note(fused.notes), want + ": residual add"))
        << residual_note(fused.notes);
  EXPECT_FALSE(test::any_nan(fused.grads));
  EXPECT_EQ(fused.logits, apart.logits);
  EXPECT_EQ(fused.loss, apart.loss);
  EXPECT_EQ(fused.grads, apart.grads);
  EXPECT_EQ(fused.buffers, apart.buffers);  // running statistics
  EXPECT_EQ(fused.eval_logits, apart.eval_logits);
}

LayerSpec conv(const std::string& name, int oc, int k = 3, int stride = 1) {
  LayerSpec s = conv2d_spec(name, oc, k, k, stride, k / 2);
  s.bias = false;
  return s;
}
LayerSpec relu(const std::string& name) {
  return layer_spec(LayerKind::Relu, name);
}
LayerSpec bn2d(const std::string& name) {
  return batchnorm_spec(LayerKind::BatchNorm2d, name);
}
LayerSpec flatten() {
  return layer_spec(LayerKind::Flatten, "flatten");
}
LayerSpec loss() {
  return layer_spec(LayerKind::SoftmaxCrossEntropy, "loss");
}

}  // namespace

// Basic blocks as the zoo's ResNet: an identity block, then one that halves the size with a
// 1x1 stride-2 conv + batchnorm shortcut (its batchnorm runs after the branch's), each followed
// by a relu; odd sizes and channel counts.
TEST(ResidualFusion, BasicBlocksGiveTheUnfusedBits) {
  expect_same_bits(
      {conv("conv1", 3), bn2d("bn1"), relu("relu1"),
       residual_spec("res1", {conv("c2", 3), bn2d("bn2"), relu("r2"), conv("c3", 3), bn2d("bn3")}),
       relu("relu3"),
       residual_spec("res2",
                     {conv("c4", 5, 3, 2), bn2d("bn4"), relu("r4"), conv("c5", 5), bn2d("bn5")},
                     {conv("c6", 5, 1, 2), bn2d("bn6")}),
       relu("relu5"), flatten(), linear_spec("fc", 4), loss()},
      {2, 9, 7}, "bn3 + res1 + relu3, bn5 + res2 + relu5");
}

// A block with no relu after its add (the add alone is fused), whose output is then read twice
// (by the next block's branch and its identity shortcut), and a block whose branch ends in a conv
// (not fused).
TEST(ResidualFusion, AddWithoutReluAndConvEndedBranch) {
  expect_same_bits({conv("conv1", 4), bn2d("bn1"), relu("relu1"),
                    residual_spec("res1", {conv("c2", 4), bn2d("bn2")}),
                    residual_spec("res2", {conv("c3", 4), relu("r3"), conv("c4", 4)}), relu("r5"),
                    flatten(), linear_spec("fc", 3), loss()},
                   {3, 6, 5}, "bn2 + res1");
}

// The branch starting with a relu on the stem's batchnorm, whose output the identity shortcut
// reads too (so that relu stays apart): only the branch's last batchnorm runs the add.
TEST(ResidualFusion, BranchStartingWithARelu) {
  expect_same_bits({conv("conv1", 3), bn2d("bn1"),
                    residual_spec("res1", {relu("r1"), conv("c2", 3), bn2d("bn2")}), relu("r2"),
                    flatten(), linear_spec("fc", 3), loss()},
                   {3, 5, 5}, "bn2 + res1 + r2");
}

TEST(ResidualFusion, SwitchAndZooResNet) {
  const TrainConfig c = load_config(test::source_dir() + "/configs/resnet_fashion.yaml");
  NetworkOptions o;
  o.max_batch = 2;
  const auto note = [&](const NetworkOptions& opt) {
    return residual_note(Network(c.model.layers, c.model.input_chw, opt, Exec{}).fusion_notes());
  };
  {
    test::ScopedEnv no_switch("CNN_FUSE_RESIDUAL", nullptr);
    const std::string n = note(with_env_switches(o, read_env_switches()));
    // Every one of the six basic blocks: its second batchnorm runs the add and the relu after it.
    size_t blocks = 0;
    for (size_t at = n.find(" + res"); at != std::string::npos; at = n.find(" + res", at + 1))
      ++blocks;
    EXPECT_EQ(blocks, 6u) << n;
  }
  {
    test::ScopedEnv env("CNN_FUSE_RESIDUAL", "0");
    EXPECT_EQ(note(with_env_switches(o, read_env_switches())), "");
  }
}

// A layer that cannot run a residual add refuses to, rather than leaving its output unwritten.
TEST(ResidualFusion, OtherLayersRefuseTheAdd) {
  std::unique_ptr<Layer> l = make_layer(conv("c", 2));
  EXPECT_FALSE(l->can_fuse_residual());
  try {
    l->forward_residual(1, nullptr, nullptr, true, nullptr, nullptr, Exec{});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "layer 'c' (conv2d) cannot run a residual add"))
        << e.what();
  }
  EXPECT_TRUE(make_layer(bn2d("b"))->can_fuse_residual());
}
