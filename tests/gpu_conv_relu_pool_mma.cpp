// The tensor-core forward of the fused conv -> ReLU -> 2x2 max-pool (kernels/conv/
// conv_relu_pool_mma.cu; conv_relu_pool_forward runs it at Precision::TF32 and BF16 under
// CNN_CRP_TENSOR_CORES=1, compute capability 8.0 and later; called directly here) against the CPU
// twin conv_relu_pool_forward_cpu. The kernel rounds x and w (TF32: cvt.rna, nearest with ties away
// from zero; BF16: nearest even), never the bias, multiplies exactly (an 11- or 8-bit significand
// squared fits FP32) and sums in FP32 in the MMA's order. So the reference is the CPU twin on x and
// w rounded the same way on the host (round_tf32_cpu, round_to_bf16): only the summation order
// separates the two. The shapes are tests/gpu_conv_relu_pool.cpp's sweep (kernels 1/3/5/7: 1, 9,
// 25, 49 taps in whole k steps of 8 / 16, so most steps have dead taps; partial channel groups;
// several tiles across and down).
//   quantized data (x on a 1/4 grid, w on 1/8, b on 1/32): exact in TF32 and BF16 and every sum
//     exact in FP32, so y and argmax must equal the CPU bit for bit, ties and all-non-positive
//     windows (the first element wins) included;
//   continuous data: |y - y_ref| <= 1e-5 * scale per output, scale = the largest over the 2x2
//     window of |b| + sum |x_r| |w_r| (the conv on absolute values). An FP32 sum of at most 49
//     exact products and a bias is off by a few units of 2^-24 * scale per add, far under 1e-5,
//     while any wrong tap, channel or window is off by O(scale). An argmax may differ from the
//     CPU's only on a near-tie: inside the output's window, the CPU's value there within
//     2e-5 * scale (two values, each off by up to the tolerance) of y_ref, and, unless it is the
//     window's first element, not clearly negative (a later element wins only when positive);
//     more than 1% of the outputs on near-ties is a bug, not rounding.
// Outputs are poisoned (NaN, argmax -7) first. NaN and infinite inputs must come out as the CPU
// gives them: a tap past K*K (the padding of the last k step) must never multiply a window value
// by its zero weight, or inf * 0 would turn a window into NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/bf16_round.h"
#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_nhwc_layout.h"
#include "kernels/conv/conv_relu_pool.h"
#include "kernels/pool/maxpool.h"
#include "runtime/memory.h"
#include "tests/conv_relu_pool_test_data.h"
#include "tests/test_util.h"

#ifdef CNN_HAVE_CUDA
#include "kernels/conv/conv_relu_pool_cuda.h"
#endif

using namespace cnn;
using namespace cnn::crp_test;

namespace {

constexpr Precision kPrecisions[] = {Precision::TF32, Precision::BF16};
constexpr double kTol = 1e-5;  // of the scale: see the top of the file

// Whether this device runs the tensor-core kernel (the tests call it directly: the forward
// takes it only under CNN_CRP_TENSOR_CORES=1).
bool mma_supported() {
#ifdef CNN_HAVE_CUDA
  return conv_relu_pool_mma_supported();
#else
  return false;
#endif
}

#define CNN_REQUIRE_CRP_MMA()                                                           \
  do {                                                                                  \
    CNN_REQUIRE_GPU();                                                                  \
    if (!mma_supported())                                                               \
      GTEST_SKIP() << "the tensor-core conv-relu-pool needs compute capability >= 8.0"; \
  } while (0)

// x and w as the kernel rounds them before its MMAs (the bias stays FP32).
std::vector<float> rounded(std::vector<float> v, Precision p) {
  for (float& e : v) e = p == Precision::BF16 ? round_to_bf16(e) : round_tf32_cpu(e);
  return v;
}

Exec cuda_exec(Precision p) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = p;
  return ex;
}

