// algo: auto's start-up tuning on the GPU: every conv/linear pass gets a timed choice, the
// gradients are left zero, the tuned network still agrees with the CPU, and deterministic mode
// or a configured variant leaves the fixed rule alone. Where weight gradients run beside, the
// input gradients are timed beside them.
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
};
Tuned tune_and_check(NetworkOptions o) {
  const GradcheckCase c = gradcheck_small_network_case();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = o.max_batch;
  o.seed = seed;
  Network gpu(c.specs, c.input_chw, o, cuda_exec(false));
  Network cpu(c.specs, c.input_chw, o, Exec{});

  const std::vector<std::string> lines = gpu.autotune();
  for (const auto& l : lines) std::printf("  %s\n", l.c_str());
  const std::vector<float> g0 = test::to_host(gpu.grads(), size_t(gpu.num_params()));
  EXPECT_TRUE(std::all_of(g0.begin(), g0.end(), [](float v) { return v == 0.f; }))
      << "autotune must leave the gradients zero";

  const size_t per_image = size_t(shape_numel(c.input_chw));
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
  return {lines, gpu.fused_conv_relu_pool()};
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
  const auto [lines, fused] = tune_and_check(o);
  // conv1 (first layer: no input gradient) 2 passes, conv2, fc1, fc2 3 passes each; with the
  // conv-relu-pool fusion (the default on CUDA): conv1's two passes are not tuned. fc1 (16
  // outputs) and fc2 (10) run the fused head backward unless CNN_LINEAR_HEAD=0: their forward
  // alone is tuned.
  const size_t fc_passes =
      linear_head_backward_applies(LinearShape{o.max_batch, 16, 10}, Device::CUDA) ? 1u : 3u;
  EXPECT_EQ(lines.size(), (fused ? 0u : 2u) + 3u + 2u * fc_passes);
  EXPECT_EQ(count_containing(lines, " input-grad: "), 1u + (fc_passes == 3u ? 2u : 0u));
  EXPECT_EQ(count_containing(lines, "beside"), 0u) << "weight gradients are not run beside here";
}

// Where the step runs weight gradients beside their input gradients, each input-gradient variant
// is timed with its layer's weight gradient running beside it on the side stream (the pair joined
// before the next), and the tuned network still agrees with the CPU; CNN_TUNE_BESIDE=0's option
// times them alone.
TEST(GpuAutotune, InputGradientsTimedBesideTheirWeightGradients) {
  CNN_REQUIRE_GPU();
  NetworkOptions o;
  o.max_batch = 9;
  o.weight_grads_beside = true;
  const std::vector<std::string> paired = tune_and_check(o).lines;
  const size_t input_grads = count_containing(paired, "input-grad");
  EXPECT_GE(input_grads, 1u) << "conv2 has an input gradient";
  EXPECT_EQ(count_containing(paired, " input-grad beside weight-grad: "), input_grads);
  o.tune_beside = false;
  const std::vector<std::string> alone = tune_and_check(o).lines;
  EXPECT_EQ(count_containing(alone, " input-grad: "), input_grads);
  EXPECT_EQ(count_containing(alone, "beside"), 0u);
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
