// A stride-1 dilated convolution on the dense kernels (conv2d_dilated_dense.h) on the GPU: the
// phase split and merge against their CPU twins, and every dense variant (igemm, wgmma,
// wgmma-nhwc, auto) at FP32, TF32 and BF16 against the double CPU reference on dilations 2 and 3,
// unequal ones, paddings from 0 to beyond the span, bias, the weight gradient accumulating onto a
// nonzero dw; a gradient check through the layer. A variant may refuse a shape (wgmma at FP32 or
// BF16); igemm and auto never do. wgmma-nhwc on the dilated shape itself, every pass it runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_dilated_dense.h"
#include "kernels/conv/conv2d_dilation_phases.h"
#include "kernels/conv/conv2d_grouped.h"
#include "layers/gradcheck/gradcheck.h"
#include "layers/layer_spec.h"
#include "runtime/error.h"
#include "runtime/tensor.h"
#include "tests/gpu_conv_direct_check.h"
#include "tests/grouped_conv_test_check.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

Exec cuda_exec(Precision p) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = p;
  return ex;
}

}  // namespace

TEST(GpuDilationPhases, MatchCpuTwins) {
  CNN_REQUIRE_GPU();
  for (const DilationPhases& p : {DilationPhases{2, 3, 5, 7, 2, 3, 1, 2, 3, 3},
                                  DilationPhases{3, 16, 32, 32, 2, 2, 2, 2, 18, 18},
                                  DilationPhases{1, 5, 13, 10, 3, 3, 3, 3, 7, 6},
                                  DilationPhases{2, 4, 9, 9, 3, 1, 0, 0, 3, 9}}) {
    const std::vector<float> image = test::random_vector(size_t(p.image_floats()), 51),
                             phases_in = test::random_vector(size_t(p.phase_floats()), 52);
    std::vector<float> phases(size_t(p.phase_floats())), back(size_t(p.image_floats()));
    dilation_phase_split_cpu(p, image.data(), phases.data());
    dilation_phase_merge_cpu(p, phases_in.data(), back.data());
    Tensor d_image = test::to_device(image), d_phases_in = test::to_device(phases_in);
    Tensor d_phases({p.phase_floats()}, Device::CUDA), d_back({p.image_floats()}, Device::CUDA);
    test::poison_device(d_phases.data(), size_t(p.phase_floats()));
    test::poison_device(d_back.data(), size_t(p.image_floats()));
    const Exec ex = cuda_exec(Precision::FP32);
    dilation_phase_split(p, d_image.data(), d_phases.data(), ex);
    dilation_phase_merge(p, d_phases_in.data(), d_back.data(), ex);
    EXPECT_EQ(test::to_host(d_phases.data(), phases.size()), phases) << p.h << "x" << p.w;
    EXPECT_EQ(test::to_host(d_back.data(), back.size()), back) << p.h << "x" << p.w;
  }
}

