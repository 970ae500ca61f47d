// A grouped convolution on the dense kernels (conv2d_grouped_dense.h) on the CPU: the group-major
// copy's index map, the block-diagonal weights, both forms against the grouped reference loops
// (forward with bias and ReLU, input gradient, weight gradient accumulating), the shapes it takes
// and refuses, its scratch sizes, and the rule by which `auto` takes it. The GPU side is
// gpu_conv2d_grouped_dense.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/conv/conv2d_grouped.h"
#include "kernels/conv/conv2d_grouped_dense.h"
#include "kernels/conv/conv2d_grouped_layout.h"
#include "layers/gradcheck/gradcheck.h"
#include "layers/layer_spec.h"
#include "runtime/error.h"
#include "tests/grouped_conv_test_check.h"
#include "tests/nhwc_dispatch_rule.h"
#include "tests/test_util.h"

using namespace cnn;

TEST(GroupMajorCopy, MapsEverySampleAndGroup) {
  const int n = 3, groups = 5;
  const int64_t plane = 7;
  std::vector<float> src(size_t(n * groups * plane)), dst(src.size()), back(src.size());
  for (size_t i = 0; i < src.size(); ++i) src[i] = float(i);
  group_major_copy(src.data(), dst.data(), n, groups, plane, true, Exec{});
  for (int i = 0; i < n; ++i)
    for (int g = 0; g < groups; ++g)
      for (int64_t e = 0; e < plane; ++e)
        ASSERT_EQ(dst[size_t((g * n + i) * plane + e)], src[size_t((i * groups + g) * plane + e)]);
  group_major_copy(dst.data(), back.data(), n, groups, plane, false, Exec{});
  EXPECT_EQ(back, src);
}

TEST(GroupMajorCopy, RefusesBadArguments) {
  std::vector<float> a(16), b(16);
  EXPECT_THROW(group_major_copy(a.data(), b.data(), 0, 2, 4, true, Exec{}), Error);
  EXPECT_THROW(group_major_copy(a.data(), b.data(), 2, 2, 0, true, Exec{}), Error);
  EXPECT_THROW(group_major_copy(a.data(), nullptr, 2, 2, 4, true, Exec{}), Error);
  EXPECT_THROW(group_major_copy(a.data(), a.data() + 4, 2, 2, 4, true, Exec{}), Error);
}

TEST(Conv2dGroupedDense, TakesDilationOneAndUpTo32GroupsOfTwoChannels) {
  EXPECT_TRUE(
      conv2d_grouped_dense_applicable(grouped_test::grouped_shape(2, 8, 5, 5, 4, 3, 1, 1, 4)));
  EXPECT_TRUE(
      conv2d_grouped_dense_applicable(grouped_test::grouped_shape(2, 64, 5, 5, 64, 3, 1, 1, 32)));
  EXPECT_FALSE(conv2d_grouped_dense_applicable(
      grouped_test::grouped_shape(2, 8, 5, 5, 8, 3, 1, 1, 8)));  // depthwise
  EXPECT_FALSE(
      conv2d_grouped_dense_applicable(grouped_test::grouped_shape(2, 128, 5, 5, 128, 3, 1, 1, 64)));
  EXPECT_FALSE(conv2d_grouped_dense_applicable(
      grouped_test::grouped_shape(2, 8, 5, 5, 8, 3, 1, 1, 1)));  // dense
  Conv2dGroupedShape d = grouped_test::grouped_shape(2, 8, 9, 9, 8, 3, 1, 2, 2);
  d.dil_h = d.dil_w = 2;
  EXPECT_FALSE(conv2d_grouped_dense_applicable(d));
  EXPECT_EQ(conv2d_grouped_forward_scratch_floats(d, Algo::Igemm, Exec{}), 0u);
  std::vector<float> x(2 * 8 * 81), w(8 * 4 * 9), y(2 * 8 * 81);
  try {
    conv2d_grouped_forward(d, x.data(), w.data(), nullptr, y.data(), false, nullptr, Algo::Igemm,
                           Exec{});
    ADD_FAILURE() << "dilation 2 accepted by the dense variant";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "dilation 2x2")) << e.what();
  }
}

