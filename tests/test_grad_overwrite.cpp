// NetworkOptions::overwrite_grads on the CPU: which gradients backward writes (every linear
// layer's weight, at most KeptGrads::kMax ranges, the largest layers' first), and that training
// with it gives bitwise the parameters of training without it (SGD, Adam, AdamW with clipping;
// the reference and the fast linear kernels; partial batches), the update leaving the written
// gradients as they were and zeroing the rest. The contract it changes: two backward passes
// without an update in between no longer sum there.
#include <gtest/gtest.h>

#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "kernels/optimizer/optimizer.h"
#include "layers/network.h"
#include "layers/param_optimizer.h"
#include "tests/grad_overwrite_check.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

const Shape kInput = {1, 12, 12};

// conv1 4 -> pool -> conv2 6 -> pool -> fc1 (54 -> 40) -> relu -> fc2 (40 -> 10).
const std::vector<LayerSpec> kNet = test::small_net(4, 6, 40);

}  // namespace

TEST(GradOverwrite, OffByDefault) {
  Network net(kNet, kInput, NetworkOptions{}, Exec{});
  EXPECT_TRUE(net.overwritten_grad_ranges().empty());
}

// On the CPU every linear layer's weight gradient is one GEMM (no fused head): both weights,
// neither bias nor anything of the convolutions.
TEST(GradOverwrite, LinearWeightsOnTheCpu) {
  NetworkOptions o;
  o.max_batch = 4;
  o.overwrite_grads = true;
  Network net(kNet, kInput, o, Exec{});
  std::vector<std::pair<int64_t, int64_t>> want;
  for (const ParamInfo& p : net.param_infos())
    if (p.name == "fc1.weight" || p.name == "fc2.weight")
      want.emplace_back(p.offset, p.offset + p.numel());
  ASSERT_EQ(want.size(), 2u);
  EXPECT_EQ(net.overwritten_grad_ranges(), want);
}

TEST(GradOverwrite, TrainingIsBitwiseTheSame) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  NetworkOptions o;
  o.max_batch = 8;
  o.seed = seed;
  OptimizerOptions sgd;
  sgd.lr = 0.05;
  sgd.momentum = 0.9;
  sgd.nesterov = true;
  sgd.weight_decay = 1e-3;
  OptimizerOptions adam;
  adam.type = OptimizerType::Adam;
  adam.lr = 1e-3;
  OptimizerOptions adamw_clipped = adam;
  adamw_clipped.type = OptimizerType::AdamW;
  adamw_clipped.weight_decay = 0.01;
  adamw_clipped.clip_grad_norm = 0.5;  // reads the gradients between backward and update
  for (Algo algo : {Algo::Auto, Algo::Naive}) {
    SCOPED_TRACE(algo_name(algo));
    o.linear_algo = algo;
    for (const OptimizerOptions& opt : {sgd, adam, adamw_clipped}) {
      SCOPED_TRACE(optimizer_name(opt.type));
      test::expect_same_training(kNet, kInput, Exec{}, o, opt, 5);
    }
  }
}

// Ten linear layers, each weight one range: the KeptGrads::kMax largest overwrite, the two
// smallest (fc1: 5 x 16, fc10: 10 x 13) keep accumulating, and training is still the same.
TEST(GradOverwrite, AtMostKMaxRangesTheLargestLayersFirst) {
  static_assert(KeptGrads::kMax == 8, "the expected names below assume 8 ranges");
  std::vector<LayerSpec> specs = {layer_spec(LayerKind::Flatten, "flatten1")};
  const int outs[] = {5, 30, 7, 25, 9, 20, 11, 18, 13, 10};
  for (size_t i = 0; i < std::size(outs); ++i) {
    specs.push_back(linear_spec("fc" + std::to_string(i + 1), outs[i]));
    if (i + 1 < std::size(outs))
      specs.push_back(layer_spec(LayerKind::Relu, "relu" + std::to_string(i + 1)));
  }
  specs.push_back(layer_spec(LayerKind::SoftmaxCrossEntropy, "loss"));
  const Shape chw = {1, 4, 4};
  NetworkOptions o;
  o.max_batch = 6;
  o.seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  o.overwrite_grads = true;
  const test::TrainRun run = test::train_steps(specs, chw, Exec{}, o, OptimizerOptions{}, 1);
  EXPECT_EQ(run.overwritten.size(), size_t(KeptGrads::kMax));
  EXPECT_EQ(run.overwritten_names,
            (std::vector<std::string>{"fc2.weight", "fc3.weight", "fc4.weight", "fc5.weight",
                                      "fc6.weight", "fc7.weight", "fc8.weight", "fc9.weight"}));
  test::expect_same_training(specs, chw, Exec{}, o, OptimizerOptions{}, 4);
}

// The contract overwrite_grads changes: without an update in between, a second backward pass
// replaces the written gradients instead of adding to them (the trainer runs one per update;
// callers that sum passes leave the option off). Elsewhere it still adds.
TEST(GradOverwrite, SecondBackwardReplacesOnlyTheWrittenGradients) {
  NetworkOptions o;
  o.max_batch = 4;
  o.seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  const std::vector<float> x = test::random_vector(4 * 144, o.seed + 1);
  const std::vector<int32_t> a = test::random_labels(4, 10, o.seed + 2),
                             b = test::random_labels(4, 10, o.seed + 3);
  const auto grads = [&](bool overwrite, bool twice) {
    NetworkOptions q = o;
    q.overwrite_grads = overwrite;
    Network net(kNet, kInput, q, Exec{});
    if (twice) net.forward_backward(4, x.data(), a.data(), 0.25f);
    net.forward_backward(4, x.data(), b.data(), 0.25f);
    return std::make_pair(net.grads_to_host(), net.overwritten_grad_ranges());
  };
  const auto [summed, none] = grads(false, true);
  const auto [second, ranges] = grads(true, true);
  const std::vector<float> alone = grads(false, false).first;
  ASSERT_TRUE(none.empty());
  ASSERT_FALSE(ranges.empty());
  for (size_t i = 0; i < second.size(); ++i) {
    bool written = false;
    for (const auto& [begin, end] : ranges) written |= int64_t(i) >= begin && int64_t(i) < end;
    EXPECT_EQ(second[i], written ? alone[i] : summed[i]) << "gradient " << i;
  }
}
