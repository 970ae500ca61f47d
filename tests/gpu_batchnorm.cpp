// Batch-norm CUDA kernels against the CPU reference: batch 1, C = 1/3/17, odd H*W, BatchNorm1d
// shapes (H*W = 1), H*W % 4 != 0 and == 0 (scalar and 16-byte loads), long planes, a large-mean
// input (the variance must not cancel), many splits per channel; NaN-poisoned outputs; the
// training pass bitwise repeatable, and the same bits from unaligned pointers; eval; the batch-1
// refusal; the fused ReLU (forward and masked backward) against the CPU twin and, bitwise, against
// the separate pass; the elementwise grid capped so that its blocks loop, bitwise. Through
// batchnorm_forward_train / batchnorm_backward the shapes that fit run the one-launch cluster
// passes (CNN_BN_ONE_PASS, the default; tests/gpu_batchnorm_one_pass.cpp tests them on their own);
// the tests of the three-launch passes' launch options turn it off.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/norm/batchnorm.h"
#include "kernels/norm/batchnorm_cuda.h"
#include "kernels/pointwise/add.h"
#include "kernels/pointwise/relu.h"
#include "runtime/error.h"
#include "runtime/memory.h"
#include "tests/batchnorm_test_check.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

using Outputs = test::BatchNormOutputs;
using test::expect_same_bits;

struct Inputs {
  BatchNormShape s;
  std::vector<float> x, gamma, beta, dy, rm, rv, dgamma, dbeta;
};

// Training arguments with torch's momentum and eps (BatchNormTrainArgs' defaults) and these
// running buffers.
BatchNormTrainArgs train_args(float* running_mean, float* running_var, float* num_batches) {
  BatchNormTrainArgs a;
  a.running_mean = running_mean;
  a.running_var = running_var;
  a.num_batches = num_batches;
  return a;
}

Inputs make_inputs(const BatchNormShape& s, uint64_t seed, float offset) {
  Inputs in;
  in.s = s;
  const size_t n = size_t(s.n) * size_t(s.c) * size_t(s.hw), c = size_t(s.c);
  in.x = test::random_vector(n, seed, offset - 2.f, offset + 2.f);
  in.gamma = test::random_vector(c, seed + 1, 0.5f, 1.5f);
  in.beta = test::random_vector(c, seed + 2);
  in.dy = test::random_vector(n, seed + 3);
  in.rm = test::random_vector(c, seed + 4);
  in.rv = test::random_vector(c, seed + 5, 0.5f, 2.f);
  in.dgamma = test::random_vector(c, seed + 6);  // gradients accumulate onto these
  in.dbeta = test::random_vector(c, seed + 7);
  return in;
}

Outputs run_cpu(const Inputs& in) {
  const BatchNormShape& s = in.s;
  Outputs o = test::outputs_before(s, in.rm, in.rv, in.dgamma, in.dbeta);
  const BatchNormTrainArgs a = test::train_args_into(o);
  batchnorm_forward_train_cpu(s, in.x.data(), in.gamma.data(), in.beta.data(), o.y.data(),
                              o.mean.data(), o.invstd.data(), a);
  batchnorm_backward_cpu(s, in.x.data(), in.dy.data(), in.gamma.data(), o.mean.data(),
                         o.invstd.data(), o.dx.data(), o.dgamma.data(), o.dbeta.data());
  return o;
}

// Values of v after `offset` leading zeros: a device copy whose data starts `offset` floats into
// the allocation, 4 * offset bytes past its 16-byte alignment.
std::vector<float> shifted(const std::vector<float>& v, size_t offset) {
  std::vector<float> out(offset, 0.f);
  out.insert(out.end(), v.begin(), v.end());
  return out;
}

