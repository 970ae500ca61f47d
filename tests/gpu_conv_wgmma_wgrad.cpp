// The Hopper wgmma weight gradient (kernels/conv/conv2d_wgmma_wgrad.h) against
// conv2d_backward_weight_cpu. Skipped unless the device is compute capability 9.0 and the build
// has the sm_90a kernel (Dispatch runs on any GPU). Cases:
//   OneTileExact        one image, one k-tile, small-integer inputs (exact in TF32): descriptors,
//                       swizzle, fragment layout; the first wrong (oc, j) is printed.
//   AwkwardShapes       C in {1, 3, 17, 64}, OC in {5, 64, 96, 130}, 1x1 / 3x3 / 5x5 / 7x7,
//                       stride 1 / 2, padding 0..3, OH*OW a multiple of 4 and >= 32 (k-tiles
//                       per image, dy by TMA) and not (k-tiles packed across images, dy
//                       gathered), batch 1 and 3, OH*OW not a multiple of 32, db and none;
//                       accumulation into a nonzero dw/db; exact on integers, then random.
//   LoadersBitwise      deterministic mode, the same inputs through TMA and the gather for dy
//                       (per-image k-tiles; a packed shape too),
//                       and through the async (noinc arrive + consumer fence) and the sync
//                       (wait, fence, arrive) hand-over: bitwise equal outputs; a dy shifted off
//                       16-byte alignment falls back to the gather and stays correct.
//   DeterministicRepeat deterministic mode is bitwise repeatable over many splits (K = 8192
//                       pixels) and agrees with the atomic mode within the tolerance.
//   ThreeTf32           precision fp32 (3xTF32): gathered and boxed B, dy by TMA and gathered,
//                       atomic and deterministic, within the 3xTF32 bounds; repeatable.
//   SplitFollowsTheGridsTiles  the one-wave split counts the db column only with db (VGG's
//                       picks, host arithmetic); a 128-channel layer with and without db
//                       deterministic in the API's scratch, repeatable, and atomic, against the
//                       CPU twin.
//   MulticastClustersMatchLoadsOfTheirOwn  the cluster each grid takes (host arithmetic); 2 x 2,
//                       1 x 2, 3 x 1 and 2 x 1 clusters, each launch's ran_cluster the expected
//                       one, deterministic bitwise equal to the blocks' own loads, and against the
//                       CPU twin deterministic and atomic; with Exec::clusters off 1 x 1;
//                       conv2d_wgrad_wgmma_planned_cluster names the cluster each one ran.
//   Dispatch            conv2d_backward_weight with Algo::Wgmma: runs (H200) or refuses naming
//                       why; BF16 refused by the kernel; the grouped convolution refuses wgmma.
//   AlgoNameAndRefusals "wgmma" parses; linear and grouped conv refuse it (no device needed).
//   BoxCopies           the pre-pass of the TMA boxes (tap-class copies of x, conv2d_wgrad_box.h)
//                       against its CPU twin, bitwise, into NaN-poisoned scratch, on awkward
//                       shapes (any GPU: it is a plain kernel).
//   BoxWidthsExact      B by TMA boxes of the copies (opt.b = Tma), one image per box width (bw
//                       32, 16, 8, and 16 at stride 2), BM 64 and 128, dy by TMA and gathered
//                       (OW not a multiple of 4), small integers: exact; isolates the
//                       per-width layout (swizzle span = bw * 4 bytes, slabs of a k-tile row,
//                       conv2d_wgrad_box_smem.h; a failure at bw 16 / 8 only says the boxes do
//                       not land or the descriptors do not read as the CPU emulation says).
//   BoxAwkwardShapes    the boxes over C in {1, 3, 8, 17, 64, 130}, OC in {8, 24, 64, 96, 200},
//                       H, W in {8, 9, 13, 14, 16, 28, 29, 32, 64} (W not a multiple of 4 too),
//                       stride 1 / 2 / 5, 1x1..7x7, padding 0..4, batch 1 / 2 / 3, db on / off,
//                       1x1 reading x itself, OW not a multiple of 4 (dy then gathered in box
//                       order); integers exact, then random.
//                       Both with B's pieces of 8 channels and of auto's run.
//   BoxRunsExact        every run of channels a piece of B may have (8, 16, 32, 64, 128, auto:
//                       one box a piece, or one a slab) on C = 3, 8, 24, 64, 100, 128, 130, 256,
//                       OC = 5, 64, 130, bw 32 / 16 / 8, 1x1 (x itself; stride 2), 3x3, 5x5,
//                       7x7 stride 2, db on / off, atomic and deterministic; integers, exact.
//                       The direct tap class (reads x itself: stride 1, W a multiple of 4) on
//                       3x3 padding 1 and 0, 5x5, 7x7 padding 3, 1x1 padding 1; BoxLoadersBitwise
//                       checks it bitwise against every class copied; BoxCopies the pre-pass
//                       skipping each copy.
//   BoxLoadersBitwise   deterministic: boxed B with dy by TMA, gathered (async and sync
//                       hand-over), misaligned dy, misaligned x (the copies read it): bitwise
//                       equal; repeat bitwise; atomic and the gathered B within the tolerance.
//                       Both with B's pieces of 8 channels and of auto's run (128 for C = 128
//                       and 256, 64 for C = 64).
//   BoxRefusals         Tma refuses a misaligned x where the boxes read x itself (1x1) and a
//                       null scratch where they read copies, in one line; Auto falls back to
//                       the gather there and stays correct.
//   BoxDispatch         the B loader both algos default to (Auto: boxes from C = 8 up; the
//                       gather with CNN_WGMMA_WGRAD_B=gather), the scratch size counting
//                       its copies, and both algos' weight gradient through
//                       conv2d_backward_weight.
// The boxes' first version read x itself and stopped the H200 with an illegal instruction at its
// first TMA load of x (innermost coordinate -1 float: TMA wants multiples of 16 bytes); these
// cases are that path's first device run with the copies.
//
// TF32 tolerance (as tests/gpu_gemm_wgmma.cpp derives it): the tensor cores read the top 19 bits
// of each operand (relative error below 2^-10 each, so below 2^-9 + 2^-20 per product), FP32
// accumulation adds at most ~K 2^-24 relative to sum |a b|, K = N*OH*OW. Per element
//   |got - ref| <= 2 (2^-9 + K 2^-23) sum_k |dy x| + 4 ulp (|ref| + |dw0|)
// holds for every input; in addition ||got - ref||_F <= 4e-3 ||sqrt(sum_k (dy x)^2)||_F catches a
// dropped k-tile or split, which the per-element bound alone could let through for long K. db is
// the same with x = 1 (its ones column is exact in TF32).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_grouped.h"
#include "kernels/gemm/linear.h"
#include "runtime/env_switches.h"
#include "runtime/error.h"
#include "runtime/exec.h"
#include "runtime/tensor.h"
#include "tests/conv_test_cases.h"
#include "tests/conv_test_check.h"
#include "tests/test_util.h"
#include "tests/wgmma_test_require.h"
#ifdef CNN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/conv/conv2d_wgmma_wgrad.h"
#include "kernels/conv/conv2d_wgrad_box.h"
#include "kernels/conv/conv2d_wgrad_box_copies.h"
#endif

