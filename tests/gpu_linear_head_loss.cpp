// The fused head-and-loss step (kernels/gemm/linear_head_loss.h) against its CPU twin on awkward
// shapes (batch 1, 7, 33, 129; 1, 7, 1023, 1030 inputs; 1, 2, 10, 17 and 32 outputs), with and
// without bias, input gradient, ReLU mask and the bias gradient of the layer before, label
// smoothing on and off, atomic and deterministic; its loss, prediction and dlogits against the
// bits of softmax_xent on the logits it wrote (NaN rows and bad labels included), its dx against
// the bits of linear_head_backward on that dlogits; every row count a block; and a network whose
// head runs it against the same network with the loss apart (NetworkOptions::fuse_head_loss).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/gemm/linear_head.h"
#include "kernels/gemm/linear_head_loss.h"
#include "kernels/gemm/linear_head_loss_cuda.h"
#include "kernels/loss/softmax_xent.h"
#include "layers/network.h"
#include "runtime/memory.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

// As gpu_linear_head.cpp: the error relative to the same sums over the terms' absolute values.
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

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

constexpr double kTol = 1e-5;

Exec cuda_exec(bool deterministic) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.deterministic = deterministic;
  return ex;
}

Buffer<int32_t> ints_to_device(const std::vector<int32_t>& v) {
  Buffer<int32_t> d(v.size(), Device::CUDA);
  d.copy_from(v.data(), Device::CPU, v.size());
  return d;
}

std::vector<int32_t> ints_to_host(const int32_t* d, size_t n) {
  std::vector<int32_t> v(n);
  raw_copy(v.data(), Device::CPU, d, Device::CUDA, n * sizeof(int32_t));
  return v;
}

// One shape's inputs on the host and the device.
struct Case {
  LinearShape s;
  std::vector<float> x, w, b, dw0, db0, input_db0;  // (N, IN), (OUT, IN), (OUT), ..., (IN)
  std::vector<int32_t> labels;                      // (N)
  Tensor d_x, d_w, d_b;
  Buffer<int32_t> d_labels;

  Case(const LinearShape& shape, uint64_t seed) : s(shape) {
    x = test::random_vector(size_t(s.n) * s.in, seed);  // about half <= 0: the mask has work
    w = test::random_vector(size_t(s.out) * s.in, seed + 1);
    b = test::random_vector(size_t(s.out), seed + 2);
    dw0 = test::random_vector(size_t(s.out) * s.in, seed + 3);
    db0 = test::random_vector(size_t(s.out), seed + 4);
    input_db0 = test::random_vector(size_t(s.in), seed + 5);
    labels = test::random_labels(size_t(s.n), s.out, seed + 6);
    upload();
  }
  void upload() {
    d_x = test::to_device(x);
    d_w = test::to_device(w);
    d_b = test::to_device(b);
    d_labels = ints_to_device(labels);
  }
};

struct Options {
  bool bias = true, want_dx = true, mask = true, input_db = true;
  float eps = 0.f;
  bool deterministic = false;
  int rows_per_block = 0;  // 0: the public API (the plan); else the launcher with these rows
};

struct Result {
  std::vector<float> y, loss, dy, dw, db, dx, input_db;
  std::vector<int32_t> pred;
};

constexpr float kScale = 1.f / 3.f;

// One fused step on the GPU from dw0 / db0 / input_db0, every output poisoned first.
Result run(const Case& c, const Options& o) {
  const LinearShape& s = c.s;
  const size_t nx = size_t(s.n) * s.in, ny = size_t(s.n) * s.out;
  Tensor d_dw = test::to_device(c.dw0), d_db = test::to_device(c.db0);
  Tensor d_input_db = test::to_device(c.input_db0);
  Buffer<float> d_y(ny, Device::CUDA), d_dy(ny, Device::CUDA), d_dx(nx, Device::CUDA);
  Buffer<float> d_loss(size_t(s.n), Device::CUDA);
  Buffer<int32_t> d_pred(size_t(s.n), Device::CUDA);
  test::poison_device(d_y.data(), ny);
  test::poison_device(d_dy.data(), ny);
  test::poison_device(d_dx.data(), nx);
  test::poison_device(d_loss.data(), size_t(s.n));
  raw_zero(d_pred.data(), Device::CUDA, d_pred.bytes());
  const XentTargets t{c.d_labels.data(), d_loss.data(), d_pred.data(), kScale, o.eps};
  const float* b = o.bias ? c.d_b.data() : nullptr;
  float* db = o.bias ? d_db.data() : nullptr;
  float* dx = o.want_dx ? d_dx.data() : nullptr;
  float* input_db = o.input_db ? d_input_db.data() : nullptr;
  if (o.rows_per_block == 0)
    linear_head_loss_step(s, c.d_x.data(), c.d_w.data(), b, d_y.data(), t, d_dy.data(), d_dw.data(),
                          db, dx, o.mask, input_db, cuda_exec(o.deterministic));
  else
#ifdef CNN_HAVE_CUDA  // the launcher, called directly for its rows, exists in CUDA builds only
    linear_head_loss_step_cuda(s, c.d_x.data(), c.d_w.data(), b, d_y.data(), t, d_dy.data(),
                               d_dw.data(), db, dx, o.mask, input_db, o.deterministic, nullptr,
                               o.rows_per_block);
#else
    ADD_FAILURE() << "rows a block need a CUDA build";
#endif
  Result r;
  r.y = test::to_host(d_y.data(), ny);
  r.dy = test::to_host(d_dy.data(), ny);
  r.loss = test::to_host(d_loss.data(), size_t(s.n));
  r.pred = ints_to_host(d_pred.data(), size_t(s.n));
  r.dw = d_dw.to_vector();
  r.db = d_db.to_vector();
  r.input_db = d_input_db.to_vector();
  if (o.want_dx) r.dx = test::to_host(d_dx.data(), nx);
  return r;
}

