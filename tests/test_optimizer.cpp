// Optimizer CPU reference against steps computed by hand (torch.optim.SGD / Adam / AdamW
// semantics), gradient zeroing and the ranges it skips, masks, grad scaling, the sum of squares
// and the NaN watch.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "runtime/error.h"
#include "kernels/optimizer/optimizer.h"
#include "tests/test_util.h"

using namespace cnn;

TEST(Sgd, MomentumThreeStepsByHand) {
  // g = 1 every step, lr 0.1, momentum 0.9: buf = 1, 1.9, 2.71; w = 1 - 0.1 * buf cumulative.
  float w = 1.f, m = 0.f;
  SgdParams p;
  p.lr = 0.1f;
  p.momentum = 0.9f;
  const float want_w[3] = {0.9f, 0.71f, 0.439f}, want_m[3] = {1.f, 1.9f, 2.71f};
  for (int step = 0; step < 3; ++step) {
    float g = 1.f;
    sgd_update(1, &w, &g, &m, nullptr, p, 1.f, Exec{});
    EXPECT_NEAR(w, want_w[step], 1e-6) << "step " << step + 1;
    EXPECT_NEAR(m, want_m[step], 1e-6) << "step " << step + 1;
    EXPECT_EQ(g, 0.f) << "the gradient is zeroed after use";
  }
}

TEST(Sgd, NesterovTwoStepsByHand) {
  // Step 1: buf = 1, d = 1 + 0.9*1 = 1.9, w = 1 - 0.19 = 0.81.
  // Step 2: buf = 0.9 + 1 = 1.9, d = 1 + 0.9*1.9 = 2.71, w = 0.81 - 0.271 = 0.539.
  float w = 1.f, m = 0.f;
  SgdParams p;
  p.lr = 0.1f;
  p.momentum = 0.9f;
  p.nesterov = true;
  float g = 1.f;
  sgd_update_cpu(1, &w, &g, &m, nullptr, p, 1.f);
  EXPECT_NEAR(w, 0.81f, 1e-6);
  g = 1.f;
  sgd_update_cpu(1, &w, &g, &m, nullptr, p, 1.f);
  EXPECT_NEAR(w, 0.539f, 1e-6);
  EXPECT_NEAR(m, 1.9f, 1e-6);
}

TEST(Sgd, WeightDecayMaskAndGradScale) {
  // No momentum (m may be null). Element 0 decays: w = 2 - 1*(0.25*4 + 0.1*2) = 0.8.
  // Element 1 is masked out: w = 2 - 1*(0.25*4) = 1.
  std::vector<float> w = {2.f, 2.f}, g = {4.f, 4.f};
  const std::vector<uint8_t> mask = {1, 0};
  SgdParams p;
  p.lr = 1.f;
  p.weight_decay = 0.1f;
  sgd_update(2, w.data(), g.data(), nullptr, mask.data(), p, 0.25f, Exec{});
  EXPECT_NEAR(w[0], 0.8f, 1e-6);
  EXPECT_NEAR(w[1], 1.f, 1e-6);
  EXPECT_EQ(g, (std::vector<float>{0.f, 0.f}));
}

TEST(Adam, FirstStepIsLrTimesSignOfGradient) {
  // Step 1: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps).
  std::vector<float> w = {1.f, 1.f, 1.f}, g = {0.5f, -2.f, 1e-3f}, m(3, 0.f), v(3, 0.f);
  AdamParams p;
  p.lr = 0.01f;
  adam_update(3, w.data(), g.data(), m.data(), v.data(), nullptr, p, 1.f, Exec{});
  const double gg[3] = {0.5, -2.0, 1e-3};
  const double b1 = 0.9f, b2 = 0.999f;  // the float hyper-parameters, exactly as stored
  for (int i = 0; i < 3; ++i) {
    const double want = 1.0 - 0.01 * gg[i] / (std::fabs(gg[i]) + 1e-8);
    EXPECT_NEAR(w[i], want, 1e-7) << i;
    EXPECT_NEAR(m[i], (1 - b1) * gg[i], 1e-7 * std::fabs(gg[i])) << i;
    EXPECT_NEAR(v[i], (1 - b2) * gg[i] * gg[i], 1e-7 * 1e-3 * gg[i] * gg[i]) << i;
    EXPECT_EQ(g[i], 0.f);
  }
}

