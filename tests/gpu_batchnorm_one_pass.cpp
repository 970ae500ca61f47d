// The one-launch BatchNorm training passes (kernels/norm/batchnorm_one_pass.cu) against the CPU
// twin on awkward shapes (N 1/3/128, C 1/3/32/128, H*W 1, 7x7, 13x11, 28x28), with and without the
// fused ReLU and the residual add, the backward's mask read and recomputed: y, the saved and
// running statistics, the batch count, dx and the accumulated dgamma / dbeta. Two runs give the
// same bits; the three-launch passes (CNN_BN_ONE_PASS=0) agree within rounding of the sums; a
// channel at the plan's limit runs in one launch, one past it falls back to the three-launch bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/norm/batchnorm.h"
#include "kernels/norm/batchnorm_cuda.h"
#include "kernels/norm/batchnorm_one_pass_plan.h"
#include "runtime/memory.h"
#include "tests/batchnorm_test_check.h"
#include "tests/test_util.h"
#ifdef CNN_HAVE_CUDA
#include "kernels/norm/batchnorm_one_pass_cuda.h"
#endif

using namespace cnn;

#ifdef CNN_HAVE_CUDA  // the CUDA launchers the tests call directly
namespace {

enum class Mask { None, Read, Recompute };  // the backward's fused-ReLU mask

struct Case {
  bool relu = false, residual = false;
  Mask mask = Mask::None;
};

struct Inputs {
  BatchNormShape s;
  std::vector<float> x, gamma, beta, dy, res, rm, rv, dgamma, dbeta;
};

using Outputs = test::BatchNormOutputs;
using test::expect_same_bits;

Inputs make_inputs(const BatchNormShape& s, uint64_t seed) {
  Inputs in;
  in.s = s;
  const size_t n = size_t(s.n) * size_t(s.c) * size_t(s.hw), c = size_t(s.c);
  in.x = test::random_vector(n, seed, -1.5f, 2.5f);  // off zero, as a conv's output is
  in.gamma = test::random_vector(c, seed + 1, 0.5f, 1.5f);
  in.beta = test::random_vector(c, seed + 2);
  in.dy = test::random_vector(n, seed + 3);
  in.res = test::random_vector(n, seed + 4);
  in.rm = test::random_vector(c, seed + 5);
  in.rv = test::random_vector(c, seed + 6, 0.5f, 2.f);
  in.dgamma = test::random_vector(c, seed + 7);  // gradients accumulate onto these
  in.dbeta = test::random_vector(c, seed + 8);
  return in;
}

// One training forward and backward through the CUDA launchers as `l` says. The backward's mask
// (Read, Recompute) is the forward's own y, as the Network runs it.
Outputs run_cuda(const Inputs& in, const Case& k, const BatchNormLaunch& l) {
  const BatchNormShape& s = in.s;
  const size_t n = in.x.size(), c = size_t(s.c);
  Tensor x = test::to_device(in.x), gamma = test::to_device(in.gamma),
         beta = test::to_device(in.beta), dy = test::to_device(in.dy),
         res = test::to_device(in.res), rm = test::to_device(in.rm), rv = test::to_device(in.rv),
         dgamma = test::to_device(in.dgamma), dbeta = test::to_device(in.dbeta),
         count = test::to_device({5.f});
  Buffer<float> y(n, Device::CUDA), dx(n, Device::CUDA), mean(c, Device::CUDA),
      invstd(c, Device::CUDA);
  Buffer<double> scratch(size_t(batchnorm_scratch_doubles(s, Device::CUDA)), Device::CUDA);
  test::poison_device(y.data(), n);
  test::poison_device(dx.data(), n);
  test::poison_device(mean.data(), c);
  test::poison_device(invstd.data(), c);
  BatchNormTrainArgs a;
  a.running_mean = rm.data();
  a.running_var = rv.data();
  a.num_batches = count.data();
  batchnorm_forward_train_cuda(s, x.data(), gamma.data(), beta.data(), y.data(), k.relu,
                               k.residual ? res.data() : nullptr, mean.data(), invstd.data(), a,
                               scratch.data(), nullptr, l);
  batchnorm_backward_cuda(s, x.data(), dy.data(), k.mask != Mask::None ? y.data() : nullptr,
                          k.mask == Mask::Recompute ? beta.data() : nullptr, gamma.data(),
                          mean.data(), invstd.data(), dx.data(), dgamma.data(), dbeta.data(),
                          scratch.data(), nullptr, l);
  Outputs o;
  o.y = test::to_host(y.data(), n);
  o.dx = test::to_host(dx.data(), n);
  o.mean = test::to_host(mean.data(), c);
  o.invstd = test::to_host(invstd.data(), c);
  o.rm = test::to_host(rm.data(), c);
  o.rv = test::to_host(rv.data(), c);
  o.count = test::to_host(count.data(), 1);
  o.dgamma = test::to_host(dgamma.data(), c);
  o.dbeta = test::to_host(dbeta.data(), c);
  return o;
}

// The CPU twin; relu_y: the mask the device's backward used (its own forward's y), so that a
// value within rounding of 0 cannot give the two different masks.
Outputs run_cpu(const Inputs& in, const Case& k, const std::vector<float>& relu_y) {
  const BatchNormShape& s = in.s;
  Outputs o = test::outputs_before(s, in.rm, in.rv, in.dgamma, in.dbeta);
  const BatchNormTrainArgs a = test::train_args_into(o);
  batchnorm_forward_train_cpu(s, in.x.data(), in.gamma.data(), in.beta.data(), o.y.data(),
                              o.mean.data(), o.invstd.data(), a, k.relu,
                              k.residual ? in.res.data() : nullptr);
  batchnorm_backward_cpu(s, in.x.data(), in.dy.data(), in.gamma.data(), o.mean.data(),
                         o.invstd.data(), o.dx.data(), o.dgamma.data(), o.dbeta.data(),
                         k.mask != Mask::None ? relu_y.data() : nullptr);
  return o;
}

// Every output of `got` against `ref` within tol (batchnorm_test_check.h says how).
void expect_close(const Inputs& in, const Outputs& got, const Outputs& ref, double tol,
                  const char* against) {
  test::expect_close(in.s, in.gamma, in.dy, got, ref, tol,
                     std::string("one-pass batchnorm against ") + against);
}

const char* mask_name(Mask m) {
  return m == Mask::None ? "none" : m == Mask::Read ? "read" : "recomputed";
}

void check_case(const Inputs& in, const Case& k) {
  SCOPED_TRACE(::testing::Message()
               << "relu " << k.relu << " residual " << k.residual << " mask " << mask_name(k.mask));
  BatchNormLaunch one, two;
  two.one_pass = false;
  const Outputs got = run_cuda(in, k, one);
  expect_close(in, got, run_cpu(in, k, got.y), 1e-3, "cpu");
  // The sums added in a fixed order: a second run gives the same bits.
  expect_same_bits(got, run_cuda(in, k, one), "second run");
  // The three-launch passes add the same terms in another order.
  expect_close(in, got, run_cuda(in, k, two), 1e-3, "three-launch");
}

void check_shape(const BatchNormShape& s, bool all_cases) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (N, C, HW) = (" << s.n << ", " << s.c
                                    << ", " << s.hw << ")");
  ASSERT_TRUE(batchnorm_one_pass_available(s)) << "the shape must run in one launch here";
  const Inputs in = make_inputs(s, seed);
  check_case(in, Case{false, false, Mask::None});
  check_case(in, Case{true, false, Mask::Recompute});  // the Network's conv -> bn -> relu
  if (!all_cases) return;
  check_case(in, Case{false, true, Mask::None});
  check_case(in, Case{true, false, Mask::Read});
  check_case(in, Case{true, true, Mask::Read});  // a residual block's bn -> add -> relu
}

}  // namespace

