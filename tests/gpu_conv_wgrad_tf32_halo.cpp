// The TF32 halo weight gradient (kernels/conv/conv2d_wgmma_wgrad_tf32_halo.h) against
// conv2d_backward_weight_cpu. Skipped unless the device is compute capability 9.0 and the build
// has the sm_90a kernel. Cases:
//   Exact        small-integer inputs (exact in TF32, every partial sum exact in FP32): bit-equal
//                to the reference, accumulated into a nonzero dw; the first wrong (oc, c, tap) is
//                printed. ResNet's 3x3 layers at batch 2-3 (32x32, 16x16, 8x8: 2, 4 and 8 output
//                rows a k-tile), C and OC not multiples of 64 (16, 20, 70, 130), a ragged last
//                band, OW 24 and 56 (6 and 7 k steps), 5x5 and 7x7 (tap groups of 4-5, padding
//                3), padding 0.
//   Random       the same shapes on FP32 random inputs: TF32 drops 13 mantissa bits of each
//                operand (at most 2^-10 of it), so |got - ref| <= (2^-9 + 2 K 2^-24) sum_k |dy x|
//                + 4 ulp (|ref| + |dw0|), K = N*OH*OW; and the relative Frobenius error under
//                2^-9 (a dropped k-tile or split is about sqrt(rows OW / K) or more).
//   Splits       every split count (1, 2, 3, 7, 12, more than the k-tiles) gives the exact answer.
//   Small        one small call on one and on two splits: the case compute-sanitizer runs.
//   Refusals     one line each, and the call throws: BF16 and FP32 precision, deterministic mode,
//                stride 2, OW not a multiple of 8.
//   Dispatch     conv2d_backward_weight with Algo::WgmmaNhwc at tf32 runs this kernel (within the
//                bound), with db too; x off 16 bytes falls back to another kernel, as correct.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "runtime/error.h"
#include "runtime/exec.h"
#include "runtime/tensor.h"
#include "tests/conv_test_check.h"
#include "tests/test_util.h"
#ifdef CNN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/conv/conv2d_wgmma_wgrad_tf32_halo.h"
#include "kernels/conv/conv2d_wgrad_tf32_halo_layout.h"
#include "runtime/cuda_check.h"
#endif

using namespace cnn;

namespace {

#ifdef CNN_HAVE_CUDA

#define CNN_REQUIRE_WGRAD_TF32_HALO()                                                          \
  do {                                                                                         \
    CNN_REQUIRE_GPU();                                                                         \
    if (!conv2d_wgrad_tf32_halo_available())                                                   \
      GTEST_SKIP() << "the TF32 halo weight gradient needs a compute capability 9.0 GPU and an " \
                      "sm_90a build";                                                          \
  } while (0)

using conv_test::Fill;
using conv_test::make_values;
constexpr auto conv = test::square_conv;  // (n, c, h, w, oc, k, stride, pad)

Exec tf32_exec(bool deterministic = false, Precision precision = Precision::TF32) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = precision;
  ex.deterministic = deterministic;
  return ex;
}

// One problem: inputs, dw0, the reference dw0 + sum dy x and the sums of |dy x| and (dy x)^2.
struct Problem {
  Conv2dShape s;
  Fill fill;
  std::vector<float> x, dy, dw0, ref, abs, sq, db_ref, db_abs;
};

Problem make_problem(const Conv2dShape& s, Fill fill, uint64_t seed) {
  Problem p{s, fill, {}, {}, {}, {}, {}, {}, {}, {}};
  const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.oc * s.oh() * s.ow();
  const size_t nw = size_t(s.oc) * s.c * s.kh * s.kw;
  p.x = make_values(nx, fill, seed);
  p.dy = make_values(ny, fill, seed + 1);
  p.dw0 = make_values(nw, fill, seed + 2);
  p.ref = p.dw0;
  std::vector<float> db(size_t(s.oc)), ax(nx), ady(ny), sx(nx), sdy(ny);
  conv2d_backward_weight_cpu(s, p.x.data(), p.dy.data(), p.ref.data(), db.data());
  p.db_ref = db;
  for (size_t i = 0; i < nx; ++i) ax[i] = std::fabs(p.x[i]), sx[i] = p.x[i] * p.x[i];
  for (size_t i = 0; i < ny; ++i) ady[i] = std::fabs(p.dy[i]), sdy[i] = p.dy[i] * p.dy[i];
  p.abs.assign(nw, 0.f);
  p.sq.assign(nw, 0.f);
  p.db_abs.assign(size_t(s.oc), 0.f);
  conv2d_backward_weight_cpu(s, ax.data(), ady.data(), p.abs.data(), p.db_abs.data());
  conv2d_backward_weight_cpu(s, sx.data(), sdy.data(), p.sq.data(), db.data());
  return p;
}

