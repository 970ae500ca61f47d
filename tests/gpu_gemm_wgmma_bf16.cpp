// The BF16 instance of the Hopper wgmma GEMM (kernels/gemm/gemm_wgmma.h, WgmmaOptions::precision
// = BF16) against the CPU GEMM run on BF16-rounded operands (kernels/common/bf16_round.h, bit for
// bit cvt.rn.bf16x2). Skipped unless the device is compute capability 9.0 and the build has the
// sm_90a kernel. From one tile up, so that the first failing case names the broken stage:
//   OneTileExact        one 128 x 128 tile, k = 64 (one BF16 k-tile, four k16 steps), every
//                       transpose, staged by TMA (K-contiguous: convert; M/N-contiguous:
//                       transpose and convert) and gathered: descriptors, swizzle, the
//                       conversion's lane mapping. Small integers are exact in BF16, so any
//                       mismatch is a layout error; the first wrong (row, col) is printed.
//   PipelineExact       many k-tiles (the 2-stage ring and the staging ring wrap, TMA issued
//                       ahead), tails in m, n, k (k % 64 != 0: zero-filled boxes), staged and
//                       gathered.
//   RoundsToNearestEven random operands: within FP32 summation error of the rounded-operand twin
//                       (truncation or TF32 would miss by ~2^-9 relative), and the staged and
//                       gathered tiles hand the tensor cores the same bits (bitwise equal).
//   SplitsForced        splits 1, 2, 4, 8, 16 on fc1's forward, input- and weight-gradient shapes
//                       and a k shorter than the split count: exact on integers, bitwise
//                       repeatable on random floats.
//   SplitGroups         k split across clusters too (a workspace, split_k_reduce) on a 4096 ->
//                       512 layer's three products and a one-k-tile k: the same checks.
//   AwkwardShapes       m, n, k from {1, 7, 33, 100, 129, 1024, 3136}, every transpose, leading
//                       dimensions aligned / ragged (gather) / shifted pointers (gather), alpha,
//                       beta, bias, ReLU; C poisoned where beta = 0; C's padding untouched.
//   LinearShapes        the linear layer's three products through gemm_cuda_path(Wgmma, BF16).
//   Dispatch            Auto routes BF16 as TF32 (forward, input gradient); FP32 (3xTF32) is
//                       refused on operands TMA cannot load.
//
// Bound per element (S = sum over k of |a b| on the rounded operands): the products of two BF16
// values are exact in FP32, so only summation separates the GPU from the twin: each side's at
// most (k + 8) 2^-23 S (k terms, up to 8 split partials), plus 4 ulp of the epilogue's terms.
// The Frobenius norms check the rest: against the twin under 1e-4 of ||alpha sqrt(sum (a b)^2)||
// (a dropped k-tile or split is ~sqrt(64 / k), far above), against the unrounded FP32 product
// under 2^-7 of it (BF16's operand rounding, rms ~2.3e-3 relative); both plus 4 ulp of the
// epilogue's beta C and bias terms, which k = 1 cases can make dominant.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/bf16_round.h"
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
};

std::string describe(const Case& c) {
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "ta=%d tb=%d m=%d n=%d k=%d pad=%d offset=%d align4=%d alpha=%g beta=%g bias=%d "
                "relu=%d fill=%s",
                c.ta, c.tb, c.m, c.n, c.k, c.pad, c.offset, c.align4, c.alpha, c.beta, c.bias,
                c.relu, c.fill == Fill::SmallInt ? "int" : "random");
  return buf;
}

std::string describe(const WgmmaOptions& o) {
  return " splits=" + std::to_string(o.splits) + " gather=" + std::to_string(o.force_gather) +
         " mn_load=" + std::to_string(int(o.mn_load));
}

std::vector<float> apply_each(const std::vector<float>& v, float (*f)(float)) {
  std::vector<float> r(v.size());
  std::transform(v.begin(), v.end(), r.begin(), f);
  return r;
}

// One case's host data (unrounded: the kernel must round) and its references, computed once
// and shared by every launch option tried on it.
struct Problem {
  Case c;
  int lda = 0, ldb = 0, ldc = 0;
  size_t off = 0;
  std::vector<float> a, b, c0, bias;
  std::vector<float> emu, emu_abs, emu_sq;  // (m, n) products of the rounded operands, |.|, ^2
  std::vector<float> ref;                   // (m, n) product of the FP32 operands
};