// offset > 0: x, dy, y and dx start `offset` floats into their allocations (not 16-byte aligned
// for offset % 4 != 0), which sends every pass down the scalar-load path.
Outputs run_cuda(const Inputs& in, bool deterministic, size_t offset = 0) {
  const BatchNormShape& s = in.s;
  Exec ex;
  ex.device = Device::CUDA;
  ex.deterministic = deterministic;
  const size_t n = in.x.size(), c = size_t(s.c);
  Tensor x = test::to_device(shifted(in.x, offset)), gamma = test::to_device(in.gamma),
         beta = test::to_device(in.beta), dy = test::to_device(shifted(in.dy, offset)),
         rm = test::to_device(in.rm), rv = test::to_device(in.rv),
         dgamma = test::to_device(in.dgamma), dbeta = test::to_device(in.dbeta),
         count = test::to_device({5.f});
  Buffer<float> y_mem(n + offset, Device::CUDA), dx_mem(n + offset, Device::CUDA),
      mean(c, Device::CUDA), invstd(c, Device::CUDA);
  float *y = y_mem.data() + offset, *dx = dx_mem.data() + offset;
  const float *x_at = x.data() + offset, *dy_at = dy.data() + offset;
  Buffer<double> scratch(size_t(batchnorm_scratch_doubles(s, Device::CUDA)), Device::CUDA);
  test::poison_device(y, n);
  test::poison_device(dx, n);
  test::poison_device(mean.data(), c);
  test::poison_device(invstd.data(), c);
  const BatchNormTrainArgs a = train_args(rm.data(), rv.data(), count.data());
  batchnorm_forward_train(s, x_at, gamma.data(), beta.data(), y, mean.data(), invstd.data(), a,
                          scratch.data(), ex);
  batchnorm_backward(s, x_at, dy_at, gamma.data(), mean.data(), invstd.data(), dx, dgamma.data(),
                     dbeta.data(), scratch.data(), ex);
  Outputs o;
  o.y = test::to_host(y, n);
  o.dx = test::to_host(dx, n);
  o.mean = test::to_host(mean.data(), c);
  o.invstd = test::to_host(invstd.data(), c);
  o.rm = test::to_host(rm.data(), c);
  o.rv = test::to_host(rv.data(), c);
  o.count = test::to_host(count.data(), 1);
  o.dgamma = test::to_host(dgamma.data(), c);
  o.dbeta = test::to_host(dbeta.data(), c);
  return o;
}

void check_shape(const BatchNormShape& s, float offset) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (N, C, HW) = (" << s.n << ", " << s.c
                                    << ", " << s.hw << ") offset " << offset);
  const Inputs in = make_inputs(s, seed, offset);
  const Outputs ref = run_cpu(in), got = run_cuda(in, false);
  test::expect_close(s, in.gamma, in.dy, got, ref, 1e-3, "batchnorm");
  // The reductions run in a fixed order in every mode: two runs give the same bits.
  expect_same_bits(got, run_cuda(in, true), "deterministic run");
}

}  // namespace

TEST(GpuBatchNorm, TrainingMatchesCpuOnAwkwardShapes) {
  CNN_REQUIRE_GPU();
  for (const BatchNormShape& s :
       {BatchNormShape{1, 3, 7}, BatchNormShape{1, 17, 33 * 31}, BatchNormShape{2, 17, 1},
        BatchNormShape{5, 1, 1}, BatchNormShape{3, 1, 4001}, BatchNormShape{128, 16, 28 * 28},
        BatchNormShape{7, 600, 1}, BatchNormShape{64, 3, 32 * 32},
        // The 4-value groups: N = C = 1 with HW = 2 (one short group), HW = 4 (one 16-byte group
        // per plane), HW % 4 == 2, the zoo's odd 7x7 and its 14x14, a large batch.
        BatchNormShape{1, 1, 2}, BatchNormShape{2, 5, 4}, BatchNormShape{3, 7, 6},
        BatchNormShape{9, 13, 7 * 7}, BatchNormShape{5, 11, 14 * 14}, BatchNormShape{512, 3, 64}})
    check_shape(s, 0.f);
  // Large N * HW: planes longer than one block's round (cut along y in the elementwise passes,
  // split inside planes in the sums), odd (scalar loads) and aligned (16-byte loads), and a
  // VGG stage-1 shape at a smaller batch.
  if (!test::light_sweeps())
    for (const BatchNormShape& s : {BatchNormShape{2, 3, 250001}, BatchNormShape{1, 2, 1 << 20},
                                    BatchNormShape{32, 64, 32 * 32}})
      check_shape(s, 0.f);
  // A large mean against a small spread: sum-of-squares variance in float would cancel. The sums
  // are of x - x[0, c, 0]; HW = 256 takes the 16-byte path.
  check_shape(BatchNormShape{16, 5, 15 * 15}, 100.f);
  check_shape(BatchNormShape{16, 4, 16 * 16}, 100.f);
}

