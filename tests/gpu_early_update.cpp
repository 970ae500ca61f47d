// ParamOptimizer's early updates and the linear weight gradients beside backward on CUDA
// (layers/param_optimizer.h, NetworkOptions::weight_grads_beside): the updates of the ranges
// backward has finished and the weight gradients, on a low-priority side stream beside the rest
// of backward, give bitwise the training of one update after backward on one stream in
// deterministic mode (FP32, TF32, BF16; SGD, AdamW; the learning rate by value and from device
// memory), and the trainer's captured step under CNN_EARLY_UPDATE=1 CNN_WGRAD_BESIDE=1 writes the
// weights of one without them (the fork and join captured as graph edges, the side kernels at
// their stream's priority).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/train/trainer.h"
#include "tests/early_update_check.h"
#include "tests/grad_overwrite_check.h"  // small_net
#include "tests/test_util.h"

using namespace cnn;
namespace fs = std::filesystem;

TEST(GpuEarlyUpdate, TrainingIsBitwiseTheSame) {
  CNN_REQUIRE_GPU();
  // conv1 8 -> pool -> conv2 16 -> pool -> fc1 (784 -> 64) -> relu -> fc2 (64 -> 10).
  const std::vector<LayerSpec> net = test::small_net(8, 16, 64);
  NetworkOptions o;
  o.max_batch = 16;
  o.seed = test::fresh_seed();
  o.overwrite_grads = true;
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  OptimizerOptions sgd;
  sgd.lr = 0.05;
  sgd.momentum = 0.9;
  sgd.weight_decay = 1e-3;
  OptimizerOptions adamw;
  adamw.type = OptimizerType::AdamW;
  adamw.lr = 1e-3;
  adamw.weight_decay = 0.01;
  for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16}) {
    SCOPED_TRACE(precision_name(p));
    Exec ex;
    ex.device = Device::CUDA;
    ex.precision = p;
    ex.deterministic = true;
    for (const OptimizerOptions& opt : {sgd, adamw}) {
      SCOPED_TRACE(optimizer_name(opt.type));
      o.weight_grads_beside = false;
      test::expect_early_updates_keep_the_bits(net, {1, 28, 28}, ex, o, opt, 4, {1, 4096});
      o.weight_grads_beside = true;
      test::expect_early_updates_keep_the_bits(net, {1, 28, 28}, ex, o, opt, 4, {0, 4096});
    }
  }
}

// With atomic reductions (BF16, the convolutions' channels-last wgmma weight gradients where the
// GPU has them, which then write dy's copy once a pass instead of sharing it): one step within
// the rounding of the reductions' order (a second step could route a gradient through another
// of two near-equal max-pool inputs, as GpuGradOverwrite notes). The BatchNorm net and a
// LeNet-like one with 32 and 64 channels.
TEST(GpuEarlyUpdate, AtomicTrainingAgreesWithinRounding) {
  CNN_REQUIRE_GPU();
  OptimizerOptions sgd;
  sgd.lr = 0.05;
  sgd.momentum = 0.9;
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = Precision::BF16;
  NetworkOptions o;
  o.max_batch = 32;
  o.seed = test::fresh_seed();
  o.overwrite_grads = true;
  o.weight_grads_beside = true;
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  test::expect_early_updates_keep_the_bits(test::norm_net(), {3, 9, 9}, ex, o, sgd, 1, {0, 1},
                                           1e-4);
  test::expect_early_updates_keep_the_bits(test::small_net(32, 64, 128), {1, 28, 28}, ex, o, sgd, 1,
                                           {0, 1}, 1e-4);
}

// tiny with a 600-wide hidden layer, deterministic, 40 steps at batch 48 (full batches replay
// the captured step, the partial ones run eagerly), CNN_EARLY_UPDATE and CNN_WGRAD_BESIDE at 1:
// the weights of a run with both at 0.
TEST(GpuEarlyUpdate, CapturedTrainerStepKeepsTheBits) {
  CNN_REQUIRE_GPU();
  const fs::path dir = test::fresh_dir("gpu_early_update", "trainer");
  const fs::path cfg_path = dir / "tiny_wide.yaml";
  std::ofstream(cfg_path) << test::tiny_wide_yaml();
  for (const char* type : {"sgd", "adam"}) {
    SCOPED_TRACE(type);
    auto run = [&](const std::string& name, const char* env) {
      TrainConfig cfg = load_config(
          cfg_path.string(),
          {"training.device=cuda", "logging.progress=off", "training.deterministic=true",
           "training.batch_size=48", "training.max_steps=40", "schedule.type=cosine",
           std::string("optimizer.type=") + type, "optimizer.lr=0.002",
           "logging.dir=" + (dir / name).string()});
      test::ScopedEnv e("CNN_EARLY_UPDATE", env), w("CNN_WGRAD_BESIDE", env);
      EXPECT_EQ(run_training(cfg, TrainArgs{}), 0);
      return dir / name / cfg.name;
    };
    const fs::path on = run(std::string("on_") + type, "1");
    const fs::path off = run(std::string("off_") + type, "0");
    EXPECT_EQ(test::checkpoint_weights(on / "last.safetensors"),
              test::checkpoint_weights(off / "last.safetensors"));
    EXPECT_TRUE(test::contains(test::slurp(off / "train.log"), "in turn on one stream"));
    const std::string log = test::slurp(on / "train.log");
    EXPECT_TRUE(test::contains(log, "optimizer: early updates")) << log;
    EXPECT_TRUE(test::contains(log, "on a second stream beside the rest")) << log;
    EXPECT_TRUE(test::contains(log, "on a second stream beside their input")) << log;
    EXPECT_TRUE(test::contains(log, "CUDA graph: captured the training step")) << log;
  }
  fs::remove_all(dir);
}
