// The Hopper wgmma convolutions (kernels/conv/conv2d_wgmma.h) against the CPU twins
// conv2d_forward_cpu and conv2d_backward_data_cpu. Skipped unless the device is compute
// capability 9.0 and the build has the sm_90a kernels (the refusals run on any GPU):
//   ForwardShapes        C in {1, 3, 17, 64}, OC in {5, 64, 96, 130}, kernels 1x1 .. 7x7 and
//                        3x5, stride 1 / 2, padding 0 .. 3, batch 1 and 3, N*OH*OW never a
//                        multiple of 128; both tile widths (64, 128); small integers first
//                        (exact in TF32: a mismatch is a layout or gather error), then random.
//   BackwardDataShapes   the stride-1 input gradient on the same kinds of shapes, negative
//                        effective padding (padding > kernel - 1) included.
//   LoadersBitwise       the three producer pipelines (async cp.async + mbarrier, cp.async
//                        groups, synchronous loads) and the forward's weights by TMA or gathered:
//                        the tensor cores see the same bits, so the outputs are bitwise equal.
//   SplitsAndRepeat      K split 1, 2, 4, 8 across a cluster: each correct, each run twice
//                        bitwise equal (no atomics: deterministic mode needs nothing more).
//   Dispatch             Algo::Wgmma through conv2d_forward / conv2d_backward_data at TF32 gives
//                        the direct call's bits, deterministic or not.
//   Refusals             FP32 and BF16 forward and input gradient, a stride-2 input gradient,
//                        grouped convolutions and linear layers refuse Algo::Wgmma with a
//                        cnn::Error (the weight gradient runs at both: gpu_conv_wgmma_wgrad.cpp).
// Tolerance (expect_close_tf32, tests/conv_test_check.h): as gpu_gemm_wgmma.cpp derives it
// ("TF32 tolerance"): per element
//   |got - ref| <= 2 (2^-9 + K 2^-23) sum |x w| + 4 ulp (|ref| + 1),
// with K the GEMM depth (C*KH*KW forward, OC*KH*KW input gradient) and sum |x w| the same
// convolution of the absolute values; and ||got - ref|| <= 4e-3 sqrt(sum (x w)^2), the scale of
// the terms (catches a dropped k-tile, which the per-element bound could let through).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "kernels/gemm/linear.h"
#include "runtime/error.h"
#include "runtime/exec.h"
#include "runtime/tensor.h"
#include "tests/conv_test_cases.h"
#include "tests/conv_test_check.h"
#include "tests/test_util.h"
#include "tests/wgmma_test_require.h"
#ifdef CNN_HAVE_CUDA
#include "kernels/conv/conv2d_wgmma.h"
#endif

using namespace cnn;