std::string describe(const Conv2dShape& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "N=%d C=%d H=%d W=%d OC=%d k=%dx%d stride=%d pad=%d (OH*OW=%d)",
                s.n, s.c, s.h, s.w, s.oc, s.kh, s.kw, s.stride_h, s.pad_h, s.oh() * s.ow());
  return buf;
}

// The kernel itself (splits 0: its pick).
std::vector<float> run_kernel(const Problem& p, int splits = 0) {
  Tensor d_x = test::to_device(p.x), d_dy = test::to_device(p.dy), d_dw = test::to_device(p.dw0);
  EXPECT_TRUE(conv2d_backward_weight_tf32_halo(p.s, d_x.data(), d_dy.data(), d_dw.data(), nullptr,
                                               tf32_exec(), splits));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return d_dw.to_vector();
}

// Checks got against the reference: exact for integer inputs, else the bound of the file comment.
void check(const Problem& p, const std::vector<float>& got, const std::string& what) {
  const Conv2dShape& s = p.s;
  const double k = double(s.n) * s.oh() * s.ow();
  const double rel = std::ldexp(1.0, -9) + 2 * k * std::ldexp(1.0, -24);
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
  EXPECT_LE(frob, std::ldexp(1.0, -9)) << what;
  if (p.fill == Fill::SmallInt) {
    EXPECT_EQ(inexact, 0) << what << ": " << first;
  }
}

std::vector<Conv2dShape> shapes() {
  return {
      conv(2, 64, 32, 32, 64, 3, 1, 1),    // ResNet's 64-channel layers: 2 rows a k-tile
      conv(2, 128, 16, 16, 128, 3, 1, 1),  // 128-channel: 4 rows
      conv(3, 256, 8, 8, 256, 3, 1, 1),    // 256-channel: a whole image, 4 channel chunks
      conv(1, 16, 8, 8, 5, 3, 1, 1),       // one k-tile, OC = 5
      conv(3, 20, 13, 16, 70, 3, 1, 1),    // OH 13: a last band of 1 row; OC = 70
      conv(2, 70, 8, 8, 130, 3, 1, 1),     // C = 70 (two chunks), OC = 130 (three tiles)
      conv(2, 32, 24, 24, 48, 3, 1, 1),    // OW 24: 48 pixels, 6 k steps
      conv(1, 16, 6, 56, 16, 3, 1, 1),     // OW 56: one row, 7 k steps
      conv(1, 17, 12, 16, 96, 5, 1, 2),    // 5x5: 5 tap groups
      conv(2, 16, 11, 16, 24, 7, 1, 3),    // 7x7, padding 3: 49 taps
      conv(2, 24, 10, 12, 16, 5, 1, 0),    // padding 0: OW 8
  };
}

TEST(GpuConvWgradTf32Halo, Exact) {
  CNN_REQUIRE_WGRAD_TF32_HALO();
  for (const Conv2dShape& s : shapes()) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(s) + " seed " + std::to_string(seed));
    ASSERT_EQ(conv2d_wgrad_tf32_halo_refusal(s, tf32_exec()), "");
    const Problem p = make_problem(s, Fill::SmallInt, seed);
    check(p, run_kernel(p), "int");
  }
}

TEST(GpuConvWgradTf32Halo, Random) {
  CNN_REQUIRE_WGRAD_TF32_HALO();
  for (const Conv2dShape& s : shapes()) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(s) + " seed " + std::to_string(seed));
    const Problem p = make_problem(s, Fill::Random, seed);
    check(p, run_kernel(p), "random");
  }
}

TEST(GpuConvWgradTf32Halo, Splits) {
  CNN_REQUIRE_WGRAD_TF32_HALO();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Problem p = make_problem(conv(3, 64, 16, 16, 128, 3, 1, 1), Fill::SmallInt, seed);
  std::printf("picked splits %d\n", conv2d_wgrad_tf32_halo_splits(p.s));
  for (int splits : {1, 2, 3, 7, 12, 1000})  // 3 images x 4 bands: 12 k-tiles
    check(p, run_kernel(p, splits), "splits " + std::to_string(splits));
}

// One small call (2 images, one k-tile each) on one and on two splits: the case compute-sanitizer
// runs.
TEST(GpuConvWgradTf32Halo, Small) {
  CNN_REQUIRE_WGRAD_TF32_HALO();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Problem p = make_problem(conv(2, 20, 8, 8, 70, 3, 1, 1), Fill::SmallInt, seed);
  for (int splits : {1, 2}) check(p, run_kernel(p, splits), "small splits " + std::to_string(splits));
}

