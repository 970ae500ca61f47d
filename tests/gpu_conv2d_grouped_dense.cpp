// A grouped convolution on the dense kernels (conv2d_grouped_dense.h) on the GPU:
// the group-major copy and the block-diagonal weights against their CPU twins (float4 and scalar
// paths, more planes than one grid row holds), and every dense variant in both forms (igemm, wgmma,
// wgmma-nhwc, auto; wgmma-nhwc in the direct form too) at FP32, TF32 and BF16 against the double
// CPU reference on awkward shapes:
// groups of 2 to 32 channels, stride 2, 1x1 and 5x5 kernels, odd sizes, bias + ReLU, the weight
// gradient accumulating onto a nonzero dw, and the deterministic weight gradient's bits from run to
// run. A variant may refuse a shape (wgmma at FP32, a strided input gradient); igemm and auto never
// do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/conv/conv2d_grouped.h"
#include "kernels/conv/conv2d_grouped_dense.h"
#include "kernels/conv/conv2d_grouped_layout.h"
#include "layers/gradcheck/gradcheck.h"
#include "layers/layer_spec.h"
#include "layers/network.h"
#include "layers/tune_cache.h"
#include "runtime/error.h"
#include "runtime/tensor.h"
#include "tests/gpu_conv_direct_check.h"
#include "tests/grouped_conv_test_check.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

Exec cuda_exec(Precision p, bool deterministic = false) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = p;
  ex.deterministic = deterministic;
  return ex;
}

}  // namespace

TEST(GpuGroupMajorCopy, MatchesCpuTwin) {
  CNN_REQUIRE_GPU();
  struct Case {
    int n, groups;
    int64_t plane;
    int offset;  // floats off the 16-byte alignment: the scalar path
  };
  // 40000 x 2 planes: more than one grid row (65535) of planes.
  for (const Case& c : {Case{3, 5, 7, 0}, Case{4, 3, 4100, 0}, Case{4, 3, 4100, 1},
                        Case{2, 2, 1, 0}, Case{40000, 2, 3, 0}}) {
    const size_t count = size_t(c.n) * c.groups * c.plane;
    const std::vector<float> src = test::random_vector(count, 11);
    for (bool to_group_major : {true, false}) {
      std::vector<float> want(count);
      group_major_copy_cpu(src.data(), want.data(), c.n, c.groups, c.plane, to_group_major);
      std::vector<float> padded(count + 4, 0.f);
      std::copy(src.begin(), src.end(), padded.begin() + c.offset);
      Tensor d_src = test::to_device(padded), d_dst({int64_t(count) + 4}, Device::CUDA);
      test::poison_device(d_dst.data(), count + 4);
      group_major_copy(d_src.data() + c.offset, d_dst.data() + c.offset, c.n, c.groups, c.plane,
                       to_group_major, cuda_exec(Precision::FP32));
      EXPECT_EQ(test::to_host(d_dst.data() + c.offset, count), want)
          << c.n << "x" << c.groups << "x" << c.plane << " offset " << c.offset
          << (to_group_major ? " to" : " from") << " group-major";
    }
  }
}

TEST(GpuBlockDiagonal, MatchesCpuTwin) {
  CNN_REQUIRE_GPU();
  for (const BlockDiagonal& b :
       {BlockDiagonal{6, 9, 3, 5}, BlockDiagonal{64, 32, 32, 9}, BlockDiagonal{200, 200, 4, 1}}) {
    const size_t nw = size_t(b.dense_floats() / b.groups), nd = size_t(b.dense_floats());
    const std::vector<float> w = test::random_vector(nw, 41), dwd = test::random_vector(nd, 42),
                             dw0 = test::random_vector(nw, 43);
    std::vector<float> wd(nd), dw = dw0;
    block_diagonal_expand_cpu(b, w.data(), wd.data());
    block_diagonal_add_back_cpu(b, dwd.data(), dw.data());
    Tensor d_w = test::to_device(w), d_wd({int64_t(nd)}, Device::CUDA),
           d_dwd = test::to_device(dwd), d_dw = test::to_device(dw0);
    test::poison_device(d_wd.data(), nd);
    const Exec ex = cuda_exec(Precision::FP32);
    block_diagonal_expand(b, d_w.data(), d_wd.data(), ex);
    block_diagonal_add_back(b, d_dwd.data(), d_dw.data(), ex);
    EXPECT_EQ(test::to_host(d_wd.data(), nd), wd) << b.oc << " " << b.c << " " << b.groups;
    EXPECT_EQ(test::to_host(d_dw.data(), nw), dw) << b.oc << " " << b.c << " " << b.groups;
    zero_floats(d_wd.data(), int64_t(nd), ex);
    EXPECT_EQ(test::to_host(d_wd.data(), nd), std::vector<float>(nd, 0.f));
  }
}