size_t pooled_size(const Conv2dShape& s) {
  const MaxPoolShape ps = conv_relu_pool_pool_shape(s);
  return size_t(ps.n) * ps.c * ps.oh() * ps.ow();
}

struct Pooled {
  std::vector<float> y;     // (N, OC, OH/2, OW/2)
  std::vector<int32_t> am;  // (N, OC, OH/2, OW/2)
};

Pooled run_cpu(const Conv2dShape& s, const Data& d) {
  const size_t np = pooled_size(s);
  Pooled r{std::vector<float>(np), std::vector<int32_t>(np)};
  conv_relu_pool_forward_cpu(s, d.x.data(), d.w.data(), d.b.data(), r.y.data(), r.am.data());
  return r;
}

// The fused forward on the GPU, into poisoned outputs (upload_poisoned): the tensor-core kernel at
// TF32 / BF16, conv_relu_pool_forward (the FP32 kernel) at FP32.
Pooled run_gpu(const Conv2dShape& s, const Data& d, const Exec& ex) {
  const size_t np = pooled_size(s);
  DeviceForward f = upload_poisoned(d, np);
#ifdef CNN_HAVE_CUDA
  if (ex.precision != Precision::FP32)
    conv_relu_pool_forward_mma_cuda(s, f.x.data(), f.w.data(), f.b.data(), f.y.data(), f.am.data(),
                                    ex);
  else
#endif
    conv_relu_pool_forward(s, f.x.data(), f.w.data(), f.b.data(), f.y.data(), f.am.data(), ex);
  return {test::to_host(f.y.data(), np), ints_to_host(f.am.data(), np)};
}

// The conv value at (n, oc, oy, ox) before the ReLU, as the CPU twin computes it
// (conv2d_forward_cpu: the bias, then taps ky, kx ascending, padding skipped, in double, rounded
// to float once), so that relu(conv_at) at the CPU's own argmax equals y_ref bitwise.
float conv_at(const Conv2dShape& s, const Data& r, int n, int oc, int oy, int ox) {
  double acc = r.b.empty() ? 0.0 : double(r.b[oc]);
  for (int ky = 0; ky < s.kh; ++ky)
    for (int kx = 0; kx < s.kw; ++kx) {
      const int iy = oy - s.pad_h + ky, ix = ox - s.pad_w + kx;
      if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
      acc += double(r.x[(int64_t(n) * s.h + iy) * s.w + ix]) *
             double(r.w[(int64_t(oc) * s.kh + ky) * s.kw + kx]);
    }
  return float(acc);
}

// The twin's ReLU (std::max(v, 0) keeps NaN).
float relu(float v) {
  return std::isnan(v) || v > 0.f ? v : 0.f;
}

// Per output, the largest over its 2x2 window of |b| + sum |x_r| |w_r|: the pool of the conv of
// the absolute values (non-finite inputs counted as 0: the outputs they reach are compared
// exactly, and the others' scale must stay finite).
std::vector<float> window_scales(const Conv2dShape& s, const Data& r) {
  Data a = r;
  for (float& e : a.x) e = std::isfinite(e) ? std::fabs(e) : 0.f;
  for (float& e : a.w) e = std::fabs(e);
  for (float& e : a.b) e = std::fabs(e);
  return run_cpu(s, a).y;
}