TEST(GpuConvWgradTf32Halo, Refusals) {
  CNN_REQUIRE_WGRAD_TF32_HALO();
  const Conv2dShape s = conv(1, 16, 8, 8, 8, 3, 1, 1);
  EXPECT_EQ(conv2d_wgrad_tf32_halo_refusal(s, tf32_exec()), "");
  struct Refused {
    Conv2dShape s;
    Exec ex;
    const char* word;
  };
  const Refused refused[] = {
      {s, tf32_exec(false, Precision::BF16), "precision"},
      {s, tf32_exec(false, Precision::FP32), "precision"},
      {s, tf32_exec(true), "deterministic"},
      {conv(1, 16, 16, 16, 8, 3, 2, 1), tf32_exec(), "stride"},
      {conv(1, 16, 14, 14, 8, 3, 1, 1), tf32_exec(), "OW"},
  };
  std::vector<float> x(size_t(16) * 16 * 16, 1.f), dy(8 * 256, 1.f), dw(8 * 16 * 9, 0.f);
  Tensor d_x = test::to_device(x), d_dy = test::to_device(dy), d_dw = test::to_device(dw);
  for (const Refused& r : refused) {
    const std::string why = conv2d_wgrad_tf32_halo_refusal(r.s, r.ex);
    std::printf("refused: %s\n", why.c_str());
    EXPECT_NE(why.find(r.word), std::string::npos) << why;
    EXPECT_EQ(why.find('\n'), std::string::npos) << why;
    EXPECT_THROW(conv2d_backward_weight_tf32_halo(r.s, d_x.data(), d_dy.data(), d_dw.data(),
                                                  nullptr, r.ex),
                 Error);
  }
}

TEST(GpuConvWgradTf32Halo, Dispatch) {
  CNN_REQUIRE_WGRAD_TF32_HALO();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Problem p = make_problem(conv(2, 64, 16, 16, 96, 3, 1, 1), Fill::Random, seed);
  const Exec ex = tf32_exec();
  const size_t floats = conv2d_backward_weight_scratch_floats(p.s, ex);
  Tensor scratch({int64_t(std::max<size_t>(floats, 1))}, Device::CUDA);
  for (bool with_db : {false, true}) {
    Tensor d_x = test::to_device(p.x), d_dy = test::to_device(p.dy);
    Tensor d_dw = test::to_device(p.dw0), d_db({int64_t(p.s.oc)}, Device::CUDA);
    CNN_CUDA_CHECK(cudaMemset(d_db.data(), 0, sizeof(float) * size_t(p.s.oc)));
    conv2d_backward_weight(p.s, d_x.data(), d_dy.data(), d_dw.data(),
                           with_db ? d_db.data() : nullptr, scratch.data(), Algo::WgmmaNhwc, ex);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    check(p, d_dw.to_vector(), with_db ? "api, db" : "api");
    if (!with_db) continue;
    // db: FP32 sums of the FP32 dy (2 N OH OW 2^-24 sum |dy| covers any order).
    const std::vector<float> db = d_db.to_vector();
    const double k = double(p.s.n) * p.s.oh() * p.s.ow();
    for (int o = 0; o < p.s.oc; ++o)
      EXPECT_LE(std::fabs(double(db[size_t(o)]) - p.db_ref[size_t(o)]),
                2 * k * std::ldexp(1.0, -24) * p.db_abs[size_t(o)] + 1e-30)
          << "db[" << o << "]: got " << db[size_t(o)] << ", expected " << p.db_ref[size_t(o)];
  }
  // x one float past a 16-byte boundary: the kernel declines it and the API runs another.
  std::vector<float> shifted(p.x.size() + 1, 0.f);
  std::copy(p.x.begin(), p.x.end(), shifted.begin() + 1);
  Tensor d_xs = test::to_device(shifted), d_dy = test::to_device(p.dy);
  Tensor d_dw = test::to_device(p.dw0);
  EXPECT_FALSE(conv2d_backward_weight_tf32_halo(p.s, d_xs.data() + 1, d_dy.data(), d_dw.data(),
                                                nullptr, ex));
  conv2d_backward_weight(p.s, d_xs.data() + 1, d_dy.data(), d_dw.data(), nullptr, scratch.data(),
                         Algo::WgmmaNhwc, ex);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  check(p, d_dw.to_vector(), "api, x off 16 bytes");
}

#endif  // CNN_HAVE_CUDA

}  // namespace