TEST(Conv2dGroupedDense, ScratchHoldsEachFormsBuffersAndAScratchIsRequired) {
  const Conv2dGroupedShape s =
      grouped_test::grouped_shape(3, 12, 9, 7, 18, 3, 2, 1, 3);  // y: 3 x 18 x 5 x 4
  const std::size_t x = 3 * 12 * 9 * 7, y = 3 * 18 * 5 * 4, wd = 18 * 12 * 9;
  const std::size_t r4x = (x + 3) / 4 * 4, r4y = (y + 3) / 4 * 4, r4wd = (wd + 3) / 4 * 4;
  const GroupedDenseForm groups = GroupedDenseForm::PerGroup,
                         diag = GroupedDenseForm::BlockDiagonal;
  EXPECT_EQ(conv2d_grouped_dense_forward_scratch_floats(s, Algo::Igemm, Exec{}, groups), r4x + r4y);
  EXPECT_EQ(conv2d_grouped_dense_backward_data_scratch_floats(s, Algo::Igemm, Exec{}, groups),
            r4x + r4y);
  EXPECT_EQ(conv2d_grouped_dense_backward_weight_scratch_floats(s, Algo::Igemm, Exec{}, groups),
            r4x + r4y);
  EXPECT_EQ(conv2d_grouped_dense_forward_scratch_floats(s, Algo::Igemm, Exec{}, diag), r4wd);
  EXPECT_EQ(conv2d_grouped_dense_backward_data_scratch_floats(s, Algo::Igemm, Exec{}, diag), r4wd);
  EXPECT_EQ(conv2d_grouped_dense_backward_weight_scratch_floats(s, Algo::Igemm, Exec{}, diag),
            r4wd);
  // The grouped op asks for its form's; the grouped kernels take none on the CPU.
  EXPECT_EQ(conv2d_grouped_forward_scratch_floats(s, Algo::Igemm, Exec{}),
            conv2d_grouped_dense_forward_scratch_floats(s, Algo::Igemm, Exec{},
                                                        conv2d_grouped_dense_form(s)));
  EXPECT_EQ(conv2d_grouped_forward_scratch_floats(s, Algo::Fast, Exec{}), 0u);
  std::vector<float> xs(x), w(18 * 4 * 9), ys(y);
  try {
    conv2d_grouped_forward(s, xs.data(), w.data(), nullptr, ys.data(), false, nullptr, Algo::Igemm,
                           Exec{});
    ADD_FAILURE() << "no scratch accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "scratch")) << e.what();
  }
}

// Block-diagonal weights of 2 groups: out channel o of group o / 2 sees inputs [3 g, 3 g + 3).
TEST(BlockDiagonal, ExpandsAndAddsBackTheDiagonalBlocks) {
  const BlockDiagonal b{4, 6, 2, 2};  // 4 out, 6 in, 2 groups, 2 taps: w (4, 3, 2)
  std::vector<float> w(24), wd(48, -1.f);
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(i + 1);
  block_diagonal_expand(b, w.data(), wd.data(), Exec{});
  for (int o = 0; o < 4; ++o)
    for (int c = 0; c < 6; ++c)
      for (int t = 0; t < 2; ++t) {
        const float want = c / 3 == o / 2 ? w[size_t((o * 3 + c % 3) * 2 + t)] : 0.f;
        EXPECT_EQ(wd[size_t((o * 6 + c) * 2 + t)], want) << o << " " << c << " " << t;
      }
  std::vector<float> dw(24, 0.5f);
  block_diagonal_add_back(b, wd.data(), dw.data(), Exec{});  // wd's diagonal blocks are w
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_EQ(dw[i], w[i] + 0.5f) << i;
  EXPECT_THROW(block_diagonal_expand(BlockDiagonal{4, 6, 4, 2}, w.data(), wd.data(), Exec{}),
               Error);
  std::vector<float> z(5, 3.f);
  zero_floats(z.data(), 4, Exec{});
  EXPECT_EQ(z, (std::vector<float>{0, 0, 0, 0, 3}));
}

