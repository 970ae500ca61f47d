// The BF16 instance of the Hopper TMA-im2col convolution (kernels/conv/conv2d_wgmma_nhwc.h with
// WgmmaNhwcOptions::precision = BF16) against the CPU twins. Skipped unless the device is
// compute capability 9.0 and the build has the sm_90a kernels:
//   PrePasses            the NCHW -> NHWC copy (channels padded to 64; the TF32 test's cases,
//                        nhwc_copy_cases) and the weight packing (forward and flipped
//                        input-gradient order), rounded to BF16, bitwise equal to their CPU
//                        twins (conv2d_nhwc_layout.h), outputs poisoned first.
//   ForwardShapes        C in {1, 3, 17, 64, 70, 130}, OC in {8, 24, 64, 200}, H, W in {7, 13,
//                        32, 33}, batch 1 and 3, stride 1 and 2, kernels 1x1 .. 7x7 (and 3x5),
//                        padding 0 .. 3, with and without bias / ReLU; the three tile widths
//                        (32 also at two and three blocks an SM, 64 at two) and the 256 x 128
//                        tile (wgmma_nhwc_tiles.h), and where the shape is stride 1 the
//                        halo tile at each width (LeNet's conv2 among them); small
//                        integers first (exact in BF16: a mismatch is an addressing error), then
//                        random values.
//   BackwardDataShapes   the input gradient on the same kinds of shapes, negative effective
//                        padding (padding > kernel - 1) included; strided ones as their phases.
//   SplitsAndRepeat      K split 1, 2, 4, 8 across a cluster (every tile width, each residency
//                        under some split, the 256-row tile): each correct, each run twice
//                        bitwise equal.
//   Scratch              the BF16 scratch is never larger than the TF32 one; a (poisoned)
//                        scratch of exactly the BF16 size gives the bits of a TF32-sized one.
//   Dispatch             Algo::WgmmaNhwc through conv2d_forward / conv2d_backward_data at
//                        precision bf16 gives the direct BF16 call's bits (and not the TF32
//                        ones); the weight gradient under wgmma-nhwc and wgmma at bf16 runs
//                        the TF32 kernel (its bits at tf32, not the BF16 implicit GEMM's), and
//                        autotune times wgmma-nhwc for the forward and both for the weight
//                        gradient.
// Tolerance: gpu_bf16.cpp's scheme. With S = sum over k of |a b| (the twin on |a|, |b|):
//   |got - emu| <= (k + 8) 2^-23 S_emu + 2^-23 |ref|   (emu: the double twin on operands rounded
//                                                       with round_to_bf16, products exact),
//   |got - ref| <= (2^-7 (1 + 2^-9) + (k + 8) 2^-23 (1 + 2^-7)) S + 2^-23 |ref|,
//   ||got - ref|| <= 2^-7 ||ref||.
// Bias and ReLU are applied to both twins in double after the sum, as the epilogue applies them
// in FP32 (one more rounding, in the 2^-23 |ref| term; ReLU is 1-Lipschitz).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/bf16_round.h"
#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_nhwc_layout.h"
#include "layers/autotune.h"
#include "runtime/error.h"
#include "runtime/exec.h"
#include "runtime/tensor.h"
#include "tests/conv_test_cases.h"
#include "tests/conv_test_check.h"
#include "tests/test_util.h"
#include "tests/wgmma_nhwc_tiles.h"
#include "tests/wgmma_test_require.h"
#ifdef CNN_HAVE_CUDA
#include "kernels/conv/conv2d_nhwc_prepass.h"
#include "kernels/conv/conv2d_wgmma_nhwc.h"
#endif

using namespace cnn;

