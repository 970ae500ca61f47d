// The Hopper TMA-im2col convolution (kernels/conv/conv2d_wgmma_nhwc.h) against the CPU twins.
// Skipped unless the device is compute capability 9.0 and the build has the sm_90a kernels (the
// dispatch refusals run on any GPU):
//   PrePasses            the NCHW -> padded NHWC TF32 copy (nhwc_copy_cases in
//                        conv_test_cases.h: one pixel, 7x7, hw not a multiple of 4, c = 1, 3,
//                        5, 12, 17, 130, c_pad a block past c, x not 16-byte aligned) and the
//                        weight packing (forward and flipped input-gradient order) bitwise equal
//                        to their CPU twins (conv2d_nhwc_layout.h), outputs poisoned with NaN
//                        first; an output that is not 16-byte aligned refused.
//   ForwardShapes        C in {1, 3, 17, 64, 130}, OC in {8, 24, 64, 200}, H, W in {7, 13, 32,
//                        33}, batch 1 and 3, stride 1 and 2, kernels 1x1 .. 7x7 (and 3x5),
//                        padding 0 .. 3, with and without bias / ReLU; the three tile widths (32
//                        also at two and three blocks an SM, 64 at two) and the 256 x 128 tile
//                        (nhwc_tile_configs in wgmma_nhwc_tiles.h), and where the shape is
//                        stride 1 the halo tile at each width (LeNet's conv2 among them); small
//                        integers first (exact in TF32: a mismatch is an addressing error), then
//                        random values.
//   BackwardDataShapes   the input gradient on the same kinds of shapes, negative effective
//                        padding (padding > kernel - 1) included; strided ones (stride 2, 3, 2x1;
//                        1x1 to 7x7 kernels, odd sizes) as their phases, stacked up to four a
//                        grid (every tile configuration) and one launch each.
//   SplitsAndRepeat      K split 1, 2, 4, 8 across a cluster (every tile width, each residency
//                        under some split, the 256-row tile): each correct, each run twice
//                        bitwise equal.
//   HaloTilesSmall       the halo tile alone on LeNet's conv2 at batch 1 (for the sanitizers).
//   StridedInputGradientSmall  two strided input gradients at batch 1, phases stacked in one
//                        grid and one launch each (for the sanitizers).
//   Picks                the tile width, rows, residency and halo rules (host code: runs
//                        without a GPU).
//   Dispatch             Algo::WgmmaNhwc through conv2d_forward / conv2d_backward_data at TF32
//                        (with a scratch of conv2d_*_scratch_floats, the direct call's size)
//                        gives the direct call's bits; its weight gradient is Algo::Wgmma's.
//   (The scratch itself, a null one refused and no allocation in a captured graph:
//   gpu_conv_nhwc_scratch.cpp.)
//   Refusals             FP32 (3xTF32, GpuConvWgmmaNhwc3xTf32 below) at three blocks an SM
//                        or with 128-column tiles at two, 128-column tiles at
//                        two blocks an SM, 64-column at three, a tile width of 48, 256-row
//                        tiles of 32 or 64 columns or at FP32, 192 rows, a stride-2 input
//                        gradient with dilation, a padding the TMA box cannot express, halo
//                        tiles on a strided input gradient, halo tiles at FP32,
//                        with a residency asked for, of 256 rows and 128 columns or of 192
//                        rows, at stride 2 or a row pitch over 128 pixels, grouped convolutions
//                        and linear layers, phases stacked at FP32: one-line cnn::Error;
//                        autotune leaves the refused variant out and still picks another.
// Tolerance: as gpu_conv_wgmma.cpp (TF32, expect_close_tf32 in tests/conv_test_check.h): per
// element
//   |got - ref| <= 2 (2^-9 + K 2^-23) sum |x w| + 4 ulp (|ref| + 1),
// and ||got - ref|| <= 4e-3 sqrt(sum (x w)^2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_nhwc_layout.h"
#include "kernels/gemm/linear.h"
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
#include "kernels/conv/conv2d_wgmma.h"
#include "kernels/conv/conv2d_wgmma_nhwc.h"
#endif

using namespace cnn;