// auto takes the dense kernels on CUDA only, and only for groups of 4 channels or more that the
// narrow-group kernels do not take whole at 4 channels or fewer.
TEST(Conv2dGroupedDense, AutoTakesGroupsOfFourChannelsOnCuda) {
  Exec cuda;
  cuda.device = Device::CUDA;
  const Conv2dGroupedShape wide =
      grouped_test::grouped_shape(8, 64, 8, 8, 64, 3, 1, 1, 8);  // 8 a group
  const Conv2dGroupedShape four =
      grouped_test::grouped_shape(8, 64, 8, 8, 64, 3, 1, 1, 16);  // 4 a group: narrow
  const Conv2dGroupedShape four_5x5 =
      grouped_test::grouped_shape(8, 64, 8, 8, 64, 5, 1, 2, 16);  // no narrow weight gradient
  EXPECT_FALSE(conv2d_grouped_runs_dense(four, Algo::Auto, cuda));
  EXPECT_TRUE(conv2d_grouped_runs_dense(four_5x5, Algo::Auto, cuda));
  const Conv2dGroupedShape narrow =
      grouped_test::grouped_shape(8, 64, 8, 8, 64, 3, 1, 1, 32);  // 2 a group
  const Conv2dGroupedShape thin_out =
      grouped_test::grouped_shape(8, 64, 8, 8, 32, 3, 1, 1, 16);  // 2 out a group
  EXPECT_TRUE(conv2d_grouped_runs_dense(wide, Algo::Auto, cuda));
  EXPECT_FALSE(conv2d_grouped_runs_dense(wide, Algo::Auto, Exec{}));
  EXPECT_FALSE(conv2d_grouped_runs_dense(narrow, Algo::Auto, cuda));
  EXPECT_FALSE(conv2d_grouped_runs_dense(thin_out, Algo::Auto, cuda));
  EXPECT_TRUE(conv2d_grouped_runs_dense(narrow, Algo::WgmmaNhwc, cuda));
  EXPECT_FALSE(conv2d_grouped_runs_dense(wide, Algo::Tiled, cuda));
  EXPECT_GT(conv2d_grouped_forward_scratch_floats(wide, Algo::Auto, cuda), 0u);
  EXPECT_EQ(conv2d_grouped_forward_scratch_floats(narrow, Algo::Auto, cuda), 0u);
}

// The form rule: block-diagonal up to 256 channels or for groups under 16 channels.
TEST(Conv2dGroupedDense, FormRule) {
  EXPECT_EQ(conv2d_grouped_dense_form(grouped_test::grouped_shape(8, 256, 8, 8, 256, 3, 1, 1, 4)),
            GroupedDenseForm::BlockDiagonal);
  EXPECT_EQ(conv2d_grouped_dense_form(grouped_test::grouped_shape(8, 512, 8, 8, 512, 3, 1, 1, 8)),
            GroupedDenseForm::PerGroup);  // 64 a group
  EXPECT_EQ(conv2d_grouped_dense_form(grouped_test::grouped_shape(8, 512, 8, 8, 512, 3, 1, 1, 32)),
            GroupedDenseForm::PerGroup);  // 16 a group
  EXPECT_EQ(conv2d_grouped_dense_form(grouped_test::grouped_shape(8, 384, 8, 8, 384, 3, 1, 1, 32)),
            GroupedDenseForm::BlockDiagonal);  // 12 a group
  EXPECT_EQ(conv2d_grouped_dense_form(grouped_test::grouped_shape(8, 512, 8, 8, 128, 3, 1, 1, 8)),
            GroupedDenseForm::PerGroup);  // 64 in, 16 out a group
}