TEST(Adam, SecondStepWithConstantGradient) {
  // g = 1 twice: m = b1 (1 - b1) + (1 - b1) = 1 - b1^2 (0.19), v = 1 - b2^2 (0.001999); the
  // bias corrections are the same numbers, so m_hat = v_hat = 1 and each step moves w by
  // lr / (1 + eps).
  float w = 1.f, m = 0.f, v = 0.f;
  AdamParams p;
  p.lr = 0.01f;
  for (int64_t step = 1; step <= 2; ++step) {
    p.step = step;
    float g = 1.f;
    adam_update_cpu(1, &w, &g, &m, &v, nullptr, p, 1.f);
  }
  const double b1 = 0.9f, b2 = 0.999f;  // the float hyper-parameters, exactly as stored
  EXPECT_NEAR(m, 1 - b1 * b1, 1e-7);
  EXPECT_NEAR(v, 1 - b2 * b2, 1e-9);
  EXPECT_NEAR(w, 0.98f, 1e-6);
}

TEST(Adam, CoupledVersusDecoupledWeightDecay) {
  // w = 4, g = 0, lr 0.1, wd 0.5, step 1.
  // Adam: d = 0.5*4 = 2, update lr * 2 / (2 + eps) = 0.1 -> 3.9.
  // AdamW: w = 4 * (1 - 0.05) = 3.8, then a zero update (m = 0).
  AdamParams p;
  p.lr = 0.1f;
  p.weight_decay = 0.5f;
  float w = 4.f, g = 0.f, m = 0.f, v = 0.f;
  adam_update_cpu(1, &w, &g, &m, &v, nullptr, p, 1.f);
  EXPECT_NEAR(w, 3.9f, 1e-6);
  p.decoupled = true;
  w = 4.f, g = 0.f, m = 0.f, v = 0.f;
  adam_update_cpu(1, &w, &g, &m, &v, nullptr, p, 1.f);
  EXPECT_NEAR(w, 3.8f, 1e-6);
  const uint8_t no_decay = 0;
  w = 4.f, g = 0.f, m = 0.f, v = 0.f;
  adam_update_cpu(1, &w, &g, &m, &v, &no_decay, p, 1.f);
  EXPECT_EQ(w, 4.f);
}

TEST(Optimizer, RejectsBadHyperParameters) {
  float w = 1, g = 1, m = 0, v = 0;
  SgdParams sp;
  sp.nesterov = true;  // momentum 0
  EXPECT_THROW(sgd_update(1, &w, &g, &m, nullptr, sp, 1.f, Exec{}), Error);
  sp.nesterov = false;
  sp.momentum = 0.9f;
  EXPECT_THROW(sgd_update(1, &w, &g, nullptr, nullptr, sp, 1.f, Exec{}), Error);
  AdamParams ap;
  ap.step = 0;
  EXPECT_THROW(adam_update(1, &w, &g, &m, &v, nullptr, ap, 1.f, Exec{}), Error);
  ap.step = 1;
  ap.beta2 = 1.f;
  EXPECT_THROW(adam_update(1, &w, &g, &m, &v, nullptr, ap, 1.f, Exec{}), Error);
}

namespace {

// Ranges over 37 gradients: at the start, two touching ones, an empty one, one to the end.
KeptGrads kept_ranges_of_37() {
  KeptGrads k;
  const int64_t ranges[][2] = {{0, 3}, {10, 17}, {17, 18}, {25, 25}, {30, 37}};
  for (const auto& r : ranges) {
    k.begin[k.count] = r[0];
    k.end[k.count++] = r[1];
  }
  return k;
}

bool in_kept(const KeptGrads& k, size_t i) {
  for (int r = 0; r < k.count; ++r)
    if (int64_t(i) >= k.begin[r] && int64_t(i) < k.end[r]) return true;
  return false;
}

}  // namespace

