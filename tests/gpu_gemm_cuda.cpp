// gemm_cuda (kernels/gemm_cuda.h) against a double-precision reference: every transpose
// combination, odd sizes, padded leading dimensions, alpha/beta, bias and ReLU, k == 0, the
// split-k cluster path, FP32 and TF32; and the linear layer's three products at the reference
// network's shapes against the CPU references of kernels/linear.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/exec.h"
#include "kernels/linear.h"
#include "kernels/memory.h"
#include "tests/test_util.h"
#ifdef CNN_HAVE_CUDA
#include "kernels/gemm_cuda.h"
#endif

using namespace cnn;

namespace {

#ifdef CNN_HAVE_CUDA

// max |got - ref| / max |ref|: error relative to the output's scale, so that outputs that cancel
// to near zero do not dominate. NaN in got (an unwritten poisoned element) gives infinity.
double rel_to_max(const std::vector<float>& got, const std::vector<float>& ref,
                  double typical = 0) {
  if (got.size() != ref.size()) return INFINITY;
  double worst = 0, scale = std::max(1e-30, typical);
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isinf(got[i])) return INFINITY;
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
  }
  return worst / scale;
}

// Typical magnitude of a sum of k products of U(-1, 1) values (sqrt(k)/3): the error scale of
// an output that happens to cancel to near zero (e.g. a bias gradient of one channel), so
// that TF32 rounding of its terms is judged against the terms, not against the remainder.
double typical(int64_t k) {
  return std::sqrt(static_cast<double>(std::max<int64_t>(1, k))) / 3;
}

double tolerance(Precision p, int k) {
  return p == Precision::TF32 ? 2e-3 : 1e-5 * std::sqrt(std::max(1.0, static_cast<double>(k)));
}

struct GemmCase {
  bool ta, tb;
  int m, n, k;
  int pad;  // extra leading-dimension elements beyond the minimum
  float alpha, beta;
  bool bias, relu;
};

std::string describe(const GemmCase& c) {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "ta=%d tb=%d m=%d n=%d k=%d pad=%d alpha=%g beta=%g bias=%d relu=%d", c.ta, c.tb,
                c.m, c.n, c.k, c.pad, c.alpha, c.beta, c.bias, c.relu);
  return buf;
}

// Plain-loop reference in double, same contract as gemm_cuda.
void gemm_reference(const GemmCase& c, const std::vector<float>& a, int lda,
                    const std::vector<float>& b, int ldb, std::vector<float>& cm, int ldc,
                    const std::vector<float>& bias) {
  for (int i = 0; i < c.m; ++i)
    for (int j = 0; j < c.n; ++j) {
      double acc = 0;
      for (int l = 0; l < c.k; ++l) {
        const double av =
            c.ta ? a[static_cast<size_t>(l) * lda + i] : a[static_cast<size_t>(i) * lda + l];
        const double bv =
            c.tb ? b[static_cast<size_t>(j) * ldb + l] : b[static_cast<size_t>(l) * ldb + j];
        acc += av * bv;
      }
      double v = c.alpha * acc;
      float& dst = cm[static_cast<size_t>(i) * ldc + j];
      if (c.beta != 0.f) v += static_cast<double>(c.beta) * dst;
      if (c.bias) v += bias[j];
      if (c.relu && v <= 0) v = 0;
      dst = static_cast<float>(v);
    }
}

// Runs one case on the GPU in `prec` (twice when check_repeat, comparing bitwise) and returns
// the error relative to the reference.
double run_case(const GemmCase& c, Precision prec, uint64_t seed, bool check_repeat = false) {
  const int a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
  const int b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
  const int lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.n + c.pad;
  auto a = test::random_vector(static_cast<size_t>(std::max(1, a_rows)) * lda, seed);
  auto b = test::random_vector(static_cast<size_t>(std::max(1, b_rows)) * ldb, seed + 1);
  auto cm = test::random_vector(static_cast<size_t>(c.m) * ldc, seed + 2);
  auto bias = test::random_vector(static_cast<size_t>(c.n), seed + 3);
  Tensor d_a = test::to_device(a), d_b = test::to_device(b), d_bias = test::to_device(bias);
  // beta == 0: the m x n block is poisoned (it must be overwritten without being read); the
  // leading-dimension padding keeps its values, which must survive untouched.
  if (c.beta == 0.f)
    for (int i = 0; i < c.m; ++i) std::fill_n(cm.begin() + static_cast<size_t>(i) * ldc, c.n, NAN);
  Tensor d_c = test::to_device(cm);
  std::vector<float> ref = cm;
  gemm_reference(c, a, lda, b, ldb, ref, ldc, bias);
  std::vector<float> c0 = cm;
  auto launch = [&] {
    gemm_cuda(c.ta, c.tb, c.m, c.n, c.k, c.alpha, d_a.data(), lda, d_b.data(), ldb, c.beta,
              d_c.data(), ldc, c.bias ? d_bias.data() : nullptr, c.relu, prec, nullptr);
  };
  launch();
  std::vector<float> got = d_c.to_vector();
  if (check_repeat) {
    d_c.copy_from(Tensor::from_host({static_cast<int64_t>(c0.size())}, c0, Device::CPU));
    launch();
    std::vector<float> again = d_c.to_vector();
    EXPECT_TRUE(std::equal(got.begin(), got.end(), again.begin(), [](float x, float y) {
      return std::memcmp(&x, &y, 4) == 0;
    })) << "second run differs bitwise";
  }
  return rel_to_max(got, ref, typical(c.k));
}

#endif  // CNN_HAVE_CUDA

}  // namespace