using namespace cnn;

namespace {

// Runs without a device: the name parses, and the ops without a wgmma kernel refuse it.
TEST(GpuConvWgmmaWgrad, AlgoNameAndRefusals) {
  EXPECT_EQ(parse_algo("wgmma"), Algo::Wgmma);
  EXPECT_STREQ(algo_name(Algo::Wgmma), "wgmma");
  const Exec cpu;
  LinearShape ls;
  ls.n = 2;
  ls.in = 3;
  ls.out = 4;
  std::vector<float> x(6, 1.f), w(12, 1.f), y(8), dx(6), dw(12);
  EXPECT_THROW(linear_forward(ls, x.data(), w.data(), nullptr, y.data(), false, Algo::Wgmma, cpu),
               Error);
  EXPECT_THROW(linear_backward_data(ls, y.data(), w.data(), dx.data(), Algo::Wgmma, cpu), Error);
  EXPECT_THROW(
      linear_backward_weight(ls, x.data(), y.data(), dw.data(), nullptr, nullptr, Algo::Wgmma, cpu),
      Error);
  Conv2dGroupedShape g;
  g.n = 1;
  g.c = 2;
  g.h = g.w = 4;
  g.oc = 2;
  g.groups = 2;
  std::vector<float> gx(32, 1.f), gw(2, 1.f), gy(32);
  // Depthwise (one channel a group): the dense kernels a group do not take it.
  EXPECT_THROW(conv2d_grouped_forward(g, gx.data(), gw.data(), nullptr, gy.data(), false, nullptr,
                                      Algo::Wgmma, cpu),
               Error);
}

#ifdef CNN_HAVE_CUDA

using conv_test::bitwise_equal;
using conv_test::Fill;
using conv_test::make_values;

Exec tf32_exec(bool deterministic, Precision precision = Precision::TF32) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = precision;  // TF32, or FP32: the 3xTF32 instance
  ex.deterministic = deterministic;
  return ex;
}

std::string describe(const Conv2dShape& s, bool db) {
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "N=%d C=%d H=%d W=%d OC=%d k=%dx%d stride=%d pad=%d (OH*OW=%d) db=%d splits=%d",
                s.n, s.c, s.h, s.w, s.oc, s.kh, s.kw, s.stride_h, s.pad_h, s.oh() * s.ow(), db,
                conv2d_wgrad_wgmma_splits(s));
  return buf;
}

// One problem's inputs and its reference: dw = dw0 + sum dy x (db likewise), and the sums of
// |dy x| and (dy x)^2 for the bounds.
struct Problem {
  Conv2dShape s;
  bool with_db = true;
  Fill fill = Fill::Random;
  std::vector<float> x, dy, dw0, db0;
  std::vector<float> ref_dw, ref_db, abs_dw, abs_db, sq_dw, sq_db;
};

Problem make_problem(const Conv2dShape& s, bool with_db, Fill fill, uint64_t seed) {
  Problem p;
  p.s = s;
  p.with_db = with_db;
  p.fill = fill;
  const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.oc * s.oh() * s.ow();
  const size_t nw = size_t(s.oc) * s.c * s.kh * s.kw;
  p.x = make_values(nx, fill, seed);
  p.dy = make_values(ny, fill, seed + 1);
  p.dw0 = make_values(nw, fill, seed + 2);
  p.db0 = make_values(size_t(s.oc), fill, seed + 3);
  p.ref_dw = p.dw0;
  p.ref_db = p.db0;
  conv2d_backward_weight_cpu(s, p.x.data(), p.dy.data(), p.ref_dw.data(), p.ref_db.data());
  auto map = [](const std::vector<float>& v, float (*f)(float)) {
    std::vector<float> r(v.size());
    std::transform(v.begin(), v.end(), r.begin(), f);
    return r;
  };
  const auto ax = map(p.x, [](float v) { return std::fabs(v); });
  const auto ady = map(p.dy, [](float v) { return std::fabs(v); });
  const auto sx = map(p.x, [](float v) { return v * v; });
  const auto sdy = map(p.dy, [](float v) { return v * v; });
  p.abs_dw.assign(nw, 0.f);
  p.abs_db.assign(size_t(s.oc), 0.f);
  p.sq_dw.assign(nw, 0.f);
  p.sq_db.assign(size_t(s.oc), 0.f);
  conv2d_backward_weight_cpu(s, ax.data(), ady.data(), p.abs_dw.data(), p.abs_db.data());
  conv2d_backward_weight_cpu(s, sx.data(), sdy.data(), p.sq_dw.data(), p.sq_db.data());
  return p;
}

struct RunOptions {
  bool deterministic = false;
  WgmmaWgradOptions opt{};
  int dy_offset = 0;  // floats by which dy is shifted (1: not 16-byte aligned, so gathered)
  int x_offset = 0;   // floats by which x is shifted (1: boxes of x itself refused, copies fine)
  bool no_scratch = false;  // pass null scratch (the boxes' copies then have nowhere to go)
  Precision precision = Precision::TF32;  // FP32: 3xTF32
  bool clusters = true;                   // Exec::clusters
};

struct Output {
  std::vector<float> dw, db;
};

Output run_wgmma(const Problem& p, const RunOptions& r) {
  const Conv2dShape& s = p.s;
  Exec ex = tf32_exec(r.deterministic, r.precision);
  ex.clusters = r.clusters;
  std::vector<float> dy(size_t(r.dy_offset) + p.dy.size(), NAN);
  std::copy(p.dy.begin(), p.dy.end(), dy.begin() + r.dy_offset);
  std::vector<float> x(size_t(r.x_offset) + p.x.size(), NAN);
  std::copy(p.x.begin(), p.x.end(), x.begin() + r.x_offset);
  Tensor d_x = test::to_device(x), d_dy = test::to_device(dy);
  Tensor d_dw = test::to_device(p.dw0), d_db = test::to_device(p.db0);
  // The API's scratch, or the explicit loader's (the copies of x where boxes can run).
  const size_t scratch_floats = std::max(conv2d_backward_weight_scratch_floats(s, ex),
                                         conv2d_wgrad_wgmma_scratch_floats(s, ex, r.opt.b));
  EXPECT_GE(conv2d_backward_weight_scratch_floats(s, ex), conv2d_wgrad_wgmma_scratch_floats(s, ex));
  Tensor scratch({int64_t(std::max<size_t>(scratch_floats, 1))}, Device::CUDA);
  test::poison_device(scratch.data(), std::max<size_t>(scratch_floats, 1));
  // The gather reads scratch only when deterministic; the boxes keep their copies there.
  using BLoad = WgmmaWgradOptions::BLoad;
  const bool boxes_may_run = r.opt.b == BLoad::Tma || r.opt.b == BLoad::Auto;
  float* const d_scratch =
      (r.deterministic || boxes_may_run) && !r.no_scratch ? scratch.data() : nullptr;
  conv2d_backward_weight_wgmma(s, d_x.data() + r.x_offset, d_dy.data() + r.dy_offset, d_dw.data(),
                               p.with_db ? d_db.data() : nullptr, d_scratch, ex, r.opt);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {d_dw.to_vector(), d_db.to_vector()};
}

