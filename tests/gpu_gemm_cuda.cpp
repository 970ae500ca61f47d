// gemm_cuda (kernels/gemm_cuda.h) against a double-precision reference: every transpose
// combination, odd sizes, padded leading dimensions, alpha/beta, bias and ReLU, k == 0, the
// split-k cluster path, FP32 and TF32; and the linear layer's three products at the reference
// network's shapes against the CPU references of kernels/linear.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/gemm/linear.h"
#include "runtime/env_switches.h"
#include "runtime/exec.h"
#include "runtime/memory.h"
#include "tests/gemm_error_measure.h"
#include "tests/test_util.h"
#ifdef CNN_HAVE_CUDA
#include "kernels/gemm/gemm_cuda.h"
#include "kernels/gemm/gemm_wgmma.h"
#endif

using namespace cnn;

namespace {

#ifdef CNN_HAVE_CUDA

using test::rel_to_max;
using test::tolerance;
using test::typical;

struct GemmCase {
  bool ta, tb;
  int m, n, k;
  int pad;  // extra leading-dimension elements beyond the minimum
  float alpha, beta;
  bool bias, relu;
  int offset = 0;       // elements by which the a, b and c pointers are shifted (1: misaligned)
  bool align4 = false;  // leading dimensions rounded up to a multiple of 4 before adding pad
};

// Shape sz through transpose pair t (bit 0: A transposed, bit 1: B transposed) with `pad`
// extra leading-dimension elements; alpha, beta, bias and ReLU varied by the case counter.
GemmCase varied_case(const int (&sz)[3], int t, int which, int pad) {
  return GemmCase{(t & 1) != 0,
                  (t & 2) != 0,
                  sz[0],
                  sz[1],
                  sz[2],
                  pad,
                  (which % 2) ? 1.5f : 1.f,
                  (which % 4 == 1) ? 0.5f : 0.f,
                  which % 3 != 1,
                  which % 2 == 0};
}

std::string describe(const GemmCase& c) {
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "ta=%d tb=%d m=%d n=%d k=%d pad=%d align4=%d offset=%d alpha=%g beta=%g bias=%d "
                "relu=%d",
                c.ta, c.tb, c.m, c.n, c.k, c.pad, c.align4, c.offset, c.alpha, c.beta, c.bias,
                c.relu);
  return buf;
}

int lead(const GemmCase& c, int cols) {
  return (c.align4 ? (cols + 3) / 4 * 4 : cols) + c.pad;
}

