// gemm_cpu against a naive double-precision triple loop: awkward sizes (edge tiles, several K, M
// and N blocks), all transpose combinations, alpha/beta, padded leading dimensions, every
// micro-kernel this CPU supports; plus determinism and the thread pool itself.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "runtime/error.h"
#include "kernels/gemm/gemm_cpu.h"
#include "runtime/thread_pool.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

struct Case {
  int64_t m, n, k;
};

struct Problem {
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
  std::vector<float> a, b, c0;  // c0: C before the call
};

// Leading dimensions a few elements wider than needed, so that row strides are exercised.
Problem make_problem(bool ta, bool tb, const Case& cs, float alpha, float beta, uint64_t seed) {
  Problem p{ta, tb, cs.m, cs.n, cs.k, 0, 0, 0, alpha, beta, {}, {}, {}};
  p.lda = (ta ? cs.m : cs.k) + 3;
  p.ldb = (tb ? cs.k : cs.n) + 1;
  p.ldc = cs.n + 2;
  const int64_t a_rows = ta ? cs.k : cs.m, b_rows = tb ? cs.n : cs.k;
  p.a = test::random_vector(static_cast<size_t>(a_rows * p.lda), seed);
  p.b = test::random_vector(static_cast<size_t>(b_rows * p.ldb), seed + 1);
  p.c0 = test::random_vector(static_cast<size_t>(cs.m * p.ldc), seed + 2);
  return p;
}

std::vector<float> run(const Problem& p, const GemmOptions& opt) {
  std::vector<float> c = p.c0;
  gemm_cpu(p.ta, p.tb, p.m, p.n, p.k, p.alpha, p.a.data(), p.lda, p.b.data(), p.ldb, p.beta,
           c.data(), p.ldc, opt);
  return c;
}

// Checks every element against the double-precision product, within the worst-case float
// summation bound (k + 4) * 2^-23 * (|alpha| sum |a||b| + |beta c|); padding columns of C must
// keep their values.
void expect_matches_naive(const Problem& p, const std::vector<float>& got) {
  double worst = 0;
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.ldc; ++j) {
      const size_t ij = static_cast<size_t>(i * p.ldc + j);
      if (j >= p.n) {
        ASSERT_EQ(got[ij], p.c0[ij]) << "padding of C written at (" << i << ", " << j << ")";
        continue;
      }
      double acc = 0, mag = 0;
      for (int64_t q = 0; q < p.k; ++q) {
        const double av = p.ta ? p.a[q * p.lda + i] : p.a[i * p.lda + q];
        const double bv = p.tb ? p.b[j * p.ldb + q] : p.b[q * p.ldb + j];
        acc += av * bv;
        mag += std::fabs(av * bv);
      }
      const double c0 = p.c0[ij];
      const double ref = p.alpha * acc + (p.beta == 0.f ? 0.0 : p.beta * c0);
      const double bound =
          (p.k + 4) * std::ldexp(1.0, -23) * (std::fabs(p.alpha) * mag + std::fabs(p.beta * c0)) +
          1e-30;
      const double err = std::fabs(got[ij] - ref);
      worst = std::max(worst, err / bound);
      ASSERT_LE(err, bound) << "C(" << i << ", " << j << ") = " << got[ij] << ", expected " << ref;
    }
  }
  ::testing::Test::RecordProperty("worst_error_over_bound", std::to_string(worst));
}

std::vector<CpuIsa> supported_isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512})
    if (cpu_isa_supported(isa)) out.push_back(isa);
  return out;
}

}  // namespace