// Checks one output against the reference; prints a one-line summary. split: the 3xTF32 bounds
// (tests/conv_test_check.h: 2^-20 a product, a Frobenius error of 3e-5).
void check(const Problem& p, const Output& o, const std::string& what, bool split = false) {
  const Conv2dShape& s = p.s;
  const double k = double(s.n) * s.oh() * s.ow();  // K: the pixels summed over
  const conv_test::Tf32Bound bound =
      split ? conv_test::Tf32Bound(k, std::ldexp(1.0, -20)) : conv_test::Tf32Bound(k);
  int64_t bad = 0, wrong = 0;
  std::string first;
  double diff2 = 0, scale2 = 0;
  auto one = [&](const char* name, size_t i, float got, float ref, float ref0, float absv,
                 float sqv) {
    const double e = std::fabs(double(got) - ref);
    const bool over = !(e <= bound(absv, std::fabs(double(ref)) + std::fabs(double(ref0))));
    const bool inexact = !(got == ref);
    if ((over && bad == 0) || (inexact && p.fill == Fill::SmallInt && wrong == 0 && bad == 0)) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "%s[%zu] (oc %zu): got %.9g, expected %.9g", name, i,
                    std::string(name) == "dw" ? i / (size_t(s.c) * s.kh * s.kw) : i, double(got),
                    double(ref));
      first = buf;
    }
    bad += over;
    wrong += inexact;
    diff2 += std::isnan(got) ? INFINITY : e * e;
    scale2 += sqv;
  };
  for (size_t i = 0; i < p.ref_dw.size(); ++i)
    one("dw", i, o.dw[i], p.ref_dw[i], p.dw0[i], p.abs_dw[i], p.sq_dw[i]);
  for (size_t i = 0; i < p.ref_db.size(); ++i) {
    if (p.with_db)
      one("db", i, o.db[i], p.ref_db[i], p.db0[i], p.abs_db[i], p.sq_db[i]);
    else if (!(o.db[i] == p.db0[i]) && bad++ == 0)
      first = "db changed although none was given";
  }
  const double frob = std::sqrt(diff2 / std::max(scale2, 1e-30));
  std::printf("%s %s: %lld inexact, %lld over the bound, rel %.3g%s%s\n", what.c_str(),
              describe(s, p.with_db).c_str(), static_cast<long long>(wrong),
              static_cast<long long>(bad), frob, first.empty() ? "" : ", first ", first.c_str());
  EXPECT_EQ(bad, 0) << what << ": " << first;
  EXPECT_LE(frob, split ? conv_test::k3xTf32Frobenius : conv_test::kTf32Frobenius) << what;
  if (p.fill == Fill::SmallInt) {
    EXPECT_EQ(wrong, 0) << "integers are exact in TF32; " << first;
  }
}

constexpr auto conv = test::square_conv;  // (n, c, h, w, oc, k, stride, pad)

TEST(GpuConvWgmmaWgrad, OneTileExact) {
  CNN_REQUIRE_WGMMA_WGRAD();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // OH*OW = 32: one k-tile; OC = 5 (BM 64), C*KH*KW = 9 (one column tile): TMA for dy.
  const Problem p = make_problem(conv(1, 1, 6, 6, 5, 3, 1, 1), true, Fill::SmallInt, seed);
  for (bool gather : {false, true}) {
    RunOptions r;
    r.opt.force_gather = gather;
    check(p, run_wgmma(p, r), gather ? "one tile, gather" : "one tile, tma");
  }
}

TEST(GpuConvWgmmaWgrad, AwkwardShapes) {
  CNN_REQUIRE_WGMMA_WGRAD();
  struct WgCase {
    Conv2dShape s;
    bool db;
  };
  const WgCase cases[] = {
      {conv(1, 1, 8, 8, 5, 1, 1, 0), true},       // 1x1, C = 1, OH*OW = 64: TMA
      {conv(3, 3, 17, 13, 64, 3, 1, 1), true},    // OH*OW = 221: packed, gathered dy
      {conv(1, 17, 20, 20, 96, 5, 1, 2), false},  // BM 128 with 32 empty rows, 5x5
      {conv(3, 64, 16, 16, 130, 3, 1, 1), true},  // two row tiles, 5 column tiles + db
      {conv(2, 3, 40, 36, 64, 7, 2, 3), true},    // a 7x7 stride-2 stem, OH*OW = 360
      {conv(3, 17, 11, 9, 5, 3, 2, 0), true},     // stride 2, OH*OW = 20 < 32: packed
      {conv(1, 64, 9, 11, 96, 1, 1, 0), true},    // 1x1, OH*OW = 99: gathered
      {conv(2, 1, 23, 29, 130, 5, 2, 3), false},  // C = 1, padding 3, OH*OW = 208
      {conv(1, 64, 32, 32, 64, 3, 1, 1), true},   // a VGG layer at batch 1: 32 k-tiles
      {conv(3, 3, 7, 7, 130, 7, 1, 3), true},     // 7x7, OH*OW = 49: gathered, ragged k-tile
      {conv(2, 17, 6, 6, 64, 5, 1, 3), true},     // padding 3 > k / 2: all-padding taps
      {conv(3, 64, 8, 8, 64, 3, 2, 1), false},    // OH*OW = 16: packed, 3 images a k-tile
      {conv(5, 64, 2, 2, 130, 3, 1, 1), true},    // OH*OW = 4: packed, 8 images a k-tile
  };
  for (const WgCase& c : cases)
    for (Fill fill : {Fill::SmallInt, Fill::Random}) {
      const uint64_t seed = test::fresh_seed();
      const std::string where = describe(c.s, c.db) + " seed " + std::to_string(seed);
      SCOPED_TRACE(where);
      const Problem p = make_problem(c.s, c.db, fill, seed);
      check(p, run_wgmma(p, RunOptions{}), fill == Fill::SmallInt ? "int" : "random");
    }
}

// The 3xTF32 instance (precision fp32): the AwkwardShapes cases and box shapes, B gathered and
// by boxes, dy by TMA and gathered, atomic and deterministic, against the double CPU twin within
// the 3xTF32 bounds (TF32 alone fails their 3e-5 Frobenius limit); deterministic runs repeat bit
// for bit.
TEST(GpuConvWgmmaWgrad, ThreeTf32) {
  CNN_REQUIRE_WGMMA_WGRAD();
  const Conv2dShape shapes[] = {
      conv(1, 1, 8, 8, 5, 1, 1, 0),       // 1x1, C = 1, BM 64, dy by TMA
      conv(3, 3, 17, 13, 64, 3, 1, 1),    // packed, gathered dy
      conv(1, 17, 20, 20, 96, 5, 1, 2),   // BM 128 with 32 empty rows
      conv(3, 64, 16, 16, 130, 3, 1, 1),  // two row tiles, 5 column tiles + db
      conv(2, 3, 40, 36, 64, 7, 2, 3),    // a 7x7 stride-2 stem
      conv(5, 64, 2, 2, 130, 3, 1, 1),    // OH*OW = 4: packed, 8 images a k-tile
      conv(2, 64, 16, 16, 64, 3, 1, 1),   // boxes of 64 channels (auto's run)
      conv(2, 17, 14, 14, 24, 3, 2, 1),   // boxes at stride 2, bw 16 / 8
      conv(3, 130, 8, 9, 200, 1, 1, 0),   // boxes of x itself (1x1), OW not a multiple of 4
  };
  using BLoad = WgmmaWgradOptions::BLoad;
  for (const Conv2dShape& s : shapes)
    for (Fill fill : {Fill::SmallInt, Fill::Random}) {
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(describe(s, true) + " seed " + std::to_string(seed));
      const Problem p = make_problem(s, true, fill, seed);
      for (BLoad b : {BLoad::Auto, BLoad::Gather})
        for (bool det : {false, true}) {
          RunOptions r;
          r.precision = Precision::FP32;
          r.deterministic = det;
          r.opt.b = b;
          const std::string what = std::string("3xtf32 ") +
                                   (b == BLoad::Gather ? "gather" : "auto") +
                                   (det ? " deterministic" : " atomic");
          const Output o = run_wgmma(p, r);
          check(p, o, what, true);
          if (det) {
            const Output again = run_wgmma(p, r);
            EXPECT_TRUE(bitwise_equal(o.dw, again.dw) && bitwise_equal(o.db, again.db))
                << what << ": not repeatable";
          }
        }
    }
}

