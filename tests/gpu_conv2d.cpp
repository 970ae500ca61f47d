// conv2d on the GPU: every CUDA variant against the CPU reference over a table of shapes, the
// deterministic weight gradient's bitwise repeatability, and batches beyond any grid-dimension
// limit. Outputs are poisoned with NaN before each run; tolerances scale with reduction length.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#ifdef CNN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "kernels/conv/conv2d.h"
#include "runtime/memory.h"
#include "runtime/tensor.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

struct Case {
  int n, c, h, w, oc, kh, kw, sh, sw, ph, pw;
};

Conv2dShape shape_of(const Case& k) {
  Conv2dShape s;
  s.n = k.n, s.c = k.c, s.h = k.h, s.w = k.w, s.oc = k.oc, s.kh = k.kh, s.kw = k.kw;
  s.stride_h = k.sh, s.stride_w = k.sw, s.pad_h = k.ph, s.pad_w = k.pw;
  return s;
}

std::string describe(const Conv2dShape& s) {
  return "N" + std::to_string(s.n) + " C" + std::to_string(s.c) + " " + std::to_string(s.h) + "x" +
         std::to_string(s.w) + " -> OC" + std::to_string(s.oc) + " k" + std::to_string(s.kh) + "x" +
         std::to_string(s.kw) + " s" + std::to_string(s.stride_h) + "," +
         std::to_string(s.stride_w) + " p" + std::to_string(s.pad_h) + "," +
         std::to_string(s.pad_w);
}

size_t x_size(const Conv2dShape& s) {
  return size_t(s.n) * s.c * s.h * s.w;
}
size_t w_size(const Conv2dShape& s) {
  return size_t(s.oc) * s.c * s.kh * s.kw;
}
size_t y_size(const Conv2dShape& s) {
  return size_t(s.n) * s.oc * s.oh() * s.ow();
}

Exec cuda_exec(bool deterministic = false) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.deterministic = deterministic;
  return ex;
}

// Error of `got` against `ref` relative to |ref|, but never relative to less than a tenth of the
// reference's rms (so values that cancel to near zero are judged by the output's scale). The
// tolerance grows with the reduction length K like float rounding does: 1e-5 * sqrt(K).
struct Compare {
  double worst = 0;  // in units of |ref| + floor
  double tol = 0;
  bool nan = false;
};

Compare compare(const std::vector<float>& got, const std::vector<float>& ref, double k) {
  Compare r;
  r.tol = 1e-5 * std::sqrt(std::max(k, 1.0));
  double sq = 0;
  for (float v : ref) sq += double(v) * v;
  const double floor = std::max(0.1 * std::sqrt(sq / std::max<size_t>(ref.size(), 1)), 1e-6);
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isinf(got[i])) {
      r.nan = true;
      continue;
    }
    const double e = std::fabs(double(got[i]) - ref[i]) / (std::fabs(double(ref[i])) + floor);
    r.worst = std::max(r.worst, e);
  }
  return r;
}

#define EXPECT_CLOSE(got, ref, k, what)                                                  \
  do {                                                                                   \
    const Compare c_ = compare(got, ref, k);                                             \
    std::printf("  %-36s worst rel error %.2e (tol %.1e)\n", what, c_.worst, c_.tol);    \
    EXPECT_FALSE(c_.nan) << what << ": NaN/Inf left in the output (unwritten element?)"; \
    EXPECT_LE(c_.worst, c_.tol) << what;                                                 \
  } while (0)

// Host data of one problem and its CPU reference results.
struct Problem {
  Conv2dShape s;
  std::vector<float> x, w, b, dy, dw0, db0;  // inputs; dw0/db0: what dw/db hold before backward
  std::vector<float> y_plain, y_bias_relu, dx, dw, db;  // references
};

Problem make_problem(const Conv2dShape& s, uint64_t seed) {
  Problem p;
  p.s = s;
  p.x = test::random_vector(x_size(s), seed);
  p.w = test::random_vector(w_size(s), seed + 1);
  p.b = test::random_vector(s.oc, seed + 2);
  p.dy = test::random_vector(y_size(s), seed + 3);
  p.dw0 = test::random_vector(w_size(s), seed + 4);
  p.db0 = test::random_vector(s.oc, seed + 5);
  p.y_plain.resize(y_size(s));
  conv2d_forward_cpu(s, p.x.data(), p.w.data(), nullptr, p.y_plain.data(), false);
  p.y_bias_relu.resize(y_size(s));
  conv2d_forward_cpu(s, p.x.data(), p.w.data(), p.b.data(), p.y_bias_relu.data(), true);
  p.dx.resize(x_size(s));
  conv2d_backward_data_cpu(s, p.dy.data(), p.w.data(), p.dx.data());
  p.dw = p.dw0;
  p.db = p.db0;
  conv2d_backward_weight_cpu(s, p.x.data(), p.dy.data(), p.dw.data(), p.db.data());
  return p;
}