// The scalar path (pointers 4, 8 or 12 bytes past 16-byte alignment) adds the same 4-value groups
// in the same order as the 16-byte path: the alignment changes the speed, never the bits.
TEST(GpuBatchNorm, UnalignedPointersGiveTheAlignedBits) {
  CNN_REQUIRE_GPU();
  for (const BatchNormShape& s : {BatchNormShape{6, 5, 16 * 16}, BatchNormShape{3, 7, 4},
                                  BatchNormShape{2, 3, 1 << 16}, BatchNormShape{4, 3, 7 * 7}}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " (N, C, HW) = (" << s.n << ", " << s.c
                                      << ", " << s.hw << ")");
    const Inputs in = make_inputs(s, seed, 0.f);
    const Outputs aligned = run_cuda(in, false);
    for (size_t offset : {1, 2, 3}) {
      SCOPED_TRACE("offset " + std::to_string(offset) + " floats");
      const Outputs moved = run_cuda(in, false, offset);
      EXPECT_FALSE(test::any_nan(moved.y));
      EXPECT_FALSE(test::any_nan(moved.dx));
      expect_same_bits(aligned, moved, "unaligned against aligned");
    }
  }
}

// Two runs on the zoo's shapes (VGG's three stages at batch 128, a ResNet 7x7 stage) give the
// same bits: the split of the sums depends on the shape alone, never on scheduling.
TEST(GpuBatchNorm, TrainingIsBitwiseRepeatable) {
  CNN_REQUIRE_GPU();
  const int n = test::light_sweeps() ? 8 : 128;
  for (const BatchNormShape& s : {BatchNormShape{n, 64, 32 * 32}, BatchNormShape{n, 128, 16 * 16},
                                  BatchNormShape{n, 256, 8 * 8}, BatchNormShape{n, 512, 7 * 7}}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " (N, C, HW) = (" << s.n << ", " << s.c
                                      << ", " << s.hw << ")");
    const Inputs in = make_inputs(s, seed, 0.5f);
    const Outputs a = run_cuda(in, false), b = run_cuda(in, false);
    EXPECT_FALSE(test::any_nan(a.y));
    EXPECT_FALSE(test::any_nan(a.dx));
    expect_same_bits(a, b, "second run");
  }
}

TEST(GpuBatchNorm, EvalMatchesCpu) {
  CNN_REQUIRE_GPU();
  for (const BatchNormShape& s :
       {BatchNormShape{1, 3, 7}, BatchNormShape{1, 17, 1}, BatchNormShape{9, 5, 13 * 11},
        BatchNormShape{1, 1, 1}, BatchNormShape{2, 5, 4}, BatchNormShape{4, 6, 16 * 16},
        BatchNormShape{3, 4, 7 * 7}, BatchNormShape{2, 3, 100003}}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Inputs in = make_inputs(s, seed, 0.f);
    std::vector<float> ref(in.x.size());
    batchnorm_forward_eval_cpu(s, in.x.data(), in.gamma.data(), in.beta.data(), in.rm.data(),
                               in.rv.data(), 1e-5f, ref.data());
    Exec ex;
    ex.device = Device::CUDA;
    Tensor x = test::to_device(in.x), g = test::to_device(in.gamma), b = test::to_device(in.beta),
           rm = test::to_device(in.rm), rv = test::to_device(in.rv);
    Buffer<float> y(in.x.size(), Device::CUDA);
    test::poison_device(y.data(), in.x.size());
    batchnorm_forward_eval(s, x.data(), g.data(), b.data(), rm.data(), rv.data(), 1e-5f, y.data(),
                           ex);
    const std::vector<float> got = test::to_host(y.data(), in.x.size());
    double scale = 0;  // near-zero outputs against the tensor's scale, as in check_shape
    for (float v : ref) scale = std::max(scale, double(std::fabs(v)));
    EXPECT_LT(test::max_rel_error(got, ref, 0.1 * scale), 1e-5);
  }
}