Problem make_problem(const Case& c, uint64_t seed) {
  Problem pr;
  pr.c = c;
  const int a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
  const int b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
  auto lead = [&](int cols) { return (c.align4 ? (cols + 3) / 4 * 4 : cols) + c.pad; };
  pr.lda = lead(a_cols);
  pr.ldb = lead(b_cols);
  pr.ldc = lead(c.n);
  pr.off = static_cast<size_t>(c.offset);
  pr.a = make_values(pr.off + size_t(a_rows) * pr.lda, c.fill, seed);
  pr.b = make_values(pr.off + size_t(b_rows) * pr.ldb, c.fill, seed + 1);
  pr.c0 = make_values(pr.off + size_t(c.m) * pr.ldc, c.fill, seed + 2);
  pr.bias = make_values(size_t(c.n), c.fill, seed + 3);
  if (c.beta == 0.f)  // the m x n block must be overwritten without being read
    for (int i = 0; i < c.m; ++i)
      std::fill_n(pr.c0.begin() + pr.off + size_t(i) * pr.ldc, c.n, NAN);

  auto product = [&](const std::vector<float>& a, const std::vector<float>& b) {
    std::vector<float> out(size_t(c.m) * c.n);
    gemm_cpu(c.ta, c.tb, c.m, c.n, c.k, 1.f, a.data() + pr.off, pr.lda, b.data() + pr.off, pr.ldb,
             0.f, out.data(), c.n);
    return out;
  };
  const std::vector<float> ra = round_to_bf16(pr.a), rb = round_to_bf16(pr.b);
  pr.emu = product(ra, rb);
  auto abs = [](float x) { return std::fabs(x); };
  auto sq = [](float x) { return x * x; };
  pr.emu_abs = product(apply_each(ra, abs), apply_each(rb, abs));
  pr.emu_sq = product(apply_each(ra, sq), apply_each(rb, sq));
  pr.ref = product(pr.a, pr.b);
  return pr;
}

struct Result {
  std::vector<float> got;  // the whole C buffer, padding and offset included
  double worst_ratio = 0;  // max over elements of |got - twin| / bound
  double frob_emu = 0;     // ||got - twin|| / ||alpha sqrt(sum (a b)^2)||
  double frob_ref = 0;     // ||got - FP32 reference|| / the same
  double epi_rel = 0;      // 4 ulp of ||beta C|| + ||bias||, relative to the same: the epilogue's
                           // roundings, which the Frobenius limits allow on top
  int64_t bad = 0;         // elements over the bound (NaN counts)
  int64_t exact_bad = 0;   // elements != twin (meaningful for SmallInt)
  std::string first_bad;   // "(row, col): got x, expected y"
  bool padding_kept = true;
};

