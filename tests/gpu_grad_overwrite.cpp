// NetworkOptions::overwrite_grads on CUDA: the linear weights whose gradient backward writes (not
// a classifier head's: its fused kernel adds split sums by atomicAdd), and that training with it
// gives the parameters of training without it: bitwise in deterministic mode (FP32, TF32, BF16;
// every linear variant; the reference network), within rounding with atomic reductions (whose
// order varies run to run anyway). After an update the written gradients hold the last batch's,
// every other one is zero.
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "kernels/gemm/linear_head.h"
#include "layers/network.h"
#include "layers/param_optimizer.h"
#include "tests/grad_overwrite_check.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

const Shape kInput = {1, 28, 28};

// conv1 8 -> pool -> conv2 16 -> pool -> fc1 (784 -> 64) -> relu -> fc2 (64 -> 10).
const std::vector<LayerSpec> kNet = test::small_net(8, 16, 64);

Exec cuda(Precision p, bool deterministic) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = p;
  ex.deterministic = deterministic;
  return ex;
}

OptimizerOptions sgd() {
  OptimizerOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  o.weight_decay = 1e-3;
  return o;
}

OptimizerOptions adamw() {
  OptimizerOptions o;
  o.type = OptimizerType::AdamW;
  o.lr = 1e-3;
  o.weight_decay = 0.01;
  return o;
}

// fc1's weight always; fc2's (10 outputs) only where it does not run the fused head backward
// (algo auto and fast, unless CNN_LINEAR_HEAD=0).
std::vector<std::string> written(Algo algo, int batch) {
  const bool head = (algo == Algo::Auto || algo == Algo::Fast) &&
                    linear_head_backward_applies(LinearShape{batch, 64, 10}, Device::CUDA);
  if (head) return {"fc1.weight"};
  return {"fc1.weight", "fc2.weight"};
}

// configs/mnist.yaml's network at its batch, `steps` SGD steps in each precision:
// test::expect_same_training in deterministic mode (tolerance 0) or with atomic reductions. With
// first_written, the first written parameter must be that one.
void expect_same_reference_training(std::initializer_list<Precision> precisions, bool deterministic,
                                    double tolerance, int steps,
                                    const char* first_written = nullptr) {
  NetworkOptions o;
  o.max_batch = test::network_batch();
  o.seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  for (Precision p : precisions) {
    SCOPED_TRACE(precision_name(p));
    const std::vector<std::string> names = test::expect_same_training(
        conv_net_specs(), kInput, cuda(p, deterministic), o, sgd(), steps, tolerance);
    if (!first_written) continue;
    ASSERT_FALSE(names.empty());
    EXPECT_EQ(names[0], first_written);
  }
}

}  // namespace

TEST(GpuGradOverwrite, DeterministicTrainingIsBitwiseTheSame) {
  CNN_REQUIRE_GPU();
  NetworkOptions o;
  o.max_batch = 32;
  o.seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16})
    for (Algo algo : {Algo::Auto, Algo::Naive, Algo::Tiled, Algo::Igemm, Algo::Fast})
      for (const OptimizerOptions& opt : {sgd(), adamw()}) {
        SCOPED_TRACE(::testing::Message() << precision_name(p) << " " << algo_name(algo) << " "
                                          << optimizer_name(opt.type));
        o.linear_algo = algo;
        EXPECT_EQ(test::expect_same_training(kNet, kInput, cuda(p, true), o, opt, 5),
                  written(algo, o.max_batch));
      }
}

// configs/mnist.yaml's network at its batch (fc1: 3136 -> 1024 on the tiled or wgmma GEMM).
TEST(GpuGradOverwrite, ReferenceNetworkIsBitwiseTheSame) {
  CNN_REQUIRE_GPU();
  expect_same_reference_training({Precision::FP32, Precision::TF32, Precision::BF16},
                                 /*deterministic=*/true, /*tolerance=*/0, /*steps=*/3,
                                 "fc1.weight");
}

// Atomic reductions (convolution weight gradients, the head's split sums) add in an order that
// varies between runs, so two runs agree only within rounding, with or without the option (SGD:
// Adam's normalized step could turn a rounding-sized gradient's sign into a full step); the
// written and zeroed gradients are checked exactly as above. One step: from the second on, the
// runs start from weights a rounding apart, where a max-pool whose two largest inputs are that
// close can route its gradient to the other one, a difference no tolerance bounds (one run in
// five on the H200 missed 1e-4 at step 3, by 3e-3, FP32); the deterministic tests above cover
// three steps.
TEST(GpuGradOverwrite, AtomicTrainingAgreesWithinRounding) {
  CNN_REQUIRE_GPU();
  expect_same_reference_training({Precision::FP32, Precision::TF32}, /*deterministic=*/false,
                                 /*tolerance=*/1e-4, /*steps=*/1);
}
