// ParamOptimizer's early updates on the CPU (layers/param_optimizer.h): each range of parameters
// updated as soon as backward has finished its gradients gives bitwise the training of one update
// after backward (SGD with momentum, Nesterov and weight decay, Adam, AdamW; with and without
// overwritten gradients; partial batches; a BatchNorm net), in-process and through the trainer
// (CNN_EARLY_UPDATE=1); the slices of the kept-gradient ranges; what it refuses.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/train/trainer.h"
#include "kernels/optimizer/optimizer.h"
#include "tests/early_update_check.h"
#include "tests/grad_overwrite_check.h"  // small_net
#include "tests/test_util.h"

using namespace cnn;
namespace fs = std::filesystem;

namespace {

OptimizerOptions sgd_nesterov() {
  OptimizerOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  o.nesterov = true;
  o.weight_decay = 1e-3;
  o.decay_biases = false;  // a decay mask that changes at every bias
  return o;
}

OptimizerOptions adam(OptimizerType type) {
  OptimizerOptions o;
  o.type = type;
  o.lr = 1e-3;
  o.weight_decay = type == OptimizerType::AdamW ? 0.01 : 0.0;
  return o;
}

// Overwritten gradients and the weight gradients beside backward, a fresh seed.
NetworkOptions beside_options(int max_batch) {
  NetworkOptions o;
  o.max_batch = max_batch;
  o.seed = test::fresh_seed();
  o.overwrite_grads = true;
  o.weight_grads_beside = true;
  return o;
}

}  // namespace

TEST(EarlyUpdate, KeptRangesSlice) {
  KeptGrads kept;
  kept.count = 3;
  kept.begin[0] = 0, kept.end[0] = 10;
  kept.begin[1] = 20, kept.end[1] = 30;
  kept.begin[2] = 25, kept.end[2] = 50;
  const KeptGrads a = kept_grads_slice(kept, 5, 27);
  ASSERT_EQ(a.count, 3);
  EXPECT_EQ(a.begin[0], 0);
  EXPECT_EQ(a.end[0], 5);
  EXPECT_EQ(a.begin[1], 15);
  EXPECT_EQ(a.end[1], 22);
  EXPECT_EQ(a.begin[2], 20);
  EXPECT_EQ(a.end[2], 22);
  EXPECT_EQ(kept_grads_slice(kept, 10, 20).count, 0);  // touching ranges leave nothing
  EXPECT_EQ(kept_grads_slice(kept, 50, 60).count, 0);
  EXPECT_EQ(kept_grads_slice(KeptGrads{}, 0, 100).count, 0);
  const KeptGrads b = kept_grads_slice(kept, 40, 48);
  ASSERT_EQ(b.count, 1);
  EXPECT_EQ(b.begin[0], 0);
  EXPECT_EQ(b.end[0], 8);
}

// Thresholds 1 (an update after every node with parameters, ranges cut at multiples of 4),
// 300 (a few layers together) and one above the parameter count (never early).
TEST(EarlyUpdate, TrainingIsBitwiseTheSame) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<LayerSpec> net = test::small_net(4, 6, 40);
  NetworkOptions o;
  o.max_batch = 8;
  o.seed = seed;
  for (bool overwrite : {false, true}) {
    SCOPED_TRACE(overwrite ? "gradients overwritten" : "gradients added to");
    o.overwrite_grads = overwrite;
    for (const OptimizerOptions& opt :
         {sgd_nesterov(), adam(OptimizerType::Adam), adam(OptimizerType::AdamW)}) {
      SCOPED_TRACE(optimizer_name(opt.type));
      test::expect_early_updates_keep_the_bits(net, {1, 12, 12}, Exec{}, o, opt, 4,
                                               {1, 300, 1 << 30});
    }
  }
}

// The early updates run during backward: once it returns, the gradients of the last layers are
// used and zeroed, the first convolution's still wait for the step's update.
TEST(EarlyUpdate, RunDuringBackward) {
  NetworkOptions o;
  o.max_batch = 4;
  Network net(test::small_net(4, 6, 40), {1, 12, 12}, o, Exec{});
  ParamOptimizer opt(sgd_nesterov(), net);
  ASSERT_EQ(opt.enable_early_updates(1000), "");
  const auto x = test::random_vector(4 * 144, 3);
  const auto labels = test::random_labels(4, net.num_classes(), 4);
  opt.begin_step(0.05);
  net.forward_backward(4, x.data(), labels.data(), 0.25f);
  const std::vector<float> g = net.grads_to_host();
  for (const ParamInfo& p : net.param_infos()) {
    // fc1.weight (54 x 40) and what follows it reach 1000 together (from the first multiple of
    // 4 in fc1.weight on); conv1 is left for the step.
    bool any = false;
    for (int64_t i = (p.offset + 3) / 4 * 4; i < p.offset + p.numel(); ++i)
      any |= g[size_t(i)] != 0.f;
    if (p.name == "fc1.weight" || p.name == "fc2.weight") {
      EXPECT_FALSE(any) << p.name;
    }
    if (p.name == "conv1.weight") {
      EXPECT_TRUE(any) << p.name;
    }
  }
  opt.step(0.05);
  EXPECT_EQ(net.grads_to_host(), std::vector<float>(g.size(), 0.f));
}

