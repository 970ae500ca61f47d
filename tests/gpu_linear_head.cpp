// The fused linear-head backward (kernels/gemm/linear_head.h) against its CPU twin on awkward
// shapes (batch 1, 3, 7, 129, 257; 1, 7, 1023, 1030 inputs; 1, 2, 10, 17 and 32 outputs), with
// and without bias, input gradient, ReLU mask and the bias gradient of the layer before, atomic
// and deterministic; the mask's bits against relu_backward's, NaN included; the folded bias
// gradient's bits against the pass it replaces (db_colsum); every row split against the twin;
// and a network whose heads run it against the same network on separate passes and on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/gemm/linear.h"
#include "kernels/gemm/linear_head.h"
#include "kernels/gemm/linear_head_cuda.h"
#include "kernels/pointwise/relu.h"
#include "layers/network.h"
#include "runtime/memory.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

// max_i |got_i - ref_i| / mag_i, mag the same sums over the terms' absolute values: a float
// sum's rounding is bounded relative to its terms' magnitudes, not to its (possibly cancelling)
// result (a single db of 257 terms may sum to nearly 0). NaN: infinite.
double bounded_error(const std::vector<float>& got, const std::vector<float>& ref,
                     const std::vector<float>& mag) {
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    worst = std::max(worst, std::fabs(double(got[i]) - ref[i]) / std::max(1e-30, double(mag[i])));
  }
  return worst;
}

std::vector<float> abs_of(std::vector<float> v) {
  for (float& e : v) e = std::fabs(e);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// FP32 sums of at most a few hundred products against the twin's double sums, relative to the
// terms' magnitudes (the worst case bound is terms x 2^-24; random errors grow as its root).
constexpr double kTol = 1e-5;

Exec cuda_exec(bool deterministic) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.deterministic = deterministic;
  return ex;
}

// One shape's inputs on the host and the device, and the twin's results for them.
struct Case {
  LinearShape s;
  std::vector<float> x, dy, w, dw0, db0;  // (N, IN), (N, OUT), (OUT, IN), (OUT, IN), (OUT)
  std::vector<float> input_db0;           // (IN): the bias gradient of the layer before
  std::vector<float> dw_ref, db_ref, dx_ref, dx_masked_ref, input_db_ref;
  // The twin on absolute values: the error scale.
  std::vector<float> dw_mag, db_mag, dx_mag, input_db_mag;
  Tensor d_x, d_dy, d_w;

  Case(const LinearShape& shape, uint64_t seed) : s(shape) {
    const size_t nx = size_t(s.n) * s.in, nw = size_t(s.out) * s.in;
    x = test::random_vector(nx, seed);  // about half <= 0: the mask has work
    dy = test::random_vector(size_t(s.n) * s.out, seed + 1);
    w = test::random_vector(nw, seed + 2);
    dw0 = test::random_vector(nw, seed + 3);
    db0 = test::random_vector(size_t(s.out), seed + 4);
    input_db0 = test::random_vector(size_t(s.in), seed + 5);
    dw_ref = dw0;
    db_ref = db0;
    dx_ref.resize(nx);
    linear_head_backward_cpu(s, x.data(), dy.data(), w.data(), dw_ref.data(), db_ref.data(),
                             dx_ref.data(), false, nullptr);
    std::vector<float> dw_again = dw0;
    dx_masked_ref.resize(nx);
    input_db_ref = input_db0;
    linear_head_backward_cpu(s, x.data(), dy.data(), w.data(), dw_again.data(), nullptr,
                             dx_masked_ref.data(), true, input_db_ref.data());
    dw_mag = abs_of(dw0);
    db_mag = abs_of(db0);
    dx_mag.resize(nx);
    linear_head_backward_cpu(s, abs_of(x).data(), abs_of(dy).data(), abs_of(w).data(),
                             dw_mag.data(), db_mag.data(), dx_mag.data(), false, nullptr);
    input_db_mag = abs_of(input_db0);
    for (size_t e = 0; e < nx; ++e) input_db_mag[e % size_t(s.in)] += dx_mag[e];
    d_x = test::to_device(x);
    d_dy = test::to_device(dy);
    d_w = test::to_device(w);
  }
};