// got against ref = the CPU twin on the rounded operands r. Non-finite reference outputs (an inf
// or NaN input in the window) must be matched exactly, value and argmax; finite ones within
// kTol * scale, the argmax equal or on a near-tie (see the top of the file).
void expect_matches_rounded(const Conv2dShape& s, const Data& r, const Pooled& got,
                            const Pooled& ref) {
  const size_t np = got.y.size();
  const std::vector<float> scale = window_scales(s, r);
  const int ow = s.ow(), ph = s.oh() / 2, pw = s.ow() / 2;
  size_t bad_y = 0, bad_am = 0, near_ties = 0;
  double worst = 0;               // the largest |y - y_ref| / scale among the finite outputs
  std::string first_y, first_am;  // the first failure of each kind, for the message
  auto note = [&](std::string& first, size_t o, const char* what) {
    if (!first.empty()) return;
    char buf[240];
    std::snprintf(buf, sizeof buf, "%s at output %zu: y %.9g ref %.9g scale %.4g argmax %d ref %d",
                  what, o, got.y[o], ref.y[o], scale[o], got.am[o], ref.am[o]);
    first = buf;
  };
  for (size_t o = 0; o < np; ++o) {
    if (!std::isfinite(ref.y[o])) {
      if (!same_value(got.y[o], ref.y[o])) {
        ++bad_y;
        note(first_y, o, "non-finite y");
      }
      if (got.am[o] != ref.am[o]) {
        ++bad_am;
        note(first_am, o, "non-finite window's argmax");
      }
      continue;
    }
    const double err = std::fabs(double(got.y[o]) - ref.y[o]);
    const double bound = kTol * scale[o];
    if (!(err <= bound)) {  // NaN fails too
      ++bad_y;
      note(first_y, o, "y");
    }
    if (err == err) worst = std::max(worst, err / std::max(double(scale[o]), 1e-30));
    if (got.am[o] == ref.am[o]) continue;
    const int64_t plane = o / (size_t(ph) * pw);  // n * OC + oc
    const int py = int(o / pw % ph), px = int(o % pw);
    const int a = got.am[o], oy = a / ow, ox = a % ow;
    const bool inside = a >= 0 && oy / 2 == py && ox / 2 == px;
    const float v = inside ? conv_at(s, r, int(plane / s.oc), int(plane % s.oc), oy, ox) : NAN;
    // A later element wins only by being strictly greater than the first one's ReLU'd value, so
    // it must be positive on the GPU: a GPU preferring it among clearly negative (all-zero)
    // windows breaks the tie wrongly, however equal the ReLU'd values are.
    const bool window_first = oy % 2 == 0 && ox % 2 == 0;
    if (inside && std::fabs(double(relu(v)) - ref.y[o]) <= 2 * bound &&
        (window_first || v >= -2 * bound)) {
      ++near_ties;
    } else {
      ++bad_am;
      note(first_am, o, "argmax");
    }
  }
  EXPECT_EQ(bad_y, 0u) << first_y << " (worst finite error " << worst << " of the scale)";
  EXPECT_EQ(bad_am, 0u) << first_am;
  // Random data puts two window values within 1e-5 of the scale about once in 1e4 windows; the
  // floor of one keeps a single honest near-tie in a tiny shape from failing.
  EXPECT_LE(near_ties, std::max<size_t>(1, np / 100)) << "near-ties: the argmax is wrong";
}

void check_quantized(const Conv2dShape& s, Precision p) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(describe(s) + " " + precision_name(p) + " quantized seed " + std::to_string(seed));
  ASSERT_TRUE(conv_relu_pool_applicable(s));
  const Data d = make_data(s, seed, true);
  // The premise of the bitwise comparison: the grids survive the operand rounding.
  ASSERT_TRUE(same_bits(rounded(d.x, p), d.x));
  ASSERT_TRUE(same_bits(rounded(d.w, p), d.w));
  const Pooled ref = run_cpu(s, d), got = run_gpu(s, d, cuda_exec(p));
  EXPECT_TRUE(same_bits(got.y, ref.y)) << "exact data: y must equal the CPU";
  EXPECT_EQ(got.am, ref.am) << "exact data: argmax (ties, non-positive windows) must equal the CPU";
}

void check_continuous(const Conv2dShape& s, Precision p) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(describe(s) + " " + precision_name(p) + " continuous seed " + std::to_string(seed));
  ASSERT_TRUE(conv_relu_pool_applicable(s));
  const Data d = make_data(s, seed, false);
  const Data r{rounded(d.x, p), rounded(d.w, p), d.b, {}, {}, {}};
  const Pooled got = run_gpu(s, d, cuda_exec(p));  // the kernel rounds d itself
  expect_matches_rounded(s, r, got, run_cpu(s, r));
}

}  // namespace

