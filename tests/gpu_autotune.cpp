// algo: auto's start-up tuning on the GPU: every conv/linear pass gets a timed choice, the
// gradients are left zero, the tuned network still agrees with the CPU, and deterministic mode
// or a configured variant leaves the fixed rule alone.
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

}  // namespace

TEST(GpuAutotune, TunesEveryPassAndKeepsTheNetworkCorrect) {
  CNN_REQUIRE_GPU();
  const GradcheckCase c = gradcheck_small_network_case();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = 9;
  NetworkOptions o;
  o.max_batch = n;
  o.seed = seed;
  Network gpu(c.specs, c.input_chw, o, cuda_exec(false));
  Network cpu(c.specs, c.input_chw, o, Exec{});

  const std::vector<std::string> lines = gpu.autotune();
  for (const auto& l : lines) std::printf("  %s\n", l.c_str());
  // conv1 (first layer: no input gradient) 2 passes, conv2, fc1, fc2 3 passes each; with the
  // conv-relu-pool fusion (the default on CUDA): conv1's two passes are not tuned. fc1 (16
  // outputs) and fc2 (10) run the fused head backward unless CNN_LINEAR_HEAD=0: their forward
  // alone is tuned.
  const size_t fc_passes =
      linear_head_backward_applies(LinearShape{n, 16, 10}, Device::CUDA) ? 1u : 3u;
  EXPECT_EQ(lines.size(), (gpu.fused_conv_relu_pool() ? 0u : 2u) + 3u + 2u * fc_passes);
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