// Runs every variant of every pass on the GPU and compares with the references.
void check_all_variants(const Problem& p) {
  const Conv2dShape& s = p.s;
  const Exec ex = cuda_exec();
  Tensor x = test::to_device(p.x), w = test::to_device(p.w), b = test::to_device(p.b);
  Tensor dy = test::to_device(p.dy);
  Tensor y({int64_t(y_size(s))}, Device::CUDA), dx({int64_t(x_size(s))}, Device::CUDA);
  const double k_fwd = double(s.c) * s.kh * s.kw + 1;
  const double k_data = double(s.oc) * s.kh * s.kw;
  const double k_wgt = double(s.n) * s.oh() * s.ow() + 1;

  const struct {
    Algo algo;
    const char* name;
  } algos[] = {{Algo::Naive, "naive"}, {Algo::Tiled, "tiled"}, {Algo::Auto, "auto"}};
  for (const auto& a : algos) {
    SCOPED_TRACE(std::string("algo ") + a.name);
    test::poison_device(y.data(), y_size(s));
    conv2d_forward(s, x.data(), w.data(), nullptr, y.data(), false, nullptr, a.algo, ex);
    EXPECT_CLOSE(test::to_host(y.data(), y_size(s)), p.y_plain, k_fwd,
                 (std::string("forward ") + a.name).c_str());

    test::poison_device(y.data(), y_size(s));
    conv2d_forward(s, x.data(), w.data(), b.data(), y.data(), true, nullptr, a.algo, ex);
    EXPECT_CLOSE(test::to_host(y.data(), y_size(s)), p.y_bias_relu, k_fwd,
                 (std::string("forward+bias+relu ") + a.name).c_str());

    test::poison_device(dx.data(), x_size(s));
    conv2d_backward_data(s, dy.data(), w.data(), dx.data(), nullptr, a.algo, ex);
    EXPECT_CLOSE(test::to_host(dx.data(), x_size(s)), p.dx, k_data,
                 (std::string("backward_data ") + a.name).c_str());
  }

  // Weight gradients accumulate, so they start from dw0/db0 rather than from poison.
  const struct {
    Algo algo;
    bool deterministic;
    const char* name;
  } wgrads[] = {{Algo::Naive, false, "naive"},
                {Algo::Tiled, false, "tiled atomic"},
                {Algo::Tiled, true, "tiled deterministic"},
                {Algo::Auto, true, "auto deterministic"}};
  for (const auto& v : wgrads) {
    SCOPED_TRACE(std::string("wgrad ") + v.name);
    const Exec wex = cuda_exec(v.deterministic);
    const size_t scratch_n = conv2d_backward_weight_scratch_floats(s, wex);
    Tensor scratch({int64_t(std::max<size_t>(scratch_n, 1))}, Device::CUDA);
    test::poison_device(scratch.data(), scratch.numel());  // stage 2 must read only stage-1 writes
    Tensor dw = test::to_device(p.dw0), db = test::to_device(p.db0);
    conv2d_backward_weight(s, x.data(), dy.data(), dw.data(), db.data(),
                           scratch_n ? scratch.data() : nullptr, v.algo, wex);
    EXPECT_CLOSE(test::to_host(dw.data(), w_size(s)), p.dw, k_wgt,
                 (std::string("backward_weight dw ") + v.name).c_str());
    EXPECT_CLOSE(test::to_host(db.data(), s.oc), p.db, k_wgt,
                 (std::string("backward_weight db ") + v.name).c_str());

    // Without a bias gradient (db == nullptr) the weights must come out the same.
    Tensor dw2 = test::to_device(p.dw0);
    test::poison_device(scratch.data(), scratch.numel());
    conv2d_backward_weight(s, x.data(), dy.data(), dw2.data(), nullptr,
                           scratch_n ? scratch.data() : nullptr, v.algo, wex);
    EXPECT_CLOSE(test::to_host(dw2.data(), w_size(s)), p.dw, k_wgt,
                 (std::string("backward_weight dw (no db) ") + v.name).c_str());
  }
}

void run_case(const Conv2dShape& s) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", shape " + describe(s));
  std::printf("%s (seed %llu)\n", describe(s).c_str(), static_cast<unsigned long long>(seed));
  check_all_variants(make_problem(s, seed));
}

}  // namespace