// The direct form: wgmma-nhwc runs the grouped shape itself (one group a block) in every pass it
// can where the groups are wide enough (the width rule); its scratch is the dense op's on that
// shape; other variants, narrower groups and the CPU keep the rule's form.
TEST(Conv2dGroupedDense, DirectFormUnderWgmmaNhwc) {
  const Conv2dGroupedShape s = grouped_test::grouped_shape(4, 512, 8, 8, 512, 3, 1, 1, 8);
  const Conv2dShape d = conv2d_grouped_as_dense(s);
  EXPECT_EQ(d.groups, 8);
  EXPECT_EQ(d.cg(), 64);
  const GroupedPass passes[] = {GroupedPass::Forward, GroupedPass::BackwardData,
                                GroupedPass::BackwardWeight};
  for (GroupedPass pass : passes) {
    EXPECT_EQ(conv2d_grouped_dense_pass_form(s, pass, Precision::TF32, true),
              GroupedDenseForm::Direct);
    EXPECT_EQ(conv2d_grouped_dense_pass_form(s, pass, Precision::TF32, false),
              conv2d_grouped_dense_form(s));
  }
  // The width rule: 32 channels fill a TF32 k-tile, half a BF16 one; the weight gradient (no
  // k-tile of channels) from 8 a group; 4 a group nowhere.
  const Conv2dGroupedShape s32 = grouped_test::grouped_shape(4, 128, 16, 16, 128, 3, 1, 1, 4);
  EXPECT_EQ(conv2d_grouped_dense_pass_form(s32, GroupedPass::Forward, Precision::TF32, true),
            GroupedDenseForm::Direct);
  EXPECT_EQ(conv2d_grouped_dense_pass_form(s32, GroupedPass::Forward, Precision::BF16, true),
            conv2d_grouped_dense_form(s32));
  EXPECT_EQ(conv2d_grouped_dense_pass_form(s32, GroupedPass::BackwardWeight, Precision::TF32, true),
            GroupedDenseForm::Direct);
  // At BF16 the weight gradient directly from 8 groups (4 here: the BF16 block-diagonal one).
  EXPECT_EQ(conv2d_grouped_dense_pass_form(s32, GroupedPass::BackwardWeight, Precision::BF16, true),
            conv2d_grouped_dense_form(s32));
  const Conv2dGroupedShape eights = grouped_test::grouped_shape(4, 256, 16, 16, 256, 3, 2, 1, 32);
  for (Precision p : {Precision::TF32, Precision::BF16})
    EXPECT_EQ(conv2d_grouped_dense_pass_form(eights, GroupedPass::BackwardWeight, p, true),
              GroupedDenseForm::Direct);
  EXPECT_EQ(conv2d_grouped_dense_pass_form(eights, GroupedPass::Forward, Precision::TF32, true),
            conv2d_grouped_dense_form(eights));
  const Conv2dGroupedShape fours = grouped_test::grouped_shape(4, 128, 16, 16, 128, 3, 1, 1, 32);
  for (GroupedPass pass : passes)
    EXPECT_EQ(conv2d_grouped_dense_pass_form(fours, pass, Precision::TF32, true),
              conv2d_grouped_dense_form(fours));
  // 16 -> 32 a group: the input gradient's k (32 output channels) fills a TF32 k-tile, the
  // forward's (16) half of one.
  const Conv2dGroupedShape mixed = grouped_test::grouped_shape(4, 128, 16, 16, 256, 3, 1, 1, 8);
  EXPECT_EQ(conv2d_grouped_dense_pass_form(mixed, GroupedPass::BackwardData, Precision::TF32, true),
            GroupedDenseForm::Direct);
  EXPECT_EQ(conv2d_grouped_dense_pass_form(mixed, GroupedPass::Forward, Precision::TF32, true),
            conv2d_grouped_dense_form(mixed));
  EXPECT_STREQ(grouped_dense_form_name(GroupedDenseForm::Direct), "direct");
  grouped_test::expect_every_pass_runs_directly(s);
  Exec ex;  // the cases below, at BF16
  ex.device = Device::CUDA;
  ex.precision = Precision::BF16;
  // Stride 2: every pass directly (the input gradient as its phases, where the dispatch takes
  // them: CNN_WGMMA_NHWC_PHASES=1), but with dilation.
  Conv2dShape strided = d;
  strided.stride_h = strided.stride_w = 2;
  EXPECT_TRUE(conv2d_forward_runs_directly(strided, Algo::WgmmaNhwc, ex));
  EXPECT_EQ(conv2d_backward_data_runs_directly(strided, Algo::WgmmaNhwc, ex),
            test::nhwc_dispatch_takes_input_gradient(strided));
  strided.dil_h = strided.dil_w = 2;
  EXPECT_FALSE(conv2d_backward_data_runs_directly(strided, Algo::WgmmaNhwc, ex));
  EXPECT_FALSE(conv2d_forward_runs_directly(d, Algo::WgmmaNhwc, Exec{}));
  // The dense op refuses a grouped shape elsewhere, in one line naming the groups, and Direct
  // asked of a variant that cannot run it is refused.
  std::vector<float> x(size_t(4) * 512 * 64), w(size_t(512) * 64 * 9), y(x.size());
  try {
    conv2d_forward(d, x.data(), w.data(), nullptr, y.data(), false, nullptr, Algo::Naive, Exec{});
    ADD_FAILURE() << "a grouped dense shape was taken on the CPU";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "groups 8")) << e.what();
  }
  EXPECT_THROW(conv2d_grouped_dense_forward(s, x.data(), w.data(), nullptr, y.data(), false,
                                            nullptr, Algo::Igemm, Exec{}, GroupedDenseForm::Direct),
               Error);
}