TEST(GpuGemmCuda, TransposesOddSizesAlphaBetaBiasRelu) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  const int sizes[][3] = {{1, 1, 1},       {3, 5, 7},       {65, 33, 17}, {130, 70, 300},
                          {17, 200, 1000}, {129, 10, 1024}, {31, 129, 3}, {200, 96, 64}};
  int which = 0;
  for (Precision prec : {Precision::FP32, Precision::TF32})
    for (const auto& sz : sizes)
      for (int t = 0; t < 4; ++t) {
        ++which;
        GemmCase c{(t & 1) != 0,
                   (t & 2) != 0,
                   sz[0],
                   sz[1],
                   sz[2],
                   (which % 3 == 0) ? 3 : 0,
                   (which % 2) ? 1.5f : 1.f,
                   (which % 4 == 1) ? 0.5f : 0.f,
                   which % 3 != 1,
                   which % 2 == 0};
        const uint64_t seed = test::fresh_seed();
        SCOPED_TRACE(describe(c) + " prec=" + precision_name(prec) +
                     " seed=" + std::to_string(seed));
        const double err = run_case(c, prec, seed);
        EXPECT_LE(err, tolerance(prec, c.k)) << "rel err " << err;
      }
#endif
}

TEST(GpuGemmCuda, KZeroGivesBetaCPlusBias) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  for (Precision prec : {Precision::FP32, Precision::TF32}) {
    GemmCase c{false, true, 37, 45, 0, 0, 2.f, 0.5f, true, false};
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed=" + std::to_string(seed));
    EXPECT_LE(run_case(c, prec, seed), 1e-6);
  }
#endif
}

TEST(GpuGemmCuda, SplitKIsBitwiseRepeatable) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  // Small m*n, long k: the k loop is split across a cluster; the fixed-order sum repeats.
  for (Precision prec : {Precision::FP32, Precision::TF32}) {
    GemmCase c{false, true, 128, 1024, 3136, 0, 1.f, 0.f, true, true};
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(std::string("prec=") + precision_name(prec) + " seed=" + std::to_string(seed));
    const double err = run_case(c, prec, seed, /*check_repeat=*/true);
    std::printf("fc1-like split-k gemm (%s): rel err %.3g\n", precision_name(prec), err);
    EXPECT_LE(err, tolerance(prec, c.k));
  }
#endif
}

// The three products of the linear layer, as linear.cu would call gemm_cuda, against the CPU
// references of kernels/linear.h, at the reference network's shapes and odd batches.
TEST(GpuGemmCuda, LinearLayerShapesMatchCpuReferences) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  const LinearShape shapes[] = {
      {128, 3136, 1024}, {128, 1024, 10}, {1, 3136, 1024}, {129, 100, 10}, {3, 7, 5}};
  for (const LinearShape& s : shapes) {
    const uint64_t seed = test::fresh_seed();
    const size_t nx = static_cast<size_t>(s.n) * s.in, ny = static_cast<size_t>(s.n) * s.out,
                 nw = static_cast<size_t>(s.out) * s.in;
    auto x = test::random_vector(nx, seed), w = test::random_vector(nw, seed + 1);
    auto b = test::random_vector(s.out, seed + 2), dy = test::random_vector(ny, seed + 3);
    auto dw0 = test::random_vector(nw, seed + 4);
    std::vector<float> y_ref(ny), dx_ref(nx), dw_ref = dw0, db_ref(s.out, 0.f);
    const bool relu = s.out > 10;
    linear_forward_cpu(s, x.data(), w.data(), b.data(), y_ref.data(), relu);
    linear_backward_data_cpu(s, dy.data(), w.data(), dx_ref.data());
    linear_backward_weight_cpu(s, x.data(), dy.data(), dw_ref.data(), db_ref.data());
    Tensor d_x = test::to_device(x), d_w = test::to_device(w), d_b = test::to_device(b);
    Tensor d_dy = test::to_device(dy);
    for (Precision prec : {Precision::FP32, Precision::TF32}) {
      SCOPED_TRACE("linear n=" + std::to_string(s.n) + " in=" + std::to_string(s.in) +
                   " out=" + std::to_string(s.out) + " prec=" + precision_name(prec) +
                   " seed=" + std::to_string(seed));
      Tensor d_y({static_cast<int64_t>(ny)}, Device::CUDA),
          d_dx({static_cast<int64_t>(nx)}, Device::CUDA);
      Tensor d_dw = test::to_device(dw0);
      test::poison_device(d_y.data(), ny);
      test::poison_device(d_dx.data(), nx);
      gemm_cuda(false, true, s.n, s.out, s.in, 1.f, d_x.data(), s.in, d_w.data(), s.in, 0.f,
                d_y.data(), s.out, d_b.data(), relu, prec, nullptr);
      gemm_cuda(false, false, s.n, s.in, s.out, 1.f, d_dy.data(), s.out, d_w.data(), s.in, 0.f,
                d_dx.data(), s.in, nullptr, false, prec, nullptr);
      gemm_cuda(true, false, s.out, s.in, s.n, 1.f, d_dy.data(), s.out, d_x.data(), s.in, 1.f,
                d_dw.data(), s.in, nullptr, false, prec, nullptr);
      const double ey = rel_to_max(d_y.to_vector(), y_ref, typical(s.in));
      const double edx = rel_to_max(d_dx.to_vector(), dx_ref, typical(s.out));
      const double edw = rel_to_max(d_dw.to_vector(), dw_ref, typical(s.n));
      std::printf("linear %d x %d -> %d (%s): rel err y %.3g dx %.3g dw %.3g\n", s.n, s.in, s.out,
                  precision_name(prec), ey, edx, edw);
      EXPECT_LE(ey, tolerance(prec, s.in));
      EXPECT_LE(edx, tolerance(prec, s.out));
      EXPECT_LE(edw, tolerance(prec, s.n));
    }
  }
#endif
}
