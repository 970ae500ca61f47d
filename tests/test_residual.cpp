// Residual blocks (the layer graph as a DAG): the Network's forward and backward against the same
// composition written out by hand with the CPU reference kernels, the gradient checks of small
// residual networks, the config syntax (parsing, default names, round trip, refusals with their
// line) and the --dry-run table.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/config/dry_run.h"
#include "app/train/trainer.h"
#include "kernels/conv/conv2d.h"
#include "kernels/gemm/linear.h"
#include "kernels/loss/softmax_xent.h"
#include "kernels/pointwise/add.h"
#include "kernels/pointwise/relu.h"
#include "layers/checkpoint/checkpoint.h"
#include "layers/checkpoint/safetensors.h"
#include "layers/gradcheck/gradcheck.h"
#include "layers/network.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

#define EXPECT_HAS(msg, part) \
  EXPECT_NE((msg).find(part), std::string::npos) << "'" << (part) << "' not in: " << (msg)

// conv1 (1x1) -> res1 {conv2 3x3, relu1, conv3 3x3; identity} -> relu2 -> flatten -> fc1 -> loss.
// conv1's output feeds both the block's layers and its identity shortcut.
std::vector<LayerSpec> identity_net() {
  return {conv2d_spec("conv1", 3, 1, 1, 1, 0),
          residual_spec("res1",
                        {conv2d_spec("conv2", 3, 3, 3, 1, 1), layer_spec(LayerKind::Relu, "relu1"),
                         conv2d_spec("conv3", 3, 3, 3, 1, 1)}),
          layer_spec(LayerKind::Relu, "relu2"),
          layer_spec(LayerKind::Flatten, "flatten1"),
          linear_spec("fc1", 4),
          layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
}

TEST(Residual, ForwardAndBackwardMatchTheHandWrittenComposition) {
  const int n = 3, c = 3, h = 5, w = 6, classes = 4;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const std::vector<float> x = test::random_vector(size_t(n * c * h * w), seed);
  const std::vector<int32_t> labels = test::random_labels(size_t(n), classes, seed + 1);

  for (const bool fuse : {false, true}) {
    SCOPED_TRACE(fuse ? "relu folded into conv2" : "relu apart");
    NetworkOptions o;
    o.max_batch = n + 1;  // a partial batch
    o.fuse_relu = fuse;
    Network net(identity_net(), {c, h, w}, o, Exec{});
    // The parameters in the order the Network lays them out (torch names).
    const std::vector<std::string> names = {"conv1.weight", "conv1.bias",   "conv2.weight",
                                            "conv2.bias",   "conv3.weight", "conv3.bias",
                                            "fc1.weight",   "fc1.bias"};
    ASSERT_EQ(net.param_infos().size(), names.size());
    for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(net.param_infos()[i].name, names[i]);
    const std::vector<float> p =
        test::random_vector(size_t(net.num_params()), seed + 2, -0.5f, 0.5f);
    net.params_from_host(p);
    net.forward_backward(n, x.data(), labels.data(), 1.0f / n);
    const std::vector<float> grads = net.grads_to_host();

    // The same by hand: a = conv1(x); s = conv3(relu(conv2(a))) + a; logits = fc1(relu(s)).
    const auto at = [&](size_t k) { return p.data() + net.param_infos()[k].offset; };
    const Conv2dShape s1 = test::square_conv(n, c, h, w, 3, 1, 1, 0),
                      s2 = test::square_conv(n, 3, h, w, 3, 3, 1, 1);
    const int64_t m = int64_t(n) * 3 * h * w;
    const LinearShape fl{n, 3 * h * w, classes};
    std::vector<float> a(m), h2(m), b(m), sum(m), r(m), logits(size_t(n * classes));
    conv2d_forward_cpu(s1, x.data(), at(0), at(1), a.data(), false);
    conv2d_forward_cpu(s2, a.data(), at(2), at(3), h2.data(), true);
    conv2d_forward_cpu(s2, h2.data(), at(4), at(5), b.data(), false);
    add_forward_cpu(m, b.data(), a.data(), sum.data());
    relu_forward_cpu(m, sum.data(), r.data());
    linear_forward_cpu(fl, r.data(), at(6), at(7), logits.data(), false);
    std::vector<float> rows(n), dlogits(logits.size());
    std::vector<int32_t> pred(n);
    softmax_xent_cpu({n, classes}, logits.data(), labels.data(), rows.data(), pred.data(),
                     dlogits.data(), 1.0f / n);

    std::vector<float> ref(grads.size(), 0.f);
    const auto dat = [&](size_t k) { return ref.data() + net.param_infos()[k].offset; };
    std::vector<float> dr(m), ds(m), dh(m), dh2(m), da(m);
    linear_backward_weight_cpu(fl, r.data(), dlogits.data(), dat(6), dat(7));
    linear_backward_data_cpu(fl, dlogits.data(), at(6), dr.data());
    relu_backward_cpu(m, r.data(), dr.data(), ds.data());
    conv2d_backward_weight_cpu(s2, h2.data(), ds.data(), dat(4), dat(5));
    conv2d_backward_data_cpu(s2, ds.data(), at(4), dh.data());
    relu_backward_cpu(m, h2.data(), dh.data(), dh2.data());
    conv2d_backward_weight_cpu(s2, a.data(), dh2.data(), dat(2), dat(3));
    conv2d_backward_data_cpu(s2, dh2.data(), at(2), da.data());
    add_forward_cpu(m, da.data(), ds.data(), da.data());  // the block's input feeds two paths
    conv2d_backward_weight_cpu(s1, x.data(), da.data(), dat(0), dat(1));

    std::vector<float> got_logits(logits.size());
    raw_copy(got_logits.data(), Device::CPU, net.logits(), Device::CPU,
             got_logits.size() * sizeof(float));
    // Float sums in another order (the Network runs the fast CPU kernels, the reference plain
    // loops): up to 3.3e-4 with the 1e-3 floor over 1000 seeds; a wrong or missing term is O(1).
    EXPECT_LT(test::max_rel_error(got_logits, logits), 2e-3);
    for (size_t k = 0; k < names.size(); ++k) {
      const ParamInfo& info = net.param_infos()[k];
      const std::vector<float> g(grads.begin() + info.offset,
                                 grads.begin() + info.offset + info.numel());
      const std::vector<float> e(ref.begin() + info.offset,
                                 ref.begin() + info.offset + info.numel());
      EXPECT_LT(test::max_rel_error(g, e), 2e-3) << info.name;
    }
  }
}

// A block as the first layer: its shortcut and its first conv read the network input itself.
TEST(Residual, BlockOnTheNetworkInputRunsAndRepeatsBitwise) {
  const std::vector<LayerSpec> specs = {
      residual_spec("res1", {conv2d_spec("conv1", 2, 3, 3, 1, 1)}),
      layer_spec(LayerKind::Flatten, "flatten1"), linear_spec("fc1", 3),
      layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
  const test::NetworkRun a =
      test::run_network_once(specs, {2, 4, 4}, Exec{}, PoolFusion::Off, 3, 5);
  const test::NetworkRun b =
      test::run_network_once(specs, {2, 4, 4}, Exec{}, PoolFusion::Off, 3, 5);
  EXPECT_FALSE(test::any_nan(a.grads));
  EXPECT_EQ(a.grads, b.grads);
  EXPECT_EQ(a.logits, b.logits);
}

TEST(Residual, GradcheckSmallResidualNetworksInDoubleAndFloat) {
  int cases = 0;
  for (const GradcheckCase& c : gradcheck_layer_cases()) {
    if (c.title.find("residual") == std::string::npos) continue;
    ++cases;
    SCOPED_TRACE(c.title);
    GradcheckOptions o;
    const GradcheckResult ref = gradcheck_reference(c.specs, c.input_chw, o);
    EXPECT_TRUE(ref.passed()) << format_gradcheck(ref);
    for (const bool fuse : {false, true}) {
      const GradcheckResult r = gradcheck_network(c.specs, c.input_chw, o, Exec{}, fuse);
      EXPECT_TRUE(r.passed()) << format_gradcheck(r);
    }
  }
  EXPECT_EQ(cases, 2);
}

// A residual network as a config would give it: BN-free ResNet-style stages, a stride-2 block
// with a 1x1 projection, relu after each add.
const char* kResidualConfig = R"(name: res
model:
  input: {channels: 1, height: 8, width: 8}
  layers:
    - conv2d: {out_channels: 4, kernel: 3, padding: 1}
    - relu
    - residual:
        layers:
          - conv2d: {out_channels: 4, kernel: 3, padding: 1}
          - relu
          - conv2d: {out_channels: 4, kernel: 3, padding: 1}
    - relu
    - residual:
        layers:
          - conv2d: {out_channels: 6, kernel: 3, stride: 2, padding: 1}
          - relu
          - conv2d: {out_channels: 6, kernel: 3, padding: 1}
        shortcut:
          - conv2d: {out_channels: 6, kernel: 1, stride: 2}
    - relu
    - flatten
    - linear: {out_features: 3}
    - softmax_cross_entropy
data: {format: synthetic, synthetic: {classes: 3}}
optimizer: {lr: 0.1}
training: {epochs: 1, batch_size: 4}
)";

TEST(Residual, ConfigNamesLayersInsideBlocksLikeTheRest) {
  const TrainConfig cfg = parse_config(kResidualConfig, "res.yaml");
  const auto& l = cfg.model.layers;
  ASSERT_EQ(l.size(), 9u);
  EXPECT_EQ(l[2].kind, LayerKind::Residual);
  EXPECT_EQ(l[2].name, "res1");
  ASSERT_EQ(l[2].branch.size(), 3u);
  EXPECT_EQ(l[2].branch[0].name, "conv2");
  EXPECT_EQ(l[2].branch[1].name, "relu2");
  EXPECT_EQ(l[2].branch[2].name, "conv3");
  EXPECT_TRUE(l[2].shortcut.empty());
  EXPECT_EQ(l[3].name, "relu3");
  EXPECT_EQ(l[4].name, "res2");
  EXPECT_EQ(l[4].branch[0].name, "conv4");
  EXPECT_EQ(l[4].branch[0].line, 15);
  ASSERT_EQ(l[4].shortcut.size(), 1u);
  EXPECT_EQ(l[4].shortcut[0].name, "conv6");
  EXPECT_EQ(l[4].shortcut[0].stride_h, 2);
  EXPECT_EQ(l[5].name, "relu5");

  // The resolved config reads back to the same network.
  const TrainConfig again = parse_config(cfg.resolved_yaml, "again.yaml");
  EXPECT_EQ(again.resolved_yaml, cfg.resolved_yaml);
  ASSERT_EQ(again.model.layers.size(), l.size());
  EXPECT_EQ(again.model.layers[4].shortcut.at(0).name, "conv6");

  Network net(cfg.model.layers, cfg.model.input_chw, NetworkOptions{}, Exec{});
  std::vector<std::string> names;
  for (const ParamInfo& p : net.param_infos()) names.push_back(p.name);
  const std::vector<std::string> expected = {
      "conv1.weight", "conv1.bias",   "conv2.weight", "conv2.bias",   "conv3.weight",
      "conv3.bias",   "conv4.weight", "conv4.bias",   "conv5.weight", "conv5.bias",
      "conv6.weight", "conv6.bias",   "fc1.weight",   "fc1.bias"};
  EXPECT_EQ(names, expected);
}

TEST(Residual, GradcheckOfAResidualConfig) {
  const TrainConfig cfg = parse_config(kResidualConfig, "res.yaml");
  GradcheckOptions o;
  const GradcheckResult ref = gradcheck_reference(cfg.model.layers, cfg.model.input_chw, o);
  EXPECT_TRUE(ref.passed()) << format_gradcheck(ref);
  const GradcheckResult net =
      gradcheck_network(cfg.model.layers, cfg.model.input_chw, o, Exec{}, true);
  EXPECT_TRUE(net.passed()) << format_gradcheck(net);
}

TEST(Residual, DryRunShowsTheBlocksIndented) {
  const TrainConfig cfg = parse_config(kResidualConfig, "res.yaml");
  const std::string out = format_dry_run(cfg);
  SCOPED_TRACE(out);
  // Rows in order, the block's own row carrying its totals, its layers indented under it.
  // res1: two 3x3 convs 4->4 (148 params each); res2: 4->6 and 6->6 3x3 (222 + 330), the 1x1
  // 4->6 projection (30).
  const char* expected[] = {"\nconv1 ",
                            "\nrelu1 ",
                            "\nres1 ",
                            "residual",
                            "(4, 8, 8)",
                            "296",
                            "\n  conv2 ",
                            "\n  relu2 ",
                            "\n  conv3 ",
                            "\n  -  ",
                            "identity (shortcut)",
                            "\n  +  ",
                            "add",
                            "\nrelu3 ",
                            "\nres2 ",
                            "(6, 4, 4)",
                            "582",
                            "\n  conv4 ",
                            "\n  conv6 ",
                            "conv2d (shortcut)",
                            "\n  +  ",
                            "\nrelu5 ",
                            "\nflatten1 ",
                            "\nfc1 ",
                            "\nloss "};
  size_t pos = 0;
  for (const char* e : expected) {
    const size_t at = out.find(e, pos);
    ASSERT_NE(at, std::string::npos) << "'" << e << "' missing after position " << pos;
    pos = at + 1;
  }
  // 40 (conv1) + 296 (res1) + 582 (res2) + 96 * 3 + 3 (fc1) = 1209.
  const NetworkSummary sum = summarize_network(cfg.model.layers, cfg.model.input_chw);
  EXPECT_EQ(sum.total_params, 40 + 296 + 582 + 96 * 3 + 3);
  EXPECT_HAS(out, "1,209");
}

std::string error_of(const std::string& text) {
  try {
    parse_config(text, "t.yaml");
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
    return msg;
  }
  ADD_FAILURE() << "the config was accepted";
  return "";
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "test bug: '" << from << "' not in the config";
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(Residual, ShapesThatDoNotMatchAreOneLineNamingTheBlock) {
  // res1's layers change the channel count; its identity shortcut cannot follow.
  const std::string e = error_of(replaced(kResidualConfig,
                                          "          - conv2d: {out_channels: 4, kernel: 3, "
                                          "padding: 1}\n    - relu",
                                          "          - conv2d: {out_channels: 5, kernel: 3, "
                                          "padding: 1}\n    - relu"));
  EXPECT_HAS(e, "t.yaml:7: model.layers[2].residual");
  EXPECT_HAS(e, "'res1'");
  EXPECT_HAS(e, "(5, 8, 8)");
  EXPECT_HAS(e, "the identity");
  EXPECT_HAS(e, "(4, 8, 8)");

  // res2's projection forgets the stride.
  const std::string p = error_of(replaced(
      kResidualConfig, "{out_channels: 6, kernel: 1, stride: 2}", "{out_channels: 6, kernel: 1}"));
  EXPECT_HAS(p, "t.yaml:13: model.layers[4].residual");
  EXPECT_HAS(p, "ending in 'conv6'");
  EXPECT_HAS(p, "(6, 8, 8)");

  // A layer inside a block that does not fit is named at its own line.
  const std::string inner =
      error_of(replaced(kResidualConfig, "- conv2d: {out_channels: 6, kernel: 3, padding: 1}",
                        "- linear: {out_features: 6}"));
  EXPECT_HAS(inner, "t.yaml:17: model.layers[4].residual.layers[2].linear");
}

TEST(Residual, BadBlocksAreRefusedWithTheirLine) {
  const std::string nested = error_of(
      replaced(kResidualConfig, "          - relu\n          - conv2d: {out_channels: 4",
               "          - residual: {layers: [relu]}\n          - conv2d: {out_channels: 4"));
  EXPECT_HAS(nested, "t.yaml:10: model.layers[2].residual.layers[1].residual");
  EXPECT_HAS(nested, "not supported in this version");

  const std::string empty = error_of(replaced(kResidualConfig, "    - relu\n    - flatten",
                                              "    - residual: {layers: []}\n    - flatten"));
  EXPECT_HAS(empty, "model.layers[5].residual.layers");
  EXPECT_HAS(empty, "at least one layer");

  const std::string bare = error_of(
      replaced(kResidualConfig, "    - relu\n    - flatten", "    - residual\n    - flatten"));
  EXPECT_HAS(bare, "model.layers[5]");
  EXPECT_HAS(bare, "needs its layers");

  const std::string loss =
      error_of(replaced(kResidualConfig, "          - relu\n          - conv2d: {out_channels: 4",
                        "          - softmax_cross_entropy\n          - conv2d: {out_channels: 4"));
  EXPECT_HAS(loss, "must be the network's last layer");

  const std::string key =
      error_of(replaced(kResidualConfig, "        shortcut:", "        shortcuts:"));
  EXPECT_HAS(key, "model.layers[4].residual.shortcuts");
  EXPECT_HAS(key, "did you mean 'shortcut'");

  const std::string dup =
      error_of(replaced(kResidualConfig, "- conv2d: {out_channels: 6, kernel: 1, stride: 2}",
                        "- conv2d: {out_channels: 6, kernel: 1, stride: 2, name: conv1}"));
  // conv1 is the first layer's default name; the clash is named at the shortcut's line.
  EXPECT_HAS(dup, "'conv1' (conv2d) at config line 19: the name 'conv1' is used twice");
}

// configs/tiny.yaml with a residual network (the override tests/gpu_residual.cpp runs on CUDA):
// trains on the CPU, repeats bitwise, resumes bitwise, and its checkpoint's resolved config
// rebuilds the network that loads it (as ./infer does).
std::vector<std::string> tiny_residual_sets(const std::filesystem::path& dir, int steps) {
  return {"training.device=cpu", "logging.progress=off", "logging.dir=" + dir.string(),
          "training.max_steps=" + std::to_string(steps),
          "model.layers=[{conv2d: {out_channels: 8, kernel: 3, padding: 1}}, relu, "
          "{residual: {layers: [{conv2d: {out_channels: 8, kernel: 3, padding: 1}}, relu, "
          "{conv2d: {out_channels: 8, kernel: 3, padding: 1}}]}}, relu, "
          "{residual: {layers: [{conv2d: {out_channels: 16, kernel: 3, stride: 2, padding: 1}}, "
          "relu, {conv2d: {out_channels: 16, kernel: 3, padding: 1}}], "
          "shortcut: [{conv2d: {out_channels: 16, kernel: 1, stride: 2}}]}}, relu, "
          "{maxpool2d: {kernel: 2}}, flatten, {linear: {out_features: 4}}, softmax_cross_entropy]"};
}

TEST(Residual, TrainsRepeatsAndResumesBitwiseOnTheCpu) {
  namespace fs = std::filesystem;
  const std::string tiny = test::source_dir() + "/configs/tiny.yaml";
  const fs::path a = test::fresh_dir("residual", "a"), b = test::fresh_dir("residual", "b"),
                 c = test::fresh_dir("residual", "c");
  ASSERT_EQ(run_training(load_config(tiny, tiny_residual_sets(a, 40)), TrainArgs{}), 0);
  ASSERT_EQ(run_training(load_config(tiny, tiny_residual_sets(b, 40)), TrainArgs{}), 0);
  const fs::path last = a / "tiny" / "last.safetensors";
  EXPECT_EQ(test::checkpoint_weights(last),
            test::checkpoint_weights(b / "tiny" / "last.safetensors"));
  ASSERT_EQ(run_training(load_config(tiny, tiny_residual_sets(c, 15)), TrainArgs{}), 0);
  TrainArgs resume;
  resume.resume = (c / "tiny" / "last.safetensors").string();
  ASSERT_EQ(run_training(load_config(tiny, tiny_residual_sets(c, 40)), resume), 0);
  EXPECT_EQ(test::checkpoint_weights(last),
            test::checkpoint_weights(c / "tiny" / "last.safetensors"));

  const CheckpointMeta meta = read_checkpoint_meta(last.string());
  const TrainConfig again = parse_config(meta.config_yaml, "checkpoint");
  ASSERT_EQ(again.model.layers.size(), 10u);
  EXPECT_EQ(again.model.layers[4].shortcut.at(0).name, "conv6");
  NetworkOptions o;
  o.max_batch = 2;
  Network net(again.model.layers, meta.input_chw, o, Exec{});
  const Checkpoint ck = load_checkpoint_for(last.string(), net);
  EXPECT_EQ(ck.params.size(), size_t(net.num_params()));
}

}  // namespace
