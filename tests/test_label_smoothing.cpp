// Label smoothing in softmax cross-entropy (torch's CrossEntropyLoss(label_smoothing=eps)): the
// loss against -sum t log p with t = (1 - eps) onehot + eps / K, the gradient p - t, eps = 0
// unchanged, and the double reference against central differences.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/loss/softmax_xent.h"
#include "layers/gradcheck/gradcheck.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

TEST(LabelSmoothing, LossAndGradientAreThoseOfTheSmoothedTarget) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = 5, k = 7;
  const std::vector<float> logits = test::random_vector(size_t(n * k), seed, -4.f, 4.f);
  const std::vector<int32_t> labels = test::random_labels(size_t(n), k, seed + 1);
  for (float eps : {0.f, 0.1f, 0.5f}) {
    std::vector<float> loss(static_cast<size_t>(n)), d(size_t(n * k));
    std::vector<int32_t> pred(static_cast<size_t>(n));
    softmax_xent({n, k}, logits.data(), labels.data(), loss.data(), pred.data(), d.data(), 0.5f,
                 Exec{}, eps);
    for (int i = 0; i < n; ++i) {
      const float* l = logits.data() + i * k;
      double mx = l[0], sum = 0;
      for (int j = 1; j < k; ++j) mx = std::max(mx, double(l[j]));
      for (int j = 0; j < k; ++j) sum += std::exp(l[j] - mx);
      double want = 0;
      for (int j = 0; j < k; ++j) {
        const double logp = l[j] - mx - std::log(sum);
        const double t = (j == labels[size_t(i)] ? 1.0 - eps : 0.0) + eps / k;
        want -= t * logp;
        EXPECT_NEAR(d[size_t(i * k + j)], 0.5 * (std::exp(logp) - t), 1e-6) << "eps " << eps;
      }
      EXPECT_NEAR(loss[size_t(i)], want, 1e-5) << "eps " << eps;
    }
  }
  std::vector<float> loss(static_cast<size_t>(n));
  std::vector<int32_t> pred(static_cast<size_t>(n));
  EXPECT_THROW(softmax_xent({n, k}, logits.data(), labels.data(), loss.data(), pred.data(), nullptr,
                            1.f, Exec{}, 1.f),
               Error);
}

TEST(LabelSmoothing, GradcheckInDoubleAndFloat) {
  GradcheckCase c = gradcheck_small_network_case();
  GradcheckOptions o;
  o.seed = test::fresh_seed();
  o.batch = 3;
  o.label_smoothing = 0.2;
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  const GradcheckResult ref = gradcheck_reference(c.specs, c.input_chw, o);
  EXPECT_TRUE(ref.passed()) << format_gradcheck(ref);
  const GradcheckResult net = gradcheck_network(c.specs, c.input_chw, o, Exec{}, true);
  EXPECT_TRUE(net.passed()) << format_gradcheck(net);
}
