// Fully connected CUDA kernels (naive and tiled GEMM) against the CPU reference on awkward
// shapes: batch 1 and 257, the reference network's 3136->1024 and 1024->10, sizes that are not
// multiples of any tile, both tile configurations, atomic and deterministic db, and bitwise
// repeatability; the weight gradient written instead of added to, on every variant.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/gemm/linear.h"
#include "runtime/memory.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

// max |got - ref| / max |ref|: the error of a dot product scales with its terms, not with its
// (possibly cancelling) result, so it is measured against the output's scale.
double scaled_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double worst = 0, scale = 1e-30;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    worst = std::max(worst, std::fabs(double(got[i]) - ref[i]));
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  return worst / scale;
}

constexpr double kTol = 1e-5;

void check_linear(const LinearShape& s) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (N, IN, OUT) = (" << s.n << ", " << s.in
                                    << ", " << s.out << ")");
  const size_t nx = size_t(s.n) * s.in, nw = size_t(s.out) * s.in, ny = size_t(s.n) * s.out;
  const std::vector<float> x = test::random_vector(nx, seed);         // (N, IN)
  const std::vector<float> w = test::random_vector(nw, seed + 1);     // (OUT, IN)
  const std::vector<float> b = test::random_vector(s.out, seed + 2);  // (OUT)
  const std::vector<float> dy = test::random_vector(ny, seed + 3);    // (N, OUT)
  const std::vector<float> dw0 = test::random_vector(nw, seed + 4);   // (OUT, IN) before +=
  const std::vector<float> db0 = test::random_vector(s.out, seed + 5);

  std::vector<float> y_relu_ref(ny), y_plain_ref(ny), dx_ref(nx), dw_ref = dw0, db_ref = db0;
  linear_forward_cpu(s, x.data(), w.data(), b.data(), y_relu_ref.data(), true);
  linear_forward_cpu(s, x.data(), w.data(), nullptr, y_plain_ref.data(), false);
  linear_backward_data_cpu(s, dy.data(), w.data(), dx_ref.data());
  linear_backward_weight_cpu(s, x.data(), dy.data(), dw_ref.data(), db_ref.data());

  Tensor d_x = test::to_device(x), d_w = test::to_device(w), d_b = test::to_device(b),
         d_dy = test::to_device(dy);
  Buffer<float> d_y(ny, Device::CUDA);   // (N, OUT)
  Buffer<float> d_dx(nx, Device::CUDA);  // (N, IN)
  Tensor d_dw = test::to_device(dw0), d_db = test::to_device(db0);

  for (Algo algo : {Algo::Naive, Algo::Tiled}) {
    for (bool deterministic : {false, true}) {
      Exec ex;
      ex.device = Device::CUDA;
      ex.deterministic = deterministic;
      test::poison_device(d_y.data(), ny);
      linear_forward(s, d_x.data(), d_w.data(), d_b.data(), d_y.data(), true, algo, ex);
      const double e_relu = scaled_error(test::to_host(d_y.data(), ny), y_relu_ref);
      test::poison_device(d_y.data(), ny);
      linear_forward(s, d_x.data(), d_w.data(), nullptr, d_y.data(), false, algo, ex);
      const double e_plain = scaled_error(test::to_host(d_y.data(), ny), y_plain_ref);

      test::poison_device(d_dx.data(), nx);
      linear_backward_data(s, d_dy.data(), d_w.data(), d_dx.data(), algo, ex);
      const double e_dx = scaled_error(test::to_host(d_dx.data(), nx), dx_ref);

      const size_t scratch_n = linear_backward_weight_scratch_floats(s, ex);
      Buffer<float> d_scratch(std::max<size_t>(scratch_n, 1), Device::CUDA);  // (scratch_n)
      test::poison_device(d_scratch.data(), d_scratch.size());
      std::vector<float> dw_runs[2], db_runs[2];
      for (int run = 0; run < 2; ++run) {
        d_dw.copy_from(test::to_device(dw0));
        d_db.copy_from(test::to_device(db0));
        linear_backward_weight(s, d_x.data(), d_dy.data(), d_dw.data(), d_db.data(),
                               d_scratch.data(), algo, ex, false, scratch_n);
        dw_runs[run] = d_dw.to_vector();
        db_runs[run] = d_db.to_vector();
      }
      const double e_dw = scaled_error(dw_runs[0], dw_ref), e_db = scaled_error(db_runs[0], db_ref);
      std::printf(
          "linear (%d, %d, %d) %s%s: scaled error y+b+relu %.3g y %.3g dx %.3g dw %.3g "
          "db %.3g\n",
          s.n, s.in, s.out, algo_name(algo), deterministic ? " deterministic" : "", e_relu, e_plain,
          e_dx, e_dw, e_db);
      EXPECT_LT(e_relu, kTol) << algo_name(algo);
      EXPECT_LT(e_plain, kTol) << algo_name(algo);
      EXPECT_LT(e_dx, kTol) << algo_name(algo);
      EXPECT_LT(e_dw, kTol) << algo_name(algo);
      EXPECT_LT(e_db, kTol) << algo_name(algo);
      EXPECT_EQ(dw_runs[0], dw_runs[1]) << "dw is a plain GEMM and must be bitwise repeatable";
      if (deterministic) {
        EXPECT_EQ(db_runs[0], db_runs[1]) << "deterministic db differs";
      }
    }
  }
}

}  // namespace