TEST(GpuConvWgmmaWgrad, LoadersBitwise) {
  CNN_REQUIRE_WGMMA_WGRAD();
  for (const Conv2dShape& s : {conv(3, 17, 12, 12, 64, 3, 1, 1), conv(2, 64, 16, 16, 130, 3, 1, 1),
                               conv(3, 3, 13, 11, 96, 5, 2, 2)}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(s, true) + " seed " + std::to_string(seed));
    const Problem p = make_problem(s, true, Fill::Random, seed);
    using Copies = WgmmaWgradOptions::Copies;
    RunOptions base;
    base.deterministic = true;
    base.opt.copies = Copies::Async;
    const Output ref = run_wgmma(p, base);
    check(p, ref, "deterministic async");
    for (bool gather : {false, true})
      for (Copies copies : {Copies::Async, Copies::Sync}) {
        RunOptions r = base;
        r.opt.force_gather = gather;
        r.opt.copies = copies;
        const Output o = run_wgmma(p, r);
        EXPECT_TRUE(bitwise_equal(o.dw, ref.dw) && bitwise_equal(o.db, ref.db))
            << "gather=" << gather << " sync=" << (copies == Copies::Sync)
            << " differs from the TMA/async run";
      }
    RunOptions shifted = base;
    shifted.dy_offset = 1;
    const Output o = run_wgmma(p, shifted);
    EXPECT_TRUE(bitwise_equal(o.dw, ref.dw) && bitwise_equal(o.db, ref.db))
        << "misaligned dy (gathered) differs";
  }
}

// Deterministic twice (bitwise equal) and atomic, each against the CPU twin.
void check_deterministic_and_atomic(const Problem& p) {
  RunOptions det;
  det.deterministic = true;
  const Output a = run_wgmma(p, det), b = run_wgmma(p, det);
  check(p, a, "deterministic");
  EXPECT_TRUE(bitwise_equal(a.dw, b.dw) && bitwise_equal(a.db, b.db))
      << "two deterministic runs differ";
  check(p, run_wgmma(p, RunOptions{}), "atomic");
}

TEST(GpuConvWgmmaWgrad, DeterministicRepeat) {
  CNN_REQUIRE_WGMMA_WGRAD();
  const Conv2dShape s = conv(8, 64, 32, 32, 64, 3, 1, 1);  // K = 8192 pixels: many splits
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(describe(s, true) + " seed " + std::to_string(seed));
  EXPECT_GT(conv2d_wgrad_wgmma_splits(s), 8);
  check_deterministic_and_atomic(make_problem(s, true, Fill::Random, seed));
}

// The split (split_k.h) counts the grid's own tiles: with C*KH*KW a multiple of 128 (128 or 256
// channels at 3x3) the db column is a tile of its own, counted only where db is asked for. The
// picks are host arithmetic (checked without a GPU too); on a GPU both the split without db and
// with it run deterministic, within the scratch the API sizes, repeat bitwise and match the CPU
// twin, as the atomic run does.
TEST(GpuConvWgmmaWgrad, SplitFollowsTheGridsTiles) {
  // VGG's 256-channel 8x8 layer at batch 128: 36 tiles (with db 38), 3 splits in one wave
  // either way. Its 128-channel 16x16 layer: 9 tiles, 14 splits (with db 10, 13).
  const Conv2dShape vgg6 = conv(128, 256, 8, 8, 256, 3, 1, 1);
  const Conv2dShape vgg4 = conv(128, 128, 16, 16, 128, 3, 1, 1);
  EXPECT_EQ(conv2d_wgrad_wgmma_splits(vgg6, true, 0, false), 3);
  EXPECT_EQ(conv2d_wgrad_wgmma_splits(vgg6, true, 0, true), 3);
  EXPECT_EQ(conv2d_wgrad_wgmma_splits(vgg4, true, 0, false), 14);
  EXPECT_EQ(conv2d_wgrad_wgmma_splits(vgg4, true, 0, true), 13);
  CNN_REQUIRE_WGMMA_WGRAD();
  const Conv2dShape s = conv(32, 128, 8, 8, 130, 3, 1, 1);  // 2 x 9 tiles (with db 2 x 10)
  EXPECT_GT(conv2d_wgrad_wgmma_splits(s, true, 0, false),
            conv2d_wgrad_wgmma_splits(s, true, 0, true));
  for (bool db : {false, true}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(s, db) + " seed " + std::to_string(seed));
    check_deterministic_and_atomic(make_problem(s, db, Fill::Random, seed));
  }
}

