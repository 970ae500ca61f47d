// Residual blocks on the GPU: the elementwise add kernel against its CPU twin (awkward sizes,
// float4 and scalar paths, in place), a residual network's forward and backward on CUDA against
// the CPU, bitwise repeatability in deterministic mode, and the trainer's CUDA-graph step on a
// residual network bitwise equal to plain launches.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/train/trainer.h"
#include "kernels/pointwise/add.h"
#include "layers/checkpoint/safetensors.h"
#include "runtime/memory.h"
#include "tests/test_util.h"

using namespace cnn;
namespace fs = std::filesystem;

namespace {

// offset 0: every pointer 16-byte aligned (float4 path); offset 1: the scalar path. in_place:
// 0 apart, 1 y = a, 2 y = b.
void check_add(int64_t count, int offset, int in_place) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " count " << count << " offset " << offset
                                    << " in place " << in_place);
  const std::vector<float> a = test::random_vector(size_t(count), seed);
  const std::vector<float> b = test::random_vector(size_t(count), seed + 1);
  std::vector<float> ref(a.size());
  add_forward_cpu(count, a.data(), b.data(), ref.data());

  Exec ex;
  ex.device = Device::CUDA;
  Buffer<float> d_a(size_t(count + offset), Device::CUDA);  // (count) at +offset
  Buffer<float> d_b(size_t(count + offset), Device::CUDA);  // (count) at +offset
  Buffer<float> d_y(size_t(count + offset), Device::CUDA);  // (count) at +offset
  float* pa = d_a.data() + offset;
  float* pb = d_b.data() + offset;
  float* py = in_place == 1 ? pa : in_place == 2 ? pb : d_y.data() + offset;
  raw_copy(pa, Device::CUDA, a.data(), Device::CPU, a.size() * sizeof(float));
  raw_copy(pb, Device::CUDA, b.data(), Device::CPU, b.size() * sizeof(float));
  if (!in_place) test::poison_device(py, a.size());
  add_forward(count, pa, pb, py, ex);
  const std::vector<float> y = test::to_host(py, a.size());
  EXPECT_EQ(std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)), 0);
}

std::vector<LayerSpec> residual_net() {
  return {conv2d_spec("conv1", 8, 3, 3, 1, 1),
          layer_spec(LayerKind::Relu, "relu1"),
          residual_spec("res1",
                        {conv2d_spec("conv2", 8, 3, 3, 1, 1), layer_spec(LayerKind::Relu, "relu2"),
                         conv2d_spec("conv3", 8, 3, 3, 1, 1)}),
          layer_spec(LayerKind::Relu, "relu3"),
          residual_spec("res2",
                        {conv2d_spec("conv4", 12, 3, 3, 2, 1), layer_spec(LayerKind::Relu, "relu4"),
                         conv2d_spec("conv5", 12, 3, 3, 1, 1)},
                        {conv2d_spec("conv6", 12, 1, 1, 2, 0)}),
          layer_spec(LayerKind::Relu, "relu5"),
          maxpool2d_spec("pool1", 2, 2),
          layer_spec(LayerKind::Flatten, "flatten1"),
          linear_spec("fc1", 10),
          layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
}

}  // namespace

TEST(GpuAdd, MatchesCpuOnAwkwardSizes) {
  CNN_REQUIRE_GPU();
  for (int64_t count : {int64_t(1), int64_t(3), int64_t(4), int64_t(1031), int64_t(4000037)})
    for (int offset : {0, 1})
      for (int in_place : {0, 1, 2}) check_add(count, offset, in_place);
}