TEST(GpuConvReluPoolMma, QuantizedMatchesCpuExactly) {
  CNN_REQUIRE_CRP_MMA();
  for (Precision p : kPrecisions)
    for (const Conv2dShape& s : sweep()) check_quantized(s, p);
}

TEST(GpuConvReluPoolMma, ContinuousMatchesRoundedCpu) {
  CNN_REQUIRE_CRP_MMA();
  for (Precision p : kPrecisions)
    for (const Conv2dShape& s : sweep()) check_continuous(s, p);
}

TEST(GpuConvReluPoolMma, NetworkConv1Batch128) {
  CNN_REQUIRE_CRP_MMA();
  const Conv2dShape s = shape(test::network_batch(), 32, 28, 28, 5, 2);
  for (Precision p : kPrecisions) {
    check_continuous(s, p);
    check_quantized(s, p);
  }
}

// All-negative pre-activations (bias -100): every window is ReLU'd to four zeros and the first
// element must win. A NaN input: the windows it reaches give NaN, the first NaN wins. Then an
// infinite input per image (+inf, -inf, +inf at a corner next to the padding), for every kernel
// size: its windows are +inf or ReLU'd -inf exactly as on the CPU; a dead tap that multiplied
// the window by its zero weight would make them NaN.
TEST(GpuConvReluPoolMma, NonPositiveWindowsAndNaN) {
  CNN_REQUIRE_CRP_MMA();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (Precision p : kPrecisions) {
    SCOPED_TRACE(precision_name(p));
    const Conv2dShape s = shape(3, 5, 6, 10, 3, 1);
    Data d = make_data(s, seed, false);
    for (auto& b : d.b) b = -100.f;
    d.x[7] = NAN;
    const Data r{rounded(d.x, p), rounded(d.w, p), d.b, {}, {}, {}};
    const Pooled ref = run_cpu(s, r), got = run_gpu(s, d, cuda_exec(p));
    EXPECT_TRUE(same_values(got.y, ref.y));
    EXPECT_EQ(got.am, ref.am);
    const int ph = s.oh() / 2, pw = s.ow() / 2;
    size_t nan_windows = 0, first_wins = 0;
    for (size_t o = 0; o < got.y.size(); ++o) {
      nan_windows += std::isnan(got.y[o]);
      const int py = int(o / pw % ph), px = int(o % pw);
      first_wins += got.y[o] == 0.f && got.am[o] == 2 * py * s.ow() + 2 * px;
    }
    EXPECT_GT(nan_windows, 0u);
    EXPECT_EQ(nan_windows + first_wins, got.y.size()) << "a non-positive window's first wins";
  }
  for (Precision p : kPrecisions)
    for (int k : {1, 3, 5, 7}) {
      const Conv2dShape s = shape(3, 5, 6, 10, k, k / 2);
      SCOPED_TRACE(describe(s) + " " + precision_name(p) + " infinite inputs");
      Data d = make_data(s, seed + 10 * k, false);
      const int hw = s.h * s.w;
      d.x[2 * s.w + 3] = INFINITY;        // image 0, inside
      d.x[hw + 3 * s.w + 6] = -INFINITY;  // image 1, inside
      d.x[2 * hw + hw - 1] = INFINITY;    // image 2, the bottom-right corner
      const Data r{rounded(d.x, p), rounded(d.w, p), d.b, {}, {}, {}};
      const Pooled ref = run_cpu(s, r), got = run_gpu(s, d, cuda_exec(p));
      size_t infinite = 0;
      for (float v : ref.y) infinite += std::isinf(v);
      EXPECT_GT(infinite, 0u) << "no window came out infinite: the case tests nothing";
      expect_matches_rounded(s, r, got, ref);
    }
}

