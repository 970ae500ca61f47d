// A property test over random network architectures (tests/random_net_config.h): for each of
// kRandomNetCount seeded random configs, written in the YAML config language, the config parses
// and round-trips, the --dry-run shapes are the shapes the Network builds and runs, the gradients
// check in double (every parameter tensor and the input) and in float (every parameter tensor,
// ReLUs folded and apart), a few SGD steps keep the loss finite, and a checkpoint round trip
// gives the logits bitwise. A failure prints the net's config; paste it into a file and
// `./train --config it.yaml --dry-run` or `./gradcheck --config it.yaml` to look at it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/config/dry_run.h"
#include "layers/checkpoint/checkpoint.h"
#include "layers/gradcheck/gradcheck.h"
#include "layers/network.h"
#include "layers/param_optimizer.h"
#include "runtime/error.h"
#include "tests/random_net_config.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

std::string describe(const test::RandomNet& n) {
  return "random net seed " + std::to_string(n.seed) + ", batch " + std::to_string(n.batch) +
         ":\n" + n.yaml;
}

// The config parsed, or a failure naming the error (the trace shows the config).
bool parse(const std::string& yaml, TrainConfig* cfg) {
  try {
    *cfg = parse_config(yaml, "random_net.yaml");
    return true;
  } catch (const Error& e) {
    ADD_FAILURE() << "a valid config was refused: " << e.what();
    return false;
  }
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

Shape per_image(const Shape& s) {
  return Shape(s.begin() + 1, s.end());
}

std::vector<float> eval_logits(Network& net, int n, const std::vector<float>& x) {
  const float* y = net.forward(n, x.data());
  return std::vector<float>(y, y + size_t(n) * size_t(net.num_classes()));
}

// A network of another channel count than 1 or 3 trains, but its checkpoint is refused before
// anything is written: one line naming the file, the input and what checkpoints hold.
void expect_checkpoint_refused(const std::string& path, const Network& net,
                               const ParamOptimizer* opt, const CheckpointMeta& meta) {
  try {
    save_checkpoint(path, net, opt, meta);
    ADD_FAILURE() << "a checkpoint of input " << shape_str(meta.input_chw) << " was written";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(test::contains(msg, path)) << msg;
    EXPECT_TRUE(test::contains(msg, shape_str(meta.input_chw))) << msg;
    EXPECT_TRUE(test::contains(msg, "1 or 3 channels")) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

class RandomNets : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { net_ = test::random_net(test::random_net_seed(GetParam())); }
  test::RandomNet net_;
};

// The config language's own view of the net (parse, resolved config, --dry-run table) against
// the Network built from it: every layer's output shape, the parameter count, the logits.
TEST_P(RandomNets, DryRunShapesAreTheNetworksShapes) {
  SCOPED_TRACE(describe(net_));
  TrainConfig cfg;
  ASSERT_TRUE(parse(net_.yaml, &cfg));
  EXPECT_EQ(cfg.model.input_chw, net_.input_chw);
  EXPECT_EQ(cfg.training.batch_size, net_.batch);
  TrainConfig again;
  ASSERT_TRUE(parse(cfg.resolved_yaml, &again));
  EXPECT_EQ(again.resolved_yaml, cfg.resolved_yaml) << "the resolved config does not read back";

  std::string dry;
  ASSERT_NO_THROW(dry = format_dry_run(cfg));
  const NetworkSummary sum = summarize_network(cfg.model.layers, cfg.model.input_chw);
  ASSERT_EQ(sum.rows.back().out, (Shape{net_.classes})) << dry;
  std::map<std::string, Shape> dry_shape;  // by layer name; a block's row is its add's output
  for (const NetworkSummaryRow& r : sum.rows)
    if (r.name != "+" && r.name != "-") dry_shape.emplace(r.name, r.out);

  NetworkOptions o;
  o.max_batch = net_.batch;
  o.seed = net_.seed;
  Network net(cfg.model.layers, cfg.model.input_chw, o, Exec{});
  EXPECT_EQ(net.num_params(), sum.total_params) << dry;
  EXPECT_EQ(net.num_classes(), net_.classes);
  for (const auto& layer : net.layers()) {
    const auto it = dry_shape.find(layer->name());
    ASSERT_NE(it, dry_shape.end()) << "layer '" << layer->name() << "' is not in the dry run\n"
                                   << dry;
    EXPECT_EQ(layer->out_shape().at(0), net_.batch) << layer->name();
    EXPECT_EQ(per_image(layer->out_shape()), it->second)
        << "layer '" << layer->name() << "': the Network's output shape is not the dry run's\n"
        << dry;
  }
  // The forward runs on those shapes: a full and a partial batch give finite logits, and the
  // image of the partial batch scores as it did in the full one (eval mode: no batch statistics,
  // no dropout), to float rounding: the CPU GEMMs may sum a tile of rows in another order than a
  // row alone (a wrong offset or stride is O(1)).
  const std::vector<float> x =
      test::random_vector(size_t(net_.batch) * size_t(shape_numel(net_.input_chw)), net_.seed);
  const std::vector<float> full = eval_logits(net, net_.batch, x);
  EXPECT_TRUE(all_finite(full));
  const std::vector<float> one = eval_logits(net, 1, x);
  EXPECT_LT(test::max_rel_error(one, std::vector<float>(full.begin(), full.begin() + net_.classes)),
            1e-4);
}

// Where the net starts conv(1 channel) -> relu -> max-pool 2x2 with an even conv output, CUDA runs
// the three as one fused pass (PoolFusion::Auto); PoolFusion::On runs its CPU twin here. A
// training step with it gives the unfused step's logits, losses and gradients: to float
// accuracy, as the twin runs the reference loops where the unfused net runs the fast CPU kernels
// (tests/test_residual.cpp's 2e-3 for sums in another order; a missing or misrouted term is O(1)).
TEST_P(RandomNets, FusedConvReluPoolStepMatchesUnfused) {
  SCOPED_TRACE(describe(net_));
  TrainConfig cfg;
  ASSERT_TRUE(parse(net_.yaml, &cfg));
  const test::NetworkRun fused = test::run_network_once(
      cfg.model.layers, cfg.model.input_chw, Exec{}, PoolFusion::On, net_.batch, net_.seed);
  if (!fused.fused) {
    EXPECT_FALSE(net_.features.count("conv_relu_maxpool_start") && net_.input_chw[1] % 2 == 0 &&
                 net_.input_chw[2] % 2 == 0)
        << "an even conv -> relu -> max-pool 2x2 start did not fuse";
    return;
  }
  const test::NetworkRun apart = test::run_network_once(
      cfg.model.layers, cfg.model.input_chw, Exec{}, PoolFusion::Off, net_.batch, net_.seed);
  EXPECT_FALSE(apart.fused);
  EXPECT_LT(test::max_rel_error(fused.logits, apart.logits), 2e-3);
  EXPECT_LT(test::max_rel_error(fused.loss, apart.loss), 2e-3);
  EXPECT_LT(test::max_rel_error(fused.grads, apart.grads), 2e-3);
}

// Central differences of the double reference's loss against its analytic backward (every
// parameter tensor and the input) and against the float Network's parameter gradients, with the
// ReLUs apart and folded into the layers before them. Tolerances: the ones every gradient check
// uses (tests/test_gradcheck.cpp; derived at gradcheck_network_tolerance), 1e-6 for double
// against double and 1e-2 for float. Kinks: the checked coordinates skip the steps that cross one
// (a ReLU input changing sign, a max-pool winner changing: the Gradchecker compares the linear
// pieces of both sides with the centre's), and inputs and parameters are random doubles, so
// exact ties do not occur; that is what keeps ReLU and max-pool nets from noisy differences.
//
// Each tensor's error is measured against at least 1e-2 of the network's largest per-coordinate
// RMS gradient (GradcheckOptions::denominator_floor), not only against its own size. A central
// difference in double carries a rounding error of ~eps |loss| / step = 2.2e-16 * ~1.6 / 1e-6,
// ~3.5e-10 per coordinate, whatever the gradient; random nets have tensors whose gradient is
// orders of magnitude below the network's (a shift that a batchnorm downstream removes but for
// the few units a ReLU clips, units a dead ReLU cuts off so that a batchnorm1d sees identical
// rows), and there that rounding is the whole relative error. Measured over these seeds without
// the floor: 4 of 60 nets over 1e-6 in double (1.9e-6, 2.1e-6, 2.5e-6, 3.1e-5), the worst falling
// as 1/step (2.7e-4 at step 1e-7, 3.1e-5 at 1e-6, 2.8e-6 at 1e-5): rounding of the differences,
// not a wrong backward. With the floor the worst is 1.7e-7 in double and 7.6e-5 in float. A
// backward that is wrong by its own size still fails unless its tensor's per-coordinate gradient is
// below 1e-8 (double check) or 1e-4 (float check) of the largest one.
TEST_P(RandomNets, GradientsCheckInDoubleAndFloat) {
  SCOPED_TRACE(describe(net_));
  TrainConfig cfg;
  ASSERT_TRUE(parse(net_.yaml, &cfg));
  GradcheckOptions o;
  o.batch = net_.batch;  // raised to 6 for batchnorm1d
  o.seed = net_.seed;
  o.denominator_floor = 1e-2;
  Gradchecker check(cfg.model.layers, cfg.model.input_chw, o);
  const GradcheckResult ref = check.reference();
  EXPECT_TRUE(ref.passed()) << format_gradcheck(ref);
  EXPECT_EQ(ref.rows.back().what, "input");
  for (const bool fuse : {false, true}) {
    const GradcheckResult r = check.network(Exec{}, fuse);
    EXPECT_TRUE(r.passed()) << "fuse_relu " << fuse << "\n" << format_gradcheck(r);
  }
}

// Three SGD steps on the CPU (the second on a partial batch) keep the loss and every parameter
// finite; a checkpoint of the trained net, loaded into a net built from the same specs and into
// one built from the config embedded in the checkpoint (as ./infer builds it), gives the same
// parameters, buffers and eval logits, bit for bit.
TEST_P(RandomNets, TrainingStepsAndCheckpointRoundTrip) {
  SCOPED_TRACE(describe(net_));
  TrainConfig cfg;
  ASSERT_TRUE(parse(net_.yaml, &cfg));
  NetworkOptions o;
  o.max_batch = net_.batch;
  o.seed = net_.seed;
  Network net(cfg.model.layers, cfg.model.input_chw, o, Exec{});
  ParamOptimizer opt(cfg.optimizer, net);
  const size_t image = size_t(shape_numel(net_.input_chw));
  for (int step = 0; step < 3; ++step) {
    // batchnorm1d nets have a batch of at least 3: the partial one still has 2 per feature.
    const int n = step == 1 ? std::max(1, net_.batch - 1) : net_.batch;
    const std::vector<float> x = test::random_vector(size_t(n) * image, net_.seed + 10 + step);
    const std::vector<int32_t> labels =
        test::random_labels(size_t(n), net_.classes, net_.seed + 20 + step);
    net.forward_backward(n, x.data(), labels.data(), 1.0f / float(n));
    const std::vector<float> loss(net.loss_rows(), net.loss_rows() + n);
    ASSERT_TRUE(all_finite(loss)) << "step " << step;
    ASSERT_TRUE(all_finite(net.grads_to_host())) << "step " << step;
    opt.step(cfg.optimizer.lr);
    ASSERT_TRUE(all_finite(net.params_to_host())) << "step " << step;
  }

  const std::vector<float> x = test::random_vector(size_t(net_.batch) * image, net_.seed + 99);
  const std::vector<float> logits = eval_logits(net, net_.batch, x);
  const auto dir = test::fresh_dir("random_nets", std::to_string(GetParam()));
  const std::string path = (dir / "last.safetensors").string();
  CheckpointMeta meta;
  meta.config_yaml = cfg.resolved_yaml;
  meta.input_chw = cfg.model.input_chw;
  for (int k = 0; k < net_.classes; ++k) meta.class_names.push_back(std::to_string(k));
  meta.mean.assign(size_t(net_.input_chw[0]), 0.f);
  meta.std.assign(size_t(net_.input_chw[0]), 1.f);
  meta.seed = net_.seed;
  if (net_.input_chw[0] != 1 && net_.input_chw[0] != 3) {
    // Refused by design: checkpoints (and the data loaders) hold 1- or 3-channel inputs.
    expect_checkpoint_refused(path, net, &opt, meta);
    std::filesystem::remove_all(dir);
    return;
  }
  ASSERT_NO_THROW(save_checkpoint(path, net, &opt, meta));

  const auto expect_same = [&](const std::vector<LayerSpec>& specs, const Shape& chw,
                               const char* what) {
    NetworkOptions other = o;
    other.seed = net_.seed + 1;  // other initial weights: the loaded ones must replace them
    Network back(specs, chw, other, Exec{});
    Checkpoint ck;
    try {
      ck = load_checkpoint_for(path, back);
    } catch (const Error& e) {
      ADD_FAILURE() << what << ": the checkpoint does not load: " << e.what();
      return;
    }
    back.params_from_host(ck.params);
    back.buffers_from_host(ck.buffers);
    EXPECT_EQ(ck.params, net.params_to_host()) << what;
    EXPECT_EQ(ck.buffers, net.buffers_to_host()) << what;
    EXPECT_EQ(eval_logits(back, net_.batch, x), logits) << what;
  };
  expect_same(cfg.model.layers, cfg.model.input_chw, "the same specs");
  CheckpointMeta read;
  ASSERT_NO_THROW(read = read_checkpoint_meta(path));
  EXPECT_EQ(read.input_chw, net_.input_chw);
  TrainConfig embedded;
  ASSERT_TRUE(parse(read.config_yaml, &embedded));
  expect_same(embedded.model.layers, read.input_chw, "the embedded config");
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomNets, ::testing::Range(0, test::kRandomNetCount));

// The generator draws every layer kind and key of the config language over the seeds the tests
// run (a change that stops drawing one fails here, not silently), and the same seed gives the
// same config.
TEST(RandomNetGenerator, CoversTheConfigLanguageAndRepeats) {
  std::set<std::string> seen, configs;
  int batch_max = 0;
  for (int i = 0; i < test::kRandomNetCount; ++i) {
    const test::RandomNet n = test::random_net(test::random_net_seed(i));
    EXPECT_EQ(n.yaml, test::random_net(test::random_net_seed(i)).yaml);
    seen.insert(n.features.begin(), n.features.end());
    configs.insert(n.yaml);
    batch_max = std::max(batch_max, n.batch);
    EXPECT_GE(n.batch, 1);
    EXPECT_LE(n.batch, 5);
  }
  EXPECT_EQ(configs.size(), size_t(test::kRandomNetCount));
  // Some nets start with the conv -> relu -> max-pool that CUDA fuses (PoolFusion::Auto).
  int fusing = 0;
  for (int i = 0; i < test::kRandomNetCount; ++i) {
    const test::RandomNet n = test::random_net(test::random_net_seed(i));
    const TrainConfig cfg = parse_config(n.yaml, "random_net.yaml");
    NetworkOptions o;
    o.max_batch = n.batch;
    o.fuse_pool = PoolFusion::On;
    fusing += Network(cfg.model.layers, cfg.model.input_chw, o, Exec{}).fused_conv_relu_pool();
  }
  EXPECT_GE(fusing, 2);
  EXPECT_EQ(batch_max, 5);
  for (const char* f : {"input_channels_1",
                        "input_channels_3",
                        "input_channels_other",
                        "input_non_square",
                        "conv2d",
                        "conv_kernel_7",
                        "conv_even_kernel",
                        "conv_nonsquare_kernel",
                        "conv_stride_2",
                        "conv_padding",
                        "conv_dilation",
                        "conv_grouped",
                        "conv_depthwise",
                        "conv_no_bias",
                        "odd_channels",
                        "batchnorm2d",
                        "batchnorm1d",
                        "relu",
                        "maxpool2d",
                        "avgpool2d",
                        "pool_padding",
                        "pool_default_stride",
                        "global_avgpool",
                        "dropout",
                        "linear",
                        "linear_hidden",
                        "linear_no_bias",
                        "residual_identity",
                        "residual_projection",
                        "residual_depthwise_separable",
                        "conv_head",
                        "no_conv",
                        "named_layer",
                        "batch_1",
                        "conv_relu_maxpool_start"})
    EXPECT_TRUE(seen.count(f)) << "no random net has " << f;
}

// Regression (random net seed 0x5eed002d, cut down): a 2-channel input. save_checkpoint wrote
// the file, and every read of it (load_checkpoint_for, read_checkpoint_meta: ./infer, --resume)
// refused it ("metadata input_chw is (2, 13, 8), expected 1 or 3 channels"). Now the write is
// refused, before anything is on disk; 1 and 3 channels still round-trip.
TEST(RandomNetsRegression, CheckpointOfAnInputNoLoaderGivesIsRefusedBeforeWriting) {
  const char* config = R"(name: two_channels
model:
  input: {channels: 2, height: 13, width: 8}
  layers:
    - conv2d: {out_channels: 2, kernel: 5, stride: 2, padding: [1, 2], bias: false}
    - global_avgpool
    - flatten
    - linear: {out_features: 5, bias: false}
    - softmax_cross_entropy
data: {format: synthetic, synthetic: {classes: 5}}
optimizer: {lr: 0.05}
training: {epochs: 1, batch_size: 2}
)";
  const auto dir = test::fresh_dir("random_nets", "regression");
  for (const int channels : {2, 1, 3, 5}) {
    SCOPED_TRACE("channels " + std::to_string(channels));
    TrainConfig cfg;
    ASSERT_TRUE(parse(config, &cfg));
    cfg.model.input_chw[0] = channels;
    NetworkOptions o;
    o.max_batch = 2;
    Network net(cfg.model.layers, cfg.model.input_chw, o, Exec{});
    CheckpointMeta meta;
    meta.config_yaml = cfg.resolved_yaml;
    meta.input_chw = cfg.model.input_chw;
    meta.class_names = {"a", "b", "c", "d", "e"};
    meta.mean.assign(size_t(channels), 0.f);
    meta.std.assign(size_t(channels), 1.f);
    const std::string path = (dir / ("c" + std::to_string(channels) + ".safetensors")).string();
    if (channels == 1 || channels == 3) {
      save_checkpoint(path, net, nullptr, meta);
      Network back(cfg.model.layers, cfg.model.input_chw, o, Exec{});
      EXPECT_EQ(load_checkpoint_for(path, back).params, net.params_to_host());
    } else {
      expect_checkpoint_refused(path, net, nullptr, meta);
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
