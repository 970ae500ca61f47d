// The BF16 weight gradient from channels-last copies (kernels/conv/conv2d_wgmma_wgrad_nhwc.h)
// against conv2d_backward_weight_cpu on the BF16-rounded x and dy. Skipped unless the device is
// compute capability 9.0 and the build has the sm_90a kernel. Cases:
//   Exact        small-integer inputs (exact in BF16, every partial sum exact in FP32): bit-equal
//                to the reference, accumulated into a nonzero dw; the first wrong (oc, c, tap)
//                is printed. One k-tile; the VGG layers at batch 2; C and OC not multiples of
//                64 (70, 130, 200), C = 1 and 3, 1x1 / 5x5 / 7x7, stride 2, padding 0..3,
//                OH*OW not a multiple of 64 (k-tiles across images, a ragged last one); every
//                tile form: one dy box (OC <= 64) or two, each consumer n64 or n128 (one x piece
//                or two side by side: the MN-major descriptor's M/N stride).
//   Random       the same shapes on random inputs, within the bound below.
//   Splits       every split count (1, 2, 3, 7, 64, and more than the k-tiles) gives the exact
//                integer answer.
//   Refusals     one line each, and the call throws: TF32 and FP32 precision, deterministic
//                mode, db, a stride the im2col TMA cannot express.
//   Dispatch     conv2d_backward_weight with Algo::WgmmaNhwc at bf16 runs this kernel (within
//                the bound), with db it falls back to the TF32 kernel (within TF32's); the API's
//                scratch covers this kernel's.
// Bound: a BF16 x BF16 product is exact in FP32, so the only error is the order of the FP32
// sums: |got - ref| <= 2 K 2^-24 sum_k |dy x| + 4 ulp (|ref| + |dw0|), K = N*OH*OW; and the
// relative Frobenius error under 1e-5 (a dropped k-tile or split is about sqrt(64 / K) or more).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/common/bf16_round.h"
#include "kernels/conv/conv2d.h"
#include "runtime/error.h"
#include "runtime/exec.h"
#include "runtime/tensor.h"
#include "tests/conv_test_check.h"
#include "tests/test_util.h"
#ifdef CNN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/conv/conv2d_wgmma_wgrad_nhwc.h"
#include "runtime/cuda_check.h"
#endif

using namespace cnn;

namespace {

#ifdef CNN_HAVE_CUDA

#define CNN_REQUIRE_WGRAD_NHWC()                                                           \
  do {                                                                                     \
    CNN_REQUIRE_GPU();                                                                     \
    if (!conv2d_wgrad_wgmma_nhwc_available())                                              \
      GTEST_SKIP() << "the BF16 channels-last weight gradient needs a compute capability " \
                      "9.0 GPU and an sm_90a build";                                       \
  } while (0)

using conv_test::Fill;
using conv_test::make_values;
constexpr auto conv = test::square_conv;  // (n, c, h, w, oc, k, stride, pad)

Exec bf16_exec(bool deterministic = false, Precision precision = Precision::BF16) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = precision;
  ex.deterministic = deterministic;
  return ex;
}

// One problem: inputs (x and dy already BF16 values), dw0, the reference dw0 + sum dy x and the
// sums of |dy x| and (dy x)^2.
struct Problem {
  Conv2dShape s;
  Fill fill;
  std::vector<float> x, dy, dw0, ref, abs, sq;
};

Problem make_problem(const Conv2dShape& s, Fill fill, uint64_t seed) {
  Problem p{s, fill, {}, {}, {}, {}, {}, {}};
  const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.oc * s.oh() * s.ow();
  const size_t nw = size_t(s.oc) * s.c * s.kh * s.kw;
  p.x = round_to_bf16(make_values(nx, fill, seed));
  p.dy = round_to_bf16(make_values(ny, fill, seed + 1));
  p.dw0 = make_values(nw, fill, seed + 2);
  p.ref = p.dw0;
  std::vector<float> db(size_t(s.oc)), ax(nx), ady(ny), sx(nx), sdy(ny);
  conv2d_backward_weight_cpu(s, p.x.data(), p.dy.data(), p.ref.data(), db.data());
  for (size_t i = 0; i < nx; ++i) ax[i] = std::fabs(p.x[i]), sx[i] = p.x[i] * p.x[i];
  for (size_t i = 0; i < ny; ++i) ady[i] = std::fabs(p.dy[i]), sdy[i] = p.dy[i] * p.dy[i];
  p.abs.assign(nw, 0.f);
  p.sq.assign(nw, 0.f);
  conv2d_backward_weight_cpu(s, ax.data(), ady.data(), p.abs.data(), db.data());
  conv2d_backward_weight_cpu(s, sx.data(), sdy.data(), p.sq.data(), db.data());
  return p;
}