// At Precision::FP32 conv_relu_pool_forward must keep the FP32 kernel: within 1e-5 of the CPU
// (TF32 or BF16 operand rounding alone would be off by ~1e-3) and bitwise equal to the unfused
// FP32 chain (the same summation order).
TEST(GpuConvReluPoolMma, UnfusedChainAgreesAtFp32) {
  CNN_REQUIRE_GPU();
  for (const Conv2dShape& s : {shape(3, 5, 28, 28, 5, 2), shape(3, 33, 16, 70, 7, 3)}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(s) + " fp32 seed " + std::to_string(seed));
    const Data d = make_data(s, seed, false);
    const Exec ex = cuda_exec(Precision::FP32);
    const Pooled ref = run_cpu(s, d), got = run_gpu(s, d, ex);
    EXPECT_LE(rel_to_max(got.y, ref.y), 1e-5);

    const MaxPoolShape ps = conv_relu_pool_pool_shape(s);
    const size_t np = pooled_size(s), nc = size_t(s.n) * s.oc * s.oh() * s.ow();
    Tensor d_x = test::to_device(d.x), d_w = test::to_device(d.w), d_b = test::to_device(d.b);
    Buffer<float> d_conv(nc, Device::CUDA), d_y(np, Device::CUDA);
    Buffer<int32_t> d_am(np, Device::CUDA);
    conv2d_forward(s, d_x.data(), d_w.data(), d_b.data(), d_conv.data(), true, nullptr, Algo::Auto,
                   ex);
    maxpool_forward(ps, d_conv.data(), d_y.data(), d_am.data(), ex);
    EXPECT_TRUE(same_bits(got.y, test::to_host(d_y.data(), np))) << "vs the unfused chain";
    EXPECT_EQ(got.am, ints_to_host(d_am.data(), np)) << "argmax vs the unfused chain";
  }
}