struct Result {
  std::vector<float> dw, db, dx, input_db;
};

// One call on the GPU from dw0 / db0 / input_db0, dx poisoned first; input_db only with the
// mask; row_splits < 0: through the public API (the picked split), else the launcher with that
// split.
Result run(const Case& c, bool bias, bool want_dx, bool mask, bool deterministic,
           int row_splits = -1) {
  const size_t nx = size_t(c.s.n) * c.s.in;
  Tensor d_dw = test::to_device(c.dw0), d_db = test::to_device(c.db0);
  Tensor d_input_db = test::to_device(c.input_db0);
  Buffer<float> d_dx(nx, Device::CUDA);  // (N, IN)
  test::poison_device(d_dx.data(), nx);
  float* db = bias ? d_db.data() : nullptr;
  float* dx = want_dx ? d_dx.data() : nullptr;
  float* input_db = want_dx && mask ? d_input_db.data() : nullptr;
  if (row_splits < 0)
    linear_head_backward(c.s, c.d_x.data(), c.d_dy.data(), c.d_w.data(), d_dw.data(), db, dx, mask,
                         input_db, cuda_exec(deterministic));
  else
#ifdef CNN_HAVE_CUDA  // the launcher, called directly for its split, exists in CUDA builds only
    linear_head_backward_cuda(c.s, c.d_x.data(), c.d_dy.data(), c.d_w.data(), d_dw.data(), db, dx,
                              mask, input_db, deterministic, nullptr, row_splits);
#else
    ADD_FAILURE() << "row splits need a CUDA build";
#endif
  Result r{d_dw.to_vector(), d_db.to_vector(), {}, d_input_db.to_vector()};
  if (want_dx) r.dx = test::to_host(d_dx.data(), nx);
  return r;
}

void check(const Case& c, const Result& r, bool bias, bool want_dx, bool mask) {
  EXPECT_LT(bounded_error(r.dw, c.dw_ref, c.dw_mag), kTol) << "dw";
  if (bias) {
    EXPECT_LT(bounded_error(r.db, c.db_ref, c.db_mag), kTol) << "db";
  } else {
    EXPECT_TRUE(same_bits(r.db, c.db0)) << "db written without a bias";
  }
  if (want_dx) {
    EXPECT_LT(bounded_error(r.dx, mask ? c.dx_masked_ref : c.dx_ref, c.dx_mag), kTol) << "dx";
  }
  if (want_dx && mask) {
    EXPECT_LT(bounded_error(r.input_db, c.input_db_ref, c.input_db_mag), kTol) << "input_db";
  } else {
    EXPECT_TRUE(same_bits(r.input_db, c.input_db0)) << "input_db written without dx and mask";
  }
}

// The bias-gradient pass the fold replaces, on the GPU: input_db0 + column sums of dx (N, IN),
// as the layer before's linear_backward_weight sums them (its weight gradient, of a 1-input
// layer, thrown away).
std::vector<float> bias_grad_pass(const Case& c, const std::vector<float>& dx, bool deterministic) {
  const LinearShape s{c.s.n, 1, c.s.in};
  Tensor d_x = test::to_device(std::vector<float>(size_t(s.n), 1.f));
  Tensor d_dy = test::to_device(dx), d_db = test::to_device(c.input_db0);
  Tensor d_dw = test::to_device(std::vector<float>(size_t(s.out), 0.f));
  const Exec ex = cuda_exec(deterministic);
  Buffer<float> scratch(std::max<size_t>(1, linear_backward_weight_scratch_floats(s, ex)),
                        Device::CUDA);
  linear_backward_weight(s, d_x.data(), d_dy.data(), d_dw.data(), d_db.data(), scratch.data(),
                         Algo::Tiled, ex);
  return d_db.to_vector();
}

}  // namespace

