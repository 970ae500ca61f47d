// algo: auto's start-up tuning on the GPU: every conv/linear pass gets a timed choice, the
// gradients are left zero, the tuned network still agrees with the CPU, and deterministic mode
// or a configured variant leaves the fixed rule alone. Where weight gradients run beside, the
// backward picks are checked in the whole backward pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "kernels/gemm/linear_head.h"
#include "layers/gradcheck/gradcheck.h"
#include "layers/network.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

Exec cuda_exec(bool deterministic) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.deterministic = deterministic;
  return ex;
}

// Tunes the small network with options o on the GPU and checks what every tuning must leave: the
// gradients zero, and a step that agrees with the CPU.
struct Tuned {
  std::vector<std::string> lines;  // the tuner's
  bool fused_pool = false;         // conv1 fused with its pool (its passes are not tuned)
  bool buffers_kept = false;       // batchnorm's running statistics as before the tuning
};
Tuned tune_and_check(NetworkOptions o, const std::vector<LayerSpec>& specs,
                     const Shape& input_chw) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = o.max_batch;
  o.seed = seed;
  Network gpu(specs, input_chw, o, cuda_exec(false));
  Network cpu(specs, input_chw, o, Exec{});

  const std::vector<float> buffers = gpu.buffers_to_host();
  const std::vector<std::string> lines = gpu.autotune();
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
  const double err = test::max_rel_error(g_gpu, g_cpu);
  std::printf("  gradients after tuning: worst rel error %.3g\n", err);
  EXPECT_LT(err, 1e-3);
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
    EXPECT_EQ(count_containing(checked.lines, "backward pass"), tried + 1);
  }
  o.tune_backward = false;
  const Tuned alone = tune_and_check(o, specs, {3, 12, 12});
  EXPECT_TRUE(alone.buffers_kept);
  EXPECT_EQ(count_containing(alone.lines, "backward pass"), 0u);
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