// ---- Weight gradient ----
// conv_relu_pool_backward_weight_mma_cuda (dw += x (*) dconv, db += sum dconv, dconv = the pool's
// backward under the ReLU mask y > 0, never formed) against the CPU twin
// conv_relu_pool_backward_weight_cpu. y and argmax come from the CPU twin's forward on the
// unrounded x, w, b and are uploaded: the kernel only reads them, and the same y and argmax on
// both sides mask and place dy identically (a GPU forward could break a near-tie the other way).
// The kernel rounds x and dconv for the precision (TF32 cvt.rna, BF16 nearest even), multiplies
// exactly (two 11- or 8-bit significands fit FP32) and sums in FP32; db is the sum of the ROUNDED
// dconv (a column of ones in the MMA). Rounding dy and then masking gives the same dconv as
// masking and then rounding (0 rounds to 0), so the reference is the twin on x and dy rounded on
// the host. Both modes: atomic (two runs, each checked) and deterministic (scratch poisoned with
// NaN before each run, two runs bitwise equal). dw and db start at dw0 / db0 (accumulation).
//   quantized data (x on 1/4, dy on 1/16 with |i| <= 16, dw0 / db0 on 1/64): unchanged by either
//     rounding, every product and partial sum a multiple of 2^-6 of at most len + 1 in magnitude
//     (len terms of at most 1 each and dw0; len <= 2^17 asserted: 24 bits), so every sum is exact
//     in FP32 in any order, truncated or not: dw and db must equal the CPU bit for bit;
//   continuous data: per gradient, with S = the same backward on |x_r|, |dy_r| and |dw0| (the
//     size of its terms, so that a gradient whose terms cancel is judged against them) and
//     len = N * PH * PW (at most one non-zero dconv a pooled output, so at most len non-zero
//     products),
//       |got - ref| <= 4 (len + 2) 2^-23 S + 4 ulp (|ref| + |dw0|).
//     The products are exact, so only the sums err. Round-to-nearest FP32 adds would give at
//     most len 2^-24 S (len + 1 terms, dw0 included, in any order). But inside one MMA the
//     tensor core aligns its addends to the largest exponent and may truncate them and the
//     normalized result instead of rounding (as tests/gpu_gemm_wgmma.cpp and conv_test_check.h
//     assume, whose TF32 bound is 2 (2^-9 + K 2^-23) S): up to one ulp, 2^-23 of a partial sum
//     <= S, for a product, the accumulator it joins and the MMA's result, so at most 3 len 2^-23 S
//     over the MMAs that carry a non-zero product (the others add exact zeros); the FP32 merges
//     after them (warps, blocks by atomicAdd or the reduce kernel, dw0) round to nearest, at most
//     (len + 1) 2^-24 S. 4 (len + 2) 2^-23 S covers both with room; the 4 ulp cover the CPU's own
//     rounding (it sums in double and rounds once). That worst case grows with len and could let
//     a dropped tile through on large shapes (a tile is 56 of the 50372 pooled outputs of the
//     N = 257, 28x28 shapes), so in addition, as tests/gpu_gemm_wgmma_bf16.cpp does,
//       ||got - ref|| <= 1e-4 sqrt(sum (dconv_r x_r)^2 + dw0^2) over all of dw and db:
//     the kernel's sums (at most 16 MMAs a warp's chain in these shapes, then the merges) err by
//     ~1e-6 of that, a dropped tile by about sqrt(56 / len) (3.3e-2 there), a TF32 kernel that
//     truncated x or dconv instead of rounding by ~3e-4, a BF16 one that kept TF32 by ~1e-3.
namespace {

constexpr double kWgradFrobenius = 1e-4;

// Terms per gradient: one pooled output of each image and window feeds each dw and db element.
int64_t wgrad_len(const Conv2dShape& s) {
  return int64_t(s.n) * (s.oh() / 2) * (s.ow() / 2);
}

Exec wgrad_exec(Precision p, bool deterministic) {
  Exec ex = cuda_exec(p);
  ex.deterministic = deterministic;
  return ex;
}

std::vector<float> absolute(std::vector<float> v) {
  for (float& e : v) e = std::fabs(e);
  return v;
}
std::vector<float> squared(std::vector<float> v) {
  for (float& e : v) e *= e;
  return v;
}

// dw then db, one vector: the checks below treat them alike.
std::vector<float> joined(std::vector<float> dw, const std::vector<float>& db) {
  dw.insert(dw.end(), db.begin(), db.end());
  return dw;
}

// The CPU twin's gradients from (dw0, db0) on x and dy, masked and placed by the forward's y and
// argmax; returned joined.
std::vector<float> cpu_wgrad(const Conv2dShape& s, const std::vector<float>& x, const Pooled& fwd,
                             const std::vector<float>& dy, std::vector<float> dw0,
                             std::vector<float> db0) {
  conv_relu_pool_backward_weight_cpu(s, x.data(), fwd.y.data(), dy.data(), fwd.am.data(),
                                     dw0.data(), db0.data());
  return joined(std::move(dw0), db0);
}

// The tensor-core weight gradient from (dw0, db0) on the unrounded x and dy (the kernel rounds
// them itself) and the uploaded y and argmax; the deterministic scratch poisoned (NaN) first, so
// that a partial the first stage never writes cannot pass. Returned joined.
std::vector<float> gpu_wgrad(const Conv2dShape& s, const Data& d, const Pooled& fwd,
                             const Exec& ex) {
  const size_t np = pooled_size(s);
  Tensor d_x = test::to_device(d.x), d_y = test::to_device(fwd.y);
  Tensor d_dy = test::to_device(d.dy);
  Buffer<int32_t> d_am(np, Device::CUDA);
  d_am.copy_from(fwd.am.data(), Device::CPU, np);
  Tensor d_dw = test::to_device(d.dw0), d_db = test::to_device(d.db0);
#ifdef CNN_HAVE_CUDA
  const size_t scratch_n = conv_relu_pool_backward_weight_mma_scratch_floats(s, ex);
  EXPECT_EQ(scratch_n != 0, ex.deterministic) << "scratch: needed exactly when deterministic";
  Buffer<float> d_scratch(std::max<size_t>(scratch_n, 1), Device::CUDA);
  if (scratch_n) test::poison_device(d_scratch.data(), scratch_n);
  conv_relu_pool_backward_weight_mma_cuda(s, d_x.data(), d_y.data(), d_dy.data(), d_am.data(),
                                          d_dw.data(), d_db.data(), d_scratch.data(), ex);
#else
  (void)ex;
  ADD_FAILURE() << "no CUDA in this build";  // unreachable: CNN_REQUIRE_CRP_MMA skips first
#endif
  return joined(test::to_host(d_dw.data(), d.dw0.size()), test::to_host(d_db.data(), d.db0.size()));
}

// The first element where got and ref differ in bits, for the failure message.
std::string first_difference(const std::vector<float>& got, const std::vector<float>& ref,
                             size_t n_dw) {
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    if (std::memcmp(&got[i], &ref[i], sizeof(float)) == 0) continue;
    char buf[160];
    std::snprintf(buf, sizeof buf, "first difference at %s[%zu]: got %.9g, ref %.9g",
                  i < n_dw ? "dw" : "db", i < n_dw ? i : i - n_dw, got[i], ref[i]);
    return buf;
  }
  return got.size() == ref.size() ? "no difference" : "sizes differ";
}