TEST(GpuLinear, MatchesCpuOnAwkwardShapes) {
  CNN_REQUIRE_GPU();
  // Sanitizer runs (test::light_sweeps) shrink the big dimensions; every tile edge case stays.
  const int big = test::light_sweeps() ? 130 : 1030, rows = test::light_sweeps() ? 100 : 1000;
  const LinearShape shapes[] = {
      {test::network_batch(), 3136, 1024},  // fc1 of the reference network
      {1, 3136, 1024},                      // batch 1
      {257, 1000, 10},                      // fc2-like, odd batch
      {test::network_batch(), 1024, 10},    // fc2
      {1, 37, 5},        {257, 37, 5},    {33, 65, 129}, {64, 64, 64},
      {3, 1, 1},         {big, 37, big},  // forward on 64x64 tiles, K not a multiple of 16
      {big, big, 37},                     // backward_data on 64x64 tiles
      {37, big, big},                     // backward_weight on 64x64 tiles, batch 37
      {rows, 17, 300},                    // chunks of rows for db
  };
  for (const LinearShape& s : shapes) check_linear(s);
}

// Auto runs gemm_cuda (the fastest variant); it must repeat bitwise and agree with tiled.
TEST(GpuLinear, AutoIsBitwiseRepeatableAndAgreesWithTiled) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const LinearShape s{77, 300, 130};
  Tensor d_x = test::to_device(test::random_vector(size_t(s.n) * s.in, seed));
  Tensor d_w = test::to_device(test::random_vector(size_t(s.out) * s.in, seed + 1));
  Buffer<float> d_y(size_t(s.n) * s.out, Device::CUDA);  // (N, OUT)
  Exec ex;
  ex.device = Device::CUDA;
  std::vector<float> runs[3];
  const Algo algos[3] = {Algo::Auto, Algo::Auto, Algo::Tiled};
  for (int i = 0; i < 3; ++i) {
    test::poison_device(d_y.data(), d_y.size());
    linear_forward(s, d_x.data(), d_w.data(), nullptr, d_y.data(), false, algos[i], ex);
    runs[i] = test::to_host(d_y.data(), d_y.size());
  }
  EXPECT_EQ(runs[0], runs[1]);
  // Different summation orders: compare relative to the outputs' scale (~sqrt(K)), not per element.
  EXPECT_LT(test::max_rel_error(runs[0], runs[2], 1.0), 1e-4);
}

// overwrite_dw: every variant, in every precision, writes dw without reading it (NaN there goes)
// with the bits of += onto zeros; db is still added to (atomic beyond 1024 rows: compared in
// deterministic mode, where it repeats).
TEST(GpuLinear, OverwriteDwGivesTheBitsOfAddingOntoZeros) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const LinearShape shapes[] = {{test::network_batch(), 3136, 1024},  // fc1: split-K, wgmma
                                {test::network_batch(), 1024, 10},    // fc2: small-m kernel
                                {1, 37, 5},
                                {33, 65, 129},
                                {37, 130, 130},
                                {1100, 17, 40}};  // several db chunks
  for (const LinearShape& s : shapes) {
    SCOPED_TRACE(::testing::Message()
                 << "(N, IN, OUT) = (" << s.n << ", " << s.in << ", " << s.out << ")");
    const size_t nw = size_t(s.out) * s.in;
    Tensor d_x = test::to_device(test::random_vector(size_t(s.n) * s.in, seed));
    Tensor d_dy = test::to_device(test::random_vector(size_t(s.n) * s.out, seed + 1));
    const std::vector<float> db0 = test::random_vector(size_t(s.out), seed + 2);
    Buffer<float> d_dw(nw, Device::CUDA);             // (OUT, IN)
    Buffer<float> d_db(size_t(s.out), Device::CUDA);  // (OUT)
    for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16})
      for (Algo algo : {Algo::Naive, Algo::Tiled, Algo::Igemm, Algo::Fast, Algo::Auto}) {
        SCOPED_TRACE(::testing::Message() << precision_name(p) << " " << algo_name(algo));
        Exec ex;
        ex.device = Device::CUDA;
        ex.precision = p;
        ex.deterministic = true;
        const size_t scratch_n = linear_backward_weight_scratch_floats(s, ex);
        Buffer<float> d_scratch(std::max<size_t>(scratch_n, 1), Device::CUDA);  // (scratch_n)
        std::vector<float> dw[2], db[2];
        for (int overwrite = 0; overwrite < 2; ++overwrite) {
          if (overwrite)
            test::poison_device(d_dw.data(), nw);
          else
            d_dw.zero();
          d_db.copy_from(db0.data(), Device::CPU, db0.size());
          linear_backward_weight(s, d_x.data(), d_dy.data(), d_dw.data(), d_db.data(),
                                 d_scratch.data(), algo, ex, overwrite == 1, scratch_n);
          dw[overwrite] = test::to_host(d_dw.data(), nw);
          db[overwrite] = test::to_host(d_db.data(), db0.size());
        }
        EXPECT_EQ(0, std::memcmp(dw[0].data(), dw[1].data(), nw * sizeof(float)));
        EXPECT_EQ(db[0], db[1]);
      }
  }
}