TEST(GpuBatchNorm, TrainingRefusesOneValuePerChannel) {
  CNN_REQUIRE_GPU();
  Exec ex;
  ex.device = Device::CUDA;
  Tensor v = test::to_device(std::vector<float>(8, 1.f));
  Buffer<double> scratch(64, Device::CUDA);
  EXPECT_THROW(batchnorm_forward_train({1, 8, 1}, v.data(), v.data(), v.data(), v.data(), v.data(),
                                       v.data(), BatchNormTrainArgs{}, scratch.data(), ex),
               Error);
}

namespace {

// One training forward and backward on the device with the ReLU fused (fused) or as the separate
// relu kernels (apart). relu_y: the post-ReLU output that masks dy; the same one for both, and
// for the CPU twin, so that a value within rounding of 0 cannot give them different masks.
struct ReluRun {
  std::vector<float> y, dx, dgamma, dbeta, dy_after;
};

ReluRun run_cuda_relu(const Inputs& in, const std::vector<float>& relu_y, bool fused) {
  const BatchNormShape& s = in.s;
  Exec ex;
  ex.device = Device::CUDA;
  const size_t n = in.x.size(), c = size_t(s.c);
  Tensor x = test::to_device(in.x), gamma = test::to_device(in.gamma),
         beta = test::to_device(in.beta), dy = test::to_device(in.dy),
         d_relu_y = test::to_device(relu_y), dgamma = test::to_device(in.dgamma),
         dbeta = test::to_device(in.dbeta);
  Buffer<float> y(n, Device::CUDA), dx(n, Device::CUDA), masked(n, Device::CUDA),
      mean(c, Device::CUDA), invstd(c, Device::CUDA);
  Buffer<double> scratch(size_t(batchnorm_scratch_doubles(s, Device::CUDA)), Device::CUDA);
  test::poison_device(y.data(), n);
  test::poison_device(dx.data(), n);
  batchnorm_forward_train(s, x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                          invstd.data(), BatchNormTrainArgs{}, scratch.data(), ex, fused);
  if (!fused) relu_forward(int64_t(n), y.data(), y.data(), ex);
  if (fused) {
    batchnorm_backward(s, x.data(), dy.data(), gamma.data(), mean.data(), invstd.data(), dx.data(),
                       dgamma.data(), dbeta.data(), scratch.data(), ex, d_relu_y.data());
  } else {
    relu_backward(int64_t(n), d_relu_y.data(), dy.data(), masked.data(), ex);
    batchnorm_backward(s, x.data(), masked.data(), gamma.data(), mean.data(), invstd.data(),
                       dx.data(), dgamma.data(), dbeta.data(), scratch.data(), ex);
  }
  ReluRun r;
  r.y = test::to_host(y.data(), n);
  r.dx = test::to_host(dx.data(), n);
  r.dgamma = test::to_host(dgamma.data(), c);
  r.dbeta = test::to_host(dbeta.data(), c);
  r.dy_after = test::to_host(dy.data(), n);
  return r;
}

// Relative error with near-zero elements measured against a tenth of the largest value of
// `scale_of` (by default the reference itself), as check_shape does.
double scaled_error(const std::vector<float>& got, const std::vector<float>& ref,
                    const std::vector<float>* scale_of = nullptr) {
  double scale = 0;
  for (float v : scale_of ? *scale_of : ref) scale = std::max(scale, double(std::fabs(v)));
  return test::max_rel_error(got, ref, 0.1 * scale);
}

void check_fused_relu(const BatchNormShape& s) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (N, C, HW) = (" << s.n << ", " << s.c
                                    << ", " << s.hw << ")");
  const Inputs in = make_inputs(s, seed, 0.f);
  const size_t n = in.x.size(), c = size_t(s.c);