// softmax_xent on the GPU, on the logits the fused step wrote: the bits its loss part must have.
Result loss_apart(const Case& c, const Result& r, float eps) {
  const size_t ny = r.y.size(), n = size_t(c.s.n);
  Tensor d_y = test::to_device(r.y);
  Buffer<float> d_loss(n, Device::CUDA), d_dy(ny, Device::CUDA);
  Buffer<int32_t> d_pred(n, Device::CUDA);
  softmax_xent(XentShape{c.s.n, c.s.out}, d_y.data(), c.d_labels.data(), d_loss.data(),
               d_pred.data(), d_dy.data(), kScale, cuda_exec(false), eps);
  Result a;
  a.loss = test::to_host(d_loss.data(), n);
  a.dy = test::to_host(d_dy.data(), ny);
  a.pred = ints_to_host(d_pred.data(), n);
  return a;
}

// Every check of one run: the forward and the loss against the twin and against softmax_xent's
// bits; the backward against the twin's backward on the same dlogits, and dx against the bits of
// linear_head_backward on them.
void check(const Case& c, const Options& o, const Result& r) {
  const LinearShape& s = c.s;
  const size_t ny = size_t(s.n) * s.out, nx = size_t(s.n) * s.in;
  // The twin's forward and loss, and their error scale.
  std::vector<float> y_ref(ny), y_mag(ny), loss_ref(size_t(s.n)), dy_ref(ny);
  std::vector<int32_t> pred_ref(size_t(s.n));
  const std::vector<float> zero_b(size_t(s.out), 0.f);
  linear_forward_cpu(s, c.x.data(), c.w.data(), o.bias ? c.b.data() : nullptr, y_ref.data(), false);
  linear_forward_cpu(s, abs_of(c.x).data(), abs_of(c.w).data(),
                     o.bias ? abs_of(c.b).data() : zero_b.data(), y_mag.data(), false);
  softmax_xent_cpu(XentShape{s.n, s.out}, y_ref.data(), c.labels.data(), loss_ref.data(),
                   pred_ref.data(), dy_ref.data(), kScale, o.eps);
  EXPECT_LT(bounded_error(r.y, y_ref, y_mag), kTol) << "y";
  for (int i = 0; i < s.n; ++i) {
    // loss = logsumexp(y) - (1 - eps) y[label] - ...: moves by at most 2 max |dy| for a change dy.
    float row_mag = 0.f;
    for (int o2 = 0; o2 < s.out; ++o2) row_mag = std::max(row_mag, y_mag[size_t(i) * s.out + o2]);
    EXPECT_NEAR(r.loss[size_t(i)], loss_ref[size_t(i)], 2 * kTol * row_mag + 1e-6) << "row " << i;
  }
  // The loss part has softmax_xent's bits for the logits written.
  const Result a = loss_apart(c, r, o.eps);
  EXPECT_TRUE(same_bits(r.loss, a.loss)) << "loss is not softmax_xent's";
  EXPECT_TRUE(same_bits(r.pred, a.pred)) << "pred is not softmax_xent's";
  EXPECT_TRUE(same_bits(r.dy, a.dy)) << "dlogits are not softmax_xent's";

  // The twin's backward on the dlogits the GPU wrote.
  std::vector<float> dw_ref = c.dw0, db_ref = c.db0, input_db_ref = c.input_db0, dx_ref(nx);
  linear_head_backward_cpu(s, c.x.data(), r.dy.data(), c.w.data(), dw_ref.data(),
                           o.bias ? db_ref.data() : nullptr, o.want_dx ? dx_ref.data() : nullptr,
                           o.mask, o.input_db ? input_db_ref.data() : nullptr);
  std::vector<float> dw_mag = abs_of(c.dw0), db_mag = abs_of(c.db0), dx_mag(nx);
  linear_head_backward_cpu(s, abs_of(c.x).data(), abs_of(r.dy).data(), abs_of(c.w).data(),
                           dw_mag.data(), db_mag.data(), dx_mag.data(), false, nullptr);
  std::vector<float> input_db_mag = abs_of(c.input_db0);
  for (size_t e = 0; e < nx; ++e) input_db_mag[e % size_t(s.in)] += dx_mag[e];
  EXPECT_LT(bounded_error(r.dw, dw_ref, dw_mag), kTol) << "dw";
  if (o.bias) {
    EXPECT_LT(bounded_error(r.db, db_ref, db_mag), kTol) << "db";
  } else {
    EXPECT_TRUE(same_bits(r.db, c.db0)) << "db written without a bias";
  }
  if (o.input_db) {
    EXPECT_LT(bounded_error(r.input_db, input_db_ref, input_db_mag), kTol) << "input_db";
  } else {
    EXPECT_TRUE(same_bits(r.input_db, c.input_db0)) << "input_db written without one";
  }
  if (!o.want_dx) return;
  EXPECT_LT(bounded_error(r.dx, dx_ref, dx_mag), kTol) << "dx";
  Tensor d_dy = test::to_device(r.dy), d_dw = test::to_device(c.dw0);
  Buffer<float> d_dx(nx, Device::CUDA);
  linear_head_backward(s, c.d_x.data(), d_dy.data(), c.d_w.data(), d_dw.data(), nullptr,
                       d_dx.data(), o.mask, nullptr, cuda_exec(true));
  EXPECT_TRUE(same_bits(r.dx, test::to_host(d_dx.data(), nx)))
      << "dx is not linear_head_backward's on the same dlogits";
}

}  // namespace

