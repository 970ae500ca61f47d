// The Hopper wgmma GEMM (kernels/gemm/gemm_wgmma.h) against the CPU GEMM (kernels/gemm/gemm_cpu.h).
// Skipped unless the device is compute capability 9.0 and the build has the sm_90a kernel. The
// cases go from one tile up, so that the first failing one names the broken stage:
//   OneTileExact            one 128x128 tile, k = 8 (one wgmma k-step): descriptors, swizzle,
//                           accumulator layout. Small-integer inputs make TF32 exact, so a
//                           mismatch is a layout error; the first wrong (row, col) is printed.
//   OneTileEachLoader       the same through each loader pair (TMA/TMA, TMA/gather,
//                           gather/TMA, gather/gather) and transpose mode, k = 32 (all four
//                           k-steps of a stage), still exact.
//   PipelineExact           many k-tiles (ring wrap-around, mbarrier phases), tails in m, n, k.
//   TmaAndGatherBitwise     the same problem through TMA and through the gather: the tensor
//                           cores must see the same bits, so the outputs are bitwise equal.
//   StagedExact             the M/N-contiguous operands by TMA into staging and transposed in
//                           shared memory (WgmmaMnLoad::Tma): one tile, then many k-tiles (the
//                           3-stage ring of two staged operands wraps), tails; exact.
//   StagedAndGatherBitwise  the staged transpose and the gather on the same random data, dgrad
//                           and wgrad shapes of fc1 included (beta 1): bitwise equal outputs;
//                           misaligned operands fall back to the gather and stay correct.
//   SplitKExactAndRepeat    splits 1, 2, 4, 8 (cluster + DSMEM reduction): exact on integers,
//                           and bitwise repeatable on random floats.
//   SplitGroupsExactAndRepeat  k split across clusters too (WgmmaOptions::groups, a workspace
//                           and split_k_reduce): the linear layer's products, exact on integers,
//                           bitwise repeatable; SplitGroupsNeedAWorkspace: refused without one.
//   AwkwardShapes           m, n, k from {1, 7, 64, 127, 128, 129, 1000, 1024, 3136}, every
//                           transpose, leading dimensions aligned / ragged / shifted pointers,
//                           alpha, beta, bias, ReLU; poisoned C; padding of C untouched.
//   LinearShapes            the linear layer's three products (batch 1, 128, 512) through
//                           gemm_cuda_path(GemmPath::Wgmma), bitwise repeatable.
//   Fp32As3xTf32            FP32 (3xTF32): exact on integers through each loader pair and a
//                           wrapping pipeline, FP32-accurate on random floats (awkward shapes,
//                           alpha, beta, bias, ReLU, every split count, bitwise repeatable), the
//                           linear layer's products through the dispatch; misaligned refused.
//   Dispatch                GemmPath::Wgmma falls back in FP32 unless 3xTF32 is asked for, and
//                           for k == 0 (runs on any GPU).
// The convolutions on the same design are tested in gpu_conv_wgmma.cpp.
//
// TF32 tolerance: the tensor cores read the top 19 bits of each FP32 operand (truncation: a
// relative error below 2^-10 per operand, so below 2^-9 + 2^-20 per product); FP32 accumulation
// adds at most ~k 2^-24 relative to sum |a b|. So per element
//   |got - ref| <= (2^-9 + k 2^-23) * sum_l |a_il b_lj| (+ the same for the CPU reference),
// a bound that holds for every input, not only on average. On random inputs the typical error
// is far smaller (~2^-10 relative to sqrt(sum_l (a_il b_lj)^2), the size of a sum of k terms of
// random sign), so in addition ||got - ref||_F must stay under 4e-3 ||alpha sqrt(sum_l (a
// b)^2)||_F: that catches a dropped k-tile or a lost split (error ~ sqrt(32 / k) of that scale),
// which the per-element bound alone could let through for long k. The scale is that of the terms,
// not of the result: with k = 1 and a bias, a * b + bias can cancel to almost nothing, and a
// relative error against ||ref|| then measures the cancellation, not the kernel.
// FP32 as 3xTF32: big = TF32(v) and small = TF32(v - big) hold each operand to 2^-22 of it, and
// the dropped small * small term is below 2^-22 of the product, so 2^-19 replaces 2^-9 in the
// bound, and the Frobenius check tightens to 5e-5: dropping either small term leaves TF32's
// ~2^-11 (4.9e-4) and fails it. (1e-5 was too tight: the FP32 rounding of a result with a bias
// and a ReLU, measured against the terms' scale, reached 1.00042e-5 on one fresh seed, m = 256,
// n = 200, k = 2000.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm/gemm_cpu.h"
#include "runtime/env_switches.h"
#include "runtime/error.h"
#include "runtime/exec.h"
#include "runtime/tensor.h"
#include "tests/test_util.h"
#include "tests/wgmma_test_require.h"
#ifdef CNN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/gemm/gemm_cuda.h"
#include "kernels/gemm/gemm_wgmma.h"
#endif