TEST(GemmCpu, MatchesNaiveOnAwkwardShapes) {
  const Case cases[] = {{1, 1, 1},     {7, 13, 5},    {129, 257, 33}, {6, 16, 256},
                        {97, 33, 300}, {13, 1100, 9}, {200, 7, 513}};
  const struct {
    float alpha, beta;
  } scalars[] = {{1.f, 0.f}, {0.5f, 2.f}, {-1.5f, 1.f}, {1.f, -0.75f}};
  for (CpuIsa isa : supported_isas()) {
    for (const Case& cs : cases) {
      for (int t = 0; t < 4; ++t) {
        const uint64_t seed = test::fresh_seed();
        const auto& sc = scalars[(t + cs.m) % 4];
        const Problem p = make_problem(t & 1, t & 2, cs, sc.alpha, sc.beta, seed);
        SCOPED_TRACE(::testing::Message()
                     << "isa=" << cpu_isa_name(isa) << " m=" << cs.m << " n=" << cs.n
                     << " k=" << cs.k << " trans_a=" << p.ta << " trans_b=" << p.tb
                     << " alpha=" << p.alpha << " beta=" << p.beta << " seed=" << seed);
        GemmOptions opt;
        opt.isa = isa;
        const std::vector<float> par = run(p, opt);
        expect_matches_naive(p, par);
        // Thread count and split do not change a single bit.
        opt.parallel = false;
        EXPECT_EQ(run(p, opt), par);
      }
    }
  }
}

TEST(GemmCpu, BetaZeroOverwritesNaN) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Problem p = make_problem(false, true, {19, 37, 21}, 1.f, 0.f, seed);
  for (auto& v : p.c0) v = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> c = p.c0;
  gemm_cpu(p.ta, p.tb, p.m, p.n, p.k, p.alpha, p.a.data(), p.lda, p.b.data(), p.ldb, p.beta,
           c.data(), p.ldc);
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) ASSERT_FALSE(std::isnan(c[i * p.ldc + j]));
}

TEST(GemmCpu, ZeroSizes) {
  std::vector<float> c = {1.f, 2.f, 3.f, 4.f};
  gemm_cpu(false, false, 2, 2, 0, 1.f, nullptr, 1, nullptr, 2, 0.5f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1.f, 1.5f, 2.f}));
  gemm_cpu(false, false, 0, 2, 3, 1.f, nullptr, 3, nullptr, 2, 0.f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1.f, 1.5f, 2.f}));
}

TEST(GemmCpu, RepeatableBitwise) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  const Problem p = make_problem(true, false, {300, 520, 270}, 1.f, 1.f, seed);
  EXPECT_EQ(run(p, {}), run(p, {}));
}

TEST(GemmCpu, RejectsBadArguments) {
  std::vector<float> a(64), b(64), c(64);
  EXPECT_THROW(gemm_cpu(false, false, -1, 2, 2, 1.f, a.data(), 2, b.data(), 2, 0.f, c.data(), 2),
               Error);
  EXPECT_THROW(gemm_cpu(false, false, 2, 2, 4, 1.f, a.data(), 3, b.data(), 2, 0.f, c.data(), 2),
               Error);  // lda < k
  EXPECT_THROW(gemm_cpu(false, true, 2, 4, 2, 1.f, a.data(), 2, b.data(), 1, 0.f, c.data(), 4),
               Error);  // ldb < k for trans_b
  EXPECT_THROW(gemm_cpu(false, false, 2, 4, 2, 1.f, a.data(), 2, b.data(), 4, 0.f, c.data(), 3),
               Error);  // ldc < n
}

TEST(ThreadPool, CoversRangeOnceAndNests) {
  const int64_t n = 1000;
  std::vector<std::atomic<int>> hits(n);
  parallel_for(3, n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) hits[static_cast<size_t>(i)]++;
    // A nested call runs inline instead of deadlocking on the busy pool.
    parallel_tasks(2, [&](int64_t) {});
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), i >= 3 ? 1 : 0);
  EXPECT_GE(cpu_thread_count(), 1);
}

TEST(ThreadPool, RethrowsTaskException) {
  std::atomic<int> ran{0};
  EXPECT_THROW(parallel_tasks(8,
                              [&](int64_t t) {
                                ++ran;
                                if (t == 5) throw std::runtime_error("task 5");
                              }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 8);  // the other tasks still ran; the pool stays usable
  parallel_tasks(4, [&](int64_t) { ++ran; });
  EXPECT_EQ(ran.load(), 12);
}