// Plain-loop reference in double, same contract as gemm_cuda.
void gemm_reference(const GemmCase& c, const float* a, int lda, const float* b, int ldb, float* cm,
                    int ldc, const float* bias) {
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

// Runs one case on the GPU through `path` in `prec` (twice when check_repeat, comparing
// bitwise) and returns the error relative to the reference. `took` receives the path that ran.
double run_case(const GemmCase& c, Precision prec, uint64_t seed, bool check_repeat = false,
                GemmPath path = GemmPath::Auto, GemmPath* took = nullptr,
                Fp32Math fp32 = Fp32Math::Ffma) {
  const int a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
  const int b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
  const int lda = lead(c, a_cols), ldb = lead(c, b_cols), ldc = lead(c, c.n);
  const size_t off = static_cast<size_t>(c.offset);
  auto a = test::random_vector(off + static_cast<size_t>(std::max(1, a_rows)) * lda, seed);
  auto b = test::random_vector(off + static_cast<size_t>(std::max(1, b_rows)) * ldb, seed + 1);
  auto cm = test::random_vector(off + static_cast<size_t>(c.m) * ldc, seed + 2);
  auto bias = test::random_vector(static_cast<size_t>(c.n), seed + 3);
  Tensor d_a = test::to_device(a), d_b = test::to_device(b), d_bias = test::to_device(bias);
  // beta == 0: the m x n block is poisoned (it must be overwritten without being read); the
  // leading-dimension padding keeps its values, which must survive untouched.
  if (c.beta == 0.f)
    for (int i = 0; i < c.m; ++i)
      std::fill_n(cm.begin() + static_cast<std::ptrdiff_t>(off + static_cast<size_t>(i) * ldc), c.n,
                  NAN);
  Tensor d_c = test::to_device(cm);
  std::vector<float> ref = cm;
  gemm_reference(c, a.data() + off, lda, b.data() + off, ldb, ref.data() + off, ldc, bias.data());
  std::vector<float> c0 = cm;
  if (took)
    *took = gemm_cuda_resolve(path, c.ta, c.tb, c.m, c.n, c.k, d_a.data() + off, lda,
                              d_b.data() + off, ldb, prec, fp32);
  auto launch = [&] {
    gemm_cuda_path(path, c.ta, c.tb, c.m, c.n, c.k, c.alpha, d_a.data() + off, lda,
                   d_b.data() + off, ldb, c.beta, d_c.data() + off, ldc,
                   c.bias ? d_bias.data() : nullptr, c.relu, prec, nullptr, fp32);
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

// True when the environment forces a GEMM path (then Auto's choice is not checked).
bool path_forced_by_env() {
  return std::getenv("CNN_GEMM_PATH") != nullptr;
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
        const GemmCase c = varied_case(sz, t, which, (which % 3 == 0) ? 3 : 0);
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
    GemmCase c{false, true, test::network_batch(), 1024, 3136, 0, 1.f, 0.f, true, true};
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(std::string("prec=") + precision_name(prec) + " seed=" + std::to_string(seed));
    const double err = run_case(c, prec, seed, /*check_repeat=*/true);
    std::printf("fc1-like split-k gemm (%s): rel err %.3g\n", precision_name(prec), err);
    EXPECT_LE(err, tolerance(prec, c.k));
  }
#endif
}

// FP32 as 3xTF32 on the 16-byte tiles, 64 x 64 and wide (Fp32Math::Tf32x3; the weight
// gradient's path in FP32 and every pass's off Hopper): every transpose, awkward m, n and k,
// alpha, beta, bias, ReLU, split k, held to the FFMA tolerance; bitwise repeatable.
TEST(GpuGemmCuda, Fp32As3xTf32OnTheVecTile) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  const int sizes[][3] = {
      {1, 1, 4}, {65, 33, 20}, {130, 70, 300}, {17, 200, 128}, {1024, 200, 128}};
  int which = 0;
  for (const auto& sz : sizes)
    for (int t = 0; t < 4; ++t) {
      ++which;
      GemmCase c = varied_case(sz, t, which, 4 * (which % 2));
      c.align4 = true;
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
      for (GemmPath path : {GemmPath::VecTile, GemmPath::VecTileWide}) {
        GemmPath took = GemmPath::Auto;
        const double err = run_case(c, Precision::FP32, seed, /*check_repeat=*/true, path, &took,
                                    Fp32Math::Tf32x3);
        EXPECT_EQ(took, path);
        std::printf("3xtf32 %s %dx%dx%d ta=%d tb=%d: rel err %.3g\n", gemm_path_name(path), c.m,
                    c.n, c.k, c.ta, c.tb, err);
        EXPECT_LE(err, tolerance(Precision::FP32, c.k)) << "rel err " << err;
      }
    }
#endif
}

// Every path (strided 4-byte tiles, 16-byte tiles, the three small-shape kernels) on awkward
// shapes: odd m/n/k, k not a multiple of 4, all transposes, alpha/beta/bias/relu, leading
// dimensions aligned to 4 (the 16-byte path runs) or not, pointers shifted by one element (the
// 16-byte path must fall back).
TEST(GpuGemmCuda, AllPathsAwkwardShapes) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  const int sizes[][3] = {{1, 1, 1},      {3, 5, 7},       {65, 33, 17}, {130, 70, 301},
                          {17, 200, 999}, {129, 10, 1023}, {31, 129, 3}, {64, 64, 32},
                          {10, 97, 130},  {128, 67, 10},   {5, 9, 40}};
  const GemmPath paths[] = {GemmPath::StridedTile, GemmPath::VecTile, GemmPath::VecTileWide,
                            GemmPath::SmallDot,    GemmPath::SmallM,  GemmPath::SmallK};
  int which = 0;
  for (GemmPath path : paths)
    for (Precision prec : {Precision::FP32, Precision::TF32})
      for (const auto& sz : sizes)
        for (int t = 0; t < 4; ++t)
          for (int layout = 0; layout < 3; ++layout) {  // ld % 4: 0, 3; pointers shifted by 1
            ++which;
            // Sanitizer runs: every path, precision, transpose and layout, on 4 of the sizes.
            const int size_index = int(&sz - &sizes[0]);
            if (test::light_sweeps() && size_index % 3 != 1) continue;
            GemmCase c = varied_case(sz, t, which, layout == 1 ? 3 : (which % 2) * 4);
            c.relu = which % 5 < 2;
            c.offset = layout == 2 ? 1 : 0;
            c.align4 = true;
            const uint64_t seed = test::fresh_seed();
            SCOPED_TRACE(describe(c) + " path=" + gemm_path_name(path) +
                         " prec=" + precision_name(prec) + " seed=" + std::to_string(seed));
            GemmPath took = GemmPath::Auto;
            const double err = run_case(c, prec, seed, false, path, &took);
            // Small kernels compute in FP32 whatever the precision.
            const bool small =
                path == GemmPath::SmallDot || path == GemmPath::SmallM || path == GemmPath::SmallK;
            EXPECT_LE(err, tolerance(small ? Precision::FP32 : prec, c.k)) << "rel err " << err;
            if (path == GemmPath::VecTile || path == GemmPath::VecTileWide) {
              // FP32 (FFMA here) has no wide tile: the 64 x 64 one runs it.
              const GemmPath vec = prec == Precision::FP32 ? GemmPath::VecTile : path;
              EXPECT_EQ(took, layout == 0 ? vec : GemmPath::StridedTile)
                  << "16-byte path taken / not taken as the alignment says";
            } else {
              EXPECT_EQ(took, path);
            }
          }
#endif
}