TEST(GpuLinearHeadLoss, MatchesCpuTwinOnAwkwardShapes) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (int n : {1, 7, 33, 129})
    for (int in : {1, 7, 1023, 1030})
      for (int out : {1, 2, 10, 17, kLinearHeadMaxOut}) {
        const Case c(LinearShape{n, in, out}, seed + uint64_t(n) * 7919 + in * 31 + out);
        Options variants[3];
        variants[1].bias = variants[1].mask = variants[1].input_db = false;  // a plain head
        variants[2].want_dx = variants[2].input_db = false;                  // a first layer
        for (bool deterministic : {false, true})
          for (float eps : {0.f, 0.1f})
            for (Options o : variants) {
              o.deterministic = deterministic;
              o.eps = eps;
              SCOPED_TRACE(::testing::Message()
                           << "(N, IN, OUT) = (" << n << ", " << in << ", " << out << ")"
                           << (deterministic ? " deterministic" : " atomic") << " eps " << eps
                           << (o.bias ? " bias" : "") << (o.want_dx ? " dx" : "")
                           << (o.mask ? " mask" : "") << (o.input_db ? " input_db" : ""));
              const Result r = run(c, o);
              check(c, o, r);
              if (deterministic) {
                const Result again = run(c, o);
                EXPECT_TRUE(same_bits(again.y, r.y) && same_bits(again.loss, r.loss) &&
                            same_bits(again.dy, r.dy) && same_bits(again.dw, r.dw) &&
                            same_bits(again.db, r.db) && same_bits(again.dx, r.dx) &&
                            same_bits(again.input_db, r.input_db))
                    << "deterministic step differs";
              }
            }
      }
}

// Every row count a block (the backward fused in normal mode, several blocks adding by
// atomicAdd) gives the twin's answer and the same logits, loss and dx bits.
TEST(GpuLinearHeadLoss, EveryRowsPerBlockMatches) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (const LinearShape& s :
       {LinearShape{129, 1030, 17}, LinearShape{128, 1024, 10}, LinearShape{600, 33, 32}}) {
    const Case c(s, seed);
    Options base;
    base.eps = 0.1f;
    const Result planned = run(c, base);
    for (int rows : {1, 2, 3, 5, 8, 16, 31, kLinearHeadLossMaxRows}) {
      SCOPED_TRACE(::testing::Message() << "(N, IN, OUT) = (" << s.n << ", " << s.in << ", "
                                        << s.out << ") " << rows << " rows a block");
      Options o = base;
      o.rows_per_block = rows;
      const Result r = run(c, o);
      check(c, o, r);
      EXPECT_TRUE(same_bits(r.y, planned.y) && same_bits(r.loss, planned.loss) &&
                  same_bits(r.dy, planned.dy) && same_bits(r.dx, planned.dx))
          << "the forward, the loss and dx depend on the rows a block";
    }
  }
}