// TMA multicast in thread-block clusters (conv2d_wgrad_wgmma_cluster): the cluster a grid takes
// (host arithmetic, checked without a GPU too), then on a GPU shapes whose boxed grids take
// 2 x 2, 1 x 2, 3 x 1 and 2 x 1 clusters (a 64-row tile, two blocks an SM; an output channel
// count past one row tile), with and without db. In each, the launch ran the cluster it should
// (WgmmaWgradOptions::ran_cluster), multicast's deterministic result is bitwise the one without
// (the same products, summed in the same order), and it matches the CPU twin deterministic and
// atomic; with Exec::clusters off it runs 1 x 1 whatever the option says.
TEST(GpuConvWgmmaWgrad, MulticastClustersMatchLoadsOfTheirOwn) {
  const auto cluster = [](int64_t n, int64_t m) {
    const WgradCluster c = conv2d_wgrad_wgmma_cluster(n, m);
    return std::make_pair(c.x, c.z);
  };
  EXPECT_EQ(cluster(18, 2), std::make_pair(2, 2));  // VGG's 256-channel 8x8 layer
  EXPECT_EQ(cluster(9, 2), std::make_pair(1, 2));   // 3 x 2 would be 6 blocks
  EXPECT_EQ(cluster(9, 1), std::make_pair(3, 1));   // 128 -> 128 channels
  EXPECT_EQ(cluster(10, 1), std::make_pair(2, 1));
  EXPECT_EQ(cluster(19, 3), std::make_pair(1, 1));
  EXPECT_EQ(cluster(1, 1), std::make_pair(1, 1));
  CNN_REQUIRE_WGMMA_WGRAD();
  using M = WgmmaWgradOptions::Multicast;
  struct Case {
    Conv2dShape s;
    bool db;
    int cx, cz;  // the cluster it must run in (a few blocks: one wave either way)
  };
  const Case cases[] = {
      {conv(4, 256, 8, 8, 256, 3, 1, 1), false, 2, 2},  // 18 x 2 tiles
      {conv(4, 256, 8, 8, 256, 3, 1, 1), true, 1, 2},   // 19 x 2
      {conv(3, 128, 8, 8, 200, 3, 1, 1), false, 1, 2},  // 9 x 2, rows past OC
      {conv(3, 128, 8, 8, 128, 3, 1, 1), false, 3, 1},  // 9 x 1
      {conv(3, 128, 8, 8, 128, 3, 1, 1), true, 2, 1},   // 10 x 1
      {conv(2, 256, 8, 12, 48, 3, 1, 1), false, 2, 1},  // 64-row tile, 18 x 1
  };
  for (const Case& c : cases) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(c.s, c.db) + " seed " + std::to_string(seed));
    const Problem p = make_problem(c.s, c.db, Fill::Random, seed);
    RunOptions on, off;
    on.opt.b = off.opt.b = WgmmaWgradOptions::BLoad::Tma;
    on.opt.multicast = M::On;
    off.opt.multicast = M::Off;
    on.deterministic = off.deterministic = true;
    // Equal results alone cannot tell a cluster from a fallback to 1 x 1: each launch says
    // which it ran.
    WgradCluster ran_on{0, 0}, ran_off{0, 0};
    on.opt.ran_cluster = &ran_on;
    off.opt.ran_cluster = &ran_off;
    const Output a = run_wgmma(p, on), b = run_wgmma(p, off);
    EXPECT_EQ(std::make_pair(ran_on.x, ran_on.z), std::make_pair(c.cx, c.cz));
    EXPECT_EQ(std::make_pair(ran_off.x, ran_off.z), std::make_pair(1, 1));
    // The host's plan (what the autotuner asks) names the cluster each launch ran.
    const auto planned = [&](const WgmmaWgradOptions& o, bool clusters, Precision precision) {
      Exec ex = tf32_exec(true, precision);
      ex.clusters = clusters;
      const WgradCluster pc = conv2d_wgrad_wgmma_planned_cluster(c.s, ex, c.db, o);
      return std::make_pair(pc.x, pc.z);
    };
    EXPECT_EQ(planned(on.opt, true, Precision::TF32), std::make_pair(c.cx, c.cz));
    EXPECT_EQ(planned(off.opt, true, Precision::TF32), std::make_pair(1, 1));
    EXPECT_EQ(planned(on.opt, false, Precision::TF32), std::make_pair(1, 1));
    EXPECT_EQ(planned(on.opt, true, Precision::FP32), std::make_pair(1, 1));  // 3xTF32
    check(p, a, "multicast, deterministic");
    EXPECT_TRUE(bitwise_equal(a.dw, b.dw) && bitwise_equal(a.db, b.db))
        << "multicast differs from the blocks' own loads";
    on.deterministic = false;
    ran_on = {0, 0};
    check(p, run_wgmma(p, on), "multicast, atomic");
    EXPECT_EQ(std::make_pair(ran_on.x, ran_on.z), std::make_pair(c.cx, c.cz));
    // An Exec with clusters off (a layer the whole-pass check turned off) loads its own.
    on.clusters = false;
    on.deterministic = true;
    ran_on = {0, 0};
    const Output own = run_wgmma(p, on);
    EXPECT_EQ(std::make_pair(ran_on.x, ran_on.z), std::make_pair(1, 1)) << "Exec::clusters off";
    EXPECT_TRUE(bitwise_equal(own.dw, b.dw) && bitwise_equal(own.db, b.db));
  }
  // conv2d's answer to the autotuner for a 256-channel 20x20 layer (18 x 2 tiles: 2 x 2): the
  // TF32 wgmma weight gradient clusters under wgmma and wgmma-nhwc at TF32, and under wgmma at
  // BF16 (it runs in TF32 there); not with Exec::clusters off, not as 3xTF32 (FP32), not in the
  // BF16 channels-last kernel (wgmma-nhwc at BF16), not on another variant. On VGG's 8x8 layer
  // wgmma-nhwc at TF32 and wgmma at BF16 take the GEMM on explicit copies, which has none.
  const Conv2dShape vgg = conv(8, 256, 20, 20, 256, 3, 1, 1);
  const auto may = [&](Algo algo, Precision precision, bool clusters = true) {
    Exec ex = tf32_exec(false, precision);
    ex.clusters = clusters;
    return conv2d_backward_weight_may_cluster(vgg, algo, ex, false);
  };
  EXPECT_TRUE(may(Algo::Wgmma, Precision::TF32));
  EXPECT_TRUE(may(Algo::WgmmaNhwc, Precision::TF32));
  EXPECT_TRUE(may(Algo::Wgmma, Precision::BF16));
  EXPECT_FALSE(may(Algo::Wgmma, Precision::TF32, false));
  EXPECT_FALSE(may(Algo::Wgmma, Precision::FP32));
  EXPECT_FALSE(may(Algo::WgmmaNhwc, Precision::BF16));
  EXPECT_FALSE(may(Algo::Fast, Precision::TF32));
  const auto may_8x8 = [&](Algo algo, Precision precision) {
    Exec ex = tf32_exec(false, precision);
    return conv2d_backward_weight_may_cluster(conv(128, 256, 8, 8, 256, 3, 1, 1), algo, ex, false);
  };
  EXPECT_TRUE(may_8x8(Algo::Wgmma, Precision::TF32));
  EXPECT_FALSE(may_8x8(Algo::WgmmaNhwc, Precision::TF32));
  EXPECT_FALSE(may_8x8(Algo::Wgmma, Precision::BF16));
}