TEST(GpuLinearHead, MatchesCpuTwinOnAwkwardShapes) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (int n : {1, 3, 7, 129, 257})
    for (int in : {1, 7, 1023, 1030})
      for (int out : {1, 2, 10, 17, kLinearHeadMaxOut}) {
        const Case c(LinearShape{n, in, out}, seed + uint64_t(n) * 7919 + in * 31 + out);
        for (bool deterministic : {false, true}) {
          Result unmasked[2];  // with and without bias
          for (bool bias : {false, true})
            for (bool mask : {false, true}) {
              SCOPED_TRACE(::testing::Message()
                           << "(N, IN, OUT) = (" << n << ", " << in << ", " << out << ")"
                           << (deterministic ? " deterministic" : " atomic")
                           << (bias ? " bias" : "") << (mask ? " mask" : ""));
              const Result r = run(c, bias, true, mask, deterministic);
              check(c, r, bias, true, mask);
              if (!mask) {
                unmasked[bias] = r;
                continue;
              }
              // The mask gives exactly relu_backward's bits on the unmasked input gradient.
              std::vector<float> want(r.dx.size());
              relu_backward_cpu(int64_t(want.size()), c.x.data(), unmasked[bias].dx.data(),
                                want.data());
              EXPECT_TRUE(same_bits(r.dx, want)) << "masked dx is not relu_backward's";
              if (deterministic) {
                const Result again = run(c, bias, true, mask, true);
                EXPECT_TRUE(same_bits(again.dw, r.dw)) << "deterministic dw differs";
                EXPECT_TRUE(same_bits(again.db, r.db)) << "deterministic db differs";
                EXPECT_TRUE(same_bits(again.dx, r.dx)) << "dx differs";
                EXPECT_TRUE(same_bits(again.input_db, r.input_db))
                    << "deterministic input_db differs";
                // One owner sums in db_colsum's order: the bits of the pass the fold replaces.
                EXPECT_TRUE(same_bits(r.input_db, bias_grad_pass(c, r.dx, true)))
                    << "input_db is not the bias-gradient pass's";
              }
            }
          // No input gradient (a first layer): the weight gradient alone.
          SCOPED_TRACE(::testing::Message()
                       << "(N, IN, OUT) = (" << n << ", " << in << ", " << out << ") no dx");
          check(c, run(c, true, false, true, deterministic), true, false, false);
        }
      }
}

// Every row split the launcher may be given, odd ones included, gives the twin's answer; one
// split is the deterministic path and gives its bits in either mode.
TEST(GpuLinearHead, EveryRowSplitMatches) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (const LinearShape& s :
       {LinearShape{257, 1030, 17}, LinearShape{128, 1024, 10}, LinearShape{600, 33, 32}}) {
    const Case c(s, seed);
    const Result det = run(c, true, true, true, true);
    check(c, det, true, true, true);
    for (int splits : {1, 2, 3, 5, 16, 33, 75, 1000}) {
      SCOPED_TRACE(::testing::Message() << "(N, IN, OUT) = (" << s.n << ", " << s.in << ", "
                                        << s.out << ") " << splits << " row splits");
      const Result r = run(c, true, true, true, false, splits);
      check(c, r, true, true, true);
      EXPECT_TRUE(same_bits(r.dx, det.dx)) << "dx does not depend on the split";
      if (splits == 1) {
        EXPECT_TRUE(same_bits(r.dw, det.dw));
        EXPECT_TRUE(same_bits(r.db, det.db));
        EXPECT_TRUE(same_bits(r.input_db, det.input_db));
      }
    }
  }
}