namespace {

#ifdef CNN_HAVE_CUDA

using namespace conv_test;  // Fill, Pass, ConvCase, conv, Tf32Problem, expect_close_tf32, ...

std::string describe(const WgmmaConvOptions& o) {
  const char* g = o.gather == WgmmaConvGather::Async       ? "async"
                  : o.gather == WgmmaConvGather::WaitGroup ? "waitgroup"
                  : o.gather == WgmmaConvGather::Sync      ? "sync"
                                                           : "default";
  return describe_tiles(o) + " gather=" + g + " force_b_gather=" + std::to_string(o.force_b_gather);
}

// Runs the problem on the GPU (output poisoned with NaN first): the direct call with `opt`, or
// conv2d_forward / conv2d_backward_data with Algo::Wgmma at TF32.
std::vector<float> run_gpu(const Tf32Problem& p, const WgmmaConvOptions& opt,
                           bool via_dispatch = false, bool deterministic = false) {
  const Conv2dShape& s = p.cc.s;
  Tensor d_in = test::to_device(p.in), d_w = test::to_device(p.w), d_b = test::to_device(p.b);
  Tensor d_out = test::to_device(std::vector<float>(p.ref.size(), NAN));
  const bool fwd = p.pass == Pass::Forward;
  const float* bias = fwd && p.cc.bias ? d_b.data() : nullptr;
  if (via_dispatch) {
    Exec ex;
    ex.device = Device::CUDA;
    ex.precision = Precision::TF32;
    ex.deterministic = deterministic;
    if (fwd)
      conv2d_forward(s, d_in.data(), d_w.data(), bias, d_out.data(), p.cc.relu, nullptr,
                     Algo::Wgmma, ex);
    else
      conv2d_backward_data(s, d_in.data(), d_w.data(), d_out.data(), nullptr, Algo::Wgmma, ex);
  } else if (fwd) {
    conv2d_forward_wgmma(s, d_in.data(), d_w.data(), bias, d_out.data(), p.cc.relu, nullptr, opt);
  } else {
    conv2d_backward_data_wgmma(s, d_in.data(), d_w.data(), d_out.data(), nullptr, opt);
  }
  return d_out.to_vector();
}

const std::vector<ConvCase>& forward_cases() {
  static const std::vector<ConvCase> c = {
      {conv(1, 1, 8, 8, 5, 1, 1, 1, 1, 0, 0)},                   // M = 64, K = 1: one k-step
      {conv(3, 3, 17, 13, 64, 3, 3, 1, 1, 1, 1), true, true},    // K = 27: gathered weights
      {conv(1, 17, 15, 11, 96, 5, 5, 1, 1, 2, 2), true},         // K = 425
      {conv(3, 64, 12, 10, 130, 3, 3, 1, 1, 1, 1), true, true},  // K = 576 (TMA), 130 columns
      {conv(3, 3, 40, 36, 64, 7, 7, 2, 2, 3, 3), true, true},    // a 7x7 stride-2 stem
      {conv(1, 17, 21, 19, 5, 5, 5, 2, 2, 2, 2)},                // stride 2, OC = 5
      {conv(3, 64, 9, 11, 96, 1, 1, 1, 1, 0, 0), true},          // 1x1, K = 64
      {conv(1, 1, 28, 28, 130, 5, 5, 1, 1, 2, 2), true, true},   // one input channel, K = 25
      {conv(3, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1)},               // M = 2352, 18 k-tiles
      {conv(3, 17, 13, 23, 96, 3, 5, 1, 2, 1, 2), false, true},  // 3x5, strides 1x2
      {conv(1, 3, 9, 7, 64, 3, 3, 2, 2, 3, 3), true},            // padding 3 > kernel / 2
  };
  return c;
}

const std::vector<ConvCase>& backward_data_cases() {
  static const std::vector<ConvCase> c = {
      {conv(1, 1, 8, 8, 5, 1, 1, 1, 1, 0, 0)},       // dx has 1 channel: one output column
      {conv(3, 3, 17, 13, 64, 3, 3, 1, 1, 1, 1)},    // K = 576
      {conv(1, 17, 15, 11, 96, 5, 5, 1, 1, 2, 2)},   // K = 2400, 17 columns
      {conv(3, 64, 12, 10, 130, 3, 3, 1, 1, 1, 1)},  // K = 1170
      {conv(1, 64, 14, 14, 5, 7, 7, 1, 1, 3, 3)},    // 7x7, OC = 5: K = 245
      {conv(1, 130, 9, 9, 17, 3, 3, 1, 1, 0, 0)},    // 130 columns, padding 0 (flipped: 2)
      {conv(2, 5, 6, 7, 9, 1, 1, 1, 1, 2, 2)},       // padding 2 on 1x1: flipped padding -2
      {conv(3, 17, 13, 23, 96, 3, 5, 1, 1, 0, 2)},   // 3x5, padding 0x2
      {conv(3, 64, 9, 11, 96, 1, 1, 1, 1, 0, 0)},    // 1x1
      {conv(3, 1, 28, 28, 64, 5, 5, 1, 1, 2, 2)},    // the first layer's shape (C = 1)
  };
  return c;
}

#endif  // CNN_HAVE_CUDA

}  // namespace