TEST(GpuConvWgmmaWgrad, Dispatch) {
  CNN_REQUIRE_GPU();
  const Conv2dShape s = conv(2, 5, 9, 9, 7, 3, 1, 1);
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Problem p = make_problem(s, true, Fill::SmallInt, seed);
  Tensor d_x = test::to_device(p.x), d_dy = test::to_device(p.dy);
  Tensor d_dw = test::to_device(p.dw0), d_db = test::to_device(p.db0);
  for (bool deterministic : {false, true}) {
    const Exec ex = tf32_exec(deterministic);
    Tensor scratch({int64_t(std::max<size_t>(conv2d_backward_weight_scratch_floats(s, ex), 1))},
                   Device::CUDA);
    d_dw = test::to_device(p.dw0);
    d_db = test::to_device(p.db0);
    auto run = [&] {
      conv2d_backward_weight(s, d_x.data(), d_dy.data(), d_dw.data(), d_db.data(), scratch.data(),
                             Algo::Wgmma, ex);
    };
    if (conv2d_wgrad_wgmma_available()) {
      run();
      check(p, {d_dw.to_vector(), d_db.to_vector()}, "via conv2d_backward_weight");
    } else {
      try {
        run();
        ADD_FAILURE() << "algo wgmma ran without the sm_90a kernel";
      } catch (const Error& e) {
        EXPECT_TRUE(test::contains(e.what(), "9.0")) << e.what();
      }
    }
  }
  // BF16 is refused by the kernel itself with the reason, whatever the device (conv2d's
  // dispatch runs it in TF32 at bf16); FP32 runs 3xTF32 (ThreeTf32).
  const Exec bf16 = tf32_exec(false, Precision::BF16);
  try {
    conv2d_backward_weight_wgmma(s, d_x.data(), d_dy.data(), d_dw.data(), d_db.data(), nullptr,
                                 bf16);
    ADD_FAILURE() << "the wgmma weight gradient ran at BF16";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "tf32 or fp32")) << e.what();
  }
  EXPECT_FALSE(conv2d_wgrad_wgmma_refusal(s, bf16).empty());
  if (conv2d_wgrad_wgmma_available()) {
    EXPECT_TRUE(conv2d_wgrad_wgmma_refusal(s, tf32_exec(false, Precision::FP32)).empty());
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// ---- B by TMA boxes ----------------------------------------------------------------------------

using BLoad = WgmmaWgradOptions::BLoad;

RunOptions boxed(bool deterministic = false) {
  RunOptions r;
  r.deterministic = deterministic;
  r.opt.b = BLoad::Tma;
  return r;
}

std::string box_describe(const Conv2dShape& s, bool db, int run = 0) {
  const WgradBoxGeometry g = wgrad_box_geometry(s, run);
  return describe(s, db) + " box " + std::to_string(g.br) + "x" + std::to_string(g.bw) + ", run " +
         std::to_string(g.run) + (run == 0 ? " (auto)" : "") + ", " + std::to_string(g.b_boxes) +
         " B boxes a stage, " +
         (g.reads_x ? std::string("reads x") : std::to_string(g.copies) + " copies") +
         ", box splits " + std::to_string(conv2d_wgrad_wgmma_splits(s, true, run));
}

// The runs the box tests force on B's pieces: the 8-channel groups and auto's pick (the two the
// CNN_WGMMA_WGRAD_BOX_RUN measurement compares).
constexpr int kTwoRuns[] = {8, WgmmaWgradOptions::kBoxRunAuto};

RunOptions boxed_run(int run, bool deterministic = false) {
  RunOptions r = boxed(deterministic);
  r.opt.box_run = run;
  return r;
}

TEST(GpuConvWgmmaWgrad, BoxCopies) {
  CNN_REQUIRE_GPU();
  const Conv2dShape shapes[] = {
      conv(2, 3, 13, 13, 4, 3, 1, 1), conv(1, 17, 16, 16, 4, 5, 1, 2),
      conv(3, 3, 29, 29, 4, 7, 2, 3), conv(2, 5, 13, 13, 4, 1, 1, 0),
      conv(2, 9, 16, 16, 4, 1, 2, 0), conv(1, 3, 40, 40, 4, 3, 5, 1),
      conv(1, 2, 9, 9, 4, 5, 1, 4),   conv(1, 130, 8, 8, 4, 7, 1, 3),
      conv(3, 3, 64, 64, 4, 7, 2, 3), conv(2, 8, 33, 28, 4, 3, 2, 0),
  };
  for (const Conv2dShape& s : shapes) {
    const uint64_t seed = test::fresh_seed();
    const WgradBoxGeometry g = wgrad_box_geometry(s);
    SCOPED_TRACE(describe(s, false) + " copies " + std::to_string(g.copies) + " of " +
                 std::to_string(g.copy_h) + "x" + std::to_string(g.copy_w) + " seed " +
                 std::to_string(seed));
    ASSERT_FALSE(g.reads_x);
    const std::vector<float> x = test::random_vector(size_t(s.n) * s.c * s.h * s.w, seed);
    std::vector<float> want(size_t(g.copy_floats));
    wgrad_box_copies_cpu(s, g, x.data(), want.data());
    Tensor d_x = test::to_device(x);
    Tensor d_copies({g.copy_floats}, Device::CUDA);
    test::poison_device(d_copies.data(), size_t(g.copy_floats));
    wgrad_box_copies_cuda(s, g, d_x.data(), d_copies.data(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got = d_copies.to_vector();
    size_t first = got.size();
    for (size_t i = 0; i < got.size() && first == got.size(); ++i)
      if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) first = i;
    EXPECT_EQ(first, got.size()) << "first difference at " << first << ": got "
                                 << (first < got.size() ? got[first] : 0.f) << ", expected "
                                 << (first < got.size() ? want[first] : 0.f);
    // Skipping each copy in turn (the direct class's, when its boxes read x): the others as
    // before, the skipped one untouched (still the poison).
    const size_t copy_size = got.size() / size_t(g.copies);
    for (int skip = 0; skip < g.copies; ++skip) {
      test::poison_device(d_copies.data(), size_t(g.copy_floats));
      const std::vector<float> poison = d_copies.to_vector();
      wgrad_box_copies_cuda(s, g, d_x.data(), d_copies.data(), nullptr, skip);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> some = d_copies.to_vector();
      size_t wrong = 0;
      for (size_t i = 0; i < some.size(); ++i) {
        const bool skipped = i / copy_size == size_t(skip);
        wrong += std::memcmp(&some[i], skipped ? &poison[i] : &want[i], sizeof(float)) != 0;
      }
      EXPECT_EQ(wrong, 0u) << "skipping copy " << skip;
    }
  }
}

TEST(GpuConvWgmmaWgrad, BoxWidthsExact) {
  CNN_REQUIRE_WGMMA_WGRAD();
  // One image, C = 8 (one group a tap); OW = 32, 16, 8: box widths 32, 16 and 8; a stride-2
  // OW = 16 (bw 16 of the copies, which hold the stride); OC = 8 (BM 64) and 130 (BM 128, two
  // consumer warpgroups: the second's rows start 64 rows of the span into each slab); OW = 14
  // and 6: dy gathered into the bw 16 / 8 slabs.
  for (const Conv2dShape& s : {conv(1, 8, 32, 32, 8, 3, 1, 1), conv(1, 8, 16, 16, 8, 3, 1, 1),
                               conv(1, 8, 8, 8, 8, 3, 1, 1), conv(1, 8, 32, 32, 8, 3, 2, 1),
                               conv(1, 8, 32, 32, 130, 3, 1, 1), conv(1, 8, 16, 16, 130, 3, 1, 1),
                               conv(1, 8, 8, 8, 130, 3, 1, 1), conv(1, 8, 14, 14, 8, 3, 1, 1),
                               conv(1, 8, 6, 6, 130, 3, 1, 1)}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(box_describe(s, true) + " seed " + std::to_string(seed));
    ASSERT_EQ(conv2d_wgrad_wgmma_box_refusal(s, nullptr), "");
    const Problem p = make_problem(s, true, Fill::SmallInt, seed);
    check(p, run_wgmma(p, boxed()), "box OW=" + std::to_string(s.ow()));
  }
}

TEST(GpuConvWgmmaWgrad, BoxAwkwardShapes) {
  CNN_REQUIRE_WGMMA_WGRAD();
  struct WgCase {
    Conv2dShape s;
    bool db;
  };
  const WgCase cases[] = {
      {conv(1, 1, 8, 8, 8, 1, 1, 0), true},       // C = 1, 1x1: bw 8, reads x itself
      {conv(3, 3, 32, 32, 24, 3, 1, 1), true},    // C = 3: 5 zero columns a group
      {conv(1, 8, 28, 28, 64, 5, 1, 0), false},   // OW = 24 (bw 32, 8 wasted columns)
      {conv(3, 17, 16, 16, 200, 3, 1, 0), true},  // OW = 14: dy gathered into bw 16 slabs
      {conv(1, 64, 64, 64, 64, 3, 2, 1), true},   // stride 2: 6 copies, OW = 32
      {conv(3, 130, 16, 16, 24, 1, 1, 0), true},  // C = 130: 17 groups, 2 column tiles; x
      {conv(1, 3, 64, 64, 64, 7, 2, 3), true},    // 7x7 stride-2 stem, padding 3: 14 copies
      {conv(3, 17, 13, 32, 8, 5, 1, 2), false},   // H = 13: a ragged last box row
      {conv(1, 64, 33, 32, 200, 3, 1, 3), true},  // padding 3 > k / 2, OH = 37
      {conv(3, 8, 8, 8, 200, 3, 2, 1), true},     // OW = 4: dy gathered, bw 8
      {conv(1, 17, 32, 28, 130, 7, 1, 3), true},  // non-square, C*KH*KW = 833, 4 copies
      {conv(3, 64, 16, 16, 64, 3, 1, 1), true},   // the VGG 16x16 layer at batch 3
      {conv(1, 130, 8, 8, 24, 5, 1, 2), false},   // C = 130, 5x5: 425 columns
      {conv(3, 3, 33, 28, 8, 3, 2, 0), true},     // stride 2, OW = 13, OH = 16
      // The shapes the boxes of x itself refused or died on: W not a multiple of 4, C = 3,
      // OC = 200, N = 3, 3x3 padding 1, 5x5 padding 2, 7x7 stride 2 padding 3, 1x1.
      {conv(3, 3, 13, 13, 200, 3, 1, 1), true},   // W = 13, 3x3 padding 1
      {conv(3, 17, 14, 14, 64, 5, 1, 2), true},   // W = 14, 5x5 padding 2
      {conv(3, 3, 29, 29, 64, 7, 2, 3), true},    // W = 29, 7x7 stride 2 padding 3: OW = 15
      {conv(3, 64, 13, 13, 200, 1, 1, 0), true},  // 1x1 padding 0, W = 13: one copy
      {conv(2, 32, 16, 16, 96, 1, 2, 0), false},  // 1x1 stride 2 (a downsample): a quarter copy
      {conv(1, 3, 40, 40, 8, 3, 5, 1), true},     // stride 5: 9 copies
      {conv(2, 8, 9, 9, 24, 5, 1, 4), true},      // padding 4: all-padding taps, W = 9
  };
  for (const WgCase& c : cases)
    for (int run : kTwoRuns)
      for (Fill fill : {Fill::SmallInt, Fill::Random}) {
        const uint64_t seed = test::fresh_seed();
        SCOPED_TRACE(box_describe(c.s, c.db, run) + " seed " + std::to_string(seed));
        ASSERT_EQ(conv2d_wgrad_wgmma_box_refusal(c.s, nullptr), "");
        const Problem p = make_problem(c.s, c.db, fill, seed);
        check(p, run_wgmma(p, boxed_run(run)), fill == Fill::SmallInt ? "box int" : "box random");
      }
}

// Every run of channels a piece of B may have (conv2d_wgrad_box_smem.h: one box a piece for run
// 8, 128 or bw 32, one box a slab for run 16..64 at bw 16 and 8), forced on each box width and
// on C that fills pieces, leaves them ragged (C = 3, 24, 100) and spans tiles (C = 256), OC
// 5 / 64 / 130 (BM 64 and 128), 1x1, 3x3, 5x5, 7x7 stride 2, db on / off, atomic and
// deterministic; small integers: exact.
TEST(GpuConvWgmmaWgrad, BoxRunsExact) {
  CNN_REQUIRE_WGMMA_WGRAD();
  struct WgCase {
    Conv2dShape s;
    bool db;
  };
  const WgCase cases[] = {
      {conv(2, 128, 16, 16, 130, 3, 1, 1), true},  // VGG conv4 at batch 2: bw 16, run 128
      {conv(1, 128, 32, 32, 64, 3, 1, 1), false},  // bw 32
      {conv(2, 128, 8, 8, 130, 3, 1, 1), true},    // bw 8: 4 slabs
      {conv(2, 256, 8, 8, 64, 3, 1, 1), true},     // a tap spans two tiles
      {conv(2, 64, 16, 16, 64, 3, 1, 1), true},    // run 64: a box a slab
      {conv(1, 64, 32, 32, 5, 3, 1, 1), false},    // run 64 at bw 32: a box a piece, OC = 5
      {conv(2, 100, 13, 13, 130, 3, 1, 1), true},  // C = 100: ragged runs, OW = 13 (dy gathered)
      {conv(2, 24, 16, 16, 5, 3, 1, 1), true},     // C = 24
      {conv(3, 3, 16, 16, 64, 3, 1, 1), true},     // C = 3: one channel piece, mostly zeros
      {conv(2, 8, 32, 32, 130, 5, 1, 2), false},   // C = 8, 5x5
      {conv(2, 64, 29, 29, 64, 7, 2, 3), true},    // 7x7 stride 2 (14 copies), OW = 15
      {conv(2, 130, 16, 16, 64, 1, 1, 0), true},   // 1x1 reading x itself, C = 130
      {conv(2, 128, 9, 11, 130, 1, 2, 0), false},  // 1x1 stride 2, odd image: OW = 6, bw 8
      {conv(2, 64, 16, 16, 64, 3, 1, 0), true},    // direct class 0: no row above x read
      {conv(2, 24, 12, 12, 130, 5, 1, 2), true},   // 5x5 padding 2: direct class 2
      {conv(1, 8, 20, 20, 64, 7, 1, 3), false},    // 7x7 padding 3: direct class 3
      {conv(2, 40, 8, 8, 5, 1, 1, 1), true},       // 1x1 padding 1: the one copy, none direct
  };
  for (const WgCase& c : cases)
    for (int run : {8, 16, 32, 64, 128, int(WgmmaWgradOptions::kBoxRunAuto)})
      for (bool deterministic : {false, true}) {
        const uint64_t seed = test::fresh_seed();
        SCOPED_TRACE(box_describe(c.s, c.db, run) + " deterministic " +
                     std::to_string(deterministic) + " seed " + std::to_string(seed));
        ASSERT_EQ(conv2d_wgrad_wgmma_box_refusal(c.s, nullptr), "");
        const Problem p = make_problem(c.s, c.db, Fill::SmallInt, seed);
        check(p, run_wgmma(p, boxed_run(run, deterministic)),
              "box run " + std::to_string(run) + (deterministic ? " deterministic" : " atomic"));
      }
}

TEST(GpuConvWgmmaWgrad, BoxLoadersBitwise) {
  CNN_REQUIRE_WGMMA_WGRAD();
  for (const Conv2dShape& s : {conv(3, 17, 16, 16, 64, 3, 1, 1), conv(2, 64, 32, 32, 130, 3, 1, 1),
                               conv(3, 3, 28, 28, 96, 5, 2, 2), conv(3, 3, 13, 13, 64, 3, 1, 1),
                               conv(2, 9, 8, 8, 130, 3, 1, 1),  // bw 8, BM 128
                               conv(2, 128, 16, 16, 130, 3, 1, 1), conv(2, 64, 16, 16, 64, 3, 1, 1),
                               conv(2, 256, 6, 6, 64, 3, 1, 1)})  // OW 6: dy gathered, bw 8
    for (int run : kTwoRuns) {
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(box_describe(s, true, run) + " seed " + std::to_string(seed));
      auto boxed = [run](bool deterministic = false) { return boxed_run(run, deterministic); };
      const Problem p = make_problem(s, true, Fill::Random, seed);
      const Output ref = run_wgmma(p, boxed(true));
      check(p, ref, "box deterministic");
      const Output again = run_wgmma(p, boxed(true));
      EXPECT_TRUE(bitwise_equal(again.dw, ref.dw) && bitwise_equal(again.db, ref.db))
          << "two deterministic box runs differ";
      using Copies = WgmmaWgradOptions::Copies;
      for (Copies copies : {Copies::Async, Copies::Sync}) {
        RunOptions r = boxed(true);
        r.opt.force_gather = true;  // dy gathered in box order, the same k-tiles and sums
        r.opt.copies = copies;
        const Output o = run_wgmma(p, r);
        EXPECT_TRUE(bitwise_equal(o.dw, ref.dw) && bitwise_equal(o.db, ref.db))
            << "box with dy gathered (sync=" << (copies == Copies::Sync) << ") differs";
      }
      RunOptions shifted = boxed(true);
      shifted.dy_offset = 1;
      Output o = run_wgmma(p, shifted);
      EXPECT_TRUE(bitwise_equal(o.dw, ref.dw) && bitwise_equal(o.db, ref.db))
          << "box with misaligned dy (gathered) differs";
      RunOptions x_shifted = boxed(true);
      x_shifted.x_offset = 1;  // the pre-pass reads x with scalar loads: any alignment
      o = run_wgmma(p, x_shifted);
      EXPECT_TRUE(bitwise_equal(o.dw, ref.dw) && bitwise_equal(o.db, ref.db))
          << "box with misaligned x (copied) differs";
      // The direct class from a copy too (its boxes read x itself by default where it has one).
      RunOptions copied = boxed(true);
      copied.opt.box_direct = WgmmaWgradOptions::Direct::Off;
      o = run_wgmma(p, copied);
      EXPECT_TRUE(bitwise_equal(o.dw, ref.dw) && bitwise_equal(o.db, ref.db))
          << "box with every class copied differs (direct class "
          << wgrad_box_geometry(s).direct_copy << ")";
      // Different k-tiles and split: the same sums in another order, within the tolerance.
      RunOptions gather;
      gather.deterministic = true;
      gather.opt.b = BLoad::Gather;
      check(p, run_wgmma(p, gather), "gathered B deterministic");
      check(p, run_wgmma(p, boxed(false)), "box atomic");
    }
}

TEST(GpuConvWgmmaWgrad, BoxRefusals) {
  CNN_REQUIRE_WGMMA_WGRAD();
  struct Refused {
    Conv2dShape s;
    int x_offset;
    bool no_scratch;
    const char* why;
  };
  for (const Refused& c : {Refused{conv(2, 8, 16, 16, 24, 1, 1, 0), 1, false, "aligned"},
                           Refused{conv(1, 3, 13, 13, 8, 3, 1, 1), 0, true, "scratch"},
                           Refused{conv(3, 8, 14, 14, 24, 5, 2, 2), 0, true, "scratch"}}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(box_describe(c.s, true) + " seed " + std::to_string(seed));
    const Problem p = make_problem(c.s, true, Fill::SmallInt, seed);
    RunOptions r = boxed();
    r.x_offset = c.x_offset;
    r.no_scratch = c.no_scratch;
    try {
      run_wgmma(p, r);
      ADD_FAILURE() << "boxes taken";
    } catch (const Error& e) {
      EXPECT_TRUE(test::contains(e.what(), c.why)) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
    r.opt.b = BLoad::Auto;  // falls back to the gather
    check(p, run_wgmma(p, r), "auto fallback");
  }
}

TEST(GpuConvWgmmaWgrad, BoxDispatch) {
  CNN_REQUIRE_WGMMA_WGRAD();
  // Both algos default to Auto (boxes where they can and C >= 8); CNN_WGMMA_WGRAD_B=gather
  // keeps the gather.
  const WgmmaWgradBSwitch sw = process_env_switches().wgmma_wgrad_b;
  const BLoad want = sw == WgmmaWgradBSwitch::Gather ? BLoad::Gather : BLoad::Auto;
  EXPECT_EQ(wgmma_wgrad_b_for(Algo::WgmmaNhwc), want) << "CNN_WGMMA_WGRAD_B switch " << int(sw);
  EXPECT_EQ(wgmma_wgrad_b_for(Algo::Wgmma), want) << "CNN_WGMMA_WGRAD_B switch " << int(sw);
  for (const Conv2dShape& s : {conv(2, 17, 16, 16, 24, 3, 1, 1), conv(3, 3, 13, 13, 64, 7, 2, 3)})
    for (Algo algo : {Algo::Wgmma, Algo::WgmmaNhwc})
      for (bool deterministic : {false, true}) {
        const uint64_t seed = test::fresh_seed();
        SCOPED_TRACE(box_describe(s, true) + " algo " + algo_name(algo) + " seed " +
                     std::to_string(seed));
        const Problem p = make_problem(s, true, Fill::SmallInt, seed);
        Tensor d_x = test::to_device(p.x), d_dy = test::to_device(p.dy);
        Tensor d_dw = test::to_device(p.dw0), d_db = test::to_device(p.db0);
        const Exec ex = tf32_exec(deterministic);
        const size_t need = conv2d_backward_weight_scratch_floats(s, ex);
        // The API's scratch holds the copies of x exactly when the default loader may box
        // (Auto boxes from 8 input channels up).
        const size_t copies = size_t(wgrad_box_geometry(s).copy_floats);
        const bool boxes = want == BLoad::Auto && s.c >= 8;
        if (boxes) {
          EXPECT_GE(need, copies + (deterministic ? size_t(conv2d_wgrad_wgmma_splits(s, true)) *
                                                        (size_t(s.oc) * s.c * s.kh * s.kw + s.oc)
                                                  : size_t(0)));
        } else {
          EXPECT_GE(need, conv2d_wgrad_wgmma_scratch_floats(s, ex, BLoad::Gather));
        }
        Tensor scratch({int64_t(std::max<size_t>(need, 1))}, Device::CUDA);
        test::poison_device(scratch.data(), std::max<size_t>(need, 1));
        conv2d_backward_weight(s, d_x.data(), d_dy.data(), d_dw.data(), d_db.data(), scratch.data(),
                               algo, ex);
        check(p, {d_dw.to_vector(), d_db.to_vector()},
              std::string("via conv2d_backward_weight ") + algo_name(algo) +
                  (boxes ? " (boxes)" : " (gather)"));
      }
}

#endif  // CNN_HAVE_CUDA

}  // namespace