// The paths Auto picks for the reference network's linear layers (batch 128), and that each of
// them repeats bitwise (split-K clusters and the small kernels sum in a fixed order).
TEST(GpuGemmCuda, NetworkShapesPathsAndBitwiseRepeat) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  struct NetCase {
    const char* name;
    GemmCase c;
    GemmPath expect;
    bool wgmma_in_tf32 = false;  // both operands K-major: Wgmma on a Hopper GPU in TF32
    bool wgmma_staged = false;  // B transposed, TMA-aligned: Wgmma there unless CNN_WGMMA_MN=gather
  };
  // As linear.cpp calls gemm_cuda: forward (x, w^T), dgrad (dy, w), wgrad (dy^T, x; beta 1).
  const int nb = test::network_batch();
  const NetCase cases[] = {
      {"fc1 fwd", {false, true, nb, 1024, 3136, 0, 1.f, 0.f, true, true}, GemmPath::VecTile, true},
      {"fc1 dgrad",
       {false, false, nb, 3136, 1024, 0, 1.f, 0.f, false, false},
       GemmPath::VecTile,
       false,
       true},
      {"fc1 wgrad", {true, false, 1024, 3136, nb, 0, 1.f, 1.f, false, false}, GemmPath::VecTile},
      {"fc2 fwd", {false, true, nb, 10, 1024, 0, 1.f, 0.f, true, false}, GemmPath::SmallDot},
      {"fc2 dgrad", {false, false, nb, 1024, 10, 0, 1.f, 0.f, false, false}, GemmPath::SmallK},
      {"fc2 wgrad", {true, false, 10, 1024, nb, 0, 1.f, 1.f, false, false}, GemmPath::SmallM},
  };
  for (const NetCase& nc : cases)
    for (Precision prec : {Precision::FP32, Precision::TF32})
      for (GemmPath path : {GemmPath::Auto, GemmPath::StridedTile}) {
        const uint64_t seed = test::fresh_seed();
        SCOPED_TRACE(std::string(nc.name) + " " + describe(nc.c) + " path=" + gemm_path_name(path) +
                     " prec=" + precision_name(prec) + " seed=" + std::to_string(seed));
        GemmPath took = GemmPath::Auto;
        const double err = run_case(nc.c, prec, seed, /*check_repeat=*/true, path, &took);
        std::printf("%s (%s, %s -> %s): rel err %.3g\n", nc.name, precision_name(prec),
                    gemm_path_name(path), gemm_path_name(took), err);
        EXPECT_LE(err, tolerance(prec, nc.c.k));
        if (path == GemmPath::Auto && !path_forced_by_env() && !test::light_sweeps()) {
          const bool wgmma =
              (nc.wgmma_in_tf32 || (nc.wgmma_staged && process_env_switches().wgmma_mn_tma)) &&
              prec == Precision::TF32 && gemm_wgmma_available();
          EXPECT_EQ(took, wgmma ? GemmPath::Wgmma : nc.expect);
        }
        if (path == GemmPath::StridedTile) {
          EXPECT_EQ(took, GemmPath::StridedTile);
        }
      }