TEST(GpuConvWgmma, ForwardShapes) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_CONV();
  for (const ConvCase& cc : forward_cases())
    for (Fill fill : {Fill::SmallInt, Fill::Random}) {
      const Tf32Problem p = make_tf32_problem(Pass::Forward, cc, fill, test::fresh_seed());
      for (int bn : {64, 128}) {
        WgmmaConvOptions o;
        o.block_n = bn;
        expect_close_tf32(p, run_gpu(p, o), describe(o));
      }
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmma, BackwardDataShapes) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_CONV();
  for (const ConvCase& cc : backward_data_cases())
    for (Fill fill : {Fill::SmallInt, Fill::Random}) {
      const Tf32Problem p = make_tf32_problem(Pass::BackwardData, cc, fill, test::fresh_seed());
      for (int bn : {64, 128}) {
        WgmmaConvOptions o;
        o.block_n = bn;
        expect_close_tf32(p, run_gpu(p, o), describe(o));
      }
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmma, LoadersBitwise) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_CONV();
  const ConvCase fwd = forward_cases()[3], fwd_c1 = forward_cases()[7];
  const ConvCase dgrad = backward_data_cases()[2];
  const std::pair<Pass, ConvCase> cases[] = {
      {Pass::Forward, fwd}, {Pass::Forward, fwd_c1}, {Pass::BackwardData, dgrad}};
  for (const auto& [pass, cc] : cases) {
    const Tf32Problem p = make_tf32_problem(pass, cc, Fill::Random, test::fresh_seed());
    for (int bn : {64, 128}) {
      WgmmaConvOptions first;
      first.block_n = bn;
      first.gather = WgmmaConvGather::Async;
      const std::vector<float> want = run_gpu(p, first);
      expect_close_tf32(p, want, describe(first));
      for (WgmmaConvGather g :
           {WgmmaConvGather::Async, WgmmaConvGather::WaitGroup, WgmmaConvGather::Sync})
        for (bool force_b_gather : {false, true}) {
          WgmmaConvOptions o = first;
          o.gather = g;
          o.force_b_gather = force_b_gather;
          const std::vector<float> got = run_gpu(p, o);
          expect_close_tf32(p, got, describe(o));
          EXPECT_TRUE(bitwise_equal(got, want))
              << p.what << ": " << describe(o) << " differs from " << describe(first);
        }
    }
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmma, SplitsAndRepeat) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_CONV();
  const std::pair<Pass, ConvCase> cases[] = {{Pass::Forward, forward_cases()[8]},
                                             {Pass::BackwardData, backward_data_cases()[3]}};
  for (const auto& [pass, cc] : cases)
    for (Fill fill : {Fill::SmallInt, Fill::Random}) {
      const Tf32Problem p = make_tf32_problem(pass, cc, fill, test::fresh_seed());
      for (int bn : {64, 128})
        for (int splits : {1, 2, 4, 8}) {
          WgmmaConvOptions o;
          o.block_n = bn;
          o.splits = splits;
          const std::vector<float> a = run_gpu(p, o), b = run_gpu(p, o);
          expect_close_tf32(p, a, describe(o));
          EXPECT_TRUE(bitwise_equal(a, b)) << p.what << " " << describe(o) << ": not repeatable";
        }
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmma, Dispatch) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_CONV();
  const std::pair<Pass, ConvCase> cases[] = {{Pass::Forward, forward_cases()[1]},
                                             {Pass::Forward, forward_cases()[4]},
                                             {Pass::BackwardData, backward_data_cases()[1]},
                                             {Pass::BackwardData, backward_data_cases()[5]}};
  for (const auto& [pass, cc] : cases) {
    const Tf32Problem p = make_tf32_problem(pass, cc, Fill::Random, test::fresh_seed());
    const std::vector<float> direct = run_gpu(p, WgmmaConvOptions{});
    expect_close_tf32(p, direct, "direct");
    for (bool deterministic : {false, true}) {
      const std::vector<float> got = run_gpu(p, WgmmaConvOptions{}, true, deterministic);
      EXPECT_TRUE(bitwise_equal(got, direct))
          << p.what << ": Algo::Wgmma (deterministic=" << deterministic
          << ") differs from the direct call";
    }
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgmma, Refusals) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_GPU();
  const Conv2dShape s = conv(2, 8, 9, 9, 16, 3, 3, 1, 1, 1, 1);
  const Conv2dShape s2 = conv(2, 8, 9, 9, 16, 3, 3, 2, 2, 1, 1);
  const size_t nmax = 2 * 16 * 9 * 9;
  Tensor d_x = test::to_device(test::random_vector(nmax, 1));
  Tensor d_w = test::to_device(test::random_vector(16 * 8 * 9, 2));
  Tensor d_y = test::to_device(std::vector<float>(nmax, 0.f));
  Exec ex;
  ex.device = Device::CUDA;
  auto expect_refused = [](const std::function<void()>& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << what << ": Algo::Wgmma was not refused";
    } catch (const Error& e) {
      const std::string msg = e.what();
      std::printf("%s: %s\n", what, msg.c_str());
      EXPECT_NE(msg.find("wgmma"), std::string::npos) << what << ": the refusal " << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << what << ": one line expected: " << msg;
    }
  };
  for (Precision pr : {Precision::FP32, Precision::BF16}) {
    ex.precision = pr;
    expect_refused(
        [&] {
          conv2d_forward(s, d_x.data(), d_w.data(), nullptr, d_y.data(), false, nullptr,
                         Algo::Wgmma, ex);
        },
        pr == Precision::FP32 ? "forward fp32" : "forward bf16");
    expect_refused(
        [&] {
          conv2d_backward_data(s, d_y.data(), d_w.data(), d_x.data(), nullptr, Algo::Wgmma, ex);
        },
        pr == Precision::FP32 ? "input gradient fp32" : "input gradient bf16");
  }
  ex.precision = Precision::TF32;
  expect_refused(
      [&] {
        conv2d_backward_data(s2, d_y.data(), d_w.data(), d_x.data(), nullptr, Algo::Wgmma, ex);
      },
      "input gradient stride 2");
  // The weight gradient runs at fp32 (3xTF32) and bf16 (in TF32): gpu_conv_wgmma_wgrad.cpp.
  expect_refused(
      [&] {
        linear_forward(LinearShape{2, 8, 16}, d_x.data(), d_w.data(), nullptr, d_y.data(), false,
                       Algo::Wgmma, ex);
      },
      "linear forward");
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}