namespace {

#ifdef CNN_HAVE_CUDA

constexpr double kUnit = 1.0 / (1 << 23);  // 2^-23: FP32 summation, per term
constexpr double kProd = 1.0 / (1 << 7);   // 2^-7: BF16 rounding of a product's two operands

using namespace conv_test;  // Fill, Pass, ConvCase, conv, make_operands, bitwise_equal, ...

std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}
std::vector<double> abs_of(std::vector<double> v) {
  for (double& x : v) x = std::fabs(x);
  return v;
}

// One case's inputs and its twins (see the file comment).
struct Problem {
  Pass pass;
  ConvCase cc;
  Fill fill;
  std::vector<float> in, w, b;  // in: x (forward) or dy (input gradient)
  std::vector<double> ref, ref_abs, emu, emu_abs;
  int64_t k = 0;  // GEMM depth
  std::string what;
};

// The pass in double on (a, w): the forward without bias / ReLU, or the input gradient.
std::vector<double> twin(Pass pass, const Conv2dShape& s, const std::vector<double>& a,
                         const std::vector<double>& w) {
  const bool fwd = pass == Pass::Forward;
  std::vector<double> out(fwd ? size_t(s.n) * s.oc * s.oh() * s.ow()
                              : size_t(s.n) * s.c * s.h * s.w);
  if (fwd)
    conv2d_forward_cpu(s, a.data(), w.data(), nullptr, out.data(), false);
  else
    conv2d_backward_data_cpu(s, a.data(), w.data(), out.data());
  return out;
}

Problem make_problem(Pass pass, const ConvCase& cc, Fill fill, uint64_t seed) {
  const Conv2dShape& s = cc.s;
  Problem p{pass, cc, fill, {}, {}, {}, {}, {}, {}, {}, 0, {}};
  ConvOperands ops = make_operands(pass, s, fill, seed);
  p.in = std::move(ops.in);
  p.w = std::move(ops.w);
  p.b = std::move(ops.b);
  const bool fwd = pass == Pass::Forward;
  const auto a = to_double(p.in), w = to_double(p.w);
  const auto ae = to_double(round_to_bf16(p.in)), we = to_double(round_to_bf16(p.w));
  p.ref = twin(pass, s, a, w);
  p.ref_abs = twin(pass, s, abs_of(a), abs_of(w));
  p.emu = twin(pass, s, ae, we);
  p.emu_abs = twin(pass, s, abs_of(ae), abs_of(we));
  if (fwd && (cc.bias || cc.relu)) {
    const int64_t pix = int64_t(s.oh()) * s.ow();
    for (size_t i = 0; i < p.ref.size(); ++i) {
      const double bias = cc.bias ? p.b[(i / pix) % s.oc] : 0.0;
      for (std::vector<double>* v : {&p.ref, &p.emu}) {
        double& y = (*v)[i];
        y += bias;
        if (cc.relu && y <= 0) y = 0;
      }
    }
  }
  p.k = gemm_depth(pass, s);
  p.what = "bf16 " + describe_problem(pass, cc, fill, seed);
  return p;
}

WgmmaNhwcOptions bf16_options(int block_n = 0, int splits = 0) {
  WgmmaNhwcOptions o;
  o.block_n = block_n;
  o.splits = splits;
  o.precision = Precision::BF16;
  return o;
}

Exec cuda_exec(Precision precision) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = precision;
  return ex;
}

enum class Via { Direct, DirectTf32Scratch, Dispatch };

