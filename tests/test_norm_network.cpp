// BatchNorm, average pooling, dropout and label smoothing inside the Network: train and eval
// modes, running statistics as buffers (not parameters) in checkpoints that torch loads (I64
// num_batches_tracked), conv/linear + batchnorm folding for inference, and config errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/train/trainer.h"
#include "layers/checkpoint/checkpoint.h"
#include "layers/checkpoint/safetensors.h"
#include "layers/fold_batchnorm.h"
#include "layers/network.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

// test::norm_net() on (3, 9, 7).
constexpr auto norm_net = test::norm_net;
const Shape kChw = {3, 9, 7};

// Random parameters and plausible running statistics (var in [0.5, 2]) into net.
void randomize(Network& net, uint64_t seed) {
  net.params_from_host(test::random_vector(size_t(net.num_params()), seed));
  std::vector<float> b = test::random_vector(size_t(net.num_buffers()), seed + 1, 0.5f, 2.f);
  for (const auto& info : net.buffer_infos())
    if (info.is_int64) b[size_t(info.offset)] = 7.f;
  net.buffers_from_host(b);
}

}  // namespace

TEST(NormNetwork, RunningStatisticsAreBuffersNotParameters) {
  NetworkOptions o;
  o.max_batch = 4;
  Network net(norm_net(), kChw, o, Exec{});
  for (const auto& p : net.param_infos()) EXPECT_EQ(p.name.find("running"), std::string::npos);
  std::vector<std::string> names;
  for (const auto& b : net.buffer_infos()) names.push_back(b.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked",
                       "bn2.running_mean", "bn2.running_var", "bn2.num_batches_tracked",
                       "bn3.running_mean", "bn3.running_var", "bn3.num_batches_tracked"}));
  // torch.nn's initial values: weight 1, bias 0, running mean 0, running var 1, count 0.
  const std::vector<float> b = net.buffers_to_host();
  EXPECT_EQ(std::vector<float>(b.begin(), b.begin() + 9),
            (std::vector<float>{0, 0, 0, 0, 1, 1, 1, 1, 0}));
}

TEST(NormNetwork, TrainingMovesTheRunningStatisticsAndEvalUsesThem) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  NetworkOptions o;
  o.max_batch = 4;
  o.seed = seed;
  Network net(norm_net(), kChw, o, Exec{});
  // Batchnorm shifts of 1 keep the ReLUs after them open: with the initial shifts of 0 some seeds
  // left every relu3 output at 0, and logits that are fc2's bias alone cannot show the statistics.
  std::vector<float> p = net.params_to_host();
  for (const auto& info : net.param_infos())
    if (info.name.rfind("bn", 0) == 0 && info.name.find(".bias") != std::string::npos)
      std::fill_n(p.begin() + info.offset, info.numel(), 1.f);
  net.params_from_host(p);
  const std::vector<float> x = test::random_vector(size_t(4 * 3 * 9 * 7), seed + 1);
  const std::vector<int32_t> labels = test::random_labels(4, 3, seed + 2);
  // Eval is a pure function of the weights: twice the same logits.
  const std::vector<float> e1(net.forward(4, x.data()), net.forward(4, x.data()) + 12);
  const std::vector<float> e2(net.forward(4, x.data()), net.forward(4, x.data()) + 12);
  EXPECT_EQ(e1, e2);
  const std::vector<float> before = net.buffers_to_host();
  net.forward_backward(4, x.data(), labels.data(), 0.25f);
  const std::vector<float> after = net.buffers_to_host();
  EXPECT_NE(before, after);
  EXPECT_EQ(after[8], 1.f);  // bn1.num_batches_tracked
  // The eval logits changed with the running statistics although no parameter moved.
  const std::vector<float> e3(net.forward(4, x.data()), net.forward(4, x.data()) + 12);
  EXPECT_NE(e1, e3);
}