// got against ref (the twin on the rounded operands) within the bounds at the top of this
// section: per element rel * S + 4 ulp (|ref| + |dw0|) with S = scale (the twin on absolute
// values, dw0 included), and in norm kWgradFrobenius of sqrt(sum of sq (the twin on squared
// operands from zero) + |init|^2). init: dw0 and db0 joined.
void expect_wgrad_close(const std::vector<float>& got, const std::vector<float>& ref,
                        const std::vector<float>& scale, const std::vector<float>& sq,
                        const std::vector<float>& init, int64_t len, size_t n_dw) {
  ASSERT_EQ(got.size(), ref.size());
  const double rel = 4.0 * double(len + 2) * std::ldexp(1.0, -23);
  const double ulp4 = 4 * std::ldexp(1.0, -24);
  size_t bad = 0;
  std::string first;
  double worst = 0, diff2 = 0, scale2 = 0;  // worst: the largest |got - ref| / S
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double(got[i]) - ref[i]);
    const double bound = rel * scale[i] + ulp4 * (std::fabs(double(ref[i])) + std::fabs(init[i]));
    if (!(e <= bound + 1e-30)) {  // NaN fails too
      if (bad++ == 0) {
        char buf[200];
        std::snprintf(buf, sizeof buf, "%s[%zu]: got %.9g, ref %.9g, scale %.4g",
                      i < n_dw ? "dw" : "db", i < n_dw ? i : i - n_dw, got[i], ref[i], scale[i]);
        first = buf;
      }
    }
    if (e == e) worst = std::max(worst, e / std::max(double(scale[i]), 1e-30));
    diff2 += std::isnan(e) ? INFINITY : e * e;
    scale2 += double(sq[i]) + double(init[i]) * init[i];
  }
  const double frob = std::sqrt(diff2 / std::max(scale2, 1e-300));
  EXPECT_EQ(bad, 0u) << "over the per-element bound (" << rel << " of the scale), first " << first
                     << "; worst " << worst << " of the scale";
  EXPECT_LE(frob, kWgradFrobenius)
      << "relative Frobenius error; " << first_difference(got, ref, n_dw);
}