// relu_backward's NaN semantics: a NaN, -0 or +0 input masks; a NaN gradient passes where the
// input is > 0. Checked against the CUDA relu_backward on the unmasked result, bit for bit.
TEST(GpuLinearHead, MaskHasReluBackwardBits) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const LinearShape s{37, 45, 10};
  Case c(s, seed);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {nan,    -0.f,    0.f,
                            1e-30f, -1e-30f, std::numeric_limits<float>::infinity()};
  for (size_t i = 0; i < c.x.size(); i += 5) c.x[i] = specials[(i / 5) % 6];
  c.dy[size_t(3) * s.out + 4] = nan;  // row 3's dx is NaN wherever x > 0
  c.d_x = test::to_device(c.x);
  c.d_dy = test::to_device(c.dy);
  for (bool deterministic : {false, true}) {
    const Result plain = run(c, true, true, false, deterministic);
    const Result masked = run(c, true, true, true, deterministic);
    Tensor d_plain = test::to_device(plain.dx);
    Buffer<float> d_want(plain.dx.size(), Device::CUDA);
    relu_backward(int64_t(plain.dx.size()), c.d_x.data(), d_plain.data(), d_want.data(),
                  cuda_exec(deterministic));
    EXPECT_TRUE(same_bits(masked.dx, test::to_host(d_want.data(), d_want.size())));
    for (int k = 0; k < s.in; ++k) {
      const float xv = c.x[size_t(3) * s.in + k], got = masked.dx[size_t(3) * s.in + k];
      if (xv > 0.f) {
        EXPECT_TRUE(std::isnan(got)) << "k " << k;
      } else {
        EXPECT_EQ(got, 0.f) << "k " << k;
      }
    }
  }
}

// A network whose linear layers (16 and 10 outputs) run the fused backward, fc2 masking fc1's
// ReLU and summing fc1's bias gradient (fc3 the same for fc2), against the same network on
// separate passes (algo igemm) and on the CPU; deterministic steps repeat bitwise.
TEST(GpuLinearHead, NetworkMatchesSeparatePasses) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const std::vector<LayerSpec> fused = {layer_spec(LayerKind::Flatten, "flatten"),
                                        linear_spec("fc1", 40),
                                        layer_spec(LayerKind::Relu, "relu1"),
                                        linear_spec("fc2", 16),
                                        layer_spec(LayerKind::Relu, "relu2"),
                                        linear_spec("fc3", 10),
                                        layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
  std::vector<LayerSpec> apart = fused;
  for (LayerSpec& l : apart)
    if (l.kind == LayerKind::Linear) l.algo = Algo::Igemm;
  // Small enough that no pre-activation is likely to fall within rounding of 0, where the two
  // networks could fairly take different sides of a ReLU.
  const Shape chw = {3, 5, 7};
  NetworkOptions o;
  o.max_batch = 35;
  o.seed = seed;
  const int n = 33;
  const test::NetworkRun cpu = test::run_network(fused, chw, Exec{}, o, n, 1);
  for (bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic" : "atomic");
    bool masks = false, sums_bias_grad = false;
    const test::NetworkRun a =
        test::run_network(fused, chw, cuda_exec(deterministic), o, n, 1, [&](const Network& net) {
          masks = net.layers()[5]->can_mask_input_relu();  // fc3
          sums_bias_grad = net.layers()[5]->can_sum_input_bias_grad();
        });
    const test::NetworkRun b = test::run_network(apart, chw, cuda_exec(deterministic), o, n, 1);
    EXPECT_EQ(masks, linear_head_backward_applies(LinearShape{n, 16, 10}, Device::CUDA));
    EXPECT_EQ(sums_bias_grad, masks);
    const double e_apart = test::max_rel_error(a.grads, b.grads);
    const double e_cpu = test::max_rel_error(a.grads, cpu.grads);
    std::printf(
        "fused heads: worst rel error of the gradients vs separate passes %.3g, vs cpu %.3g\n",
        e_apart, e_cpu);
    EXPECT_FALSE(test::any_nan(a.grads));
    EXPECT_LT(e_apart, 1e-3);
    EXPECT_LT(e_cpu, 1e-3);
    if (deterministic) {
      const test::NetworkRun again = test::run_network(fused, chw, cuda_exec(true), o, n, 1);
      EXPECT_TRUE(same_bits(again.grads, a.grads));
    }
  }
}