TEST(NormNetwork, BatchNorm1dRefusesABatchOfOneInTrainingOnly) {
  NetworkOptions o;
  o.max_batch = 2;
  Network net(norm_net(), kChw, o, Exec{});
  const std::vector<float> x = test::random_vector(size_t(3 * 9 * 7), 5);
  const std::vector<int32_t> label = {1};
  net.forward(1, x.data());  // eval: fine
  try {
    net.forward_backward(1, x.data(), label.data(), 1.f);
    ADD_FAILURE() << "a batch of 1 trained through batchnorm1d";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bn3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("more than 1 value per channel"), std::string::npos);
  }
}

TEST(NormNetwork, DropoutIsRepeatablePerStepAndOffInEval) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<float> x = test::random_vector(size_t(4 * 3 * 9 * 7), seed + 1);
  const std::vector<int32_t> labels = test::random_labels(4, 3, seed + 2);
  auto grads_at = [&](int64_t step) {
    NetworkOptions o;
    o.max_batch = 4;
    o.seed = seed;
    Network net(norm_net(), kChw, o, Exec{});
    net.set_step_counter(&step);
    net.forward_backward(4, x.data(), labels.data(), 0.25f);
    return net.grads_to_host();
  };
  const std::vector<float> at3 = grads_at(3);
  EXPECT_EQ(at3, grads_at(3));
  // A new step draws a new mask; it changes the gradients unless it happens to keep and drop the
  // same units among the ~12 that ReLU lets through (0.625^12, about 1 in 280, was seen), so the
  // next five steps must not all give step 3's gradients.
  bool moved = false;
  for (int64_t step = 4; step < 9 && !moved; ++step) moved = grads_at(step) != at3;
  EXPECT_TRUE(moved) << "dropout's masks do not follow the step counter";
}

TEST(NormNetwork, CheckpointRoundTripWithTorchNamesAndInt64Count) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  NetworkOptions o;
  o.max_batch = 2;
  Network net(norm_net(), kChw, o, Exec{});
  randomize(net, seed);
  CheckpointMeta m;
  m.input_chw = kChw;
  m.class_names = {"a", "b", "c"};
  m.mean = {0.f, 0.f, 0.f};
  m.std = {1.f, 1.f, 1.f};
  const auto dir = test::fresh_dir("norm", "ckpt");
  const std::string path = (dir / "bn.safetensors").string();
  save_checkpoint(path, net, nullptr, m);

  const SafetensorsFile f = read_safetensors(path);
  const SafetensorsEntry* count = f.find("bn2.num_batches_tracked");
  ASSERT_TRUE(count);
  EXPECT_EQ(count->dtype, "I64");
  EXPECT_TRUE(count->shape.empty());  // a 0-d tensor, as torch stores it
  EXPECT_EQ(f.tensor_i64("bn2.num_batches_tracked").ints, (std::vector<int64_t>{7}));
  EXPECT_EQ(f.find("bn2.running_var")->dtype, "F32");
  EXPECT_EQ(f.find("bn2.weight")->shape, (std::vector<int64_t>{5}));

  Network back(norm_net(), kChw, o, Exec{});
  const Checkpoint ck = load_checkpoint_for(path, back);
  EXPECT_EQ(ck.params, net.params_to_host());
  EXPECT_EQ(ck.buffers, net.buffers_to_host());
  // A network without the batchnorm layers refuses the checkpoint, naming a tensor.
  std::vector<LayerSpec> plain = {conv2d_spec("conv1", 4, 3, 3, 1, 1),
                                  layer_spec(LayerKind::Flatten, "f"), linear_spec("fc2", 3),
                                  layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
  Network other(plain, kChw, o, Exec{});
  EXPECT_THROW(load_checkpoint_for(path, other), Error);
}