TEST(GpuConv2dGroupedDense, EveryDenseVariantMatchesCpu) {
  CNN_REQUIRE_GPU();
  const Conv2dGroupedShape shapes[] = {
      grouped_test::grouped_shape(3, 12, 9, 7, 18, 3, 1, 1, 3),  // 4 -> 6 a group, odd sizes
      grouped_test::grouped_shape(2, 64, 8, 8, 64, 3, 2, 1, 2),  // 32 a group, stride 2
      grouped_test::grouped_shape(5, 40, 6, 6, 20, 1, 1, 0, 4),  // 1x1, 10 -> 5 a group
      grouped_test::grouped_shape(4, 48, 10, 10, 96, 5, 1, 2,
                                  3),  // 5x5, 16 -> 32 a group: auto runs dense
      grouped_test::grouped_shape(2, 64, 7, 7, 64, 3, 1, 1, 32)};  // 32 groups of 2
  for (const Conv2dGroupedShape& s : shapes) {
    const std::string tag = "C" + std::to_string(s.c) + " " + std::to_string(s.h) + "x" +
                            std::to_string(s.w) + " OC" + std::to_string(s.oc) + " k" +
                            std::to_string(s.kh) + " s" + std::to_string(s.stride_h) + " g" +
                            std::to_string(s.groups);
    const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.oc * s.oh() * s.ow();
    const size_t nw = size_t(s.oc) * s.cg() * s.kh * s.kw;
    const grouped_test::Problem ref = grouped_test::make_problem(s);
    const double k_fwd = double(s.cg()) * s.kh * s.kw + 1, k_data = double(s.ocg()) * s.kh * s.kw;
    const double k_wgt = double(s.n) * s.oh() * s.ow();
    Tensor d_x = test::to_device(ref.x), d_w = test::to_device(ref.w), d_b = test::to_device(ref.b),
           d_dy = test::to_device(ref.dy);
    Tensor d_y({int64_t(ny)}, Device::CUDA), d_dx({int64_t(nx)}, Device::CUDA);
    // The dense variants in each form called directly; auto through the grouped op (its rule's
    // form, the dense op's fixed rule on each pass).
    struct Variant {
      Algo algo;
      bool direct;
      GroupedDenseForm form;
    };
    std::vector<Variant> variants;
    for (GroupedDenseForm f : {GroupedDenseForm::PerGroup, GroupedDenseForm::BlockDiagonal})
      for (Algo a : {Algo::Igemm, Algo::Wgmma, Algo::WgmmaNhwc}) variants.push_back({a, true, f});
    variants.push_back({Algo::WgmmaNhwc, true, GroupedDenseForm::Direct});
    variants.push_back({Algo::Auto, false, conv2d_grouped_dense_form(s)});
    for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16})
      for (const Variant& v : variants) {
        const Algo a = v.algo;
        const Exec ex = cuda_exec(p);
        const std::string what = tag + " " + algo_name(a) + " " +
                                 (v.direct ? grouped_dense_form_name(v.form) : "(rule)") + " " +
                                 (p == Precision::BF16   ? "bf16"
                                  : p == Precision::TF32 ? "tf32"
                                                         : "fp32");
        const size_t need =
            v.direct
                ? std::max({conv2d_grouped_dense_forward_scratch_floats(s, a, ex, v.form),
                            conv2d_grouped_dense_backward_data_scratch_floats(s, a, ex, v.form),
                            conv2d_grouped_dense_backward_weight_scratch_floats(s, a, ex, v.form)})
                : std::max({conv2d_grouped_forward_scratch_floats(s, a, ex),
                            conv2d_grouped_backward_data_scratch_floats(s, a, ex),
                            conv2d_grouped_backward_weight_scratch_floats(s, a, ex)});
        Tensor scratch({int64_t(std::max<size_t>(need, 1))}, Device::CUDA);
        float* const sp = need ? scratch.data() : nullptr;
        // The block-diagonal GEMMs are G times deeper (their extra terms are exact zeros).
        const double deeper = v.form == GroupedDenseForm::BlockDiagonal ? s.groups : 1;
        // Each pass alone: a refusal of one does not skip the others.
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
              if (v.direct)
                conv2d_grouped_dense_forward(s, d_x.data(), d_w.data(), d_b.data(), d_y.data(),
                                             false, sp, a, ex, v.form);
              else
                conv2d_grouped_forward(s, d_x.data(), d_w.data(), d_b.data(), d_y.data(), false, sp,
                                       a, ex);
            }))
          grouped_test::expect_within(test::to_host(d_y.data(), ny), ref.y, ref.y_abs,
                                      k_fwd * deeper, p, what + " forward");
        test::poison_device(d_dx.data(), nx);
        if (run("input gradient", [&] {
              if (v.direct)
                conv2d_grouped_dense_backward_data(s, d_dy.data(), d_w.data(), d_dx.data(), sp, a,
                                                   ex, v.form);
              else
                conv2d_grouped_backward_data(s, d_dy.data(), d_w.data(), d_dx.data(), sp, a, ex);
            }))
          grouped_test::expect_within(test::to_host(d_dx.data(), nx), ref.dx, ref.dx_abs,
                                      k_data * deeper, p, what + " input gradient");
        Tensor d_dw = test::to_device(ref.dw0), d_db = test::to_device(ref.db0);
        if (run("weight gradient", [&] {
              if (v.direct)
                conv2d_grouped_dense_backward_weight(s, d_x.data(), d_dy.data(), d_dw.data(),
                                                     d_db.data(), sp, a, ex, v.form);
              else
                conv2d_grouped_backward_weight(s, d_x.data(), d_dy.data(), d_dw.data(), d_db.data(),
                                               sp, a, ex);
            })) {
          grouped_test::expect_within(test::to_host(d_dw.data(), nw), ref.dw, ref.dw_abs, k_wgt, p,
                                      what + " weight gradient");
          // The dense kernels sum db at the pass's precision too (dy rounded as a GEMM operand).
          grouped_test::expect_within(test::to_host(d_db.data(), s.oc), ref.db, ref.db_abs, k_wgt,
                                      p, what + " bias gradient");
        }
      }
  }
}