TEST(GpuBatchNormOnePass, MatchesCpuOnAwkwardShapes) {
  CNN_REQUIRE_GPU();
  for (int n : {1, 3, 128})
    for (int c : {1, 3, 32, 128})
      for (int64_t hw : {int64_t(1), int64_t(7 * 7), int64_t(13 * 11), int64_t(28 * 28)}) {
        if (int64_t(n) * hw < 2) continue;  // training needs two values a channel
        const int64_t values = int64_t(n) * c * hw;
        if (test::light_sweeps() && values > (int64_t(1) << 21)) continue;
        check_shape(BatchNormShape{n, c, hw}, values <= (int64_t(1) << 21));
      }
}

// A channel of kBnOnePassMaxValues values (clusters of 16 blocks, 32 values a thread) in one
// launch, aligned (16-byte loads) and odd (scalar loads); one value more falls back to the
// three-launch passes, bit for bit.
TEST(GpuBatchNormOnePass, AtThePlansLimitAndPastIt) {
  CNN_REQUIRE_GPU();
  check_shape(BatchNormShape{1, 2, kBnOnePassMaxValues}, true);
  check_shape(BatchNormShape{2, 3, kBnOnePassMaxValues / 2}, false);
  check_shape(BatchNormShape{127, 2, 1031}, false);  // M = 130937: odd, the 16-cluster
  for (const BatchNormShape& s :
       {BatchNormShape{1, 2, kBnOnePassMaxValues + 1}, BatchNormShape{129, 3, 32 * 32}}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " (N, C, HW) = (" << s.n << ", " << s.c
                                      << ", " << s.hw << ")");
    EXPECT_FALSE(batchnorm_one_pass_available(s));
    const Inputs in = make_inputs(s, seed);
    BatchNormLaunch one, two;
    two.one_pass = false;
    for (const Case& k : {Case{false, false, Mask::None}, Case{true, true, Mask::Read}})
      expect_same_bits(run_cuda(in, k, one), run_cuda(in, k, two), "past the limit");
  }
}

// The zoo's BatchNorm shapes (ResNet on Fashion-MNIST, VGG on CIFAR at batch 128) run in one
// launch and agree with the three-launch passes.
TEST(GpuBatchNormOnePass, ZooShapesRunInOneLaunch) {
  CNN_REQUIRE_GPU();
  const int n = test::light_sweeps() ? 16 : 128;
  for (const BatchNormShape& s : {BatchNormShape{n, 32, 28 * 28}, BatchNormShape{n, 64, 14 * 14},
                                  BatchNormShape{n, 128, 7 * 7}, BatchNormShape{n, 64, 32 * 32},
                                  BatchNormShape{n, 128, 16 * 16}, BatchNormShape{n, 256, 8 * 8}})
    check_shape(s, false);
}
#endif  // CNN_HAVE_CUDA