namespace {

#ifdef CNN_HAVE_CUDA

using namespace conv_test;  // Fill, Pass, ConvCase, conv, Tf32Problem, expect_close_tf32, ...

enum class Via { Direct, Dispatch };

// Runs the problem on the GPU (output and scratch poisoned with NaN first): the direct call with
// `opt`, or conv2d_forward / conv2d_backward_data with Algo::WgmmaNhwc at opt.precision, each with
// a scratch of the size its own sizing function gives.
std::vector<float> run_gpu(const Tf32Problem& p, const WgmmaNhwcOptions& opt,
                           Via via = Via::Direct) {
  const Conv2dShape& s = p.cc.s;
  Tensor d_in = test::to_device(p.in), d_w = test::to_device(p.w), d_b = test::to_device(p.b);
  Tensor d_out = test::to_device(std::vector<float>(p.ref.size(), NAN));
  const bool fwd = p.pass == Pass::Forward;
  const float* bias = fwd && p.cc.bias ? d_b.data() : nullptr;
  if (via == Via::Dispatch) {
    Exec ex;
    ex.device = Device::CUDA;
    ex.precision = opt.precision;
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
    const size_t nscratch = fwd ? conv2d_forward_wgmma_nhwc_scratch_floats(s, opt.precision)
                                : conv2d_backward_data_wgmma_nhwc_scratch_floats(s, opt.precision);
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

// The float copy pre-pass `cuda` (TF32-rounded or unrounded) on every nhwc_copy_cases() case,
// output poisoned with NaN, bitwise equal to its CPU twin `cpu`.
template <class Cpu, class Cuda>
void expect_copies_match(Cpu cpu, Cuda cuda, const char* name) {
  for (const NhwcCopyCase& k : nhwc_copy_cases()) {
    const int c_pad = (k.c + 31) / 32 * 32 + 32 * k.extra_blocks;
    const std::vector<float> x = test::random_vector(size_t(k.n) * k.c * k.hw, test::fresh_seed());
    std::vector<float> want(size_t(k.n) * k.hw * c_pad);
    cpu(x.data(), k.n, k.c, k.hw, c_pad, want.data());
    std::vector<float> shifted(size_t(k.x_offset), 0.f);
    shifted.insert(shifted.end(), x.begin(), x.end());
    Tensor d_x = test::to_device(shifted),
           d_out = test::to_device(std::vector<float>(want.size(), NAN));
    cuda(d_x.data() + k.x_offset, k.n, k.c, k.hw, c_pad, d_out.data(), nullptr);
    EXPECT_TRUE(bitwise_equal(d_out.to_vector(), want))
        << name << " " << describe(k) << " c_pad=" << c_pad;
  }
}

#endif  // CNN_HAVE_CUDA

}  // namespace

TEST(GpuConvWgmmaNhwc, PrePasses) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  expect_copies_match([](const float* x, int n, int c, int64_t hw, int c_pad,
                         float* out) { nchw_to_nhwc_tf32_cpu(x, n, c, hw, c_pad, out); },
                      nchw_to_nhwc_tf32_cuda, "nchw_to_nhwc_tf32");
  {  // the copy's rows are stored 16 bytes at a time: an output off by one float is refused
    Tensor d_x = test::to_device(std::vector<float>(3 * 16, 1.f)),
           d_out = test::to_device(std::vector<float>(16 * 32 + 1, 0.f));
    EXPECT_THROW(nchw_to_nhwc_tf32_cuda(d_x.data(), 1, 3, 16, 32, d_out.data() + 1, nullptr),
                 Error);
  }
  for (const Conv2dShape& s :
       {conv(1, 3, 7, 7, 24, 3, 3, 1, 1, 1, 1), conv(1, 130, 7, 7, 8, 1, 1, 1, 1, 0, 0),
        conv(1, 17, 7, 7, 200, 7, 5, 1, 1, 3, 2)})
    for (bool fwd : {true, false}) {
      const WeightPack wp = fwd ? forward_weight_pack(s) : backward_data_weight_pack(s);
      const std::vector<float> w =
          test::random_vector(size_t(s.oc) * s.c * s.kh * s.kw, test::fresh_seed());
      std::vector<float> want(size_t(wp.rows) * wp.taps * wp.k_pad);
      pack_weights_tf32_cpu(wp, w.data(), want.data());
      Tensor d_w = test::to_device(w),
             d_out = test::to_device(std::vector<float>(want.size(), NAN));
      pack_weights_tf32_cuda(wp, d_w.data(), d_out.data(), nullptr);
      EXPECT_TRUE(bitwise_equal(d_out.to_vector(), want))
          << "pack_weights_tf32 " << (fwd ? "forward" : "input gradient") << " C=" << s.c
          << " OC=" << s.oc << " k=" << s.kh << "x" << s.kw;
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmmaNhwc, ForwardShapes) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  for (const ConvCase& cc : nhwc_forward_cases())
    for (Fill fill : {Fill::SmallInt, Fill::Random}) {
      const Tf32Problem p = make_tf32_problem(Pass::Forward, cc, fill, test::fresh_seed());
      for (const WgmmaNhwcOptions& o : nhwc_tile_configs(Precision::TF32, Pass::Forward, cc.s))
        expect_close_tf32(p, run_gpu(p, o), describe_tiles(o));
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmmaNhwc, BackwardDataShapes) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  for (const ConvCase& cc : nhwc_backward_data_cases())
    for (Fill fill : {Fill::SmallInt, Fill::Random}) {
      const Tf32Problem p = make_tf32_problem(Pass::BackwardData, cc, fill, test::fresh_seed());
      for (const WgmmaNhwcOptions& o : nhwc_tile_configs(Precision::TF32, Pass::BackwardData, cc.s))
        expect_close_tf32(p, run_gpu(p, o), describe_tiles(o));
      // The configurations above stack a strided gradient's phases; one launch a phase too.
      if (cc.s.stride_h > 1 || cc.s.stride_w > 1) {
        WgmmaNhwcOptions o;
        o.phase_launch = NhwcPhaseLaunch::Separate;
        expect_close_tf32(p, run_gpu(p, o), describe_tiles(o) + " phases separate");
      }
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmmaNhwc, SplitsAndRepeat) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  const std::pair<Pass, ConvCase> cases[] = {{Pass::Forward, nhwc_forward_cases()[8]},
                                             {Pass::Forward, nhwc_forward_cases()[4]},
                                             {Pass::BackwardData, nhwc_backward_data_cases()[3]},
                                             {Pass::BackwardData, nhwc_backward_data_cases()[12]}};
  for (const auto& [pass, cc] : cases)
    for (Fill fill : {Fill::SmallInt, Fill::Random}) {
      const Tf32Problem p = make_tf32_problem(pass, cc, fill, test::fresh_seed());
      for (int splits : {1, 2, 4, 8})
        for (const WgmmaNhwcOptions& o : nhwc_tile_configs(Precision::TF32, pass, cc.s, splits)) {
          const std::vector<float> a = run_gpu(p, o), b = run_gpu(p, o);
          expect_close_tf32(p, a, describe_tiles(o));
          EXPECT_TRUE(bitwise_equal(a, b))
              << p.what << " " << describe_tiles(o) << ": not repeatable";
        }
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// The halo tile alone, on LeNet's conv2 shape at batch 1 (forward: 32 -> 64 channels; input
// gradient: 64 -> 32, two chunks), every width at 128 rows and 32 and 64 at 256, one and two
// splits: a case short enough for compute-sanitizer's racecheck.
TEST(GpuConvWgmmaNhwc, HaloTilesSmall) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  const ConvCase cc{conv(1, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2), true, true};
  for (Pass pass : {Pass::Forward, Pass::BackwardData}) {
    const Tf32Problem p = make_tf32_problem(pass, cc, Fill::Random, test::fresh_seed());
    for (int splits : {1, 2})
      for (const WgmmaNhwcOptions& o : nhwc_tile_configs(Precision::TF32, pass, cc.s, splits))
        if (o.a_load == NhwcALoad::Halo) expect_close_tf32(p, run_gpu(p, o), describe_tiles(o));
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// Strided input gradients at batch 1, TF32 and FP32 (3xTF32) at picked tiles, one and two
// splits: an odd 3x3 stride-2 layer and a 1x1 one (phases without taps): short enough for
// compute-sanitizer.
TEST(GpuConvWgmmaNhwc, StridedInputGradientSmall) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  for (const ConvCase cc : {ConvCase{conv(1, 17, 13, 15, 40, 3, 3, 2, 2, 1, 1)},
                            ConvCase{conv(1, 24, 10, 10, 64, 1, 1, 2, 2, 0, 0)}}) {
    const Tf32Problem p = make_tf32_problem(Pass::BackwardData, cc, Fill::Random, test::fresh_seed());
    for (int splits : {1, 2}) {
      WgmmaNhwcOptions o;
      o.splits = splits;
      for (NhwcPhaseLaunch launch : {NhwcPhaseLaunch::Stacked, NhwcPhaseLaunch::Separate}) {
        o.phase_launch = launch;
        expect_close_tf32(
            p, run_gpu(p, o),
            describe_tiles(o) + (launch == NhwcPhaseLaunch::Stacked ? " stacked" : ""));
      }
      o.phase_launch = NhwcPhaseLaunch::Auto;
      o.precision = Precision::FP32;
      expect_close_3xtf32(p, run_gpu(p, o), describe_tiles(o));
    }
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmmaNhwc, Picks) {
#ifdef CNN_HAVE_CUDA
  // 32 columns for a GEMM N of at most 32 (LeNet's conv2 input gradient: 32 channels of dx).
  for (int n : {1, 8, 24, 32}) EXPECT_EQ(conv2d_wgmma_nhwc_pick_block_n(25088, n), 32) << n;
  for (int n : {33, 64, 130, 200})
    EXPECT_EQ(conv2d_wgmma_nhwc_pick_block_n(25088, n), conv2d_wgmma_pick_block_n(25088, n)) << n;
  // Residency on 132 SMs: a grid of one wave keeps the deep ring; 32-column tiles go to three an
  // SM past two waves' worth of one (a 32-channel layer at 28x28, batch 128: 784 tiles).
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_blocks_per_sm(132, 132, 32), 1);
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_blocks_per_sm(196, 132, 32), 2);
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_blocks_per_sm(784, 132, 32), 3);
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_blocks_per_sm(784, 132, 64), 2);
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_blocks_per_sm(100, 132, 64), 1);
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_blocks_per_sm(784, 132, 128), 1);
  // 256 rows with 128-column tiles where twice the 256-row grid covers 90% of 132 SMs (60
  // tiles): VGG's 128-channel 16x16 forward (M = 32768: 128 tiles) and 256-channel 8x8 one (M =
  // 8192: 64); not its 128-channel 8x8 input gradient (32 tiles) nor the ResNet's 7x7 layers
  // (M = 6272: 25), nor 64-column tiles (VGG's 64-channel 32x32 layers).
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_block_m(32768, 128, 128, 132), 256);
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_block_m(8192, 256, 128, 132), 256);
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_block_m(8192, 128, 128, 132), 128);
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_block_m(6272, 128, 128, 132), 128);
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_block_m(131072, 64, 64, 132), 128);
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_block_m(256 * 60, 128, 128, 132), 256);
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_block_m(256 * 59, 128, 128, 132), 128);
  // Halo tiles at TF32 and BF16 for 16 taps or more where at least half of a tile's 128 rows
  // are output pixels: LeNet's conv2 (14x14, 5x5: 7 rows of pitch 18, 98 pixels) forward and
  // input gradient, a 5x5 layer at 28x28 (4 rows of pitch 32: 112); not 3x3 layers, not a 7x7
  // image (49), not stride 2, not FP32.
  const Conv2dShape lenet2 = conv(128, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2);
  for (Precision pr : {Precision::TF32, Precision::BF16}) {
    EXPECT_TRUE(conv2d_wgmma_nhwc_pick_halo(lenet2, pr));
    EXPECT_TRUE(conv2d_wgmma_nhwc_pick_halo(backward_data_as_forward(lenet2), pr));
    EXPECT_TRUE(conv2d_wgmma_nhwc_pick_halo(conv(128, 32, 28, 28, 32, 5, 5, 1, 1, 2, 2), pr));
    EXPECT_FALSE(conv2d_wgmma_nhwc_pick_halo(conv(128, 32, 28, 28, 32, 3, 3, 1, 1, 1, 1), pr));
    EXPECT_FALSE(conv2d_wgmma_nhwc_pick_halo(conv(128, 128, 7, 7, 128, 5, 5, 1, 1, 2, 2), pr));
    EXPECT_FALSE(conv2d_wgmma_nhwc_pick_halo(conv(128, 32, 28, 28, 64, 5, 5, 2, 2, 2, 2), pr));
  }
  EXPECT_FALSE(conv2d_wgmma_nhwc_pick_halo(lenet2, Precision::FP32));
  // 256-row halo tiles for LeNet's conv2 (one 14-row image a tile: 128 tiles on 132 SMs, 98 of
  // 128 rows or 196 of 256 used alike) at 32 and 64 columns; not 128 columns, not where the
  // grid would leave a tenth of the SMs idle (batch 64: 64 tiles), not the 28x28 3x3 layer (8
  // rows of 30: 4 tiles an image, the last half empty: 77% of the rows used against 88%).
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_halo_rows(lenet2, 64, 132), 256);
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_halo_rows(backward_data_as_forward(lenet2), 32, 132), 256);
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_halo_rows(lenet2, 128, 132), 128);
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_halo_rows(conv(64, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2), 64, 132),
            128);
  EXPECT_EQ(conv2d_wgmma_nhwc_pick_halo_rows(conv(128, 32, 28, 28, 32, 3, 3, 1, 1, 1, 1), 32, 132),
            128);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmmaNhwc, Dispatch) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  const std::pair<Pass, ConvCase> cases[] = {{Pass::Forward, nhwc_forward_cases()[1]},
                                             {Pass::Forward, nhwc_forward_cases()[4]},
                                             {Pass::BackwardData, nhwc_backward_data_cases()[1]},
                                             {Pass::BackwardData, nhwc_backward_data_cases()[5]},
                                             {Pass::BackwardData, nhwc_backward_data_cases()[14]}};
  for (const auto& [pass, cc] : cases) {
    if (!nhwc_dispatch_takes(pass, cc.s)) continue;  // CNN_WGMMA_NHWC_PHASES=0
    const Tf32Problem p = make_tf32_problem(pass, cc, Fill::Random, test::fresh_seed());
    const std::vector<float> direct = run_gpu(p, WgmmaNhwcOptions{});
    expect_close_tf32(p, direct, "direct");
    EXPECT_TRUE(bitwise_equal(run_gpu(p, {}, Via::Dispatch), direct))
        << p.what << ": Algo::WgmmaNhwc differs from the direct call";
  }
  // The weight gradient under wgmma-nhwc is wgmma's kernel on planes of more than 16x16 output
  // pixels: the same bits (deterministic). Smaller ones take the GEMM on explicit copies
  // (gpu_conv_wgrad_im2col.cpp).
  const Conv2dShape s = conv(3, 17, 17, 17, 24, 3, 3, 1, 1, 1, 1);
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = Precision::TF32;
  ex.deterministic = true;
  Tensor d_x = test::to_device(test::random_vector(size_t(s.n) * s.c * s.h * s.w, 3));
  Tensor d_dy = test::to_device(test::random_vector(size_t(s.n) * s.oc * s.oh() * s.ow(), 4));
  Tensor d_scratch = test::to_device(
      std::vector<float>(std::max<size_t>(conv2d_backward_weight_scratch_floats(s, ex), 1), 0.f));
  std::vector<float> dw[2];
  int i = 0;
  for (Algo a : {Algo::Wgmma, Algo::WgmmaNhwc}) {
    Tensor d_dw = test::to_device(std::vector<float>(size_t(s.oc) * s.c * 9, 0.f));
    Tensor d_db = test::to_device(std::vector<float>(size_t(s.oc), 0.f));
    conv2d_backward_weight(s, d_x.data(), d_dy.data(), d_dw.data(), d_db.data(), d_scratch.data(),
                           a, ex);
    dw[i++] = d_dw.to_vector();
  }
  EXPECT_TRUE(bitwise_equal(dw[0], dw[1])) << "the weight gradient under wgmma-nhwc";
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmmaNhwc, Refusals) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_GPU();
  const Conv2dShape s = conv(2, 8, 9, 9, 16, 3, 3, 1, 1, 1, 1);
  const Conv2dShape s2 = conv(2, 8, 9, 9, 16, 3, 3, 2, 2, 1, 1);
  Conv2dShape wide = conv(1, 8, 4, 4, 16, 1, 1, 1, 1, 130, 0);  // lower corner -130
  const size_t nmax = size_t(16) * 4 * 264;
  Tensor d_x = test::to_device(test::random_vector(nmax, 1));
  Tensor d_w = test::to_device(test::random_vector(16 * 8 * 9, 2));
  Tensor d_y = test::to_device(std::vector<float>(nmax, 0.f));
  Exec ex;
  ex.device = Device::CUDA;
  auto expect_refused = [](const std::function<void()>& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << what << ": Algo::WgmmaNhwc was not refused";
    } catch (const Error& e) {
      const std::string msg = e.what();
      std::printf("%s: %s\n", what, msg.c_str());
      EXPECT_NE(msg.find("wgmma-nhwc"), std::string::npos) << what << ": the refusal " << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << what << ": one line expected: " << msg;
      // The calls pass no scratch: the real reason must come before the missing scratch.
      EXPECT_EQ(msg.find("needs a scratch"), std::string::npos) << what << ": " << msg;
    }
  };
  // Tile settings the direct call refuses. FP32 runs as 3xTF32 (GpuConvWgmmaNhwc3xTf32 below),
  // one or two blocks an SM, two only with 32- or 64-column tiles; two blocks an SM of
  // 128-column tiles do not fit the registers; three only of 32-column tiles (a 64-column stage
  // leaves a ring of two); 256 rows only with 128 columns, at TF32 or BF16.
  // Halo tiles: TF32 or BF16, their own residency, 128 rows or 256 of at most 64 columns,
  // stride 1, a row pitch of at most 128 pixels (conv2d_halo_layout.h).
  struct {
    Conv2dShape shape;
    NhwcALoad a_load;
    int block_n, blocks_per_sm, block_m;
    Precision precision;
    const char* what;
  } const refused[] = {
      {s, NhwcALoad::Auto, 32, 3, 0, Precision::FP32, "fp32 at three blocks an SM"},
      {s, NhwcALoad::Auto, 128, 2, 0, Precision::FP32, "fp32 block_n 128 at two blocks an SM"},
      {s, NhwcALoad::Auto, 128, 2, 0, Precision::TF32, "block_n 128 at two blocks an SM"},
      {s, NhwcALoad::Auto, 64, 3, 0, Precision::TF32, "block_n 64 at three blocks an SM"},
      {s, NhwcALoad::Auto, 32, 1, 256, Precision::TF32, "block_m 256 with block_n 32"},
      {s, NhwcALoad::Auto, 64, 1, 256, Precision::TF32, "block_m 256 with block_n 64"},
      {s, NhwcALoad::Auto, 128, 1, 256, Precision::FP32, "block_m 256 at fp32"},
      {s, NhwcALoad::Auto, 128, 1, 192, Precision::TF32, "block_m 192"},
      {s, NhwcALoad::Auto, 48, 0, 0, Precision::TF32, "block_n 48"},
      {s, NhwcALoad::Halo, 0, 0, 0, Precision::FP32, "halo tiles at fp32"},
      {s, NhwcALoad::Halo, 0, 2, 0, Precision::TF32, "halo tiles at two blocks an SM"},
      {s, NhwcALoad::Halo, 128, 0, 256, Precision::BF16, "halo tiles of 256 rows and 128 columns"},
      {s, NhwcALoad::Halo, 0, 0, 192, Precision::TF32, "halo tiles of 192 rows"},
      {s2, NhwcALoad::Halo, 0, 0, 0, Precision::TF32, "halo tiles at stride 2"},
      {conv(1, 8, 4, 140, 16, 3, 3, 1, 1, 1, 1), NhwcALoad::Halo, 0, 0, 0, Precision::TF32,
       "halo row pitch 142"}};
  for (const auto& t : refused) {
    WgmmaNhwcOptions o;
    o.a_load = t.a_load;
    o.block_n = t.block_n;
    o.blocks_per_sm = t.blocks_per_sm;
    o.block_m = t.block_m;
    o.precision = t.precision;
    expect_refused(
        [&] {
          conv2d_forward_wgmma_nhwc(t.shape, d_x.data(), d_w.data(), nullptr, d_y.data(), false,
                                    nullptr, nullptr, o);
        },
        t.what);
  }
  ex.precision = Precision::TF32;
  Conv2dShape s2_dilated = s2;
  s2_dilated.dil_h = s2_dilated.dil_w = 2;
  expect_refused(
      [&] {
        conv2d_backward_data_wgmma_nhwc(s2_dilated, d_y.data(), d_w.data(), d_x.data(), nullptr,
                                        nullptr, WgmmaNhwcOptions{});
      },
      "input gradient stride 2 with dilation 2");
  if (!test::nhwc_dispatch_takes_input_gradient(s2))
    expect_refused(
        [&] {
          conv2d_backward_data(s2, d_y.data(), d_w.data(), d_x.data(), nullptr, Algo::WgmmaNhwc,
                               ex);
        },
        "input gradient stride 2 under CNN_WGMMA_NHWC_PHASES=0");
  {
    WgmmaNhwcOptions o;
    o.a_load = NhwcALoad::Halo;
    expect_refused(
        [&] {
          conv2d_backward_data_wgmma_nhwc(s2, d_y.data(), d_w.data(), d_x.data(), nullptr, nullptr,
                                          o);
        },
        "halo tiles on a stride-2 input gradient");
  }
  {
    WgmmaNhwcOptions o;
    o.precision = Precision::FP32;
    o.phase_launch = NhwcPhaseLaunch::Stacked;
    expect_refused(
        [&] {
          conv2d_backward_data_wgmma_nhwc(s2, d_y.data(), d_w.data(), d_x.data(), nullptr, nullptr,
                                          o);
        },
        "phases stacked at fp32");
  }
  expect_refused(
      [&] {
        conv2d_forward(wide, d_x.data(), d_w.data(), nullptr, d_y.data(), false, nullptr,
                       Algo::WgmmaNhwc, ex);
      },
      "forward padding 130");
  expect_refused(
      [&] {
        linear_forward(LinearShape{2, 8, 16}, d_x.data(), d_w.data(), nullptr, d_y.data(), false,
                       Algo::WgmmaNhwc, ex);
      },
      "linear forward");
  // Autotune times the candidates; the refused one (here: given no scratch) is left out, another
  // is picked.
  const TuneChoice c = pick_fastest(
      std::string("conv_s2"), "input-grad",
      [&](Algo a) { conv2d_backward_data(s2, d_y.data(), d_w.data(), d_x.data(), nullptr, a, ex); },
      ex);
  EXPECT_NE(c.chosen, Algo::WgmmaNhwc);
  EXPECT_NE(c.chosen, Algo::Auto);
  for (const auto& [a, us] : c.timings) EXPECT_NE(a, Algo::WgmmaNhwc) << "timed at " << us << " us";
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// The FP32 instance: 3xTF32 (WgmmaNhwcOptions::precision = FP32), the same kernel with the
// weights packed twice and A split into TF32 parts in registers (one block an SM) or by the
// pre-pass into two copies (two blocks an SM).
//   PrePasses3xTf32    the unrounded NHWC copy (nhwc_copy_cases), the split copies and the two
//                      weight packs bitwise equal to their CPU twins; the packs' sum within
//                      2^-22 of each weight.
//   ForwardShapes / BackwardDataShapes / SplitsAndRepeat   the TF32 cases, every tile width at
//                      one block an SM and widths 32 and 64 at two, splits 1, 2, 4, 8, against
//                      the double CPU twin with expect_close_3xtf32 (a Frobenius error of 3e-5:
//                      TF32's ~3e-4 fails it), repeatable bitwise.
//   Dispatch           Algo::WgmmaNhwc at precision fp32 gives the direct call's bits, and autotune
//                      at fp32 times it.
namespace {
#ifdef CNN_HAVE_CUDA
WgmmaNhwcOptions fp32_options(int block_n, int splits = 0, int blocks_per_sm = 0) {
  WgmmaNhwcOptions o;
  o.precision = Precision::FP32;
  o.block_n = block_n;
  o.splits = splits;
  o.blocks_per_sm = blocks_per_sm;
  return o;
}

// Every 3xTF32 instance: each width at one block an SM, 32 and 64 columns at two.
std::vector<WgmmaNhwcOptions> fp32_configs(int splits = 0) {
  return {fp32_options(32, splits, 1), fp32_options(32, splits, 2), fp32_options(64, splits, 1),
          fp32_options(64, splits, 2), fp32_options(128, splits, 1)};
}
#endif
}  // namespace