// The dense CPU reference loops take groups: equal to the grouped reference.
TEST(Conv2dGroupedDense, DenseReferenceTakesGroups) {
  const Conv2dGroupedShape s = grouped_test::grouped_shape(2, 12, 7, 6, 18, 3, 2, 1, 3);
  const Conv2dShape d = conv2d_grouped_as_dense(s);
  const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.oc * s.oh() * s.ow();
  const size_t nw = size_t(s.oc) * s.cg() * s.kh * s.kw;
  const std::vector<float> x = test::random_vector(nx, 1), w = test::random_vector(nw, 2),
                           b = test::random_vector(s.oc, 3), dy = test::random_vector(ny, 4);
  std::vector<float> y(ny), y_ref(ny), dx(nx), dx_ref(nx), dw(nw), dw_ref(nw), db(s.oc),
      db_ref(s.oc);
  conv2d_forward_cpu(d, x.data(), w.data(), b.data(), y.data(), true);
  conv2d_grouped_forward_cpu(s, x.data(), w.data(), b.data(), y_ref.data(), true);
  conv2d_backward_data_cpu(d, dy.data(), w.data(), dx.data());
  conv2d_grouped_backward_data_cpu(s, dy.data(), w.data(), dx_ref.data());
  conv2d_backward_weight_cpu(d, x.data(), dy.data(), dw.data(), db.data());
  conv2d_grouped_backward_weight_cpu(s, x.data(), dy.data(), dw_ref.data(), db_ref.data());
  grouped_test::expect_near_all(y, y_ref, "forward");
  grouped_test::expect_near_all(dx, dx_ref, "input gradient");
  grouped_test::expect_near_all(dw, dw_ref, "weight gradient");
  grouped_test::expect_near_all(db, db_ref, "bias gradient");
}