std::string describe(const Conv2dShape& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "N=%d C=%d H=%d W=%d OC=%d k=%dx%d stride=%d pad=%d (OH*OW=%d)",
                s.n, s.c, s.h, s.w, s.oc, s.kh, s.kw, s.stride_h, s.pad_h, s.oh() * s.ow());
  return buf;
}

// The kernel itself (splits 0: its pick; consumer_n 0: its pick), into NaN-poisoned scratch.
std::vector<float> run_kernel(const Problem& p, int splits = 0, int consumer_n = 0) {
  Tensor d_x = test::to_device(p.x), d_dy = test::to_device(p.dy), d_dw = test::to_device(p.dw0);
  const size_t floats = conv2d_wgrad_wgmma_nhwc_scratch_floats(p.s);
  Tensor scratch({int64_t(floats)}, Device::CUDA);
  test::poison_device(scratch.data(), floats);
  WgmmaWgradNhwcOptions opt;
  opt.splits = splits;
  opt.consumer_n = consumer_n;
  conv2d_backward_weight_wgmma_nhwc(p.s, d_x.data(), d_dy.data(), d_dw.data(), scratch.data(),
                                    bf16_exec(), opt);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return d_dw.to_vector();
}

// Checks got against the reference: exact for integer inputs, else the bound of the file comment
// with `product` the relative error allowed per product (0 here; 2^-9 for the TF32 fallback).
void check(const Problem& p, const std::vector<float>& got, const std::string& what,
           double product = 0) {
  const Conv2dShape& s = p.s;
  const double k = double(s.n) * s.oh() * s.ow();
  const double rel = 2 * (product + k * std::ldexp(1.0, -24));
  int64_t bad = 0, inexact = 0;
  std::string first;
  double diff2 = 0, scale2 = 0;
  for (size_t i = 0; i < p.ref.size(); ++i) {
    const double e = std::fabs(double(got[i]) - p.ref[i]);
    const double mag = std::fabs(double(p.ref[i])) + std::fabs(double(p.dw0[i]));
    const bool over = !(e <= rel * p.abs[i] + 4 * std::ldexp(mag, -23));
    const bool wrong = !(got[i] == p.ref[i]);
    if (first.empty() && (over || (wrong && p.fill == Fill::SmallInt))) {
      const size_t taps = size_t(s.kh) * s.kw, oc = i / (size_t(s.c) * taps);
      char buf[200];
      std::snprintf(buf, sizeof buf, "dw[oc %zu][c %zu][tap %zu]: got %.9g, expected %.9g", oc,
                    (i / taps) % size_t(s.c), i % taps, double(got[i]), double(p.ref[i]));
      first = buf;
    }
    bad += over;
    inexact += wrong;
    diff2 += std::isnan(got[i]) ? INFINITY : e * e;
    scale2 += p.sq[i];
  }
  const double frob = std::sqrt(diff2 / std::max(scale2, 1e-30));
  std::printf("%s %s: %lld inexact, %lld over the bound, rel %.3g%s%s\n", what.c_str(),
              describe(s).c_str(), static_cast<long long>(inexact), static_cast<long long>(bad),
              frob, first.empty() ? "" : ", first ", first.c_str());
  EXPECT_EQ(bad, 0) << what << ": " << first;
  EXPECT_LE(frob, product > 0 ? conv_test::kTf32Frobenius : 1e-5) << what;
  if (p.fill == Fill::SmallInt && product == 0) EXPECT_EQ(inexact, 0) << what << ": " << first;
}

std::vector<Conv2dShape> shapes() {
  return {
      conv(1, 64, 8, 8, 64, 3, 1, 1),      // one k-tile (64 output pixels)
      conv(1, 1, 6, 6, 5, 3, 1, 1),        // C = 1, OC = 5: padded channels, ragged k-tile
      conv(2, 64, 32, 32, 64, 3, 1, 1),    // VGG conv2 at batch 2 (one dy box, two pieces)
      conv(2, 128, 16, 16, 128, 3, 1, 1),  // VGG conv4 (two dy boxes, one piece)
      conv(3, 256, 8, 8, 256, 3, 1, 1),    // VGG conv6: two row tiles
      conv(2, 64, 16, 16, 128, 3, 1, 1),   // VGG conv3
      conv(3, 3, 17, 13, 64, 3, 1, 1),     // C = 3, OH*OW = 221: k-tiles across images
      conv(2, 70, 9, 11, 130, 1, 1, 0),    // 1x1, C = 70 (two chunks), OC = 130 (a last 128-tile)
      conv(1, 17, 20, 20, 96, 5, 1, 2),    // 5x5, OC = 96
      conv(2, 3, 40, 36, 64, 7, 2, 3),     // a 7x7 stride-2 stem
      conv(3, 17, 11, 9, 200, 3, 2, 0),    // stride 2, no padding, OH*OW = 20
      conv(2, 32, 6, 6, 48, 5, 1, 3),      // padding 3 > k / 2: all-padding taps
  };
}