// Small awkward shapes: kernels 1/3/5/7 and 3x5, strides 1/2/3, padding 0/1/2, channels
// 1/3/7, oc 1/5/32, batch 1 and 257, non-square images, images smaller and larger than a tile.
TEST(GpuConv2d, AllVariantsMatchCpuOnShapeTable) {
  CNN_REQUIRE_GPU();
  const Case cases[] = {
      // n   c   h   w  oc kh kw sh sw ph pw
      {1, 1, 13, 17, 1, 3, 3, 1, 1, 1, 1},
      {1, 3, 13, 17, 5, 3, 3, 1, 1, 0, 0},
      {2, 7, 13, 17, 32, 5, 5, 1, 1, 2, 2},
      {3, 3, 13, 17, 5, 7, 7, 1, 1, 2, 2},
      {2, 3, 13, 17, 5, 1, 1, 1, 1, 0, 0},
      {2, 3, 13, 17, 5, 1, 1, 2, 2, 0, 0},
      {2, 7, 13, 17, 5, 3, 5, 1, 1, 1, 2},   // rectangular kernel
      {2, 3, 13, 17, 5, 3, 3, 2, 2, 1, 1},   // stride 2
      {2, 3, 13, 17, 32, 5, 5, 3, 3, 2, 2},  // stride 3
      {2, 3, 17, 13, 5, 7, 7, 3, 3, 0, 0},
      {2, 1, 13, 17, 1, 3, 3, 2, 3, 0, 1},   // mixed strides and pads
      {2, 3, 13, 17, 5, 2, 2, 3, 3, 0, 0},   // stride > kernel: some inputs get no gradient
      {1, 2, 5, 6, 3, 3, 3, 1, 1, 2, 2},     // outputs that see only padding
      {2, 3, 3, 3, 5, 5, 5, 1, 1, 1, 1},     // kernel == padded input: 1x1 output
      {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},     // a single pixel
      {1, 7, 40, 37, 32, 5, 5, 1, 1, 2, 2},  // several tiles with ragged edges
      {1, 3, 35, 33, 5, 3, 3, 2, 2, 1, 1},   // several tiles, stride 2
      {257, 1, 13, 17, 5, 3, 3, 1, 1, 1, 1},
      {257, 3, 7, 9, 32, 3, 3, 2, 2, 1, 1},
      {257, 7, 6, 5, 1, 3, 5, 1, 1, 1, 2},
  };
  for (const Case& k : cases) run_case(shape_of(k));
}

// The reference network's two convolutions at batch 128.
TEST(GpuConv2d, NetworkShapesMatchCpu) {
  CNN_REQUIRE_GPU();
  run_case(shape_of({test::network_batch(), 1, 28, 28, 32, 5, 5, 1, 1, 2, 2}));
  run_case(shape_of({test::network_batch(), 32, 14, 14, 64, 5, 5, 1, 1, 2, 2}));
}

// Tile + halo too large for shared memory: the tiled forward must fall back, not fail.
TEST(GpuConv2d, HugeKernelFallsBackCorrectly) {
  CNN_REQUIRE_GPU();
  // 90x90 taps: the tiled forward's weights + tile (297 KB) and the tiled weight gradient's
  // partial sums (8.3 MB) exceed any block's shared memory, so both fall back to naive. Small
  // enough (3x3 outputs) that racecheck finishes it in seconds.
  run_case(shape_of({1, 1, 100, 100, 2, 90, 90, 4, 4, 0, 0}));
}

// N*C planes beyond 65535 (the y/z grid limit): every launch must cover them all.
TEST(GpuConv2d, ManyPlanesBeyondGridLimit) {
  CNN_REQUIRE_GPU();
  run_case(shape_of({70000, 1, 3, 3, 2, 3, 3, 1, 1, 1, 1}));
  run_case(shape_of({300, 250, 3, 3, 2, 3, 3, 1, 1, 1, 1}));
}