// wgmma-nhwc on the grouped shape itself, one group a block (the direct form), through the dense
// op (gpu_conv_direct_check.h): groups of 2 to 80 input channels (one to three k-tile chunks), 4 to
// 40 output channels, 1x1, 3x3 and 5x5, stride 2 (forward and weight gradient), batch 1.
TEST(GpuConv2dGroupedDense, WgmmaNhwcRunsEachGroup) {
  CNN_REQUIRE_GPU();
  const Conv2dGroupedShape shapes[] = {
      grouped_test::grouped_shape(3, 12, 9, 7, 18, 3, 1, 1, 3),       // 4 -> 6 a group
      grouped_test::grouped_shape(2, 64, 8, 8, 64, 3, 2, 1, 2),       // 32 a group, stride 2
      grouped_test::grouped_shape(5, 40, 6, 6, 20, 1, 1, 0, 4),       // 1x1, 10 -> 5 a group
      grouped_test::grouped_shape(4, 96, 10, 10, 96, 5, 1, 2, 3),     // 5x5, 32 a group
      grouped_test::grouped_shape(2, 128, 7, 7, 128, 3, 1, 1, 32),    // 32 groups of 4
      grouped_test::grouped_shape(1, 160, 9, 9, 80, 3, 1, 1, 2),      // 80 -> 40, batch 1
      grouped_test::grouped_shape(2, 256, 16, 16, 256, 3, 2, 1, 8)};  // resnext's stride-2 layer
  for (const Conv2dGroupedShape& s : shapes)
    grouped_test::expect_direct_passes_match(
        s, "C" + std::to_string(s.c) + " " + std::to_string(s.h) + "x" + std::to_string(s.w) +
               " OC" + std::to_string(s.oc) + " k" + std::to_string(s.kh) + " s" +
               std::to_string(s.stride_h) + " g" + std::to_string(s.groups));
}

// Deterministic mode: igemm's weight gradient's bits repeat, in both forms at every precision.
TEST(GpuConv2dGroupedDense, DeterministicWeightGradientRepeats) {
  CNN_REQUIRE_GPU();
  const Conv2dGroupedShape s = grouped_test::grouped_shape(6, 48, 9, 9, 48, 3, 1, 1, 3);
  const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.oc * s.oh() * s.ow();
  const size_t nw = size_t(s.oc) * s.cg() * s.kh * s.kw;
  Tensor d_x = test::to_device(test::random_vector(nx, 31)),
         d_dy = test::to_device(test::random_vector(ny, 32));
  for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16})
    for (GroupedDenseForm form : {GroupedDenseForm::PerGroup, GroupedDenseForm::BlockDiagonal}) {
      const Exec ex = cuda_exec(p, true);
      const size_t need =
          conv2d_grouped_dense_backward_weight_scratch_floats(s, Algo::Igemm, ex, form);
      Tensor scratch({int64_t(std::max<size_t>(need, 1))}, Device::CUDA);
      std::vector<float> first;
      for (int run = 0; run < 2; ++run) {
        Tensor dw = test::to_device(std::vector<float>(nw, 0.f)),
               db = test::to_device(std::vector<float>(size_t(s.oc), 0.f));
        conv2d_grouped_dense_backward_weight(s, d_x.data(), d_dy.data(), dw.data(), db.data(),
                                             need ? scratch.data() : nullptr, Algo::Igemm, ex,
                                             form);
        std::vector<float> got = test::to_host(dw.data(), nw);
        if (run == 0)
          first = got;
        else
          EXPECT_EQ(got, first) << grouped_dense_form_name(form) << " precision " << int(p);
      }
    }
}