// Runs the problem on the GPU (output and scratch poisoned with NaN first): the direct call with
// `opt` and a scratch of the size for opt.precision (or of the larger TF32 size), or
// conv2d_forward / conv2d_backward_data with Algo::WgmmaNhwc at `opt.precision` and a scratch of
// conv2d_*_scratch_floats.
std::vector<float> run_gpu(const Problem& p, const WgmmaNhwcOptions& opt, Via via = Via::Direct) {
  const Conv2dShape& s = p.cc.s;
  Tensor d_in = test::to_device(p.in), d_w = test::to_device(p.w), d_b = test::to_device(p.b);
  Tensor d_out = test::to_device(std::vector<float>(p.ref.size(), NAN));
  const bool fwd = p.pass == Pass::Forward;
  const float* bias = fwd && p.cc.bias ? d_b.data() : nullptr;
  if (via == Via::Dispatch) {
    const Exec ex = cuda_exec(opt.precision);
    const size_t nscratch = fwd ? conv2d_forward_scratch_floats(s, Algo::WgmmaNhwc, ex)
                                : conv2d_backward_data_scratch_floats(s, Algo::WgmmaNhwc, ex);
    Tensor d_scratch = test::to_device(std::vector<float>(nscratch, NAN));
    if (fwd)
      conv2d_forward(s, d_in.data(), d_w.data(), bias, d_out.data(), p.cc.relu, d_scratch.data(),
                     Algo::WgmmaNhwc, ex);
    else
      conv2d_backward_data(s, d_in.data(), d_w.data(), d_out.data(), d_scratch.data(),
                           Algo::WgmmaNhwc, ex);
  } else {
    const Precision sized = via == Via::DirectTf32Scratch ? Precision::TF32 : opt.precision;
    const size_t nscratch = fwd ? conv2d_forward_wgmma_nhwc_scratch_floats(s, sized)
                                : conv2d_backward_data_wgmma_nhwc_scratch_floats(s, sized);
    Tensor d_scratch = test::to_device(std::vector<float>(nscratch, NAN));
    float* scratch = d_scratch.data();
    if (fwd)
      conv2d_forward_wgmma_nhwc(s, d_in.data(), d_w.data(), bias, d_out.data(), p.cc.relu, scratch,
                                nullptr, opt);
    else
      conv2d_backward_data_wgmma_nhwc(s, d_in.data(), d_w.data(), d_out.data(), scratch, nullptr,
                                      opt);
  }
  return d_out.to_vector();
}

// Checks got against both twins (see the file comment); prints one summary line.
void expect_close(const Problem& p, const std::vector<float>& got, const std::string& how) {
  SCOPED_TRACE(p.what + " " + how);
  ASSERT_EQ(got.size(), p.ref.size());
  const double adds = double(p.k + 8) * kUnit;
  int64_t bad_emu = 0, bad_ref = 0, inexact = 0;
  double worst_emu = 0, worst_ref = 0, num = 0, den = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i];
    const double tiny = 1e-30 + kUnit * std::fabs(p.ref[i]);
    const double e_emu = std::fabs(g - p.emu[i]), b_emu = adds * p.emu_abs[i] + tiny;
    const double e_ref = std::fabs(g - p.ref[i]);
    const double b_ref = (kProd * (1 + 1.0 / 512) + adds * (1 + kProd)) * p.ref_abs[i] + tiny;
    if (!(e_emu <= b_emu) || !(e_ref <= b_ref)) {
      if (!(e_emu <= b_emu)) ++bad_emu;
      if (!(e_ref <= b_ref)) ++bad_ref;
      if (first.empty()) {
        char where[200];
        std::snprintf(where, sizeof where,
                      "out[%zu]: got %.9g, BF16-operand twin %.9g (bound %.3g), FP32 twin %.9g "
                      "(bound %.3g)",
                      i, g, p.emu[i], b_emu, p.ref[i], b_ref);
        first = where;
      }
    }
    if (!(g == p.ref[i])) ++inexact;
    worst_emu = std::max(worst_emu, std::isnan(g) ? INFINITY : e_emu / b_emu);
    worst_ref = std::max(worst_ref, std::isnan(g) ? INFINITY : e_ref / b_ref);
    num += std::isnan(g) ? INFINITY : e_ref * e_ref;
    den += p.ref[i] * p.ref[i];
  }
  const double frob = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  std::printf("%s %s: worst bound ratio %.3g (bf16 twin) %.3g (fp32 twin), rel %.3g%s%s\n",
              p.what.c_str(), how.c_str(), worst_emu, worst_ref, frob, first.empty() ? "" : ", ",
              first.c_str());
  EXPECT_EQ(bad_emu, 0) << "elements over the BF16-operand bound; " << first;
  EXPECT_EQ(bad_ref, 0) << "elements over the FP32 bound; " << first;
  EXPECT_LE(frob, kProd) << "relative Frobenius error";
  if (p.fill == Fill::SmallInt) {
    EXPECT_EQ(inexact, 0) << "small-integer inputs are exact in BF16; " << first;
  }
}