// Runs the problem through gemm_wgmma in BF16 with `opt` (or gemm_cuda_path(Wgmma, BF16) when
// via_dispatch) and measures it against the twin.
Result launch(const Problem& pr, WgmmaOptions opt, bool via_dispatch = false) {
  const Case& c = pr.c;
  Tensor d_a = test::to_device(pr.a), d_b = test::to_device(pr.b), d_c = test::to_device(pr.c0);
  Tensor d_bias = test::to_device(pr.bias);
  const float* pa = d_a.data() + pr.off;
  const float* pb = d_b.data() + pr.off;
  float* pc = d_c.data() + pr.off;
  const float* bias = c.bias ? d_bias.data() : nullptr;
  opt.precision = Precision::BF16;
  Tensor d_work;  // split groups' workspace, poisoned: a plane no cluster wrote shows as NaN
  const int most_groups = opt.groups > 1    ? opt.groups
                          : opt.groups == 0 ? gemm_wgmma_pick_groups(c.m, c.n, c.k, opt.precision)
                                            : 1;
  if (most_groups > 1) {
    d_work =
        test::to_device(std::vector<float>(gemm_wgmma_work_floats(c.m, c.n, most_groups), NAN));
    opt.work = d_work.data();
    opt.work_floats = size_t(d_work.numel());
  }
  if (via_dispatch)
    gemm_cuda_path(GemmPath::Wgmma, c.ta, c.tb, c.m, c.n, c.k, c.alpha, pa, pr.lda, pb, pr.ldb,
                   c.beta, pc, pr.ldc, bias, c.relu, Precision::BF16, nullptr);
  else
    gemm_wgmma(c.ta, c.tb, c.m, c.n, c.k, c.alpha, pa, pr.lda, pb, pr.ldb, c.beta, pc, pr.ldc, bias,
               c.relu, nullptr, opt);
  Result r;
  r.got = d_c.to_vector();

  const double bound_rel = (c.k + 8) * std::ldexp(1.0, -23);
  const double ulp4 = 4 * std::ldexp(1.0, -24);  // the epilogue's own roundings
  double diff_emu = 0, diff_ref = 0, scale2 = 0, epi2 = 0;
  std::vector<char> in_block(r.got.size(), 0);
  auto finish = [&](double ab, double bc, double bj) {
    double v = ab + bc + bj;
    if (c.relu && v <= 0) v = 0;
    return v;
  };
  for (int i = 0; i < c.m; ++i)
    for (int j = 0; j < c.n; ++j) {
      const size_t ci = pr.off + size_t(i) * pr.ldc + j, pi = size_t(i) * c.n + j;
      in_block[ci] = 1;
      const double ab = double(c.alpha) * pr.emu[pi];
      const double bc = c.beta != 0.f ? double(c.beta) * pr.c0[ci] : 0.0;
      const double bj = c.bias ? double(pr.bias[j]) : 0.0;
      const float twin = static_cast<float>(finish(ab, bc, bj));
      const double fp32 = finish(double(c.alpha) * pr.ref[pi], bc, bj);
      const double g = r.got[ci];
      const double bound = 2 * bound_rel * std::fabs(double(c.alpha)) * pr.emu_abs[pi] +
                           ulp4 * (std::fabs(ab) + std::fabs(bc) + std::fabs(bj)) + 1e-30;
      const double e = std::fabs(g - twin);
      const double ratio = std::isnan(g) ? INFINITY : e / bound;
      r.worst_ratio = std::max(r.worst_ratio, ratio);
      diff_emu += std::isnan(g) ? INFINITY : e * e;
      diff_ref += std::isnan(g) ? INFINITY : (g - fp32) * (g - fp32);
      scale2 += double(c.alpha) * c.alpha * pr.emu_sq[pi];
      epi2 += (std::fabs(bc) + std::fabs(bj)) * (std::fabs(bc) + std::fabs(bj));
      const bool over = !(ratio <= 1.0);
      const bool inexact = !(g == twin);
      if ((over && r.bad == 0) ||
          (inexact && c.fill == Fill::SmallInt && r.exact_bad == 0 && r.bad == 0)) {
        char buf[120];
        std::snprintf(buf, sizeof buf, "(%d, %d): got %.9g, expected %.9g", i, j, g, twin);
        r.first_bad = buf;
      }
      if (over) ++r.bad;
      if (inexact) ++r.exact_bad;
    }
  for (size_t i = 0; i < r.got.size(); ++i)
    if (!in_block[i] && std::memcmp(&r.got[i], &pr.c0[i], 4) != 0) r.padding_kept = false;
  const double scale = scale2 > 0 ? std::sqrt(scale2) : 1.0;
  r.frob_emu = std::sqrt(diff_emu) / scale;
  r.frob_ref = std::sqrt(diff_ref) / scale;
  r.epi_rel = ulp4 * std::sqrt(epi2) / scale;
  return r;
}

void expect_close(const Case& c, const Result& r) {
  EXPECT_EQ(r.bad, 0) << r.bad << " elements over the bound of the BF16-operand twin (worst ratio "
                      << r.worst_ratio << "), first " << r.first_bad;
  EXPECT_LE(r.frob_emu, 1e-4 + r.epi_rel) << "relative Frobenius error against the BF16 twin";
  EXPECT_LE(r.frob_ref, std::ldexp(1.0, -7) + r.epi_rel) << "relative Frobenius error against FP32";
  EXPECT_TRUE(r.padding_kept) << "C's leading-dimension padding or the bytes before it changed";
  if (c.fill == Fill::SmallInt) {
    EXPECT_EQ(r.exact_bad, 0) << "small-integer inputs are exact in BF16; first wrong element "
                              << r.first_bad;
  }
}