TEST(GpuConv2dDilatedDense, EveryDenseVariantMatchesCpu) {
  CNN_REQUIRE_GPU();
  const Conv2dGroupedShape shapes[] = {
      grouped_test::dilated_shape(3, 16, 12, 11, 24, 3, 2, 2, 2,
                                  2),  // "same" at dilation 2, odd sizes
      grouped_test::dilated_shape(2, 64, 16, 16, 64, 3, 3, 3, 3, 3),  // 64 channels, dilation 3
      grouped_test::dilated_shape(2, 12, 10, 14, 8, 3, 1, 0, 2,
                                  3),  // unequal dilations, small paddings
      grouped_test::dilated_shape(2, 32, 12, 12, 20, 5, 4, 4, 2, 2)};  // 5x5
  for (const Conv2dGroupedShape& s : shapes) {
    const std::string tag = "C" + std::to_string(s.c) + " " + std::to_string(s.h) + "x" +
                            std::to_string(s.w) + " OC" + std::to_string(s.oc) + " k" +
                            std::to_string(s.kh) + " d" + std::to_string(s.dil_h) + "x" +
                            std::to_string(s.dil_w);
    const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.oc * s.oh() * s.ow();
    const size_t nw = size_t(s.oc) * s.c * s.kh * s.kw;
    const grouped_test::Problem ref = grouped_test::make_problem(s);
    const double k_fwd = double(s.c) * s.kh * s.kw + 1, k_data = double(s.oc) * s.kh * s.kw;
    // The phases' batch sums over d_h d_w N images of the phase size.
    const Conv2dShape d = conv2d_dilated_phase_shape(s);
    const double k_wgt = double(d.n) * d.oh() * d.ow();
    Tensor d_x = test::to_device(ref.x), d_w = test::to_device(ref.w), d_b = test::to_device(ref.b),
           d_dy = test::to_device(ref.dy);
    Tensor d_y({int64_t(ny)}, Device::CUDA), d_dx({int64_t(nx)}, Device::CUDA);
    for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16})
      for (Algo a : {Algo::Igemm, Algo::Wgmma, Algo::WgmmaNhwc, Algo::Auto}) {
        const Exec ex = cuda_exec(p);
        const std::string what = tag + " " + algo_name(a) + " " + precision_name(p);
        const size_t need = std::max({conv2d_grouped_forward_scratch_floats(s, a, ex),
                                      conv2d_grouped_backward_data_scratch_floats(s, a, ex),
                                      conv2d_grouped_backward_weight_scratch_floats(s, a, ex)});
        Tensor scratch({int64_t(std::max<size_t>(need, 1))}, Device::CUDA);
        float* const sp = need ? scratch.data() : nullptr;
        const auto run = [&](const char* pass, const std::function<void()>& f) {
          try {
            f();
            return true;
          } catch (const Error& e) {
            EXPECT_TRUE(a != Algo::Igemm && a != Algo::Auto)
                << what << " " << pass << ": " << e.what();
            std::printf("%s %s refused: %s\n", what.c_str(), pass, e.what());
            return false;
          }
        };
        test::poison_device(d_y.data(), ny);
        if (run("forward", [&] {
              conv2d_grouped_forward(s, d_x.data(), d_w.data(), d_b.data(), d_y.data(), false, sp,
                                     a, ex);
            }))
          grouped_test::expect_within(test::to_host(d_y.data(), ny), ref.y, ref.y_abs, k_fwd, p,
                                      what + " forward");
        test::poison_device(d_dx.data(), nx);
        if (run("input gradient", [&] {
              conv2d_grouped_backward_data(s, d_dy.data(), d_w.data(), d_dx.data(), sp, a, ex);
            }))
          grouped_test::expect_within(test::to_host(d_dx.data(), nx), ref.dx, ref.dx_abs, k_data, p,
                                      what + " input gradient");
        Tensor d_dw = test::to_device(ref.dw0), d_db = test::to_device(ref.db0);
        if (run("weight gradient", [&] {
              conv2d_grouped_backward_weight(s, d_x.data(), d_dy.data(), d_dw.data(), d_db.data(),
                                             sp, a, ex);
            })) {
          grouped_test::expect_within(test::to_host(d_dw.data(), nw), ref.dw, ref.dw_abs, k_wgt, p,
                                      what + " weight gradient");
          grouped_test::expect_within(test::to_host(d_db.data(), s.oc), ref.db, ref.db_abs, k_wgt,
                                      p, what + " bias gradient");
        }
      }
  }
}

// wgmma-nhwc on the dilated shape itself, through the dense op (gpu_conv_direct_check.h): the
// forward and input gradient's TMA im2col reading each tap at its dilated offset, the weight
// gradient (the BF16 channels-last kernel, the wgmma gather), on odd channel counts, batch 1,
// dilation up to 6, a padding beyond the span (the input gradient's view padded negatively) and
// a strided forward and weight gradient.
TEST(GpuConv2dDilatedDense, WgmmaNhwcReadsDilatedTaps) {
  CNN_REQUIRE_GPU();
  struct Case {
    Conv2dGroupedShape s;
    int stride;
  };
  const Case cases[] = {{grouped_test::dilated_shape(3, 37, 13, 12, 45, 3, 2, 2, 2, 2), 1},
                        {grouped_test::dilated_shape(1, 3, 20, 19, 70, 5, 9, 1, 2, 4), 1},
                        {grouped_test::dilated_shape(2, 64, 16, 16, 96, 3, 6, 6, 6, 6), 1},
                        {grouped_test::dilated_shape(2, 130, 9, 11, 33, 3, 1, 3, 3, 1), 1},
                        {grouped_test::dilated_shape(2, 24, 17, 15, 40, 3, 2, 2, 2, 2), 2}};
  for (Case c : cases) {
    Conv2dGroupedShape s = c.s;
    s.stride_h = s.stride_w = c.stride;
    grouped_test::expect_direct_passes_match(
        s, "C" + std::to_string(s.c) + " " + std::to_string(s.h) + "x" + std::to_string(s.w) +
               " OC" + std::to_string(s.oc) + " k" + std::to_string(s.kh) + " d" +
               std::to_string(s.dil_h) + "x" + std::to_string(s.dil_w) + " s" +
               std::to_string(c.stride));
  }
}

// Through the layer on the GPU: dilated layers configured igemm, wgmma-nhwc and auto in a float
// Network against the double numerical gradient, FP32.
TEST(GpuConv2dDilatedDense, GradcheckFloatNetworkOnGpu) {
  CNN_REQUIRE_GPU();
  for (Algo a : {Algo::Igemm, Algo::WgmmaNhwc, Algo::Auto}) {
    LayerSpec conv = conv2d_spec("conv", 16, 3, 3, 1, 2);
    conv.dil_h = conv.dil_w = 2;
    conv.algo = a;
    GradcheckOptions o;
    o.seed = test::fresh_seed();
    SCOPED_TRACE(std::string(algo_name(a)) + " seed " + std::to_string(o.seed));
    const GradcheckResult r = gradcheck_network(test::conv_in_small_net(conv, 16), {16, 6, 7}, o,
                                                cuda_exec(Precision::FP32), true);
    EXPECT_TRUE(r.passed()) << format_gradcheck(r);
  }
}