// The composition on the CPU's dense kernels against the grouped reference loops: groups of
// several channels, stride 2, 1x1 and 5x5, one output channel a group.
TEST(Conv2dGroupedDense, MatchesTheGroupedReferenceOnCpu) {
  const Conv2dGroupedShape shapes[] = {grouped_test::grouped_shape(3, 12, 9, 7, 18, 3, 1, 1, 3),
                                       grouped_test::grouped_shape(2, 12, 11, 10, 6, 5, 2, 2, 2),
                                       grouped_test::grouped_shape(2, 10, 4, 6, 20, 1, 1, 0, 5),
                                       grouped_test::grouped_shape(1, 8, 5, 5, 4, 3, 2, 0, 4)};
  for (const Conv2dGroupedShape& s : shapes) {
    SCOPED_TRACE("C" + std::to_string(s.c) + " OC" + std::to_string(s.oc) + " k" +
                 std::to_string(s.kh) + " s" + std::to_string(s.stride_h) + " g" +
                 std::to_string(s.groups));
    const std::size_t nx = std::size_t(s.n) * s.c * s.h * s.w;
    const std::size_t ny = std::size_t(s.n) * s.oc * s.oh() * s.ow();
    const std::size_t nw = std::size_t(s.oc) * s.cg() * s.kh * s.kw;
    const std::vector<float> x = test::random_vector(nx, 1), w = test::random_vector(nw, 2),
                             b = test::random_vector(s.oc, 3), dy = test::random_vector(ny, 4),
                             dw0 = test::random_vector(nw, 5), db0 = test::random_vector(s.oc, 6);
    for (GroupedDenseForm form : {GroupedDenseForm::PerGroup, GroupedDenseForm::BlockDiagonal}) {
      SCOPED_TRACE(grouped_dense_form_name(form));
      std::vector<float> scratch(std::max(
          {conv2d_grouped_dense_forward_scratch_floats(s, Algo::Igemm, {}, form),
           conv2d_grouped_dense_backward_data_scratch_floats(s, Algo::Igemm, {}, form),
           conv2d_grouped_dense_backward_weight_scratch_floats(s, Algo::Igemm, {}, form)}));
      std::vector<float> y(ny), y_ref(ny), dx(nx), dx_ref(nx);
      conv2d_grouped_dense_forward(s, x.data(), w.data(), b.data(), y.data(), true, scratch.data(),
                                   Algo::Igemm, Exec{}, form);
      conv2d_grouped_forward_cpu(s, x.data(), w.data(), b.data(), y_ref.data(), true);
      grouped_test::expect_near_all(y, y_ref, "forward");
      conv2d_grouped_dense_backward_data(s, dy.data(), w.data(), dx.data(), scratch.data(),
                                         Algo::Igemm, Exec{}, form);
      conv2d_grouped_backward_data_cpu(s, dy.data(), w.data(), dx_ref.data());
      grouped_test::expect_near_all(dx, dx_ref, "input gradient");
      std::vector<float> dw = dw0, db = db0, dw_ref = dw0, db_ref = db0;
      conv2d_grouped_dense_backward_weight(s, x.data(), dy.data(), dw.data(), db.data(),
                                           scratch.data(), Algo::Igemm, Exec{}, form);
      conv2d_grouped_backward_weight_cpu(s, x.data(), dy.data(), dw_ref.data(), db_ref.data());
      grouped_test::expect_near_all(dw, dw_ref, "weight gradient");
      grouped_test::expect_near_all(db, db_ref, "bias gradient");
    }
  }
}

// Through the layer: a grouped convolution configured `algo: igemm` (the dense kernels a group)
// in a float Network on the CPU against the double numerical gradient.
TEST(Conv2dGroupedDense, FloatNetworkGradcheckOnCpu) {
  LayerSpec conv = conv2d_spec("conv", 12, 3, 3, 2, 1);
  conv.groups = 3;
  conv.algo = Algo::Igemm;
  const std::vector<LayerSpec> specs = test::conv_in_small_net(conv, 6);
  GradcheckOptions o;
  o.seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  const GradcheckResult r = gradcheck_network(specs, {6, 7, 9}, o, Exec{}, true);
  EXPECT_TRUE(r.passed()) << format_gradcheck(r);
}

// A dense variant configured on a layer it cannot serve is refused at setup, naming the layer.
TEST(Conv2dGroupedDense, LayerRefusesDenseVariantOnDepthwise) {
  LayerSpec conv = conv2d_spec("dw", 6, 3, 3, 1, 1);
  conv.groups = 6;
  conv.algo = Algo::Wgmma;
  const std::vector<LayerSpec> specs = {conv, layer_spec(LayerKind::Flatten, "flatten"),
                                        linear_spec("fc", 5),
                                        layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
  try {
    gradcheck_network(specs, {6, 5, 5}, GradcheckOptions{}, Exec{}, true);
    ADD_FAILURE() << "wgmma accepted on a depthwise layer";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "dw: algo wgmma")) << e.what();
  }
}