// The ranges a backward pass overwrites keep this update's gradient, every other one is zeroed,
// and w, m and v are those of the same update without ranges, bit for bit (SGD with momentum,
// Nesterov and decay; Adam; AdamW; through the dispatch and the CPU twins).
TEST(Optimizer, KeptRangesKeepTheirGradientsAndChangeNothingElse) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int64_t count = 37;
  const size_t n = size_t(count);
  const KeptGrads kept = kept_ranges_of_37();
  const std::vector<float> g0 = test::random_vector(n, seed), w0 = test::random_vector(n, seed + 1);
  const std::vector<uint8_t> mask(n, 1);
  for (int kind = 0; kind < 3; ++kind) {
    SCOPED_TRACE("kind " + std::to_string(kind));
    std::vector<float> w[2] = {w0, w0}, m[2], v[2], g[2];
    for (int with = 0; with < 2; ++with) {
      m[with] = test::random_vector(n, seed + 2);
      v[with] = test::random_vector(n, seed + 3, 0.f, 1.f);
      g[with] = g0;
      const KeptGrads k = with ? kept : KeptGrads{};
      if (kind == 0) {
        SgdParams p;
        p.lr = 0.1f;
        p.momentum = 0.9f;
        p.nesterov = true;
        p.weight_decay = 0.01f;
        sgd_update(count, w[with].data(), g[with].data(), m[with].data(), mask.data(), p, 0.5f,
                   Exec{}, nullptr, k);
      } else {
        AdamParams p;
        p.lr = 0.01f;
        p.weight_decay = 0.05f;
        p.decoupled = kind == 2;
        p.step = 3;
        adam_update_cpu(count, w[with].data(), g[with].data(), m[with].data(), v[with].data(),
                        mask.data(), p, 0.5f, k);
      }
    }
    EXPECT_EQ(w[0], w[1]);
    EXPECT_EQ(m[0], m[1]);
    EXPECT_EQ(v[0], v[1]);
    EXPECT_EQ(g[0], std::vector<float>(n, 0.f));
    for (size_t i = 0; i < n; ++i)
      EXPECT_EQ(g[1][i], in_kept(kept, i) ? g0[i] : 0.f) << "gradient " << i;
  }
}

TEST(Optimizer, RejectsKeptRangesOutsideTheBuffer) {
  std::vector<float> w(8, 1.f), g(8, 1.f), m(8, 0.f), v(8, 0.f);
  const SgdParams sp;
  const AdamParams ap;
  const auto refused = [&](int64_t begin, int64_t end, int count) {
    KeptGrads k;
    k.count = count;
    k.begin[0] = begin;
    k.end[0] = end;
    EXPECT_THROW(sgd_update(8, w.data(), g.data(), m.data(), nullptr, sp, 1.f, Exec{}, nullptr, k),
                 Error)
        << begin << " " << end << " " << count;
    EXPECT_THROW(adam_update(8, w.data(), g.data(), m.data(), v.data(), nullptr, ap, 1.f, Exec{},
                             nullptr, nullptr, k),
                 Error)
        << begin << " " << end << " " << count;
  };
  refused(0, 9, 1);   // past the end
  refused(-1, 2, 1);  // before the start
  refused(5, 4, 1);   // reversed
  refused(0, 1, KeptGrads::kMax + 1);
  refused(0, 1, -1);
}

TEST(Optimizer, SumSquaresAndNonFinite) {
  const std::vector<float> g = {1.f, -2.f, 3.f};
  double out = -1;
  sum_squares(3, g.data(), &out, nullptr, Exec{});
  EXPECT_EQ(out, 14.0);
  sum_squares(0, nullptr, &out, nullptr, Exec{});
  EXPECT_EQ(out, 0.0);
  EXPECT_EQ(sum_squares_scratch_doubles(0), 0);
  EXPECT_GE(sum_squares_scratch_doubles(1), 1);

  int32_t flag = 0;
  find_nonfinite(3, g.data(), &flag, Exec{});
  EXPECT_EQ(flag, 0);
  const std::vector<float> bad = {1.f, std::numeric_limits<float>::infinity(), 0.f};
  find_nonfinite(3, bad.data(), &flag, Exec{});
  EXPECT_EQ(flag, 1);
  flag = 0;
  const std::vector<float> nan = {std::numeric_limits<float>::quiet_NaN()};
  find_nonfinite(1, nan.data(), &flag, Exec{});
  EXPECT_EQ(flag, 1);
}