bool bitwise_equal(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
}

WgmmaOptions staged_opt(int splits = 0) {
  WgmmaOptions o;
  o.splits = splits;
  o.mn_load = WgmmaMnLoad::Tma;
  return o;
}
WgmmaOptions gather_opt(int splits = 0) {
  WgmmaOptions o;
  o.splits = splits;
  o.force_gather = true;
  return o;
}

Case transposed(int t) {  // t: bit 0 trans_a, bit 1 B stored (k, n) (N-contiguous)
  Case c;
  c.ta = (t & 1) != 0;
  c.tb = (t & 2) == 0;
  return c;
}

// A product of the split tests, {m, n, k, t, beta} (t as for transposed(); beta 1: dw += dy^T x,
// without bias and ReLU), its small-integer and random problems made once for every plan.
struct SplitCase {
  uint64_t seed = 0;
  Problem exact, random;
};
SplitCase split_case(const int (&cs)[5]) {
  Case c = transposed(cs[3]);
  c.m = cs[0];
  c.n = cs[1];
  c.k = cs[2];
  c.beta = cs[4] ? 1.f : 0.f;
  c.fill = Fill::SmallInt;
  SplitCase sc;
  sc.seed = test::fresh_seed();
  sc.exact = make_problem(c, sc.seed);
  Case cr = c;
  cr.fill = Fill::Random;
  cr.bias = cr.relu = cs[4] == 0;
  sc.random = make_problem(cr, sc.seed + 10);
  return sc;
}

// sc under the plan o (printed under `what`): exact on integers, within the bound and bitwise
// repeatable on random floats.
void check_split_plan(const SplitCase& sc, const WgmmaOptions& o, const std::string& what) {
  const Case& c = sc.exact.c;
  SCOPED_TRACE(describe(c) + " " + what + " seed=" + std::to_string(sc.seed));
  const Result e = launch(sc.exact, o);
  std::printf("bf16 %s %dx%dx%d ta=%d tb=%d: %lld wrong%s%s\n", what.c_str(), c.m, c.n, c.k, c.ta,
              c.tb, static_cast<long long>(e.exact_bad), e.exact_bad ? ", first " : "",
              e.first_bad.c_str());
  expect_close(c, e);
  const Result r1 = launch(sc.random, o), r2 = launch(sc.random, o);
  expect_close(sc.random.c, r1);
  EXPECT_TRUE(bitwise_equal(r1.got, r2.got)) << "two runs differ bitwise";
}

#endif  // CNN_HAVE_CUDA

}  // namespace