TEST(GpuConvWgradNhwcBf16, Exact) {
  CNN_REQUIRE_WGRAD_NHWC();
  for (const Conv2dShape& s : shapes()) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(s) + " seed " + std::to_string(seed));
    const Problem p = make_problem(s, Fill::SmallInt, seed);
    for (int n : {64, 128}) check(p, run_kernel(p, 0, n), "int n" + std::to_string(n));
  }
}

TEST(GpuConvWgradNhwcBf16, Random) {
  CNN_REQUIRE_WGRAD_NHWC();
  for (const Conv2dShape& s : shapes()) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(s) + " seed " + std::to_string(seed));
    const Problem p = make_problem(s, Fill::Random, seed);
    for (int n : {64, 128}) check(p, run_kernel(p, 0, n), "random n" + std::to_string(n));
  }
}

TEST(GpuConvWgradNhwcBf16, Splits) {
  CNN_REQUIRE_WGRAD_NHWC();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Problem p = make_problem(conv(3, 64, 16, 16, 128, 3, 1, 1), Fill::SmallInt, seed);
  std::printf("picked splits %d\n", conv2d_wgrad_wgmma_nhwc_splits(p.s));
  for (int splits : {1, 2, 3, 7, 64, 1000})  // 12 k-tiles: 64 and 1000 run 12 splits
    for (int n : {64, 128})
      check(p, run_kernel(p, splits, n),
            "splits " + std::to_string(splits) + " n" + std::to_string(n));
}

TEST(GpuConvWgradNhwcBf16, Refusals) {
  CNN_REQUIRE_WGRAD_NHWC();
  const Conv2dShape s = conv(1, 8, 8, 8, 8, 3, 1, 1);
  EXPECT_EQ(conv2d_wgrad_wgmma_nhwc_refusal(s, bf16_exec(), false), "");
  struct Refused {
    Conv2dShape s;
    Exec ex;
    bool db;
  };
  const Refused refused[] = {
      {s, bf16_exec(false, Precision::TF32), false},
      {s, bf16_exec(false, Precision::FP32), false},
      {s, bf16_exec(true), false},
      {s, bf16_exec(), true},
      {conv(1, 8, 40, 40, 8, 3, 9, 1), bf16_exec(), false},  // stride 9: past the TMA's 8
  };
  std::vector<float> x(size_t(1) * 8 * 40 * 40, 1.f), dy(8 * 64, 1.f), dw(8 * 8 * 9, 0.f);
  Tensor d_x = test::to_device(x), d_dy = test::to_device(dy), d_dw = test::to_device(dw);
  Tensor scratch({int64_t(1 << 16)}, Device::CUDA);
  for (const Refused& r : refused) {
    const std::string why = conv2d_wgrad_wgmma_nhwc_refusal(r.s, r.ex, r.db);
    std::printf("refused: %s\n", why.c_str());
    EXPECT_FALSE(why.empty()) << describe(r.s);
    EXPECT_EQ(why.find('\n'), std::string::npos) << why;
    if (!r.db)
      EXPECT_THROW(conv2d_backward_weight_wgmma_nhwc(r.s, d_x.data(), d_dy.data(), d_dw.data(),
                                                     scratch.data(), r.ex),
                   Error);
  }
}

TEST(GpuConvWgradNhwcBf16, Dispatch) {
  CNN_REQUIRE_WGRAD_NHWC();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Problem p = make_problem(conv(2, 64, 16, 16, 96, 3, 1, 1), Fill::Random, seed);
  const Exec ex = bf16_exec();
  const size_t floats = conv2d_backward_weight_scratch_floats(p.s, ex);
  EXPECT_GE(floats, conv2d_wgrad_wgmma_nhwc_scratch_floats(p.s));
  Tensor scratch({int64_t(floats)}, Device::CUDA);
  for (bool with_db : {false, true}) {
    Tensor d_x = test::to_device(p.x), d_dy = test::to_device(p.dy);
    Tensor d_dw = test::to_device(p.dw0), d_db({int64_t(p.s.oc)}, Device::CUDA);
    test::poison_device(scratch.data(), floats);
    CNN_CUDA_CHECK(cudaMemset(d_db.data(), 0, sizeof(float) * size_t(p.s.oc)));
    conv2d_backward_weight(p.s, d_x.data(), d_dy.data(), d_dw.data(),
                           with_db ? d_db.data() : nullptr, scratch.data(), Algo::WgmmaNhwc, ex);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    // With db the TF32 kernel runs: the inputs are BF16 values, exact in TF32 too, so the same
    // bound holds with TF32's per-product allowance.
    check(p, d_dw.to_vector(), with_db ? "api, db (tf32 kernel)" : "api",
          with_db ? std::ldexp(1.0, -9) : 0);
  }
}

#endif  // CNN_HAVE_CUDA

}  // namespace