// The TF32 test's shapes (conv_test_cases.h; at BF16 a chunk is 64 channels, so C = 3 leaves 61
// zero channels and 64 is one chunk exactly), and in the forward one more: 70 channels, two
// chunks with 58 zero channels.
const std::vector<ConvCase>& forward_cases() {
  static const std::vector<ConvCase> c = [] {
    std::vector<ConvCase> v = nhwc_forward_cases();
    v.push_back({conv(3, 70, 13, 13, 24, 3, 3, 1, 1, 1, 1), true, true});
    return v;
  }();
  return c;
}

const std::vector<ConvCase>& backward_data_cases() {
  return nhwc_backward_data_cases();
}

// n bf16 values (as bit patterns) on the device, all 0xffff (a NaN) first.
Tensor poisoned_bf16(size_t n) {
  std::vector<float> v((n + 1) / 2);
  const uint32_t nan2 = 0xffffffffu;
  for (float& x : v) std::memcpy(&x, &nan2, 4);
  return test::to_device(v);
}
std::vector<uint16_t> download_bf16(const Tensor& t, size_t n) {
  const std::vector<float> v = t.to_vector();
  std::vector<uint16_t> out(n);
  std::memcpy(out.data(), v.data(), n * 2);
  return out;
}

#endif  // CNN_HAVE_CUDA

}  // namespace