void check_wgrad_quantized(const Conv2dShape& s, Precision p) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(describe(s) + " " + precision_name(p) + " wgrad quantized seed " +
               std::to_string(seed));
  ASSERT_TRUE(conv_relu_pool_applicable(s));
  // The premise of the bitwise comparison: len terms of at most 1 on a 2^-6 grid (and dw0 / db0)
  // stay within FP32's 24 bits.
  ASSERT_LE(wgrad_len(s), int64_t{1} << 17);
  const Data d = make_data(s, seed, true);
  ASSERT_TRUE(same_bits(rounded(d.x, p), d.x));
  ASSERT_TRUE(same_bits(rounded(d.dy, p), d.dy));
  const Pooled fwd = run_cpu(s, d);
  const std::vector<float> ref = cpu_wgrad(s, d.x, fwd, d.dy, d.dw0, d.db0);
  const size_t n_dw = d.dw0.size();
  for (bool det : {false, true}) {
    SCOPED_TRACE(det ? "deterministic" : "atomic");
    for (int rep = 0; rep < 2; ++rep) {  // a second run catches state left by the first
      const std::vector<float> got = gpu_wgrad(s, d, fwd, wgrad_exec(p, det));
      EXPECT_TRUE(same_bits(got, ref))
          << "exact data: dw and db must equal the CPU; " << first_difference(got, ref, n_dw);
    }
  }
}

void check_wgrad_continuous(const Conv2dShape& s, Precision p) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(describe(s) + " " + precision_name(p) + " wgrad continuous seed " +
               std::to_string(seed));
  ASSERT_TRUE(conv_relu_pool_applicable(s));
  const Data d = make_data(s, seed, false);
  const Pooled fwd = run_cpu(s, d);
  const std::vector<float> xr = rounded(d.x, p), dyr = rounded(d.dy, p);
  const std::vector<float> ref = cpu_wgrad(s, xr, fwd, dyr, d.dw0, d.db0);
  const std::vector<float> scale =
      cpu_wgrad(s, absolute(xr), fwd, absolute(dyr), absolute(d.dw0), absolute(d.db0));
  const std::vector<float> sq =
      cpu_wgrad(s, squared(xr), fwd, squared(dyr), std::vector<float>(d.dw0.size(), 0.f),
                std::vector<float>(d.db0.size(), 0.f));
  const std::vector<float> init = joined(d.dw0, d.db0);
  const int64_t len = wgrad_len(s);
  const size_t n_dw = d.dw0.size();
  for (bool det : {false, true}) {
    SCOPED_TRACE(det ? "deterministic" : "atomic");
    std::vector<std::vector<float>> runs;
    for (int rep = 0; rep < 2; ++rep) {
      runs.push_back(gpu_wgrad(s, d, fwd, wgrad_exec(p, det)));
      expect_wgrad_close(runs.back(), ref, scale, sq, init, len, n_dw);
    }
    if (det) {
      EXPECT_TRUE(same_bits(runs[0], runs[1]))
          << "deterministic mode is not repeatable; " << first_difference(runs[1], runs[0], n_dw);
    }
  }
}

}  // namespace

TEST(GpuConvReluPoolMma, WgradQuantizedMatchesCpuExactly) {
  CNN_REQUIRE_CRP_MMA();
  for (Precision p : kPrecisions)
    for (const Conv2dShape& s : sweep()) check_wgrad_quantized(s, p);
}

TEST(GpuConvReluPoolMma, WgradContinuousMatchesRoundedCpu) {
  CNN_REQUIRE_CRP_MMA();
  for (Precision p : kPrecisions)
    for (const Conv2dShape& s : sweep()) check_wgrad_continuous(s, p);
}

TEST(GpuConvReluPoolMma, WgradNetworkConv1Batch128) {
  CNN_REQUIRE_CRP_MMA();
  const Conv2dShape s = shape(test::network_batch(), 32, 28, 28, 5, 2);
  for (Precision p : kPrecisions) {
    check_wgrad_continuous(s, p);
    check_wgrad_quantized(s, p);
  }
}