// Weight gradients beside backward (conv2's and the linear layers'), alone and with early
// updates: on the CPU the same passes in another order, the same bits.
TEST(EarlyUpdate, WeightGradientsBesideAreBitwiseTheSame) {
  const NetworkOptions o = beside_options(8);
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  test::expect_early_updates_keep_the_bits(test::small_net(4, 6, 40), {1, 12, 12}, Exec{}, o,
                                           adam(OptimizerType::AdamW), 4, {0, 1});
}

TEST(EarlyUpdate, NormalizationNetworkIsBitwiseTheSame) {
  const NetworkOptions o = beside_options(6);
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  test::expect_early_updates_keep_the_bits(test::norm_net(), {3, 9, 9}, Exec{}, o, sgd_nesterov(),
                                           3, {0, 1, 64});
}

TEST(EarlyUpdate, RefusedWithClippingAndBesideAnotherHook) {
  const std::vector<LayerSpec> specs = test::small_net(2, 3, 8);
  NetworkOptions o;
  o.max_batch = 2;
  {
    Network net(specs, {1, 12, 12}, o, Exec{});
    OptimizerOptions clipped = sgd_nesterov();
    clipped.clip_grad_norm = 1.0;
    ParamOptimizer opt(clipped, net);
    EXPECT_TRUE(test::contains(opt.enable_early_updates(), "clip_grad_norm"));
    EXPECT_FALSE(opt.early_updates());
    EXPECT_FALSE(net.has_grads_ready_hook());
  }
  {
    Network net(specs, {1, 12, 12}, o, Exec{});
    net.set_grads_ready_hook([](int64_t) {});
    ParamOptimizer opt(sgd_nesterov(), net);
    EXPECT_TRUE(test::contains(opt.enable_early_updates(), "summed across GPUs"));
    EXPECT_FALSE(opt.early_updates());
  }
  {
    Network net(specs, {1, 12, 12}, o, Exec{});
    {
      ParamOptimizer opt(sgd_nesterov(), net);
      EXPECT_EQ(opt.enable_early_updates(), "");
      EXPECT_TRUE(net.has_grads_ready_hook());
      opt.begin_step(0.05);
      EXPECT_THROW(opt.step(0.01), Error);  // another learning rate than the step began with
    }
    EXPECT_FALSE(net.has_grads_ready_hook());  // the optimizer's hook goes with it
  }
}

// The trainer under CNN_EARLY_UPDATE=1 on tiny with a 600-wide hidden layer: the weights of a
// run without it, and the log says so. On the CPU the trainer leaves the weight gradients in
// turn whatever CNN_WGRAD_BESIDE says (no second stream to overlap on) and logs nothing of them.
TEST(EarlyUpdate, TrainerSwitchKeepsTheBits) {
  const fs::path dir = test::fresh_dir("early_update", "trainer");
  const fs::path cfg_path = dir / "tiny_wide.yaml";
  std::ofstream(cfg_path) << test::tiny_wide_yaml();
  auto run = [&](const char* name, const char* env) {
    TrainConfig cfg =
        load_config(cfg_path.string(),
                    {"training.device=cpu", "logging.progress=off", "training.max_steps=12",
                     "optimizer.type=sgd", "optimizer.nesterov=true",
                     "optimizer.weight_decay=0.001", "logging.dir=" + (dir / name).string()});
    test::ScopedEnv e("CNN_EARLY_UPDATE", env), w("CNN_WGRAD_BESIDE", env);
    EXPECT_EQ(run_training(cfg, TrainArgs{}), 0);
    return dir / name / cfg.name;
  };
  const fs::path on = run("on", "1"), off = run("off", "0");
  EXPECT_EQ(test::checkpoint_weights(on / "last.safetensors"),
            test::checkpoint_weights(off / "last.safetensors"));
  const std::string log_on = test::slurp(on / "train.log"),
                    log_off = test::slurp(off / "train.log");
  EXPECT_TRUE(test::contains(log_on, "optimizer: early updates")) << log_on;
  EXPECT_FALSE(test::contains(log_on, "weight gradients")) << log_on;
  EXPECT_FALSE(test::contains(log_off, "early updates")) << log_off;
  fs::remove_all(dir);
}