TEST(NormNetwork, FoldedAndUnfoldedAgreeInEval) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  NetworkOptions o;
  o.max_batch = 5;
  Network net(norm_net(), kChw, o, Exec{});
  randomize(net, seed);
  const FoldedNetwork folded =
      fold_batchnorm(norm_net(), kChw, net.params_to_host(), net.buffers_to_host());
  EXPECT_EQ(folded.folded, (std::vector<std::string>{"conv1 + bn1", "conv2 + bn2", "fc1 + bn3"}));
  for (const auto& s : folded.specs) {
    EXPECT_NE(s.kind, LayerKind::BatchNorm2d);
    EXPECT_NE(s.kind, LayerKind::BatchNorm1d);
  }
  Network fast(folded.specs, kChw, o, Exec{});
  fast.params_from_host(folded.params);
  fast.buffers_from_host(folded.buffers);
  const std::vector<float> x = test::random_vector(size_t(5 * 3 * 9 * 7), seed + 7, -2.f, 2.f);
  const float* a = net.forward(5, x.data());
  const std::vector<float> unfolded(a, a + 15);
  const float* b = fast.forward(5, x.data());
  const std::vector<float> fused(b, b + 15);
  // The fold reorders float rounding (scale times weights, then the sums), so the logits agree to
  // float accuracy relative to their own size, not each to its own: a logit near zero has no
  // relative accuracy (4.75e-4 relative was seen). A wrong fold is off by O(1) of that size.
  double diff = 0, size = 0;
  for (size_t i = 0; i < unfolded.size(); ++i) {
    diff = std::max(diff, double(std::fabs(fused[i] - unfolded[i])));
    size = std::max(size, double(std::fabs(unfolded[i])));
  }
  EXPECT_LT(diff, 1e-5 * size) << "largest difference " << diff << " for logits up to " << size;
}

namespace {
const char* kNormConfig = R"(name: t
model:
  input: {channels: 1, height: 16, width: 16}
  layers:
    - conv2d: {out_channels: 4, kernel: 3, padding: 1, bias: false}
    - batchnorm2d: {momentum: 0.2, eps: 1.0e-3}
    - relu
    - avgpool2d: {kernel: 2}
    - global_avgpool
    - flatten
    - dropout: {p: 0.3}
    - linear: {out_features: 3}
    - softmax_cross_entropy
data:
  format: synthetic
  synthetic: {train: 10, test: 5, classes: 3}
optimizer:
  lr: 0.1
training:
  epochs: 1
  batch_size: 4
  label_smoothing: 0.1
)";

std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  try {
    parse_config(text, "t.yaml", sets);
  } catch (const Error& e) {
    return e.what();
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

#define EXPECT_HAS(msg, part) \
  EXPECT_NE((msg).find(part), std::string::npos) << "'" << (part) << "' not in: " << (msg)
}  // namespace

TEST(NormConfig, NewKindsParseNameAndRoundTrip) {
  const TrainConfig c = parse_config(kNormConfig, "t.yaml");
  ASSERT_EQ(c.model.layers.size(), 9u);
  EXPECT_EQ(c.model.layers[1].kind, LayerKind::BatchNorm2d);
  EXPECT_EQ(c.model.layers[1].name, "bn1");
  EXPECT_DOUBLE_EQ(c.model.layers[1].momentum, 0.2);
  EXPECT_DOUBLE_EQ(c.model.layers[1].eps, 1e-3);
  EXPECT_EQ(c.model.layers[3].kind, LayerKind::AvgPool2d);
  EXPECT_EQ(c.model.layers[3].stride_h, 2);  // defaults to the window
  EXPECT_EQ(c.model.layers[4].kind, LayerKind::GlobalAvgPool);
  EXPECT_EQ(c.model.layers[6].kind, LayerKind::Dropout);
  EXPECT_DOUBLE_EQ(c.model.layers[6].dropout_p, 0.3);
  EXPECT_DOUBLE_EQ(c.training.label_smoothing, 0.1);
  const TrainConfig again = parse_config(c.resolved_yaml, "t.yaml");
  EXPECT_EQ(again.resolved_yaml, c.resolved_yaml);
  const NetworkSummary sum = summarize_network(c.model.layers, c.model.input_chw);
  EXPECT_EQ(sum.rows[1].params, 8);  // bn1: weight and bias; running stats are not parameters
  EXPECT_EQ(sum.rows[4].out, (Shape{4, 1, 1}));
}