  // Eval (any batch, 1 included): fused against the CPU twin and against eval + relu_forward.
  {
    std::vector<float> ref(n), ref_linear(n);
    batchnorm_forward_eval_cpu(s, in.x.data(), in.gamma.data(), in.beta.data(), in.rm.data(),
                               in.rv.data(), 1e-5f, ref.data(), true);
    // The error scale is the normalized values before the ReLU: the kernel's rounding is relative
    // to them (x * scale + shift, folded), and the ReLU can leave only small outputs of a
    // channel (with C = 1, a seed once left 1.7e-5 against the clipped tensor's largest value).
    batchnorm_forward_eval_cpu(s, in.x.data(), in.gamma.data(), in.beta.data(), in.rm.data(),
                               in.rv.data(), 1e-5f, ref_linear.data(), false);
    Exec ex;
    ex.device = Device::CUDA;
    Tensor x = test::to_device(in.x), g = test::to_device(in.gamma), b = test::to_device(in.beta),
           rm = test::to_device(in.rm), rv = test::to_device(in.rv);
    Buffer<float> fused(n, Device::CUDA), apart(n, Device::CUDA);
    test::poison_device(fused.data(), n);
    test::poison_device(apart.data(), n);
    batchnorm_forward_eval(s, x.data(), g.data(), b.data(), rm.data(), rv.data(), 1e-5f,
                           fused.data(), ex, true);
    batchnorm_forward_eval(s, x.data(), g.data(), b.data(), rm.data(), rv.data(), 1e-5f,
                           apart.data(), ex);
    relu_forward(int64_t(n), apart.data(), apart.data(), ex);
    const std::vector<float> got = test::to_host(fused.data(), n);
    EXPECT_FALSE(test::any_nan(got));
    EXPECT_LT(scaled_error(got, ref, &ref_linear), 1e-5) << "eval y";
    EXPECT_EQ(got, test::to_host(apart.data(), n)) << "eval y: fused and apart differ";
  }
  if (s.count() < 2) return;  // training needs two values per channel

  // Training: the CPU twin, fused.
  std::vector<float> ref_y(n), mean(c), invstd(c), ref_dx(n);
  std::vector<float> ref_dgamma = in.dgamma, ref_dbeta = in.dbeta;
  batchnorm_forward_train_cpu(s, in.x.data(), in.gamma.data(), in.beta.data(), ref_y.data(),
                              mean.data(), invstd.data(), BatchNormTrainArgs{}, true);
  batchnorm_backward_cpu(s, in.x.data(), in.dy.data(), in.gamma.data(), mean.data(), invstd.data(),
                         ref_dx.data(), ref_dgamma.data(), ref_dbeta.data(), ref_y.data());
  const ReluRun fused = run_cuda_relu(in, ref_y, true);
  const ReluRun apart = run_cuda_relu(in, ref_y, false);
  const std::vector<
      std::pair<const char*, std::pair<const std::vector<float>*, const std::vector<float>*>>>
      pairs = {{"y", {&fused.y, &ref_y}},
               {"dx", {&fused.dx, &ref_dx}},
               {"dgamma", {&fused.dgamma, &ref_dgamma}},
               {"dbeta", {&fused.dbeta, &ref_dbeta}}};
  for (const auto& [what, p] : pairs) {
    EXPECT_FALSE(test::any_nan(*p.first)) << what;
    const double e = scaled_error(*p.first, *p.second);
    std::printf("batchnorm+relu (%d, %d, %lld) %s: rel error %.3g\n", s.n, s.c, (long long)s.hw,
                what, e);
    EXPECT_LT(e, 1e-3) << what;
  }
  // The fused kernels run the separate pass's float operations on the same values.
  EXPECT_EQ(fused.y, apart.y);
  EXPECT_EQ(fused.dx, apart.dx);
  EXPECT_EQ(fused.dgamma, apart.dgamma);
  EXPECT_EQ(fused.dbeta, apart.dbeta);
  EXPECT_EQ(fused.dy_after, in.dy) << "the fused backward must not write dy";
}

}  // namespace

TEST(GpuBatchNorm, FusedReluMatchesCpuAndTheSeparatePass) {
  CNN_REQUIRE_GPU();
  for (int n : {1, 3})
    for (int c : {1, 3, 65})
      for (int64_t hw : {int64_t(1), int64_t(7 * 7), int64_t(8 * 8), int64_t(33 * 33)})
        check_fused_relu(BatchNormShape{n, c, hw});
  // Many splits per channel (a VGG stage's shape at a small batch).
  check_fused_relu(BatchNormShape{8, 64, 32 * 32});
}