#endif
}

// Auto's choice between the two 16-byte tiles: the 128 x 128 one for BF16 outputs of at least
// 4 64 x 64 tiles an SM (fc1's weight gradient: 16 x 49 of them), the 64 x 64 one otherwise and
// in TF32 (where the wide tile made the LeNet step slower).
TEST(GpuGemmCuda, AutoTakesTheWideTileForLargeBf16Outputs) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  if (path_forced_by_env()) return;
  int dev = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  const float* none = nullptr;                      // 16-byte aligned: the tile paths are open
  auto wgrad = [&](int m, int n, Precision prec) {  // dw (m, n) = dy^T (m, k) x (k, n), k = 128
    return gemm_cuda_resolve(GemmPath::Auto, true, false, m, n, 128, none, m, none, n, prec);
  };
  EXPECT_EQ(wgrad(1024, 3136, Precision::BF16),
            16 * 49 >= 4 * sms ? GemmPath::VecTileWide : GemmPath::VecTile);
  EXPECT_EQ(wgrad(1024, 3136, Precision::TF32), GemmPath::VecTile);
  EXPECT_EQ(wgrad(256, 320, Precision::BF16), GemmPath::VecTile);  // 20 tiles
  // Asked for, the wide tile runs wherever the operands allow 16-byte copies.
  EXPECT_EQ(gemm_cuda_resolve(GemmPath::VecTileWide, true, false, 256, 320, 128, none, 256, none,
                              320, Precision::BF16),
            GemmPath::VecTileWide);
#endif
}

// The three products of the linear layer, as linear.cu would call gemm_cuda, against the CPU
// references of kernels/linear.h, at the reference network's shapes and odd batches.
TEST(GpuGemmCuda, LinearLayerShapesMatchCpuReferences) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  const LinearShape shapes[] = {{test::network_batch(), 3136, 1024},
                                {test::network_batch(), 1024, 10},
                                {1, 3136, 1024},
                                {129, 100, 10},
                                {3, 7, 5}};
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
    for (GemmPath path : {GemmPath::Auto, GemmPath::StridedTile})
      for (Precision prec : {Precision::FP32, Precision::TF32}) {
        SCOPED_TRACE("linear n=" + std::to_string(s.n) + " in=" + std::to_string(s.in) +
                     " out=" + std::to_string(s.out) + " prec=" + precision_name(prec) +
                     " path=" + gemm_path_name(path) + " seed=" + std::to_string(seed));
        Tensor d_y({static_cast<int64_t>(ny)}, Device::CUDA),
            d_dx({static_cast<int64_t>(nx)}, Device::CUDA);
        Tensor d_dw = test::to_device(dw0);
        test::poison_device(d_y.data(), ny);
        test::poison_device(d_dx.data(), nx);
        gemm_cuda_path(path, false, true, s.n, s.out, s.in, 1.f, d_x.data(), s.in, d_w.data(), s.in,
                       0.f, d_y.data(), s.out, d_b.data(), relu, prec, nullptr);
        gemm_cuda_path(path, false, false, s.n, s.in, s.out, 1.f, d_dy.data(), s.out, d_w.data(),
                       s.in, 0.f, d_dx.data(), s.in, nullptr, false, prec, nullptr);
        gemm_cuda_path(path, true, false, s.out, s.in, s.n, 1.f, d_dy.data(), s.out, d_x.data(),
                       s.in, 1.f, d_dw.data(), s.in, nullptr, false, prec, nullptr);
        const double ey = rel_to_max(d_y.to_vector(), y_ref, typical(s.in));
        const double edx = rel_to_max(d_dx.to_vector(), dx_ref, typical(s.out));
        const double edw = rel_to_max(d_dw.to_vector(), dw_ref, typical(s.n));
        std::printf("linear %d x %d -> %d (%s, %s): rel err y %.3g dx %.3g dw %.3g\n", s.n, s.in,
                    s.out, precision_name(prec), gemm_path_name(path), ey, edx, edw);
        EXPECT_LE(ey, tolerance(prec, s.in));
        EXPECT_LE(edx, tolerance(prec, s.out));
        EXPECT_LE(edw, tolerance(prec, s.n));
      }
  }
#endif
}