TEST(NormConfig, BadValuesNameTheKeyAndLine) {
  // batchnorm2d after flatten: the layer's key and line, and the kind to use instead.
  std::string e =
      error_of(replaced(kNormConfig, "    - dropout: {p: 0.3}\n", "    - batchnorm2d\n"));
  EXPECT_HAS(e, "model.layers[6]");
  EXPECT_HAS(e, "line 11");
  EXPECT_HAS(e, "batchnorm1d");
  // batchnorm1d on an image.
  e = error_of(replaced(kNormConfig, "batchnorm2d: {momentum: 0.2, eps: 1.0e-3}", "batchnorm1d"));
  EXPECT_HAS(e, "model.layers[1]");
  EXPECT_HAS(e, "batchnorm2d");
  e = error_of(kNormConfig, {"model.layers[6].dropout.p=1.0"});
  EXPECT_HAS(e, "model.layers[6].dropout.p");
  e = error_of(kNormConfig, {"training.label_smoothing=1"});
  EXPECT_HAS(e, "training.label_smoothing");
  e = error_of(kNormConfig, {"model.layers[1].batchnorm2d.eps=0"});
  EXPECT_HAS(e, "eps");
  e = error_of(kNormConfig, {"model.layers[1].batchnorm2d.momentm=0.1"});
  EXPECT_HAS(e, "momentum");  // did you mean
  e = error_of(replaced(kNormConfig, "avgpool2d: {kernel: 2}", "avgpool2d"));
  EXPECT_HAS(e, "avgpool2d: {kernel: 2}");
}

namespace {

// Every tensor of a checkpoint, I64 ones as floats.
std::vector<float> tensors_of(const std::string& path) {
  const SafetensorsFile f = read_safetensors(path);
  std::vector<float> all;
  for (const auto& e : f.entries()) {
    if (e.dtype == "I64") {
      for (int64_t v : f.tensor_i64(e.name).ints) all.push_back(float(v));
      continue;
    }
    const std::vector<float> t = f.tensor_f32(e.name).data;
    all.insert(all.end(), t.begin(), t.end());
  }
  return all;
}

TrainConfig norm_run(const std::string& dir, int64_t max_steps) {
  return parse_config(kNormConfig, "t.yaml",
                      {"training.device=cpu", "logging.progress=off", "logging.dir=" + dir,
                       "training.epochs=3", "training.max_steps=" + std::to_string(max_steps)});
}

}  // namespace

TEST(NormTrainE2E, ResumeRestoresRunningStatisticsAndDropoutStepBitwise) {
  const auto a = test::fresh_dir("norm", "full"), b = test::fresh_dir("norm", "split");
  const TrainConfig full = norm_run(a.string(), 7);
  ASSERT_EQ(run_training(full, TrainArgs{}), 0);
  const std::string full_ckpt = (a / full.name / "last.safetensors").string();
  const SafetensorsFile f = read_safetensors(full_ckpt);
  EXPECT_EQ(f.tensor_i64("bn1.num_batches_tracked").ints, (std::vector<int64_t>{7}));
  ASSERT_EQ(run_training(norm_run(b.string(), 4), TrainArgs{}), 0);
  const TrainConfig rest = norm_run(b.string(), 7);
  TrainArgs args;
  args.resume = (b / rest.name / "last.safetensors").string();
  ASSERT_EQ(run_training(rest, args), 0);
  EXPECT_EQ(tensors_of(full_ckpt), tensors_of((b / rest.name / "last.safetensors").string()));
}