using namespace cnn;

namespace {

#ifdef CNN_HAVE_CUDA

using test::Fill;
using test::make_values;

struct Case {
  bool ta = false, tb = true;
  int m = 1, n = 1, k = 1;
  int pad = 0;         // extra leading-dimension elements
  int offset = 0;      // elements by which a, b and c are shifted (1: not 16-byte aligned)
  bool align4 = true;  // leading dimensions rounded up to a multiple of 4 before adding pad
  float alpha = 1.f, beta = 0.f;
  bool bias = false, relu = false;
  Fill fill = Fill::Random;
  WgmmaOptions opt{};
};

// A case of shape (m, n, k) through transpose pair t (bit 0: A transposed; bit 1 clear: B
// transposed), everything else as Case has it.
Case shaped(int t, int m, int n, int k) {
  Case c;
  c.ta = (t & 1) != 0;
  c.tb = (t & 2) == 0;
  c.m = m;
  c.n = n;
  c.k = k;
  return c;
}

std::string describe(const Case& c) {
  char buf[240];
  std::snprintf(buf, sizeof buf,
                "ta=%d tb=%d m=%d n=%d k=%d pad=%d offset=%d align4=%d alpha=%g beta=%g bias=%d "
                "relu=%d fill=%s splits=%d groups=%d gather=%d mn_tma=%d",
                c.ta, c.tb, c.m, c.n, c.k, c.pad, c.offset, c.align4, c.alpha, c.beta, c.bias,
                c.relu, c.fill == Fill::SmallInt ? "int" : "random", c.opt.splits, c.opt.groups,
                c.opt.force_gather, c.opt.mn_load == WgmmaMnLoad::Tma);
  return buf;
}

struct Result {
  std::vector<float> got;  // the whole C buffer, padding and offset included
  double worst_ratio = 0;  // max over elements of |got - ref| / bound
  double frob_rel = 0;     // ||got - ref|| / ||alpha sqrt(sum_l (a b)^2)|| over the m x n block
  int64_t bad = 0;         // elements over the bound (NaN counts)
  int64_t exact_bad = 0;   // elements != ref (meaningful for SmallInt)
  std::string first_bad;   // "(row, col): got x, expected y" of the first bad element
  bool padding_kept = true;
};

// Runs case c through gemm_wgmma (or gemm_cuda_path(path) when via_dispatch) and checks it
// against gemm_cpu on the host.
Result run(const Case& c, uint64_t seed, bool via_dispatch = false) {
  const int a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
  const int b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
  auto lead = [&](int cols) { return (c.align4 ? (cols + 3) / 4 * 4 : cols) + c.pad; };
  const int lda = lead(a_cols), ldb = lead(b_cols), ldc = lead(c.n);
  const size_t off = static_cast<size_t>(c.offset);
  const auto a = make_values(off + size_t(a_rows) * lda, c.fill, seed);
  const auto b = make_values(off + size_t(b_rows) * ldb, c.fill, seed + 1);
  auto c0 = make_values(off + size_t(c.m) * ldc, c.fill, seed + 2);
  const auto bias = make_values(size_t(c.n), c.fill, seed + 3);
  if (c.beta == 0.f)  // the m x n block must be overwritten without being read
    for (int i = 0; i < c.m; ++i) std::fill_n(c0.begin() + off + size_t(i) * ldc, c.n, NAN);

  // Reference: alpha * op(A) op(B) (+ beta C) (+ bias), ReLU; sum |a b| for the bound and
  // sum (a b)^2 for the Frobenius check.
  std::vector<float> prod(size_t(c.m) * c.n), absprod(size_t(c.m) * c.n), sqprod(size_t(c.m) * c.n);
  gemm_cpu(c.ta, c.tb, c.m, c.n, c.k, 1.f, a.data() + off, lda, b.data() + off, ldb, 0.f,
           prod.data(), c.n);
  std::vector<float> abs_a(a.size()), abs_b(b.size());
  std::transform(a.begin(), a.end(), abs_a.begin(), [](float x) { return std::fabs(x); });
  std::transform(b.begin(), b.end(), abs_b.begin(), [](float x) { return std::fabs(x); });
  gemm_cpu(c.ta, c.tb, c.m, c.n, c.k, 1.f, abs_a.data() + off, lda, abs_b.data() + off, ldb, 0.f,
           absprod.data(), c.n);
  std::vector<float> sq_a(a.size()), sq_b(b.size());
  std::transform(a.begin(), a.end(), sq_a.begin(), [](float x) { return x * x; });
  std::transform(b.begin(), b.end(), sq_b.begin(), [](float x) { return x * x; });
  gemm_cpu(c.ta, c.tb, c.m, c.n, c.k, 1.f, sq_a.data() + off, lda, sq_b.data() + off, ldb, 0.f,
           sqprod.data(), c.n);

  Tensor d_a = test::to_device(a), d_b = test::to_device(b), d_c = test::to_device(c0);
  Tensor d_bias = test::to_device(bias);
  const float* pa = d_a.data() + off;
  const float* pb = d_b.data() + off;
  float* pc = d_c.data() + off;
  // Split groups get a workspace poisoned with NaN: a plane the reduction reads but no cluster
  // wrote shows.
  // Groups 0 (the pick) get the workspace of the most groups the pick may take.
  WgmmaOptions opt = c.opt;
  Tensor d_work;
  const int most_groups = opt.groups > 1    ? opt.groups
                          : opt.groups == 0 ? gemm_wgmma_pick_groups(c.m, c.n, c.k, opt.precision)
                                            : 1;
  if (most_groups > 1) {
    const std::vector<float> poison(gemm_wgmma_work_floats(c.m, c.n, most_groups), NAN);
    d_work = test::to_device(poison);
    opt.work = d_work.data();
    opt.work_floats = poison.size();
  }
  if (via_dispatch)
    gemm_cuda_path(GemmPath::Wgmma, c.ta, c.tb, c.m, c.n, c.k, c.alpha, pa, lda, pb, ldb, c.beta,
                   pc, ldc, c.bias ? d_bias.data() : nullptr, c.relu, c.opt.precision, nullptr,
                   Fp32Math::Tf32x3);
  else
    gemm_wgmma(c.ta, c.tb, c.m, c.n, c.k, c.alpha, pa, lda, pb, ldb, c.beta, pc, ldc,
               c.bias ? d_bias.data() : nullptr, c.relu, nullptr, opt);
  Result r;
  r.got = d_c.to_vector();

  const double bound_rel =
      std::ldexp(1.0, c.opt.precision == Precision::FP32 ? -19 : -9) + c.k * std::ldexp(1.0, -23);
  const double ulp4 = 4 * std::ldexp(1.0, -24);  // the epilogue's own roundings
  double diff2 = 0, scale2 = 0;
  std::vector<char> in_block(r.got.size(), 0);
  for (int i = 0; i < c.m; ++i)
    for (int j = 0; j < c.n; ++j) {
      const size_t ci = off + size_t(i) * ldc + j, pi = size_t(i) * c.n + j;
      in_block[ci] = 1;
      const double ab = double(c.alpha) * prod[pi];
      const double bc = c.beta != 0.f ? double(c.beta) * c0[ci] : 0.0;
      const double bj = c.bias ? double(bias[j]) : 0.0;
      double v = ab + bc + bj;
      if (c.relu && v <= 0) v = 0;
      const float ref = static_cast<float>(v);
      const double g = r.got[ci];
      const double bound = 2 * bound_rel * std::fabs(double(c.alpha)) * absprod[pi] +
                           ulp4 * (std::fabs(ab) + std::fabs(bc) + std::fabs(bj)) + 1e-30;
      const double e = std::fabs(g - ref);
      const double ratio = std::isnan(g) ? INFINITY : e / bound;
      r.worst_ratio = std::max(r.worst_ratio, ratio);
      diff2 += std::isnan(g) ? INFINITY : e * e;
      scale2 += double(c.alpha) * c.alpha * sqprod[pi];
      const bool over = !(ratio <= 1.0);
      const bool inexact = !(g == ref);
      // The first element over the bound; with integer inputs, the first inexact one.
      if ((over && r.bad == 0) ||
          (inexact && c.fill == Fill::SmallInt && r.exact_bad == 0 && r.bad == 0)) {
        char buf[120];
        std::snprintf(buf, sizeof buf, "(%d, %d): got %.9g, expected %.9g", i, j, g, ref);
        r.first_bad = buf;
      }
      if (over) ++r.bad;
      if (inexact) ++r.exact_bad;
    }
  for (size_t i = 0; i < r.got.size(); ++i)
    if (!in_block[i] && std::memcmp(&r.got[i], &c0[i], 4) != 0) r.padding_kept = false;
  r.frob_rel = scale2 > 0 ? std::sqrt(diff2 / scale2) : std::sqrt(diff2);
  return r;
}

void expect_close(const Case& c, const Result& r) {
  EXPECT_EQ(r.bad, 0) << r.bad << " elements over the TF32 bound (worst ratio " << r.worst_ratio
                      << "), first " << r.first_bad;
  EXPECT_LE(r.frob_rel, c.opt.precision == Precision::FP32 ? 5e-5 : 4e-3)
      << "relative Frobenius error";
  EXPECT_TRUE(r.padding_kept) << "C's leading-dimension padding or the bytes before it changed";
  if (c.fill == Fill::SmallInt) {
    EXPECT_EQ(r.exact_bad, 0) << "small-integer inputs are exact in TF32; first wrong element "
                              << r.first_bad;
  }
}

// Small-integer case (m, n, k) = sz through transpose pair t (bit 0: A transposed; bit 1 clear:
// B transposed), one split, precision prec; run with a fresh seed, printed under `what` with its
// count of inexact elements, and checked.
void check_exact_case(const char* what, int t, const int (&sz)[3], Precision prec = Precision::TF32,
                      WgmmaMnLoad mn_load = WgmmaMnLoad::Default) {
  Case c = shaped(t, sz[0], sz[1], sz[2]);
  c.fill = Fill::SmallInt;
  c.opt.splits = 1;
  c.opt.precision = prec;
  c.opt.mn_load = mn_load;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
  const Result r = run(c, seed);
  std::printf("%s %dx%dx%d ta=%d tb=%d: %lld wrong%s%s\n", what, c.m, c.n, c.k, c.ta, c.tb,
              static_cast<long long>(r.exact_bad), r.exact_bad ? ", first " : "",
              r.first_bad.c_str());
  expect_close(c, r);
}

bool bitwise_equal(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
}

// Case c under its plan (c.opt's splits and groups) as the split tests check one: exact on small
// integers (printed under `what` with its count of inexact elements), then twice on the same
// random floats with alpha 1.5, bias and ReLU, within the bound and bitwise equal.
void check_split_plan(const std::string& what, Case c) {
  c.fill = Fill::SmallInt;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
  const Result exact = run(c, seed);
  std::printf("%s %dx%dx%d: %lld wrong%s%s\n", what.c_str(), c.m, c.n, c.k,
              static_cast<long long>(exact.exact_bad), exact.exact_bad ? ", first " : "",
              exact.first_bad.c_str());
  expect_close(c, exact);
  c.fill = Fill::Random;
  c.alpha = 1.5f;
  c.bias = c.relu = true;
  const Result r1 = run(c, seed + 10), r2 = run(c, seed + 10);
  expect_close(c, r1);
  EXPECT_TRUE(bitwise_equal(r1.got, r2.got)) << "two runs differ bitwise";
}

#endif  // CNN_HAVE_CUDA

}  // namespace

