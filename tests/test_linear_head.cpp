// The fused linear-head backward's CPU side: hand values of the twin through the dispatch (mask,
// no bias, no input gradient, the bias gradient of the layer before), its refusals, when the linear
// layer takes it (never on the CPU, so CPU networks keep their separate passes), and how the
// launcher splits the batch.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/gemm/linear_head.h"
#include "kernels/gemm/linear_head_cuda.h"
#include "layers/network.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

// x (2, 3), w (2, 3), dy (2, 2), as in test_linear.cpp.
const std::vector<float> kX = {1, -2, 3, 0, 5, -6};
const std::vector<float> kW = {1, 0, -1, 0.5f, 0.5f, 0.5f};
const std::vector<float> kDy = {1, 2, 3, 4};
const LinearShape kShape{2, 3, 2};

}  // namespace

TEST(LinearHead, HandValuesWithMaskBiasAndAccumulation) {
  // dw = dy^T x = [[1 x0 + 3 x1], [2 x0 + 4 x1]] = [[1, 13, -15], [2, 16, -18]]; db = [4, 6];
  // dx = dy w = [[2, 1, 0], [5, 2, -1]], masked where x <= 0: [[2, 0, 0], [0, 2, 0]].
  std::vector<float> dw(6, 1.f), db(2, 1.f), dx(6, -99.f);
  linear_head_backward(kShape, kX.data(), kDy.data(), kW.data(), dw.data(), db.data(), dx.data(),
                       true, nullptr, Exec{});
  EXPECT_EQ(dw, (std::vector<float>{2, 14, -14, 3, 17, -17}));
  EXPECT_EQ(db, (std::vector<float>{5, 7}));
  EXPECT_EQ(dx, (std::vector<float>{2, 0, 0, 0, 2, 0}));
  linear_head_backward(kShape, kX.data(), kDy.data(), kW.data(), dw.data(), nullptr, dx.data(),
                       false, nullptr, Exec{});  // no bias: db untouched, dw accumulates again
  EXPECT_EQ(dw, (std::vector<float>{3, 27, -29, 5, 33, -35}));
  EXPECT_EQ(db, (std::vector<float>{5, 7}));
  EXPECT_EQ(dx, (std::vector<float>{2, 1, 0, 5, 2, -1}));
  std::vector<float> only_dw(6, 0.f);
  linear_head_backward(kShape, kX.data(), kDy.data(), nullptr, only_dw.data(), nullptr, nullptr,
                       true, nullptr, Exec{});  // no input gradient: w is not needed
  EXPECT_EQ(only_dw, (std::vector<float>{1, 13, -15, 2, 16, -18}));
}

TEST(LinearHead, SumsTheBiasGradientOfTheLayerBefore) {
  // The masked dx [[2, 0, 0], [0, 2, 0]] is that layer's output gradient: its bias gradient
  // grows by the column sums [2, 2, 0].
  std::vector<float> dw(6, 0.f), dx(6, -99.f), input_db = {1, 1, 1};
  linear_head_backward(kShape, kX.data(), kDy.data(), kW.data(), dw.data(), nullptr, dx.data(),
                       true, input_db.data(), Exec{});
  EXPECT_EQ(dx, (std::vector<float>{2, 0, 0, 0, 2, 0}));
  EXPECT_EQ(input_db, (std::vector<float>{3, 3, 1}));
  // Without the mask, or without dx, there is no output gradient of that layer to sum.
  try {
    linear_head_backward(kShape, kX.data(), kDy.data(), kW.data(), dw.data(), nullptr, dx.data(),
                         false, input_db.data(), Exec{});
    ADD_FAILURE() << "input_db accepted without the mask";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(test::contains(msg, "input_db")) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_THROW(linear_head_backward(kShape, kX.data(), kDy.data(), kW.data(), dw.data(), nullptr,
                                    nullptr, true, input_db.data(), Exec{}),
               Error);
}

TEST(LinearHead, RefusesTooManyOutputsAndNullPointers) {
  std::vector<float> buf(size_t(4) * (kLinearHeadMaxOut + 1) * 3);
  float* p = buf.data();
  try {
    linear_head_backward(LinearShape{2, 3, kLinearHeadMaxOut + 1}, p, p, p, p, p, p, false, nullptr,
                         Exec{});
    ADD_FAILURE() << "33 outputs accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(test::contains(msg, "33 outputs")) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_THROW(linear_head_backward(kShape, nullptr, p, p, p, p, p, false, nullptr, Exec{}), Error);
  EXPECT_THROW(linear_head_backward(kShape, p, p, nullptr, p, p, p, false, nullptr, Exec{}), Error);
  EXPECT_THROW(linear_head_backward(LinearShape{0, 3, 2}, p, p, p, p, p, p, false, nullptr, Exec{}),
               Error);
}

TEST(LinearHead, AppliesToCudaHeadsOnly) {
  EXPECT_FALSE(linear_head_backward_applies(LinearShape{128, 1024, 10}, Device::CPU));
  EXPECT_FALSE(
      linear_head_backward_applies(LinearShape{128, 1024, kLinearHeadMaxOut + 1}, Device::CUDA));
  EXPECT_EQ(linear_head_backward_applies(LinearShape{128, 1024, kLinearHeadMaxOut}, Device::CUDA),
            built_with_cuda() && process_env_switches().linear_head);
}

// On the CPU the linear layers keep their separate passes, so no ReLU mask (nor the bias
// gradient of the layer before) moves to them.
TEST(LinearHead, CpuLinearLayerDoesNotTakeTheReluMask) {
  const std::vector<LayerSpec> specs = {layer_spec(LayerKind::Flatten, "flatten"),
                                        linear_spec("fc1", 12), layer_spec(LayerKind::Relu, "relu"),
                                        linear_spec("fc2", 5),
                                        layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
  NetworkOptions o;
  o.max_batch = 3;
  Network net(specs, {2, 3, 3}, o, Exec{});
  EXPECT_FALSE(net.layers()[3]->can_mask_input_relu());
  EXPECT_FALSE(net.layers()[3]->can_sum_input_bias_grad());
}

TEST(LinearHead, RowSplitsFillTheGpuAndKeepRowsAWarp) {
  constexpr int kSms = 132;  // the H200
  // LeNet's fc2: 32 column blocks; 4 splits of 32 rows, 4 a warp.
  EXPECT_EQ(linear_head_pick_row_splits({128, 1024, 10}, false, kSms), 4);
  EXPECT_EQ(linear_head_pick_row_splits({128, 1024, 10}, true, kSms), 1);
  EXPECT_EQ(linear_head_pick_row_splits({1, 1024, 10}, false, kSms), 1);
  EXPECT_EQ(linear_head_pick_row_splits({257, 7, 3}, false, kSms), 9);      // ceil(257 / 32) rows
  EXPECT_EQ(linear_head_pick_row_splits({600, 5000, 32}, false, kSms), 1);  // 157 column blocks
  EXPECT_EQ(linear_head_pick_row_splits({600, 1030, 32}, false, kSms), 4);  // 33 column blocks
  EXPECT_EQ(linear_head_pick_row_splits({600, 1030, 32}, false, 0), 1);
}