#ifdef CNN_HAVE_CUDA  // the CUDA launchers the tests below call directly
namespace {

// The device state of one layer's training: its parameters, buffers, saved statistics and the
// gradients it accumulates.
struct TrainState {
  Tensor gamma, beta, rm, rv, count, dgamma, dbeta;
  Buffer<float> mean, invstd;
  Buffer<double> scratch;
};

TrainState make_state(const Inputs& in) {
  const size_t c = size_t(in.s.c);
  return {test::to_device(in.gamma),
          test::to_device(in.beta),
          test::to_device(in.rm),
          test::to_device(in.rv),
          test::to_device({5.f}),
          test::to_device(in.dgamma),
          test::to_device(in.dbeta),
          Buffer<float>(c, Device::CUDA),
          Buffer<float>(c, Device::CUDA),
          Buffer<double>(size_t(batchnorm_scratch_doubles(in.s, Device::CUDA)), Device::CUDA)};
}

// One training step through the CUDA launchers as `launch` says: forward of x into y (relu: the
// fused ReLU, whose y then masks dy; recompute: the backward recomputes that mask from x and
// beta instead of reading y), backward into dx (null: dgamma and dbeta only).
void train_step(const BatchNormShape& s, const BatchNormLaunch& launch, bool relu, const float* x,
                const float* dy, float* y, float* dx, TrainState& t, bool recompute = false) {
  const BatchNormTrainArgs a = train_args(t.rm.data(), t.rv.data(), t.count.data());
  batchnorm_forward_train_cuda(s, x, t.gamma.data(), t.beta.data(), y, relu, nullptr, t.mean.data(),
                               t.invstd.data(), a, t.scratch.data(), nullptr, launch);
  batchnorm_backward_cuda(s, x, dy, relu ? y : nullptr, relu && recompute ? t.beta.data() : nullptr,
                          t.gamma.data(), t.mean.data(), t.invstd.data(), dx, t.dgamma.data(),
                          t.dbeta.data(), t.scratch.data(), nullptr, launch);
}

// Two training steps (the second on other x and dy): every output of each, with the running
// statistics, the batch count and the accumulated dgamma / dbeta after both.
std::vector<Outputs> run_two_steps(const Inputs& first, const Inputs& second,
                                   const BatchNormLaunch& launch, bool relu, bool with_dx,
                                   bool recompute = false) {
  const BatchNormShape& s = first.s;
  const size_t n = first.x.size(), c = size_t(s.c);
  TrainState t = make_state(first);
  std::vector<Outputs> out;
  for (const Inputs* in : {&first, &second}) {
    Tensor x = test::to_device(in->x), dy = test::to_device(in->dy);
    Buffer<float> y(n, Device::CUDA), dx(n, Device::CUDA);
    test::poison_device(y.data(), n);
    test::poison_device(dx.data(), n);
    test::poison_device(t.mean.data(), c);
    test::poison_device(t.invstd.data(), c);
    train_step(s, launch, relu, x.data(), dy.data(), y.data(), with_dx ? dx.data() : nullptr, t,
               recompute);
    Outputs o;
    o.y = test::to_host(y.data(), n);
    if (with_dx) o.dx = test::to_host(dx.data(), n);
    o.mean = test::to_host(t.mean.data(), c);
    o.invstd = test::to_host(t.invstd.data(), c);
    o.rm = test::to_host(t.rm.data(), c);
    o.rv = test::to_host(t.rv.data(), c);
    o.count = test::to_host(t.count.data(), 1);
    o.dgamma = test::to_host(t.dgamma.data(), c);
    o.dbeta = test::to_host(t.dbeta.data(), c);
    out.push_back(std::move(o));
  }
  return out;
}

void check_grid_caps(const BatchNormShape& s) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (N, C, HW) = (" << s.n << ", " << s.c
                                    << ", " << s.hw << ") splits " << batchnorm_splits(s));
  const Inputs first = make_inputs(s, seed, 0.5f), second = make_inputs(s, seed + 100, -1.f);
  BatchNormLaunch full, chunks, capped;
  for (BatchNormLaunch* l : {&full, &chunks, &capped}) l->one_pass = false;
  // Two blocks along y: a block of a long plane loops over its chunks.
  chunks.max_grid_y = 2;
  // Three blocks along x too: blocks loop over rounds of planes (their channels wrapping past C).
  capped.max_grid_x = 3;
  capped.max_grid_y = 2;
  for (bool relu : {false, true})
    for (bool with_dx : {true, false}) {
      SCOPED_TRACE(::testing::Message()
                   << (relu ? "fused relu" : "no relu") << (with_dx ? "" : ", no dx"));
      const std::vector<Outputs> want = run_two_steps(first, second, full, relu, with_dx);
      for (const Outputs& o : want) {
        EXPECT_FALSE(test::any_nan(o.y));
        EXPECT_FALSE(test::any_nan(o.dx));
        EXPECT_FALSE(test::any_nan(o.rv));
      }
      EXPECT_EQ(want[1].count, std::vector<float>{7.f}) << "two steps count two batches";
      for (const BatchNormLaunch* l : {&full, &chunks, &capped})
        for (bool recompute : {false, true}) {
          if (l == &full && !recompute) continue;  // that is `want`
          if (recompute && !relu) continue;        // no mask to recompute
          SCOPED_TRACE(::testing::Message() << (l == &full     ? "full grid"
                                                : l == &chunks ? "grid y capped"
                                                               : "grid x and y capped")
                                            << (recompute ? ", mask recomputed" : ""));
          const std::vector<Outputs> got =
              run_two_steps(first, second, *l, relu, with_dx, recompute);
          expect_same_bits(got[0], want[0], "first step");
          expect_same_bits(got[1], want[1], "second step");
        }
    }
}

}  // namespace