// softmax_xent's NaN and label behaviour: a row of NaN logits (a NaN input), labels out of
// range (NaN loss), a confident row; the loss part keeps softmax_xent's bits on each.
TEST(GpuLinearHeadLoss, NanRowsAndBadLabelsAsSoftmaxXent) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (int out : {1, 10, kLinearHeadMaxOut}) {
    Case c(LinearShape{9, 45, out}, seed + out);
    c.x[size_t(0) * 45 + 7] = std::numeric_limits<float>::quiet_NaN();  // row 0: NaN logits
    c.labels[1] = -1;
    c.labels[2] = out;
    for (int k = 0; k < 45; ++k) c.x[size_t(3) * 45 + k] = 40.f * c.w[size_t(k)];  // confident
    c.upload();
    for (bool deterministic : {false, true}) {
      SCOPED_TRACE(::testing::Message() << out << " outputs" << (deterministic ? " det" : ""));
      Options o;
      o.deterministic = deterministic;
      o.eps = 0.1f;
      const Result r = run(c, o);
      const Result a = loss_apart(c, r, o.eps);
      EXPECT_TRUE(same_bits(r.loss, a.loss));
      EXPECT_TRUE(same_bits(r.pred, a.pred));
      EXPECT_TRUE(same_bits(r.dy, a.dy));
      EXPECT_TRUE(std::isnan(r.loss[0]) && std::isnan(r.loss[1]) && std::isnan(r.loss[2]));
      EXPECT_EQ(r.pred[0], 0);  // an all-NaN row still predicts a valid class
      EXPECT_FALSE(std::isnan(r.loss[3]));
    }
  }
}

// A network whose head (10 outputs, masking fc1's ReLU and summing fc1's bias gradient) runs the
// fused step, against the same network with the loss apart (fuse_head_loss off), with and
// without label smoothing; deterministic steps repeat bitwise.
TEST(GpuLinearHeadLoss, NetworkMatchesLossApart) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const std::vector<LayerSpec> specs = {
      layer_spec(LayerKind::Flatten, "flatten"), linear_spec("fc1", 40),
      layer_spec(LayerKind::Relu, "relu1"), linear_spec("fc2", 10),
      layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
  const Shape chw = {3, 5, 7};
  for (int n : {7, 33}) {
    for (float eps : {0.f, 0.1f}) {
      for (bool deterministic : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "batch " << n << " eps " << eps
                                          << (deterministic ? " deterministic" : " atomic"));
        NetworkOptions o;
        o.max_batch = 35;
        o.seed = seed;
        o.label_smoothing = eps;
        NetworkOptions apart_o = o;
        apart_o.fuse_head_loss = false;
        bool fused = false, apart_fused = true;
        const test::NetworkRun a =
            test::run_network(specs, chw, cuda_exec(deterministic), o, n, 2,
                              [&](const Network& net) { fused = net.loss_in_last_layer(); });
        const test::NetworkRun b =
            test::run_network(specs, chw, cuda_exec(deterministic), apart_o, n, 2,
                              [&](const Network& net) { apart_fused = net.loss_in_last_layer(); });
        EXPECT_EQ(fused, linear_head_backward_applies(LinearShape{n, 40, 10}, Device::CUDA));
        EXPECT_FALSE(apart_fused);
        const double e_logits = test::max_rel_error(a.logits, b.logits);
        const double e_loss = test::max_rel_error(a.loss, b.loss);
        const double e_grads = test::max_rel_error(a.grads, b.grads);
        std::printf("fused head loss: worst rel error vs apart: logits %.3g loss %.3g grads %.3g\n",
                    e_logits, e_loss, e_grads);
        EXPECT_FALSE(test::any_nan(a.grads));
        EXPECT_LT(e_logits, 1e-4);
        EXPECT_LT(e_loss, 1e-4);
        EXPECT_LT(e_grads, 1e-3);
        if (deterministic) {
          const test::NetworkRun again = test::run_network(specs, chw, cuda_exec(true), o, n, 2);
          EXPECT_TRUE(same_bits(again.grads, a.grads));
          EXPECT_TRUE(same_bits(again.loss, a.loss));
        }
      }
    }
  }
}