TEST(GpuGemmWgmma, OneTileExact) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  // 64 x 64 x 8: the first consumer warpgroup, one wgmma k-step, one stage, one split; then the
  // full 128 x 128 tile (both consumer warpgroups, all 16 n8 blocks of the accumulator).
  for (int size : {64, 128}) {
    Case c;
    c.m = c.n = size;
    c.k = 8;
    c.fill = Fill::SmallInt;
    c.opt.splits = 1;
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
    const Result r = run(c, seed);
    std::printf("one tile %dx%dx8 (TMA, TMA): %lld wrong elements%s%s\n", size, size,
                static_cast<long long>(r.exact_bad), r.exact_bad ? ", first " : "",
                r.first_bad.c_str());
    expect_close(c, r);
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmma, OneTileEachLoader) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  // Transpose modes: (ta, tb) = (0, 1) both K-contiguous: TMA/TMA; (0, 0) TMA/gather (dgrad);
  // (1, 1) gather/TMA; (1, 0) gather/gather (wgrad). force_gather: gather/gather for all.
  for (int t = 0; t < 4; ++t)
    for (bool gather : {false, true}) {
      Case c = shaped(t, 128, 128, 32);
      c.fill = Fill::SmallInt;
      c.opt.splits = 1;
      c.opt.force_gather = gather;
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
      const Result r = run(c, seed);
      std::printf("one tile 128x128x32 ta=%d tb=%d gather=%d: %lld wrong%s%s\n", c.ta, c.tb, gather,
                  static_cast<long long>(r.exact_bad), r.exact_bad ? ", first " : "",
                  r.first_bad.c_str());
      expect_close(c, r);
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmma, PipelineExact) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  // 13 and 40 k-tiles wrap the 4-stage ring several times; ragged k (k % 32 != 0, odd); m, n
  // tails inside a tile; two by three tiles.
  const int sizes[][3] = {{128, 128, 416}, {128, 128, 1280}, {100, 90, 417}, {257, 300, 1001}};
  for (const auto& sz : sizes)
    for (int t = 0; t < 4; ++t) check_exact_case("pipeline", t, sz);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmma, TmaAndGatherBitwise) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  for (int t = 0; t < 4; ++t) {
    Case c = shaped(t, 200, 129, 333);
    c.opt.splits = 2;
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
    const Result tma = run(c, seed);
    c.opt.force_gather = true;
    const Result gather = run(c, seed);
    expect_close(c, tma);
    expect_close(c, gather);
    EXPECT_TRUE(bitwise_equal(tma.got, gather.got))
        << "TMA and the gather must hand the tensor cores the same bits";
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmma, StagedExact) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  // (ta, tb) = (0, 0): B staged (dgrad); (1, 1): A staged; (1, 0): both staged (wgrad). One
  // stage's k (32), then 13 / 40 k-tiles and ragged m, n, k.
  const int sizes[][3] = {
      {128, 128, 32}, {128, 128, 416}, {128, 128, 1280}, {100, 90, 417}, {257, 300, 1001}};
  for (const auto& sz : sizes)
    for (int t : {1, 2, 3}) check_exact_case("staged", t, sz, Precision::TF32, WgmmaMnLoad::Tma);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmma, StagedAndGatherBitwise) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  // {m, n, k, splits (0: picked), beta != 0, layout: 0 aligned, 1 ld + 3 (gather fallback),
  // 2 pointers shifted by 1 (gather fallback)}; fc1's dgrad (128 x 3136 x 1024) and wgrad
  // (1024 x 3136 x 128, dw += ) at batch 128.
  const int cases[][6] = {{200, 129, 333, 2, 0, 0},   {257, 300, 1001, 1, 1, 0},
                          {300, 260, 128, 0, 1, 0},   {128, 3136, 1024, 0, 0, 0},
                          {1024, 3136, 128, 0, 1, 0}, {129, 127, 128, 4, 1, 0},
                          {200, 129, 333, 2, 0, 1},   {200, 129, 333, 2, 1, 2}};
  for (const auto& cs : cases)
    for (int t = 0; t < 4; ++t) {
      Case c = shaped(t, cs[0], cs[1], cs[2]);
      c.opt.splits = cs[3];
      c.beta = cs[4] ? 1.f : 0.f;
      c.pad = cs[5] == 1 ? 3 : 0;
      c.align4 = cs[5] != 1;
      c.offset = cs[5] == 2 ? 1 : 0;
      c.bias = c.relu = (t == 2);
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
      c.opt.mn_load = WgmmaMnLoad::Tma;
      const Result staged = run(c, seed);
      c.opt.mn_load = WgmmaMnLoad::Gather;
      const Result gather = run(c, seed);
      expect_close(c, staged);
      expect_close(c, gather);
      EXPECT_TRUE(bitwise_equal(staged.got, gather.got))
          << "the staged transpose and the gather must hand the tensor cores the same bits";
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmma, SplitKExactAndRepeat) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  // fc1's forward shape (k = 3136, 98 k-tiles) and a k shorter than the split count (k-tiles
  // 1: seven of eight ranks add nothing but still take part in the reduction).
  const int sizes[][3] = {{test::network_batch(), 1024, 3136}, {130, 140, 7}};
  for (const auto& sz : sizes)
    for (int splits : {1, 2, 4, 8, 16}) {
      Case c;
      c.m = sz[0];
      c.n = sz[1];
      c.k = sz[2];
      c.opt.splits = splits;
      check_split_plan("split-k splits=" + std::to_string(splits), c);
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmma, SplitGroupsExactAndRepeat) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  // The linear layer's three products at batch 128 (a VGG-style 4096 -> 512 layer: forward (x,
  // w^T), input gradient (dy, w), weight gradient (dy^T, x) with beta 1), the TMA-staged
  // transposes included, and a k of one k-tile, where most groups add nothing (planes of
  // zeros). Groups 2 and 8 over the picked splits, 4 over 2 splits; the partial planes are
  // summed by split_k_reduce. Exact on integers, within the bound on random floats with alpha,
  // bias and ReLU, and bitwise repeatable.
  const int b = test::network_batch();
  struct Shape {
    int t, m, n, k;
    float beta;
  };
  const Shape shapes[] = {{0, b, 512, 4096, 0.f},
                          {2, b, 4096, 512, 0.f},
                          {3, 512, 4096, b, 1.f},
                          {0, 130, 140, 7, 0.f}};
  // (splits, groups); 0: the pick ({0, 0}: the automatic plan, given the workspace it asks for)
  const int plans[][2] = {{0, 0}, {0, 2}, {0, 8}, {2, 4}};
  for (const Shape& sh : shapes)
    for (const auto& plan : plans) {
      if (test::light_sweeps() && plan[1] == 2) continue;
      Case c = shaped(sh.t, sh.m, sh.n, sh.k);
      c.beta = sh.beta;
      c.opt.splits = plan[0];
      c.opt.groups = plan[1];
      check_split_plan("split groups t=" + std::to_string(sh.t) + " splits=" +
                           std::to_string(plan[0]) + " groups=" + std::to_string(plan[1]),
                       c);
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmma, SplitGroupsNeedAWorkspace) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  Tensor a = test::to_device(std::vector<float>(128 * 256, 1.f));
  Tensor c = test::to_device(std::vector<float>(128 * 128, 0.f));
  WgmmaOptions opt;
  opt.groups = 4;  // and no workspace
  EXPECT_THROW(gemm_wgmma(false, true, 128, 128, 256, 1.f, a.data(), 256, a.data(), 256, 0.f,
                          c.data(), 128, nullptr, false, nullptr, opt),
               Error);
  Tensor small = test::to_device(std::vector<float>(gemm_wgmma_work_floats(128, 128, 4) - 4));
  opt.work = small.data();
  opt.work_floats = small.numel();
  EXPECT_THROW(gemm_wgmma(false, true, 128, 128, 256, 1.f, a.data(), 256, a.data(), 256, 0.f,
                          c.data(), 128, nullptr, false, nullptr, opt),
               Error);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmma, AwkwardShapes) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  // (m, n, k) from {1, 7, 64, 127, 128, 129, 1000, 1024, 3136}; the large ones run with
  // aligned leading dimensions only (the CPU reference is the cost).
  const int sizes[][3] = {{1, 1, 1},       {7, 7, 7},         {1, 7, 64},        {64, 64, 8},
                          {127, 128, 129}, {129, 127, 128},   {128, 1000, 7},    {1000, 129, 127},
                          {7, 3136, 64},   {1, 1024, 3136},   {1, 3136, 1024},   {3136, 64, 1000},
                          {1024, 129, 1},  {512, 1024, 3136}, {1000, 1024, 1024}};
  int which = 0;
  for (const auto& sz : sizes) {
    const bool big = double(sz[0]) * sz[1] * sz[2] > 1e8;
    for (int t = 0; t < 4; ++t)
      for (int layout = 0; layout < 3; ++layout) {  // aligned; ld + 3; pointers shifted by 1
        if (big && layout > 0) continue;
        if (test::light_sweeps() && (which % 3 != 0 || big)) {
          ++which;
          continue;
        }
        ++which;
        Case c = shaped(t, sz[0], sz[1], sz[2]);
        c.pad = layout == 1 ? 3 : (layout == 0 ? 4 * (which % 2) : 0);
        c.align4 = layout != 1;
        c.offset = layout == 2 ? 1 : 0;
        c.alpha = (which % 2) ? 1.5f : 1.f;
        c.beta = (which % 4 == 1) ? 0.5f : 0.f;
        c.bias = which % 3 != 1;
        c.relu = which % 5 < 2;
        const uint64_t seed = test::fresh_seed();
        SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
        expect_close(c, run(c, seed));
      }
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmma, LinearShapes) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  // As linear.cpp calls gemm_cuda (x (N, IN), w (OUT, IN)): forward (x, w^T), dgrad (dy, w),
  // wgrad (dy^T, x; beta 1), at fc1 (3136 -> 1024) and fc2 (1024 -> 10).
  const int layers[][2] = {{3136, 1024}, {1024, 10}};  // (in, out)
  for (int batch : {1, test::network_batch(), 512})
    for (const auto& io : layers) {
      const int in = io[0], out = io[1];
      const Case cases[] = {
          {false, true, batch, out, in, 0, 0, true, 1.f, 0.f, true, true},     // forward
          {false, false, batch, in, out, 0, 0, true, 1.f, 0.f, false, false},  // dgrad
          {true, false, out, in, batch, 0, 0, true, 1.f, 1.f, false, false},   // wgrad, dw +=
      };
      for (const Case& c : cases) {
        const uint64_t seed = test::fresh_seed();
        SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
        const Result r1 = run(c, seed, /*via_dispatch=*/true);
        const Result r2 = run(c, seed, /*via_dispatch=*/true);
        std::printf("linear %d x %d -> %d, gemm %dx%dx%d ta=%d tb=%d: worst/bound %.3g, rel %.3g\n",
                    batch, in, out, c.m, c.n, c.k, c.ta, c.tb, r1.worst_ratio, r1.frob_rel);
        expect_close(c, r1);
        EXPECT_TRUE(bitwise_equal(r1.got, r2.got)) << "two runs differ bitwise";
      }
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmma, Fp32As3xTf32) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  // Exact on small integers (small parts all zero): each loader pair (TMA/TMA, TMA/staged,
  // staged/TMA, staged/staged), one tile and a pipeline that wraps the ring and both slots of
  // the small parts, with tails in m, n and k.
  const int exact_sizes[][3] = {{128, 128, 32}, {257, 300, 1001}};
  for (const auto& sz : exact_sizes)
    for (int t = 0; t < 4; ++t) check_exact_case("3xtf32 exact", t, sz, Precision::FP32);
  // Random floats: FP32 accuracy (the bound and the 5e-5 Frobenius check above), every transpose,
  // aligned leading dimensions with and without padding, alpha, beta, bias, ReLU; every split
  // count on one shape, each bitwise repeatable.
  const int sizes[][3] = {{1, 1, 1},       {7, 8, 64},       {127, 128, 129},
                          {129, 127, 128}, {128, 1000, 7},   {1000, 129, 127},
                          {1, 1024, 3136}, {3136, 64, 1000}, {200, 129, 333}};
  int which = 0;
  for (const auto& sz : sizes)
    for (int t = 0; t < 4; ++t) {
      ++which;
      if (test::light_sweeps() && which % 3 != 0) continue;
      Case c = shaped(t, sz[0], sz[1], sz[2]);
      c.pad = 4 * (which % 2);
      c.alpha = (which % 2) ? 1.5f : 1.f;
      c.beta = (which % 4 == 1) ? 0.5f : 0.f;
      c.bias = which % 3 != 1;
      c.relu = which % 5 < 2;
      c.opt.precision = Precision::FP32;
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
      const Result r = run(c, seed);
      std::printf("3xtf32 %dx%dx%d ta=%d tb=%d: worst/bound %.3g, rel %.3g\n", c.m, c.n, c.k, c.ta,
                  c.tb, r.worst_ratio, r.frob_rel);
      expect_close(c, r);
    }
  for (int splits : {1, 2, 4, 8}) {
    Case c;
    c.m = 256;
    c.n = 200;
    c.k = 2000;
    c.tb = false;  // the input gradient's layout: B staged and transposed
    c.bias = c.relu = true;
    c.opt.splits = splits;
    c.opt.precision = Precision::FP32;
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
    const Result r1 = run(c, seed), r2 = run(c, seed);
    expect_close(c, r1);
    EXPECT_TRUE(bitwise_equal(r1.got, r2.got)) << "two runs differ bitwise";
  }
  // The linear layer's products at fc1's shape through the dispatch (3xTF32 asked for).
  const int batch = test::network_batch();
  const Case linear[] = {
      {false, true, batch, 1024, 3136, 0, 0, true, 1.f, 0.f, true, true},     // forward
      {false, false, batch, 3136, 1024, 0, 0, true, 1.f, 0.f, false, false},  // dgrad
      {true, false, 1024, 3136, batch, 0, 0, true, 1.f, 1.f, false, false},   // wgrad, dw +=
  };
  for (Case c : linear) {
    c.opt.precision = Precision::FP32;
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
    const Result r = run(c, seed, /*via_dispatch=*/true);
    std::printf("3xtf32 linear gemm %dx%dx%d ta=%d tb=%d: worst/bound %.3g, rel %.3g\n", c.m, c.n,
                c.k, c.ta, c.tb, r.worst_ratio, r.frob_rel);
    expect_close(c, r);
  }
  // Operands TMA cannot load are refused with a message, not gathered.
  Case bad;
  bad.m = bad.n = bad.k = 64;
  bad.offset = 1;
  bad.opt.precision = Precision::FP32;
  EXPECT_THROW(run(bad, test::fresh_seed()), cnn::Error);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmma, Dispatch) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_GPU();
  // Wgmma is never taken in FP32, for k == 0, or off compute capability 9.0.
  float* none = nullptr;
  EXPECT_NE(gemm_cuda_resolve(GemmPath::Wgmma, false, true, 128, 128, 128, none, 128, none, 128,
                              Precision::FP32),
            GemmPath::Wgmma);
  EXPECT_NE(gemm_cuda_resolve(GemmPath::Wgmma, false, true, 128, 128, 0, none, 128, none, 128,
                              Precision::TF32),
            GemmPath::Wgmma);
  EXPECT_EQ(gemm_cuda_resolve(GemmPath::Wgmma, false, true, 128, 128, 128, none, 128, none, 128,
                              Precision::TF32) == GemmPath::Wgmma,
            gemm_wgmma_available());
  // Auto picks it in TF32 where A is K-contiguous: the forward (both operands K-major) always,
  // the input gradient (B N-contiguous) with the TMA staging (CNN_WGMMA_MN, default tma); never
  // the weight gradient (A M-contiguous) unless CNN_GEMM_PATH=wgmma. The switches are read once
  // per process.
  const GemmPathSwitch env = process_env_switches().gemm_path;
  const bool staged = process_env_switches().wgmma_mn_tma;
  const bool avail = gemm_wgmma_available();
  EXPECT_EQ(gemm_cuda_resolve(GemmPath::Auto, false, true, 128, 1024, 3136, none, 3136, none, 3136,
                              Precision::TF32) == GemmPath::Wgmma,
            (env == GemmPathSwitch::Wgmma || env == GemmPathSwitch::Auto) && avail);
  EXPECT_EQ(gemm_cuda_resolve(GemmPath::Auto, false, false, 128, 3136, 1024, none, 1024, none, 3136,
                              Precision::TF32) == GemmPath::Wgmma,
            (env == GemmPathSwitch::Wgmma || (env == GemmPathSwitch::Auto && staged)) && avail);
  EXPECT_EQ(gemm_cuda_resolve(GemmPath::Auto, true, false, 1024, 3136, 128, none, 1024, none, 3136,
                              Precision::TF32) == GemmPath::Wgmma,
            env == GemmPathSwitch::Wgmma && avail);
  EXPECT_NE(gemm_cuda_resolve(GemmPath::Auto, false, true, 128, 1024, 3136, none, 3136, none, 3136,
                              Precision::FP32),
            GemmPath::Wgmma);
  // FP32 with 3xTF32 asked for: as TF32 where both operands are TMA-aligned, never otherwise.
  EXPECT_EQ(gemm_cuda_resolve(GemmPath::Auto, false, true, 128, 1024, 3136, none, 3136, none, 3136,
                              Precision::FP32, Fp32Math::Tf32x3) == GemmPath::Wgmma,
            (env == GemmPathSwitch::Wgmma || env == GemmPathSwitch::Auto) && avail);
  EXPECT_EQ(gemm_cuda_resolve(GemmPath::Wgmma, false, true, 128, 128, 128, none, 128, none, 128,
                              Precision::FP32, Fp32Math::Tf32x3) == GemmPath::Wgmma,
            avail);
  const float* shifted = reinterpret_cast<const float*>(uintptr_t(4));  // 4 bytes off 16
  EXPECT_NE(gemm_cuda_resolve(GemmPath::Wgmma, false, true, 128, 128, 128, shifted, 128, none, 128,
                              Precision::FP32, Fp32Math::Tf32x3),
            GemmPath::Wgmma);
  EXPECT_NE(gemm_cuda_resolve(GemmPath::Wgmma, false, true, 128, 128, 128, none, 127, none, 128,
                              Precision::FP32, Fp32Math::Tf32x3),
            GemmPath::Wgmma);
  {
    test::ScopedEnv env("CNN_GEMM_PATH", "wgmma");
    EXPECT_EQ(read_env_switches().gemm_path, GemmPathSwitch::Wgmma);
  }
  {
    test::ScopedEnv env("CNN_WGMMA_MN", "tma");
    EXPECT_TRUE(read_env_switches().wgmma_mn_tma);
  }
  {
    test::ScopedEnv env("CNN_WGMMA_MN", "gather");
    EXPECT_FALSE(read_env_switches().wgmma_mn_tma);
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}