// The elementwise passes give the same bits whether their blocks cover the planes in one round or
// loop over planes and chunks, and the fused ReLU's mask recomputed from x and beta is the
// forward's y > 0, so every output keeps its bits: one to many partials a channel (a warp's lanes
// looping past 32), H*W = 1, 2, 7x7, odd C, N = 1 and 512, 16-byte and scalar loads, long planes
// in chunks.
TEST(GpuBatchNorm, CappedGridGivesTheSameBits) {
  CNN_REQUIRE_GPU();
  for (const BatchNormShape& s :
       {BatchNormShape{1, 3, 7}, BatchNormShape{2, 17, 1}, BatchNormShape{5, 1, 1},
        BatchNormShape{7, 600, 1}, BatchNormShape{1, 1, 2}, BatchNormShape{2, 5, 4},
        BatchNormShape{3, 7, 6}, BatchNormShape{9, 13, 7 * 7}, BatchNormShape{3, 1, 4001},
        BatchNormShape{1, 17, 33 * 31}, BatchNormShape{512, 3, 64}, BatchNormShape{64, 3, 32 * 32},
        BatchNormShape{10, 4, 1000}, BatchNormShape{20, 6, 1000}, BatchNormShape{128, 16, 28 * 28},
        BatchNormShape{2, 3, 20001}, BatchNormShape{2, 3, 1 << 14}, BatchNormShape{33, 300, 4}})
    check_grid_caps(s);
  const int n = test::light_sweeps() ? 16 : 128;
  for (const BatchNormShape& s : {BatchNormShape{n, 256, 8 * 8}, BatchNormShape{n, 512, 4 * 4},
                                  BatchNormShape{n, 512, 7 * 7}})
    check_grid_caps(s);
  if (!test::light_sweeps())
    for (const BatchNormShape& s : {BatchNormShape{2, 3, 250001}, BatchNormShape{1, 2, 1 << 20},
                                    BatchNormShape{32, 64, 32 * 32}})
      check_grid_caps(s);
}