TEST(GpuConvWgmmaNhwc3xTf32, PrePasses) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  expect_copies_match([](const float* x, int n, int c, int64_t hw, int c_pad,
                         float* out) { nchw_to_nhwc_fp32_cpu(x, n, c, hw, c_pad, out); },
                      nchw_to_nhwc_fp32_cuda, "nchw_to_nhwc_fp32");
  // The split copies, each part on its own (the other into a scratch buffer).
  const auto cpu_part = [](bool small) {
    return [small](const float* x, int n, int c, int64_t hw, int c_pad, float* out) {
      std::vector<float> other(size_t(n) * hw * c_pad);
      if (small)
        nchw_to_nhwc_tf32_split_cpu(x, n, c, hw, c_pad, other.data(), out);
      else
        nchw_to_nhwc_tf32_split_cpu(x, n, c, hw, c_pad, out, other.data());
    };
  };
  const auto cuda_part = [](bool small) {
    return [small](const float* x, int n, int c, int64_t hw, int c_pad, float* out,
                   cudaStream_t stream) {
      Tensor other = test::to_device(std::vector<float>(size_t(n) * hw * c_pad, NAN));
      if (small)
        nchw_to_nhwc_tf32_split_cuda(x, n, c, hw, c_pad, other.data(), out, stream);
      else
        nchw_to_nhwc_tf32_split_cuda(x, n, c, hw, c_pad, out, other.data(), stream);
    };
  };
  expect_copies_match(cpu_part(false), cuda_part(false), "nchw_to_nhwc_tf32_split big");
  expect_copies_match(cpu_part(true), cuda_part(true), "nchw_to_nhwc_tf32_split small");
  for (const Conv2dShape& s :
       {conv(1, 3, 7, 7, 24, 3, 3, 1, 1, 1, 1), conv(1, 17, 7, 7, 200, 7, 5, 1, 1, 3, 2)})
    for (bool fwd : {true, false}) {
      const WeightPack wp = fwd ? forward_weight_pack(s) : backward_data_weight_pack(s);
      const std::vector<float> w =
          test::random_vector(size_t(s.oc) * s.c * s.kh * s.kw, test::fresh_seed());
      const size_t n = size_t(wp.rows) * wp.taps * wp.k_pad;
      std::vector<float> big(n), small(n);
      pack_weights_tf32_split_cpu(wp, w.data(), big.data(), small.data());
      std::vector<float> tf32(n);  // big is the TF32 pack itself
      pack_weights_tf32_cpu(wp, w.data(), tf32.data());
      EXPECT_TRUE(bitwise_equal(big, tf32));
      for (int oc = 0; oc < s.oc; ++oc)  // forward order: row oc, tap t, k = channel
        for (int c = 0; fwd && c < s.c; ++c)
          for (int t = 0; t < s.kh * s.kw; ++t) {
            const size_t i = (size_t(oc) * wp.taps + t) * wp.k_pad + c;
            const double v = w[(size_t(oc) * s.c + c) * s.kh * s.kw + t];
            ASSERT_LE(std::fabs(double(big[i]) + double(small[i]) - v),
                      std::ldexp(std::fabs(v), -22))
                << "oc=" << oc << " c=" << c << " tap=" << t;
          }
      Tensor d_w = test::to_device(w), d_big = test::to_device(std::vector<float>(n, NAN)),
             d_small = test::to_device(std::vector<float>(n, NAN));
      pack_weights_tf32_split_cuda(wp, d_w.data(), d_big.data(), d_small.data(), nullptr);
      EXPECT_TRUE(bitwise_equal(d_big.to_vector(), big) &&
                  bitwise_equal(d_small.to_vector(), small))
          << "pack_weights_tf32_split " << (fwd ? "forward" : "input gradient") << " C=" << s.c
          << " OC=" << s.oc;
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmmaNhwc3xTf32, ForwardAndBackwardDataShapes) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  for (Pass pass : {Pass::Forward, Pass::BackwardData})
    for (const ConvCase& cc :
         pass == Pass::Forward ? nhwc_forward_cases() : nhwc_backward_data_cases())
      for (Fill fill : {Fill::SmallInt, Fill::Random}) {
        const Tf32Problem p = make_tf32_problem(pass, cc, fill, test::fresh_seed());
        for (const WgmmaNhwcOptions& o : fp32_configs())
          expect_close_3xtf32(p, run_gpu(p, o), describe_tiles(o));
      }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmmaNhwc3xTf32, SplitsAndRepeat) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  const std::pair<Pass, ConvCase> cases[] = {{Pass::Forward, nhwc_forward_cases()[8]},
                                             {Pass::Forward, nhwc_forward_cases()[4]},
                                             {Pass::BackwardData, nhwc_backward_data_cases()[3]},
                                             {Pass::BackwardData, nhwc_backward_data_cases()[12]}};
  for (const auto& [pass, cc] : cases) {
    const Tf32Problem p = make_tf32_problem(pass, cc, Fill::Random, test::fresh_seed());
    for (int splits : {1, 2, 4, 8})
      for (const WgmmaNhwcOptions& o : fp32_configs(splits)) {
        const std::vector<float> a = run_gpu(p, o), b = run_gpu(p, o);
        expect_close_3xtf32(p, a, describe_tiles(o));
        EXPECT_TRUE(bitwise_equal(a, b))
            << p.what << " " << describe_tiles(o) << ": not repeatable";
      }
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmmaNhwc3xTf32, Dispatch) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  const std::pair<Pass, ConvCase> cases[] = {{Pass::Forward, nhwc_forward_cases()[4]},
                                             {Pass::BackwardData, nhwc_backward_data_cases()[5]}};
  for (const auto& [pass, cc] : cases) {
    const Tf32Problem p = make_tf32_problem(pass, cc, Fill::Random, test::fresh_seed());
    const WgmmaNhwcOptions o = fp32_options(0);
    const std::vector<float> direct = run_gpu(p, o);
    expect_close_3xtf32(p, direct, "direct");
    EXPECT_TRUE(bitwise_equal(run_gpu(p, o, Via::Dispatch), direct))
        << p.what << ": Algo::WgmmaNhwc at fp32 differs from the direct call";
  }
  // Autotune at fp32 times wgmma-nhwc for a forward pass (it may or may not pick it).
  const Conv2dShape s = conv(3, 64, 16, 16, 64, 3, 3, 1, 1, 1, 1);
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = Precision::FP32;
  Tensor d_x = test::to_device(test::random_vector(size_t(s.n) * s.c * s.h * s.w, 1));
  Tensor d_w = test::to_device(test::random_vector(size_t(s.oc) * s.c * 9, 2));
  Tensor d_y = test::to_device(std::vector<float>(size_t(s.n) * s.oc * s.h * s.w, 0.f));
  Tensor d_scratch = test::to_device(
      std::vector<float>(conv2d_forward_scratch_floats(s, Algo::WgmmaNhwc, ex), 0.f));
  const TuneChoice c = pick_fastest(
      std::string("conv_fp32"), "forward",
      [&](Algo a) {
        conv2d_forward(s, d_x.data(), d_w.data(), nullptr, d_y.data(), false, d_scratch.data(), a,
                       ex);
      },
      ex);
  bool timed = false;
  for (const auto& [a, us] : c.timings) timed |= a == Algo::WgmmaNhwc;
  EXPECT_TRUE(timed) << "autotune at fp32 left wgmma-nhwc out";
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}