// Through the layer on the GPU: grouped layers configured igemm, wgmma-nhwc and auto (16 channels
// a group: the dense kernels) in a float Network against the double numerical gradient, FP32.
TEST(GpuConv2dGroupedDense, GradcheckFloatNetworkOnGpu) {
  CNN_REQUIRE_GPU();
  for (Algo a : {Algo::Igemm, Algo::WgmmaNhwc, Algo::Auto}) {
    LayerSpec conv = conv2d_spec("conv", 32, 3, 3, 1, 1);
    conv.groups = 2;
    conv.algo = a;
    const std::vector<LayerSpec> specs = test::conv_in_small_net(conv, 32);
    GradcheckOptions o;
    o.seed = test::fresh_seed();
    SCOPED_TRACE(std::string(algo_name(a)) + " seed " + std::to_string(o.seed));
    const GradcheckResult r =
        gradcheck_network(specs, {32, 5, 6}, o, cuda_exec(Precision::FP32), true);
    EXPECT_TRUE(r.passed()) << format_gradcheck(r);
  }
}

// A grouped layer whose weight gradient autotune moves from the grouped kernels (auto's untuned
// pick for 2 channels a group, no scratch) to a dense one (block-diagonal weights in scratch),
// run beside the input gradient on the side stream: the side scratch is refitted after tuning
// to the pick's need (it was sized for the untuned pick), and steps then train as with the
// weight gradients in turn. The pick is forced through the tune cache, so the test does not
// hang on which variant times faster.
TEST(GpuConv2dGroupedDense, SideScratchFitsTheTunedWeightGradient) {
  CNN_REQUIRE_GPU();
  LayerSpec conv = conv2d_spec("conv", 64, 3, 3, 1, 1);
  conv.groups = 32;
  conv.bias = false;
  const std::vector<LayerSpec> specs = test::conv_in_small_net(conv, 64, 3);
  const Shape chw = {3, 12, 12};
  // FP32: the two networks may tune to different variants, which then agree to ~1e-6 (at TF32
  // they differ by its rounding, a few percent on small gradients).
  const Exec ex = cuda_exec(Precision::FP32);
  NetworkOptions o;
  o.max_batch = 32;
  o.weight_grads_beside = true;
  Network net(specs, chw, o, ex);
  const Conv2dGroupedShape g = grouped_test::grouped_shape(32, 64, 12, 12, 64, 3, 1, 1, 32);
  ASSERT_FALSE(conv2d_grouped_runs_dense(g, Algo::Auto, ex)) << "the untuned pick must differ";
  TuneCache cache;
  // The layer's key (layers/conv2d_layer.cpp), with and without the ReLU it may have fused.
  for (const char* tail : {"", " relu"})
    cache.put(
        TuneCache::key(std::string("conv2d n32 c64 h12 w12 oc64 k3x3 s1x1 p1x1 d1x1 g32") + tail,
                       "weight-grad", precision_name(ex.precision), false),
        CachedTune{"igemm", {}});
  bool forced = false;
  for (const std::string& line : net.autotune(&cache)) {
    std::printf("%s\n", line.c_str());
    forced = forced || (line.rfind("conv weight-grad: igemm", 0) == 0 &&
                        line.find("[cached]") != std::string::npos);
  }
  ASSERT_TRUE(forced) << "the cached weight-gradient pick was not taken";
  EXPECT_GE(net.side_scratch_floats(),
            conv2d_grouped_backward_weight_scratch_floats(g, Algo::Igemm, ex));
  EXPECT_GT(conv2d_grouped_backward_weight_scratch_floats(g, Algo::Igemm, ex),
            conv2d_grouped_backward_weight_scratch_floats(g, Algo::Auto, ex));
  // Three steps with the tuned picks, against the same network with its weight gradients in turn.
  NetworkOptions in_turn = o;
  in_turn.weight_grads_beside = false;
  Network ref(specs, chw, in_turn, ex);
  ref.autotune();
  for (int s = 0; s < 3; ++s) {
    const test::StepBatch b = test::step_batch(chw, net.num_classes(), o, s, ex.device);
    net.forward_backward(b.n, b.x.data(), b.labels.data(), 1.0f / float(b.n));
    ref.forward_backward(b.n, b.x.data(), b.labels.data(), 1.0f / float(b.n));
  }
  const std::vector<float> got = net.grads_to_host(), want = ref.grads_to_host();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_FALSE(test::any_nan(got));
  EXPECT_LT(test::max_rel_error(got, want, 1e-2), 1e-3);
}
