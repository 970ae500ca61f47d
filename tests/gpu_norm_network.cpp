// A network with every new kind (batchnorm 2d/1d, avgpool, global avgpool, dropout) and label
// smoothing, CUDA against CPU: one training step (logits, losses, gradients, running
// statistics), eval logits, and the step bitwise repeatable in deterministic mode; the relus folded
// into the batchnorms give the bits of the relus run apart.
#include <gtest/gtest.h>

#include <vector>

#include "layers/network.h"
#include "runtime/memory.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

constexpr auto norm_net = test::norm_net;
const Shape kChw = {3, 17, 15};

struct Step {
  std::vector<float> logits, loss, grads, buffers, eval_logits;
};

Step run(const Exec& ex, uint64_t seed, int n, bool fold_batchnorm_relu = true) {
  NetworkOptions o;
  o.max_batch = n;
  o.seed = seed;
  o.label_smoothing = 0.1f;
  o.fuse_batchnorm_relu = fold_batchnorm_relu;
  Network net(norm_net(), kChw, o, ex);
  const std::vector<float> x = test::random_vector(size_t(n) * 3 * 17 * 15, seed + 1);
  const std::vector<int32_t> labels = test::random_labels(size_t(n), 3, seed + 2);
  Buffer<float> d_x(x.size(), ex.device);
  d_x.copy_from(x.data(), Device::CPU, x.size());
  Buffer<int32_t> d_labels(labels.size(), ex.device);
  d_labels.copy_from(labels.data(), Device::CPU, labels.size());
  const int64_t step = 9;
  Buffer<int64_t> d_step(1, ex.device);
  d_step.copy_from(&step, Device::CPU, 1);
  net.set_step_counter(d_step.data());
  net.forward_backward(n, d_x.data(), d_labels.data(), 1.f / float(n));
  stream_sync(ex.device, ex.stream);
  Step s;
  s.logits.resize(size_t(n) * 3);
  raw_copy(s.logits.data(), Device::CPU, net.logits(), ex.device, s.logits.size() * sizeof(float));
  s.loss.resize(size_t(n));
  raw_copy(s.loss.data(), Device::CPU, net.loss_rows(), ex.device, s.loss.size() * sizeof(float));
  s.grads = net.grads_to_host();
  s.buffers = net.buffers_to_host();
  const float* e = net.forward(n, d_x.data());
  s.eval_logits.resize(size_t(n) * 3);
  raw_copy(s.eval_logits.data(), Device::CPU, e, ex.device, s.eval_logits.size() * sizeof(float));
  return s;
}

}  // namespace

TEST(GpuNormNetwork, TrainingStepAndEvalMatchCpu) {
  CNN_REQUIRE_GPU();
  for (int n : {2, 33}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + " batch " + std::to_string(n));
    const Step cpu = run(Exec{}, seed, n);
    Exec ex;
    ex.device = Device::CUDA;
    const Step gpu = run(ex, seed, n);
    EXPECT_LT(test::max_rel_error(gpu.logits, cpu.logits), 1e-3);
    EXPECT_LT(test::max_rel_error(gpu.loss, cpu.loss), 1e-3);
    // At batch 2 BatchNorm divides by the deviation of two values: where they nearly agree,
    // the rounding of their difference is amplified by 1/sqrt(var + eps) (up to ~316), and the
    // H200 measured 1.13e-2 once; at batch 33 the statistics are tame.
    EXPECT_LT(test::max_rel_error(gpu.grads, cpu.grads, 1e-2), n == 2 ? 3e-2 : 1e-2);
    EXPECT_LT(test::max_rel_error(gpu.buffers, cpu.buffers), 1e-4);
    EXPECT_LT(test::max_rel_error(gpu.eval_logits, cpu.eval_logits), 1e-3);
  }
}

TEST(GpuNormNetwork, DeterministicStepIsBitwiseRepeatable) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Exec ex;
  ex.device = Device::CUDA;
  ex.deterministic = true;
  const Step a = run(ex, seed, 64), b = run(ex, seed, 64);
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.grads, b.grads);
  EXPECT_EQ(a.buffers, b.buffers);
  EXPECT_EQ(a.eval_logits, b.eval_logits);
}

// The batchnorm kernels with the relu folded in run the relu kernels' float operations on the same
// values (tests/gpu_batchnorm.cpp checks them alone), and every other kernel of the step is the
// same in both networks: in deterministic mode the two steps agree bitwise.
TEST(GpuNormNetwork, FoldedReluGivesTheSeparatePassBits) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Exec ex;
  ex.device = Device::CUDA;
  ex.deterministic = true;
  for (int n : {2, 33}) {
    SCOPED_TRACE("batch " + std::to_string(n));
    const Step folded = run(ex, seed, n, true), apart = run(ex, seed, n, false);
    EXPECT_FALSE(test::any_nan(folded.grads));
    EXPECT_EQ(folded.logits, apart.logits);
    EXPECT_EQ(folded.loss, apart.loss);
    EXPECT_EQ(folded.grads, apart.grads);
    EXPECT_EQ(folded.buffers, apart.buffers);
    EXPECT_EQ(folded.eval_logits, apart.eval_logits);
  }
}
