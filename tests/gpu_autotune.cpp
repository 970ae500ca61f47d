// algo: auto's start-up tuning on the GPU: every conv/linear pass gets a timed choice, the
// gradients are left zero, the tuned network still agrees with the CPU, and deterministic mode
// or a configured variant leaves the fixed rule alone. Where weight gradients run beside, the
// backward picks are checked in the whole backward pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "kernels/conv/conv2d_wgmma_wgrad.h"
#include "kernels/gemm/linear_head.h"
#include "layers/gradcheck/gradcheck.h"
#include "layers/network.h"
#include "layers/tune_cache.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

Exec cuda_exec(bool deterministic, Precision precision = Precision::FP32) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.deterministic = deterministic;
  ex.precision = precision;
  return ex;
}

// Tunes the small network with options o on the GPU (through `cache` when given) and checks what
// every tuning must leave: the gradients zero, and a step that agrees with the CPU. FP32: each
// element within 1e-3 relative (floor 1e-3); TF32 rounds each operand to 11 bits (2^-11 = 4.9e-4
// a product), so there the worst element within 1e-2 of the largest gradient.
struct Tuned {
  std::vector<std::string> lines;  // the tuner's
  bool fused_pool = false;         // conv1 fused with its pool (its passes are not tuned)
  bool buffers_kept = false;       // batchnorm's running statistics as before the tuning
};
Tuned tune_and_check(NetworkOptions o, const std::vector<LayerSpec>& specs, const Shape& input_chw,
                     Precision precision = Precision::FP32, TuneCache* cache = nullptr) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = o.max_batch;
  o.seed = seed;
  Network gpu(specs, input_chw, o, cuda_exec(false, precision));
  Network cpu(specs, input_chw, o, Exec{});

  const std::vector<float> buffers = gpu.buffers_to_host();
  const std::vector<std::string> lines = gpu.autotune(cache);
  const bool buffers_kept = gpu.buffers_to_host() == buffers;
  for (const auto& l : lines) std::printf("  %s\n", l.c_str());
  const std::vector<float> g0 = test::to_host(gpu.grads(), size_t(gpu.num_params()));
  EXPECT_TRUE(std::all_of(g0.begin(), g0.end(), [](float v) { return v == 0.f; }))
      << "autotune must leave the gradients zero";

  const size_t per_image = size_t(shape_numel(input_chw));
  const auto x = test::random_vector(n * per_image, seed);
  const auto labels = test::random_labels(n, gpu.num_classes(), seed + 1);
  Tensor d_x = test::to_device(x);
  Buffer<int32_t> d_labels(labels.size(), Device::CUDA);
  d_labels.copy_from(labels.data(), Device::CPU, labels.size());
  gpu.forward_backward(n, d_x.data(), d_labels.data(), 1.0f / n);
  cpu.forward_backward(n, x.data(), labels.data(), 1.0f / n);
  const std::vector<float> g_gpu = test::to_host(gpu.grads(), size_t(gpu.num_params()));
  const std::vector<float> g_cpu(cpu.grads(), cpu.grads() + cpu.num_params());
  double err = 0;
  if (precision == Precision::FP32) {
    err = test::max_rel_error(g_gpu, g_cpu);
  } else {
    double worst = 0, largest = 0;
    for (size_t i = 0; i < g_cpu.size(); ++i) {
      const double d = std::fabs(double(g_gpu[i]) - g_cpu[i]);
      worst = std::isnan(d) ? INFINITY : std::max(worst, d);  // std::max would drop a NaN
      largest = std::max(largest, std::fabs(double(g_cpu[i])));
    }
    err = worst / std::max(largest, 1e-30);
  }
  std::printf("  gradients after tuning: worst rel error %.3g\n", err);
  EXPECT_LT(err, precision == Precision::FP32 ? 1e-3 : 1e-2);
  return {lines, gpu.fused_conv_relu_pool(), buffers_kept};
}

size_t count_containing(const std::vector<std::string>& lines, const std::string& part) {
  return size_t(std::count_if(lines.begin(), lines.end(),
                              [&](const std::string& l) { return test::contains(l, part); }));
}

}  // namespace

TEST(GpuAutotune, TunesEveryPassAndKeepsTheNetworkCorrect) {
  CNN_REQUIRE_GPU();
  NetworkOptions o;
  o.max_batch = 9;
  const GradcheckCase c = gradcheck_small_network_case();
  const Tuned tuned = tune_and_check(o, c.specs, c.input_chw);
  const std::vector<std::string>& lines = tuned.lines;
  const bool fused = tuned.fused_pool;
  // conv1 (first layer: no input gradient) 2 passes, conv2, fc1, fc2 3 passes each; with the
  // conv-relu-pool fusion (the default on CUDA): conv1's two passes are not tuned. fc1 (16
  // outputs) and fc2 (10) run the fused head backward unless CNN_LINEAR_HEAD=0: their forward
  // alone is tuned.
  const size_t fc_passes =
      linear_head_backward_applies(LinearShape{o.max_batch, 16, 10}, Device::CUDA) ? 1u : 3u;
  EXPECT_EQ(lines.size(), (fused ? 0u : 2u) + 3u + 2u * fc_passes);
  EXPECT_EQ(count_containing(lines, " input-grad: "), 1u + (fc_passes == 3u ? 2u : 0u));
  EXPECT_EQ(count_containing(lines, "backward pass"), 0u) << "no weight gradients beside here";
}