TEST(GpuConvWgmmaNhwcBf16, PrePasses) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  for (const NhwcCopyCase& k : nhwc_copy_cases()) {
    const int c_pad = (k.c + 63) / 64 * 64 + 64 * k.extra_blocks;
    const std::vector<float> x = test::random_vector(size_t(k.n) * k.c * k.hw, test::fresh_seed());
    std::vector<uint16_t> want(size_t(k.n) * k.hw * c_pad);
    nchw_to_nhwc_bf16_cpu(x.data(), k.n, k.c, k.hw, c_pad, want.data());
    std::vector<float> shifted(size_t(k.x_offset), 0.f);
    shifted.insert(shifted.end(), x.begin(), x.end());
    Tensor d_x = test::to_device(shifted), d_out = poisoned_bf16(want.size());
    nchw_to_nhwc_bf16_cuda(d_x.data() + k.x_offset, k.n, k.c, k.hw, c_pad,
                           reinterpret_cast<uint16_t*>(d_out.data()), nullptr);
    EXPECT_TRUE(download_bf16(d_out, want.size()) == want)
        << "nchw_to_nhwc_bf16 " << describe(k) << " c_pad=" << c_pad;
  }
  for (const Conv2dShape& s :
       {conv(1, 3, 7, 7, 24, 3, 3, 1, 1, 1, 1), conv(1, 130, 7, 7, 8, 1, 1, 1, 1, 0, 0),
        conv(1, 17, 7, 7, 200, 7, 5, 1, 1, 3, 2), conv(1, 64, 7, 7, 70, 3, 3, 1, 1, 1, 1)})
    for (bool fwd : {true, false}) {
      const WeightPack wp = fwd ? forward_weight_pack(s, kNhwcChannelBlockBf16)
                                : backward_data_weight_pack(s, kNhwcChannelBlockBf16);
      const std::vector<float> w =
          test::random_vector(size_t(s.oc) * s.c * s.kh * s.kw, test::fresh_seed());
      std::vector<uint16_t> want(size_t(wp.rows) * wp.taps * wp.k_pad);
      pack_weights_bf16_cpu(wp, w.data(), want.data());
      Tensor d_w = test::to_device(w), d_out = poisoned_bf16(want.size());
      pack_weights_bf16_cuda(wp, d_w.data(), reinterpret_cast<uint16_t*>(d_out.data()), nullptr);
      EXPECT_TRUE(download_bf16(d_out, want.size()) == want)
          << "pack_weights_bf16 " << (fwd ? "forward" : "input gradient") << " C=" << s.c
          << " OC=" << s.oc << " k=" << s.kh << "x" << s.kw;
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmmaNhwcBf16, ForwardShapes) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  for (const ConvCase& cc : forward_cases())
    for (Fill fill : {Fill::SmallInt, Fill::Random}) {
      const Problem p = make_problem(Pass::Forward, cc, fill, test::fresh_seed());
      for (const WgmmaNhwcOptions& o : nhwc_tile_configs(Precision::BF16, Pass::Forward, cc.s))
        expect_close(p, run_gpu(p, o), describe_tiles(o));
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmmaNhwcBf16, BackwardDataShapes) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  for (const ConvCase& cc : backward_data_cases())
    for (Fill fill : {Fill::SmallInt, Fill::Random}) {
      const Problem p = make_problem(Pass::BackwardData, cc, fill, test::fresh_seed());
      for (const WgmmaNhwcOptions& o : nhwc_tile_configs(Precision::BF16, Pass::BackwardData, cc.s))
        expect_close(p, run_gpu(p, o), describe_tiles(o));
      // The configurations above stack a strided gradient's phases; one launch a phase too.
      if (cc.s.stride_h > 1 || cc.s.stride_w > 1) {
        WgmmaNhwcOptions o;
        o.precision = Precision::BF16;
        o.phase_launch = NhwcPhaseLaunch::Separate;
        expect_close(p, run_gpu(p, o), describe_tiles(o) + " phases separate");
      }
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmmaNhwcBf16, SplitsAndRepeat) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  const std::pair<Pass, ConvCase> cases[] = {{Pass::Forward, forward_cases()[8]},
                                             {Pass::Forward, forward_cases()[4]},
                                             {Pass::Forward, forward_cases()[11]},
                                             {Pass::BackwardData, backward_data_cases()[3]},
                                             {Pass::BackwardData, backward_data_cases()[12]}};
  for (const auto& [pass, cc] : cases)
    for (Fill fill : {Fill::SmallInt, Fill::Random}) {
      const Problem p = make_problem(pass, cc, fill, test::fresh_seed());
      for (int splits : {1, 2, 4, 8})
        for (const WgmmaNhwcOptions& o : nhwc_tile_configs(Precision::BF16, pass, cc.s, splits)) {
          const std::vector<float> a = run_gpu(p, o), b = run_gpu(p, o);
          expect_close(p, a, describe_tiles(o));
          EXPECT_TRUE(bitwise_equal(a, b))
              << p.what << " " << describe_tiles(o) << ": not repeatable";
        }
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmmaNhwcBf16, Scratch) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  for (const ConvCase& cc : forward_cases()) {
    EXPECT_LE(conv2d_forward_wgmma_nhwc_scratch_floats(cc.s, Precision::BF16),
              conv2d_forward_wgmma_nhwc_scratch_floats(cc.s, Precision::TF32));
    EXPECT_LE(conv2d_backward_data_wgmma_nhwc_scratch_floats(cc.s, Precision::BF16),
              conv2d_backward_data_wgmma_nhwc_scratch_floats(cc.s, Precision::TF32));
  }
  const std::pair<Pass, ConvCase> cases[] = {{Pass::Forward, forward_cases()[3]},
                                             {Pass::Forward, forward_cases()[6]},
                                             {Pass::BackwardData, backward_data_cases()[2]},
                                             {Pass::BackwardData, backward_data_cases()[13]}};
  for (const auto& [pass, cc] : cases) {
    const Problem p = make_problem(pass, cc, Fill::Random, test::fresh_seed());
    const std::vector<float> own = run_gpu(p, bf16_options(), Via::Direct);
    expect_close(p, own, "scratch of the BF16 size");
    EXPECT_TRUE(bitwise_equal(run_gpu(p, bf16_options(), Via::DirectTf32Scratch), own))
        << p.what << ": a TF32-sized scratch gives other bits than a BF16-sized one";
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmmaNhwcBf16, Dispatch) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  const std::pair<Pass, ConvCase> cases[] = {{Pass::Forward, forward_cases()[1]},
                                             {Pass::Forward, forward_cases()[4]},
                                             {Pass::BackwardData, backward_data_cases()[1]},
                                             {Pass::BackwardData, backward_data_cases()[5]},
                                             {Pass::BackwardData, backward_data_cases()[14]}};
  for (const auto& [pass, cc] : cases) {
    if (!nhwc_dispatch_takes(pass, cc.s)) continue;  // CNN_WGMMA_NHWC_PHASES=0
    const Problem p = make_problem(pass, cc, Fill::Random, test::fresh_seed());
    const std::vector<float> direct = run_gpu(p, bf16_options());
    expect_close(p, direct, "direct");
    EXPECT_TRUE(bitwise_equal(run_gpu(p, bf16_options(), Via::Dispatch), direct))
        << p.what << ": Algo::WgmmaNhwc at bf16 differs from the direct BF16 call";
    WgmmaNhwcOptions tf32;  // random operands: TF32 and BF16 cannot agree bit for bit
    EXPECT_FALSE(bitwise_equal(run_gpu(p, tf32, Via::Dispatch), direct))
        << p.what << ": precision tf32 gave the BF16 bits";
  }

  // The weight gradient: wgmma's kernel multiplies in TF32 only, so at bf16 wgmma-nhwc's (and
  // wgmma's) weight gradient runs it in TF32 (never less precise than BF16; autotune weighs it
  // against the BF16 implicit GEMM); the forward times wgmma-nhwc. A plane of more than 16x16
  // output pixels: on smaller ones wgmma's at bf16 is the GEMM on explicit copies
  // (gpu_conv_wgrad_im2col.cpp).
  const Conv2dShape s = conv(3, 17, 17, 17, 24, 3, 3, 1, 1, 1, 1);
  const Exec ex = cuda_exec(Precision::BF16);
  Tensor d_x = test::to_device(test::random_vector(size_t(s.n) * s.c * s.h * s.w, 3));
  Tensor d_dy = test::to_device(test::random_vector(size_t(s.n) * s.oc * s.oh() * s.ow(), 4));
  Tensor d_w = test::to_device(test::random_vector(size_t(s.oc) * s.c * 9, 5));
  Tensor d_y = test::to_device(std::vector<float>(size_t(s.n) * s.oc * s.oh() * s.ow(), 0.f));
  Tensor d_dw = test::to_device(std::vector<float>(size_t(s.oc) * s.c * 9, 0.f));
  Tensor d_db = test::to_device(std::vector<float>(size_t(s.oc), 0.f));
  Tensor d_scratch = test::to_device(
      std::vector<float>(std::max<size_t>(conv2d_backward_weight_scratch_floats(s, ex), 1), 0.f));
  auto dw_pass = [&](Algo a) {
    conv2d_backward_weight(s, d_x.data(), d_dy.data(), d_dw.data(), d_db.data(), d_scratch.data(),
                           a, ex);
  };
  // Deterministic, so that the two calls' sums come in one order (atomics would not).
  Exec det = ex;
  det.deterministic = true;
  Tensor d_det_scratch = test::to_device(
      std::vector<float>(std::max<size_t>(conv2d_backward_weight_scratch_floats(s, det), 1), 0.f));
  auto dw_bits = [&](Algo a) {  // fresh zeroed gradients: the weight gradient accumulates
    Tensor dw = test::to_device(std::vector<float>(size_t(s.oc) * s.c * 9, 0.f));
    Tensor db_sum = test::to_device(std::vector<float>(size_t(s.oc), 0.f));
    conv2d_backward_weight(s, d_x.data(), d_dy.data(), dw.data(), db_sum.data(),
                           d_det_scratch.data(), a, det);
    std::vector<float> out = test::to_host(dw.data(), size_t(dw.numel()));
    const std::vector<float> db = test::to_host(db_sum.data(), size_t(db_sum.numel()));
    out.insert(out.end(), db.begin(), db.end());
    return out;
  };
  const std::vector<float> bf16_nhwc = dw_bits(Algo::WgmmaNhwc);
  EXPECT_TRUE(bitwise_equal(bf16_nhwc, dw_bits(Algo::Wgmma)))
      << "the weight gradients of wgmma and wgmma-nhwc at bf16 differ";
  EXPECT_FALSE(bitwise_equal(bf16_nhwc, dw_bits(Algo::Igemm)))
      << "the weight gradient under wgmma-nhwc at bf16 gave the BF16 implicit GEMM's bits";
  {
    Exec tf32_det = det;
    tf32_det.precision = Precision::TF32;
    Tensor dw = test::to_device(std::vector<float>(size_t(s.oc) * s.c * 9, 0.f));
    Tensor db_sum = test::to_device(std::vector<float>(size_t(s.oc), 0.f));
    conv2d_backward_weight(s, d_x.data(), d_dy.data(), dw.data(), db_sum.data(),
                           d_det_scratch.data(), Algo::WgmmaNhwc, tf32_det);
    std::vector<float> at_tf32 = test::to_host(dw.data(), size_t(dw.numel()));
    const std::vector<float> db = test::to_host(db_sum.data(), size_t(db_sum.numel()));
    at_tf32.insert(at_tf32.end(), db.begin(), db.end());
    EXPECT_TRUE(bitwise_equal(bf16_nhwc, at_tf32))
        << "the weight gradient under wgmma-nhwc at bf16 is not the TF32 kernel's";
  }
  auto timed = [](const TuneChoice& c, Algo a) {
    return std::any_of(c.timings.begin(), c.timings.end(),
                       [a](const auto& t) { return t.first == a; });
  };
  // Autotune hands every candidate the scratch the layer sized for them (tune_scratch_floats):
  // without it wgmma-nhwc would be refused, and so left out.
  Tensor d_fwd_scratch = test::to_device(
      std::vector<float>(conv2d_forward_scratch_floats(s, Algo::WgmmaNhwc, ex), 0.f));
  const TuneChoice fwd = pick_fastest(
      std::string("conv_bf16"), "forward",
      [&](Algo a) {
        conv2d_forward(s, d_x.data(), d_w.data(), nullptr, d_y.data(), false, d_fwd_scratch.data(),
                       a, ex);
      },
      ex);
  std::printf("%s\n", describe(fwd).c_str());
  EXPECT_TRUE(timed(fwd, Algo::WgmmaNhwc)) << "autotune left wgmma-nhwc out at bf16";
  EXPECT_FALSE(timed(fwd, Algo::Wgmma)) << "the TF32-only wgmma was timed at bf16";
  const TuneChoice dw = pick_fastest(std::string("conv_bf16"), "weight-grad", dw_pass, ex);
  std::printf("%s\n", describe(dw).c_str());
  EXPECT_NE(dw.chosen, Algo::Auto);
  EXPECT_TRUE(timed(dw, Algo::Wgmma) && timed(dw, Algo::Igemm))
      << "autotune did not weigh the TF32 wgmma weight gradient against the BF16 one at bf16";
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}
