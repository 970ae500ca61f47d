// Softmax cross-entropy CUDA kernel against the CPU reference: batch 1 and 257, 1 to 1000
// classes, logits of magnitude 1000, integer logits (ties), and the device metrics (bitwise
// repeatable).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "runtime/memory.h"
#include "kernels/loss/softmax_xent.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

std::vector<int32_t> ints_to_host(const int32_t* d, size_t n) {
  std::vector<int32_t> v(n);
  raw_copy(v.data(), Device::CPU, d, Device::CUDA, n * sizeof(int32_t));
  return v;
}

// kind 0: U(-1, 1); 1: U(-1000, 1000) (overflows a naive exp); 2: integers in [0, 3] (ties).
void check_xent(int n, int classes, int kind) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << " n " << n << " classes " << classes << " kind " << kind);
  const size_t nl = size_t(n) * classes;
  std::vector<float> logits =
      test::random_vector(nl, seed, kind == 1 ? -1000.f : -1.f, kind == 1 ? 1000.f : 1.f);
  if (kind == 2) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> d(0, 3);
    for (auto& v : logits) v = float(d(rng));
  }
  const std::vector<int32_t> labels = test::random_labels(n, classes, seed + 1);
  const float scale = 1.f / n;
  std::vector<float> loss_ref(n), d_ref(nl);
  std::vector<int32_t> pred_ref(n);
  softmax_xent_cpu(XentShape{n, classes}, logits.data(), labels.data(), loss_ref.data(),
                   pred_ref.data(), d_ref.data(), scale);

  Exec ex;
  ex.device = Device::CUDA;
  Tensor d_logits = test::to_device(logits);  // (N, classes)
  Buffer<int32_t> d_labels(n, Device::CUDA);  // (N)
  d_labels.copy_from(labels.data(), Device::CPU, n);
  Buffer<float> d_loss(n, Device::CUDA);      // (N)
  Buffer<int32_t> d_pred(n, Device::CUDA);    // (N)
  Buffer<float> d_dlogits(nl, Device::CUDA);  // (N, classes)
  test::poison_device(d_loss.data(), n);
  test::poison_device(d_dlogits.data(), nl);
  raw_zero(d_pred.data(), Device::CUDA, d_pred.bytes());
  softmax_xent(XentShape{n, classes}, d_logits.data(), d_labels.data(), d_loss.data(),
               d_pred.data(), d_dlogits.data(), scale, ex);
  const std::vector<float> loss = test::to_host(d_loss.data(), n);
  const std::vector<float> dl = test::to_host(d_dlogits.data(), nl);
  const std::vector<int32_t> pred = ints_to_host(d_pred.data(), n);

  // dlogits are softmax values in [0, 1] times 1/n: judge them against 1/n.
  const double e_loss = test::max_rel_error(loss, loss_ref, 1e-4);
  const double e_d = test::max_rel_error(dl, d_ref, scale * 1e-2);
  std::printf("softmax_xent n %d classes %d kind %d: worst rel error loss %.3g dlogits %.3g\n", n,
              classes, kind, e_loss, e_d);
  EXPECT_LT(e_loss, 1e-5);
  EXPECT_LT(e_d, 1e-4);
  EXPECT_EQ(pred, pred_ref);

  // Without dlogits (evaluation): same loss and predictions.
  test::poison_device(d_loss.data(), n);
  softmax_xent(XentShape{n, classes}, d_logits.data(), d_labels.data(), d_loss.data(),
               d_pred.data(), nullptr, scale, ex);
  EXPECT_EQ(test::to_host(d_loss.data(), n), loss);

  // Metrics: fixed-order device reduction, twice from the same start -> bitwise equal.
  double totals_ref[3] = {1.5, 2, 3};
  accumulate_metrics_cpu(n, loss.data(), pred.data(), labels.data(), totals_ref);
  Buffer<double> d_totals(3, Device::CUDA);  // (3)
  double runs[2][3];
  for (auto& run : runs) {
    const double start[3] = {1.5, 2, 3};
    d_totals.copy_from(start, Device::CPU, 3);
    accumulate_metrics(n, d_loss.data(), d_pred.data(), d_labels.data(), d_totals.data(), ex);
    raw_copy(run, Device::CPU, d_totals.data(), Device::CUDA, sizeof(run));
  }
  EXPECT_NEAR(runs[0][0], totals_ref[0], 1e-9 * (1 + std::fabs(totals_ref[0])));
  EXPECT_EQ(runs[0][1], totals_ref[1]);
  EXPECT_EQ(runs[0][2], totals_ref[2]);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(runs[0][i], runs[1][i]) << "metrics not repeatable";
}

}  // namespace

TEST(GpuSoftmaxXent, MatchesCpu) {
  CNN_REQUIRE_GPU();
  for (int n : {1, 257, 4099})
    for (int classes : {1, 2, 10, 33, 1000})
      for (int kind : {0, 1, 2}) check_xent(n, classes, kind);
}