// The forward's shift K (each channel's first value) is kept in the scratch by the sums, so y may
// overwrite x: in place gives the out-of-place bits, in three launches and in one (which reads
// every value, and K, before any block writes).
TEST(GpuBatchNorm, TrainingForwardInPlaceGivesTheSameBits) {
  CNN_REQUIRE_GPU();
  for (const BatchNormShape& s : {BatchNormShape{9, 13, 7 * 7}, BatchNormShape{7, 600, 1},
                                  BatchNormShape{4, 6, 16 * 16}, BatchNormShape{2, 3, 20001}}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " (N, C, HW) = (" << s.n << ", " << s.c
                                      << ", " << s.hw << ")");
    const Inputs in = make_inputs(s, seed, 0.5f);
    const size_t n = in.x.size(), c = size_t(s.c);
    for (bool one_pass : {false, true}) {
      SCOPED_TRACE(one_pass ? "one launch" : "three launches");
      BatchNormLaunch l;
      l.one_pass = one_pass;
      BatchNormTrainArgs a;
      TrainState apart = make_state(in), inplace = make_state(in);
      Tensor x = test::to_device(in.x), xy = test::to_device(in.x);
      Buffer<float> y(n, Device::CUDA);
      batchnorm_forward_train_cuda(s, x.data(), apart.gamma.data(), apart.beta.data(), y.data(),
                                   false, nullptr, apart.mean.data(), apart.invstd.data(), a,
                                   apart.scratch.data(), nullptr, l);
      batchnorm_forward_train_cuda(s, xy.data(), inplace.gamma.data(), inplace.beta.data(),
                                   xy.data(), false, nullptr, inplace.mean.data(),
                                   inplace.invstd.data(), a, inplace.scratch.data(), nullptr, l);
      EXPECT_EQ(test::to_host(xy.data(), n), test::to_host(y.data(), n));
      EXPECT_EQ(test::to_host(inplace.mean.data(), c), test::to_host(apart.mean.data(), c));
      EXPECT_EQ(test::to_host(inplace.invstd.data(), c), test::to_host(apart.invstd.data(), c));
    }
  }
}

// A residual add in the normalizing pass (training in three launches and in one; eval), with and
// without the ReLU after it: the bits of the normalize, add and relu passes run apart, on
// 16-byte and scalar paths (a residual 1 float past alignment takes the scalar path alone).
TEST(GpuBatchNorm, ResidualAddGivesTheSeparatePassBits) {
  CNN_REQUIRE_GPU();
  Exec ex;
  ex.device = Device::CUDA;
  for (const BatchNormShape& s :
       {BatchNormShape{2, 17, 1}, BatchNormShape{3, 7, 6}, BatchNormShape{9, 13, 7 * 7},
        BatchNormShape{16, 32, 28 * 28}, BatchNormShape{8, 64, 14 * 14},
        BatchNormShape{5, 128, 7 * 7}, BatchNormShape{2, 3, 20001}})
    for (int res_offset : {0, 1}) {
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(::testing::Message()
                   << "seed " << seed << " (N, C, HW) = (" << s.n << ", " << s.c << ", " << s.hw
                   << ") residual offset " << res_offset);
      const Inputs in = make_inputs(s, seed, 0.5f);
      const size_t n = in.x.size();
      const std::vector<float> res = test::random_vector(n, seed + 50);
      Tensor x = test::to_device(in.x), r = test::to_device(shifted(res, size_t(res_offset)));
      const float* d_res = r.data() + res_offset;
      Buffer<float> apart(n, Device::CUDA), fused(n, Device::CUDA);
      // training in three launches, eval, training in one launch
      for (int mode = 0; mode < 3; ++mode)
        for (bool relu : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "mode " << mode << " relu " << relu);
          test::poison_device(fused.data(), n);
          const auto forward = [&](float* y, bool relu_in, const float* residual) {
            TrainState t = make_state(in);
            if (mode == 1) {
              batchnorm_forward_eval(s, x.data(), t.gamma.data(), t.beta.data(), t.rm.data(),
                                     t.rv.data(), 1e-5f, y, ex, relu_in, residual);
              return;
            }
            BatchNormLaunch l;
            l.one_pass = mode == 2;
            BatchNormTrainArgs a;
            batchnorm_forward_train_cuda(s, x.data(), t.gamma.data(), t.beta.data(), y, relu_in,
                                         residual, t.mean.data(), t.invstd.data(), a,
                                         t.scratch.data(), nullptr, l);
          };
          forward(apart.data(), false, nullptr);
          add_forward(int64_t(n), apart.data(), d_res, apart.data(), ex);
          if (relu) relu_forward(int64_t(n), apart.data(), apart.data(), ex);
          forward(fused.data(), relu, d_res);
          const std::vector<float> want = test::to_host(apart.data(), n);
          EXPECT_FALSE(test::any_nan(want));
          EXPECT_EQ(test::to_host(fused.data(), n), want);
        }
    }
}
#endif  // CNN_HAVE_CUDA