// Deterministic mode: two runs give bitwise-equal dw/db; atomic mode stays within tolerance of
// the CPU (checked against the reference in the tests above as well).
TEST(GpuConv2d, DeterministicWeightGradientIsBitwiseRepeatable) {
  CNN_REQUIRE_GPU();
  const Case cases[] = {{test::network_batch(), 32, 14, 14, 64, 5, 5, 1, 1, 2, 2},
                        {257, 3, 13, 17, 5, 3, 5, 2, 1, 1, 2},
                        {70000, 1, 3, 3, 2, 3, 3, 1, 1, 1, 1}};
  for (const Case& k : cases) {
    const Conv2dShape s = shape_of(k);
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + ", shape " + describe(s));
    const auto hx = test::random_vector(x_size(s), seed);
    const auto hdy = test::random_vector(y_size(s), seed + 1);
    const auto hdw0 = test::random_vector(w_size(s), seed + 2);
    const auto hdb0 = test::random_vector(s.oc, seed + 3);
    Tensor x = test::to_device(hx), dy = test::to_device(hdy);

    auto run = [&](bool deterministic, std::vector<float>* dw_out, std::vector<float>* db_out) {
      const Exec ex = cuda_exec(deterministic);
      const size_t n = conv2d_backward_weight_scratch_floats(s, ex);
      if (deterministic) {
        EXPECT_GT(n, 0u);
      }
      Tensor scratch({int64_t(std::max<size_t>(n, 1))}, Device::CUDA);
      test::poison_device(scratch.data(), scratch.numel());
      Tensor dw = test::to_device(hdw0), db = test::to_device(hdb0);
      conv2d_backward_weight(s, x.data(), dy.data(), dw.data(), db.data(),
                             n ? scratch.data() : nullptr, Algo::Tiled, ex);
      *dw_out = test::to_host(dw.data(), w_size(s));
      *db_out = test::to_host(db.data(), s.oc);
    };
    std::vector<float> dw1, db1, dw2, db2, dwa, dba;
    run(true, &dw1, &db1);
    run(true, &dw2, &db2);
    run(false, &dwa, &dba);
    ASSERT_EQ(dw1.size(), dw2.size());
    EXPECT_EQ(0, std::memcmp(dw1.data(), dw2.data(), dw1.size() * sizeof(float)))
        << "deterministic dw differs between two runs";
    EXPECT_EQ(0, std::memcmp(db1.data(), db2.data(), db1.size() * sizeof(float)))
        << "deterministic db differs between two runs";

    std::vector<float> ref_dw = hdw0, ref_db = hdb0;
    conv2d_backward_weight_cpu(s, hx.data(), hdy.data(), ref_dw.data(), ref_db.data());
    const double k = double(s.n) * s.oh() * s.ow() + 1;
    std::printf("%s\n", describe(s).c_str());
    EXPECT_CLOSE(dw1, ref_dw, k, "deterministic dw");
    EXPECT_CLOSE(db1, ref_db, k, "deterministic db");
    EXPECT_CLOSE(dwa, ref_dw, k, "atomic dw");
    EXPECT_CLOSE(dba, ref_db, k, "atomic db");
  }
}

#ifdef CNN_HAVE_CUDA
// Launches go on the given stream: a non-default stream gives the same answer.
TEST(GpuConv2d, RunsOnTheGivenStream) {
  CNN_REQUIRE_GPU();
  const Conv2dShape s = shape_of({3, 5, 11, 9, 7, 3, 3, 1, 2, 1, 0});
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Problem p = make_problem(s, seed);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  Exec ex = cuda_exec(true);
  ex.stream = stream;
  Tensor x = test::to_device(p.x), w = test::to_device(p.w), b = test::to_device(p.b);
  Tensor dy = test::to_device(p.dy), dw = test::to_device(p.dw0), db = test::to_device(p.db0);
  Tensor y({int64_t(y_size(s))}, Device::CUDA), dx({int64_t(x_size(s))}, Device::CUDA);
  Tensor scratch({int64_t(conv2d_backward_weight_scratch_floats(s, ex))}, Device::CUDA);
  test::poison_device(y.data(), y_size(s));
  test::poison_device(dx.data(), x_size(s));
  conv2d_forward(s, x.data(), w.data(), b.data(), y.data(), true, nullptr, Algo::Tiled, ex);
  conv2d_backward_data(s, dy.data(), w.data(), dx.data(), nullptr, Algo::Tiled, ex);
  conv2d_backward_weight(s, x.data(), dy.data(), dw.data(), db.data(), scratch.data(), Algo::Tiled,
                         ex);
  stream_sync(Device::CUDA, stream);
  EXPECT_CLOSE(test::to_host(y.data(), y_size(s)), p.y_bias_relu, 5 * 9 + 1, "forward (stream)");
  EXPECT_CLOSE(test::to_host(dx.data(), x_size(s)), p.dx, 7 * 9, "backward_data (stream)");
  EXPECT_CLOSE(test::to_host(dw.data(), w_size(s)), p.dw, 3 * 11 * 4 + 1, "dw (stream)");
  EXPECT_CLOSE(test::to_host(db.data(), s.oc), p.db, 3 * 11 * 4 + 1, "db (stream)");
  cudaStreamDestroy(stream);
}
#endif  // CNN_HAVE_CUDA