// Where the step runs weight gradients beside, the backward picks are then checked in the whole
// backward pass: a summary line after any pass tried, batchnorm's running statistics as before
// (the check runs a forward in training mode), the gradients zero and the network correct;
// without the option (CNN_TUNE_BACKWARD=0) nothing is checked.
TEST(GpuAutotune, BackwardPicksCheckedInTheWholePass) {
  CNN_REQUIRE_GPU();
  const std::vector<LayerSpec> specs = {conv2d_spec("conv1", 8, 3, 3, 1, 1),
                                        batchnorm_spec(LayerKind::BatchNorm2d, "bn1"),
                                        layer_spec(LayerKind::Relu, "relu1"),
                                        conv2d_spec("conv2", 8, 3, 3, 1, 1),
                                        batchnorm_spec(LayerKind::BatchNorm2d, "bn2"),
                                        layer_spec(LayerKind::Relu, "relu2"),
                                        maxpool2d_spec("pool1", 2, 2, 0),
                                        layer_spec(LayerKind::Flatten, "flatten"),
                                        linear_spec("fc1", 40),
                                        layer_spec(LayerKind::Relu, "relu3"),
                                        linear_spec("fc2", 10),
                                        layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
  NetworkOptions o;
  o.max_batch = 16;
  o.weight_grads_beside = true;
  o.tune_backward = true;
  const Tuned checked = tune_and_check(o, specs, {3, 12, 12});
  EXPECT_TRUE(checked.buffers_kept) << "batchnorm's running statistics moved";
  const size_t tried = count_containing(checked.lines, " in the backward pass: ");
  std::printf("  %zu backward passes tried in the whole\n", tried);
  if (tried > 0) {
    EXPECT_TRUE(test::contains(checked.lines.back(), "backward pass: ")) << checked.lines.back();
    // A summary after the variants tried, and none for switches at FP32 (3xTF32 has no
    // clusters).
    EXPECT_EQ(count_containing(checked.lines, "backward pass"), tried + 1);
    EXPECT_EQ(count_containing(checked.lines, ": clusters "), 0u);
  }
  o.tune_backward = false;
  const Tuned alone = tune_and_check(o, specs, {3, 12, 12});
  EXPECT_TRUE(alone.buffers_kept);
  EXPECT_EQ(count_containing(alone.lines, "backward pass"), 0u);
}

// At TF32 a weight gradient picked alone on the wgmma kernel has a cluster form
// (Exec::clusters): the check tries it off in the whole backward pass, one line a weight
// gradient so picked (and only those), and the network is correct whichever it keeps. At batch
// 16 `tiled` wins these weight gradients alone, so a second tuning takes wgmma for the
// convolutions' weight gradients from the cache of the first; their 256-channel 8x8 shape (VGG's
// conv6) runs in 2 x 2 clusters.
TEST(GpuAutotune, ClusterSwitchesCheckedInTheWholePass) {
  CNN_REQUIRE_GPU();
  if (!conv2d_wgrad_wgmma_available()) GTEST_SKIP() << "no sm_90a wgmma weight gradient here";
  const std::vector<LayerSpec> specs = {conv2d_spec("conv1", 256, 3, 3, 1, 1),
                                        layer_spec(LayerKind::Relu, "relu1"),
                                        conv2d_spec("conv2", 256, 3, 3, 1, 1),
                                        layer_spec(LayerKind::Relu, "relu2"),
                                        layer_spec(LayerKind::Flatten, "flatten"),
                                        linear_spec("fc1", 10),
                                        layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
  NetworkOptions o;
  o.max_batch = 16;
  o.weight_grads_beside = true;
  o.tune_backward = true;
  TuneCache cache;
  tune_and_check(o, specs, {256, 8, 8}, Precision::TF32, &cache);
  size_t conv_wgrads = 0;
  for (const std::string& key : cache.keys()) {
    if (key.rfind("conv2d ", 0) != 0 || !test::contains(key, "| weight-grad |")) continue;
    cache.put(key, CachedTune{"wgmma", {}});
    ++conv_wgrads;
  }
  ASSERT_EQ(conv_wgrads, 1u) << "the two convolutions share a shape, so one cache key";
  const Tuned checked = tune_and_check(o, specs, {256, 8, 8}, Precision::TF32, &cache);
  for (const char* layer : {"conv1", "conv2"}) {
    EXPECT_EQ(count_containing(checked.lines, std::string(layer) + " weight-grad: wgmma "), 1u)
        << layer << ": the cached pick";
    EXPECT_EQ(count_containing(checked.lines,
                               std::string(layer) + " weight-grad in the backward pass: clusters "),
              1u)
        << layer;
  }
  EXPECT_EQ(count_containing(checked.lines, "fc1 weight-grad in the backward pass: clusters "), 0u)
      << "the linear layer's weight gradient has no cluster form";
  EXPECT_EQ(count_containing(checked.lines, "with every switch on, "), 1u);
}

TEST(GpuAutotune, DeterministicModeAndConfiguredVariantsAreNotTuned) {
  CNN_REQUIRE_GPU();
  GradcheckCase c = gradcheck_small_network_case();
  NetworkOptions o;
  o.max_batch = 4;
  Network det(c.specs, c.input_chw, o, cuda_exec(true));
  EXPECT_TRUE(det.autotune().empty()) << "a timed choice could differ between two runs";

  for (LayerSpec& s : c.specs) s.algo = Algo::Tiled;  // every layer configured explicitly
  Network fixed(c.specs, c.input_chw, o, cuda_exec(false));
  EXPECT_TRUE(fixed.autotune().empty());
}

TEST(GpuAutotune, CpuNetworkIsNotTuned) {
  const GradcheckCase c = gradcheck_small_network_case();
  NetworkOptions o;
  o.max_batch = 2;
  Network cpu(c.specs, c.input_chw, o, Exec{});
  EXPECT_TRUE(cpu.autotune().empty());
}