TEST(GpuGemmWgmmaBf16, OneTileExact) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  for (int size : {64, 128})
    for (int t = 0; t < 4; ++t) {
      Case c = transposed(t);
      c.m = c.n = size;
      c.k = 64;
      c.fill = Fill::SmallInt;
      const uint64_t seed = test::fresh_seed();
      const Problem pr = make_problem(c, seed);
      for (const WgmmaOptions& o : {staged_opt(1), gather_opt(1)}) {
        SCOPED_TRACE(describe(c) + describe(o) + " seed=" + std::to_string(seed));
        const Result r = launch(pr, o);
        std::printf("bf16 one tile %dx%dx64 ta=%d tb=%d gather=%d: %lld wrong%s%s\n", size, size,
                    c.ta, c.tb, o.force_gather, static_cast<long long>(r.exact_bad),
                    r.exact_bad ? ", first " : "", r.first_bad.c_str());
        expect_close(c, r);
      }
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmmaBf16, PipelineExact) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  // 10 and 33 k-tiles of 64 wrap the 2-stage rings many times; ragged k (33: the second box of
  // the only k-tile is mostly past K; 1001), m and n tails, two by three tiles.
  const int sizes[][3] = {{128, 128, 640}, {128, 128, 2112}, {100, 90, 33}, {257, 300, 1001}};
  for (const auto& sz : sizes)
    for (int t = 0; t < 4; ++t) {
      Case c = transposed(t);
      c.m = sz[0];
      c.n = sz[1];
      c.k = sz[2];
      c.fill = Fill::SmallInt;
      const uint64_t seed = test::fresh_seed();
      const Problem pr = make_problem(c, seed);
      for (const WgmmaOptions& o : {staged_opt(1), gather_opt(1)}) {
        SCOPED_TRACE(describe(c) + describe(o) + " seed=" + std::to_string(seed));
        const Result r = launch(pr, o);
        std::printf("bf16 pipeline %dx%dx%d ta=%d tb=%d gather=%d: %lld wrong%s%s\n", c.m, c.n, c.k,
                    c.ta, c.tb, o.force_gather, static_cast<long long>(r.exact_bad),
                    r.exact_bad ? ", first " : "", r.first_bad.c_str());
        expect_close(c, r);
      }
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmmaBf16, RoundsToNearestEven) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  for (int t = 0; t < 4; ++t) {
    Case c = transposed(t);
    c.m = 200;
    c.n = 129;
    c.k = 333;
    const uint64_t seed = test::fresh_seed();
    const Problem pr = make_problem(c, seed);
    SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
    const Result staged = launch(pr, staged_opt(2)), gather = launch(pr, gather_opt(2));
    std::printf(
        "bf16 random 200x129x333 ta=%d tb=%d: worst/bound %.3g, rel to twin %.3g, to fp32 "
        "%.3g\n",
        c.ta, c.tb, staged.worst_ratio, staged.frob_emu, staged.frob_ref);
    expect_close(c, staged);
    expect_close(c, gather);
    EXPECT_TRUE(bitwise_equal(staged.got, gather.got))
        << "the staged conversion and the gather must hand the tensor cores the same bits";
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmmaBf16, SplitsForced) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  // {m, n, k, t, beta}: fc1's forward (49 k-tiles), input gradient (B staged and transposed),
  // weight gradient (both transposed, dw +=), and k-tiles fewer than the splits (1: seven of
  // eight ranks add nothing but take part in the reduction).
  const int cases[][5] = {{test::network_batch(), 1024, 3136, 0, 0},
                          {test::network_batch(), 3136, 1024, 2, 0},
                          {1024, 3136, test::network_batch(), 3, 1},
                          {130, 140, 7, 0, 0}};
  for (const auto& cs : cases) {
    const SplitCase sc = split_case(cs);
    for (int splits : {1, 2, 4, 8, 16})
      check_split_plan(sc, staged_opt(splits), "split-k splits=" + std::to_string(splits));
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmmaBf16, SplitGroups) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  // k split across clusters too (WgmmaOptions::groups, the planes summed by split_k_reduce):
  // a VGG-style 4096 -> 512 layer's forward, input gradient (staged transpose) and weight
  // gradient (dw +=) at the test batch, and a k of one k-tile (most planes zeros). Exact on
  // integers, within the bound and bitwise repeatable on random floats.
  const int b = test::network_batch();
  const int cases[][5] = {
      {b, 512, 4096, 0, 0}, {b, 4096, 512, 2, 0}, {512, 4096, b, 3, 1}, {130, 140, 7, 0, 0}};
  // (splits, groups); 0: the pick ({0, 0}: the automatic plan, given the workspace it asks for)
  const int plans[][2] = {{0, 0}, {0, 4}, {2, 8}, {1, 16}};
  for (const auto& cs : cases) {
    const SplitCase sc = split_case(cs);
    for (const auto& plan : plans) {
      WgmmaOptions o = staged_opt(plan[0]);
      o.groups = plan[1];
      check_split_plan(
          sc, o,
          "split groups splits=" + std::to_string(plan[0]) + " groups=" + std::to_string(plan[1]));
    }
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmmaBf16, AwkwardShapes) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  // (m, n, k) from {1, 7, 33, 100, 129, 1024, 3136}; the large ones with aligned leading
  // dimensions only (the CPU twin is the cost).
  const int sizes[][3] = {{1, 1, 1},         {7, 7, 7},        {1, 7, 33},      {33, 100, 129},
                          {129, 33, 100},    {100, 129, 1024}, {1024, 129, 7},  {7, 3136, 33},
                          {1, 1024, 3136},   {1, 3136, 1024},  {3136, 33, 100}, {129, 1024, 129},
                          {1024, 100, 3136}, {129, 3136, 1024}};
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
        Case c = transposed(t);
        c.m = sz[0];
        c.n = sz[1];
        c.k = sz[2];
        c.pad = layout == 1 ? 3 : (layout == 0 ? 4 * (which % 2) : 0);
        c.align4 = layout != 1;
        c.offset = layout == 2 ? 1 : 0;
        c.alpha = (which % 2) ? 1.5f : 1.f;
        c.beta = (which % 4 == 1) ? 0.5f : 0.f;
        c.bias = which % 3 != 1;
        c.relu = which % 5 < 2;
        const uint64_t seed = test::fresh_seed();
        SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
        expect_close(c, launch(make_problem(c, seed), WgmmaOptions{}));
      }
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmmaBf16, LinearShapes) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  // As linear.cpp calls gemm_cuda (x (N, IN), w (OUT, IN)): forward (x, w^T), dgrad (dy, w),
  // wgrad (dy^T, x; beta 1), at fc1 (3136 -> 1024) and fc2 (1024 -> 10).
  const int layers[][2] = {{3136, 1024}, {1024, 10}};  // (in, out)
  for (int batch : {1, test::network_batch()})
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
        const Problem pr = make_problem(c, seed);
        const Result r1 = launch(pr, WgmmaOptions{}, /*via_dispatch=*/true);
        const Result r2 = launch(pr, WgmmaOptions{}, /*via_dispatch=*/true);
        std::printf(
            "bf16 linear %d x %d -> %d, gemm %dx%dx%d ta=%d tb=%d: worst/bound %.3g, rel %.3g\n",
            batch, in, out, c.m, c.n, c.k, c.ta, c.tb, r1.worst_ratio, r1.frob_ref);
        expect_close(c, r1);
        EXPECT_TRUE(bitwise_equal(r1.got, r2.got)) << "two runs differ bitwise";
      }
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuGemmWgmmaBf16, Dispatch) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_GPU();
  // Auto treats BF16 as TF32: the forward (both operands K-major) and, with the TMA staging
  // (CNN_WGMMA_MN, default tma), the input gradient take wgmma; the weight gradient only with
  // CNN_GEMM_PATH=wgmma. The switches are read once per process.
  float* none = nullptr;
  const GemmPathSwitch env = process_env_switches().gemm_path;
  const bool staged = process_env_switches().wgmma_mn_tma;
  const bool avail = gemm_wgmma_available();
  EXPECT_EQ(gemm_cuda_resolve(GemmPath::Wgmma, false, true, 128, 128, 128, none, 128, none, 128,
                              Precision::BF16) == GemmPath::Wgmma,
            avail);
  EXPECT_EQ(gemm_cuda_resolve(GemmPath::Auto, false, true, 128, 1024, 3136, none, 3136, none, 3136,
                              Precision::BF16) == GemmPath::Wgmma,
            (env == GemmPathSwitch::Wgmma || env == GemmPathSwitch::Auto) && avail);
  EXPECT_EQ(gemm_cuda_resolve(GemmPath::Auto, false, false, 128, 3136, 1024, none, 1024, none, 3136,
                              Precision::BF16) == GemmPath::Wgmma,
            (env == GemmPathSwitch::Wgmma || (env == GemmPathSwitch::Auto && staged)) && avail);
  EXPECT_EQ(gemm_cuda_resolve(GemmPath::Auto, true, false, 1024, 3136, 128, none, 1024, none, 3136,
                              Precision::BF16) == GemmPath::Wgmma,
            env == GemmPathSwitch::Wgmma && avail);
  if (avail) {
    // gemm_wgmma runs FP32 as 3xTF32 on TMA-aligned operands only, and refuses others naming
    // the precision (A one float past a 16-byte boundary).
    Tensor d = test::to_device(std::vector<float>(80, 1.f));
    WgmmaOptions o;
    o.precision = Precision::FP32;
    try {
      gemm_wgmma(false, true, 8, 8, 8, 1.f, d.data() + 1, 8, d.data(), 8, 0.f, d.data() + 16, 8,
                 nullptr, false, nullptr, o);
      ADD_FAILURE() << "gemm_wgmma ran FP32 on a misaligned operand";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FP32 (3xTF32)"), std::string::npos) << e.what();
    }
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}