TEST(GpuResidual, NetworkMatchesCpu) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Shape chw = {3, 15, 13};  // odd sizes: the stride-2 block rounds down
  const int n = 5;
  const test::NetworkRun cpu =
      test::run_network_once(residual_net(), chw, Exec{}, PoolFusion::Off, n, seed);
  for (const bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic" : "atomics");
    Exec ex;
    ex.device = Device::CUDA;
    ex.deterministic = deterministic;
    const test::NetworkRun gpu =
        test::run_network_once(residual_net(), chw, ex, PoolFusion::Auto, n, seed);
    const double el = test::max_rel_error(gpu.logits, cpu.logits);
    const double eg = test::max_rel_error(gpu.grads, cpu.grads);
    std::printf("residual net: worst rel error logits %.3g grads %.3g\n", el, eg);
    EXPECT_LT(el, 1e-3);
    EXPECT_LT(eg, 2e-3);  // float sums in another order, through 5 convs and a linear
    EXPECT_FALSE(test::any_nan(gpu.grads));
    if (deterministic) {
      const test::NetworkRun again =
          test::run_network_once(residual_net(), chw, ex, PoolFusion::Auto, n, seed);
      EXPECT_EQ(std::memcmp(again.grads.data(), gpu.grads.data(), gpu.grads.size() * 4), 0);
      EXPECT_EQ(std::memcmp(again.logits.data(), gpu.logits.data(), gpu.logits.size() * 4), 0);
    }
  }
}

// configs/tiny.yaml's data and schedule with a residual network: the CUDA-graph step against
// plain launches, deterministic, over partial batches and an epoch boundary.
TEST(GpuResidual, StepGraphEqualsPlainLaunchesBitwise) {
  CNN_REQUIRE_GPU();
  const std::vector<std::string> sets = {
      "training.device=cuda",
      "logging.progress=off",
      "training.deterministic=true",
      "training.batch_size=48",
      "training.max_steps=30",
      "model.layers=[{conv2d: {out_channels: 8, kernel: 3, padding: 1}}, relu, "
      "{residual: {layers: [{conv2d: {out_channels: 8, kernel: 3, padding: 1}}, relu, "
      "{conv2d: {out_channels: 8, kernel: 3, padding: 1}}]}}, relu, "
      "{residual: {layers: [{conv2d: {out_channels: 16, kernel: 3, stride: 2, padding: 1}}, relu, "
      "{conv2d: {out_channels: 16, kernel: 3, padding: 1}}], "
      "shortcut: [{conv2d: {out_channels: 16, kernel: 1, stride: 2}}]}}, relu, "
      "{maxpool2d: {kernel: 2}}, flatten, {linear: {out_features: 4}}, softmax_cross_entropy]"};
  const auto run = [&](const std::string& name, bool graph) {
    const fs::path dir = test::fresh_dir("gpu_residual", name);
    std::vector<std::string> s = sets;
    s.push_back(std::string("training.cuda_graph=") + (graph ? "true" : "false"));
    const TrainConfig cfg = load_config(test::source_dir() + "/configs/tiny.yaml", s);
    TrainArgs args;
    args.log_dir = dir.string();
    EXPECT_EQ(run_training(cfg, args), 0);
    return dir;
  };
  const fs::path g = run("graph", true), e = run("eager", false);
  EXPECT_TRUE(test::contains(test::slurp(g / "train.log"), "CUDA graph: on"));
  EXPECT_TRUE(test::contains(test::slurp(g / "train.log"), "kernels launch while"));
  const SafetensorsFile fa = read_safetensors((g / "last.safetensors").string());
  const SafetensorsFile fb = read_safetensors((e / "last.safetensors").string());
  ASSERT_EQ(fa.entries().size(), fb.entries().size());
  for (const SafetensorsEntry& ea : fa.entries()) {
    const SafetensorsEntry* eb = fb.find(ea.name);
    ASSERT_NE(eb, nullptr) << ea.name;
    ASSERT_EQ(ea.end - ea.begin, eb->end - eb->begin) << ea.name;
    EXPECT_EQ(std::memcmp(fa.bytes(ea), fb.bytes(*eb), ea.end - ea.begin), 0) << ea.name;
  }
}
