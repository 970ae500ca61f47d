// The fused head-and-loss step's CPU side: the twin through the dispatch against the separate
// references and hand values, its refusals, how the launcher cuts the batch, and when the
// Network runs it (never on the CPU; NetworkOptions::fuse_head_loss and CNN_HEAD_LOSS).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/gemm/linear_head_loss.h"
#include "kernels/gemm/linear_head_loss_cuda.h"
#include "layers/network.h"
#include "runtime/error.h"
#include "runtime/exec.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

// x (2, 3), w (2, 3), b (2), as in test_linear_head.cpp.
const std::vector<float> kX = {1, -2, 3, 0, 5, -6};
const std::vector<float> kW = {1, 0, -1, 0.5f, 0.5f, 0.5f};
const std::vector<float> kB = {0.5f, -1};
const std::vector<int32_t> kLabels = {1, 0};
const LinearShape kShape{2, 3, 2};

}  // namespace

TEST(LinearHeadLoss, TwinIsTheSeparateReferences) {
  // y = x w^T + b = [[1 - 3 + 0.5, 1 - 1], [6 + 0.5, -0.5 - 1]] = [[-1.5, 0], [6.5, -1.5]].
  for (float eps : {0.f, 0.1f}) {
    SCOPED_TRACE(eps);
    std::vector<float> y(4), dy(4), dw(6, 1.f), db(2, 1.f), dx(6), input_db(3, 1.f), loss(2);
    std::vector<int32_t> pred(2, -1);
    const XentTargets t{kLabels.data(), loss.data(), pred.data(), 0.5f, eps};
    linear_head_loss_step(kShape, kX.data(), kW.data(), kB.data(), y.data(), t, dy.data(),
                          dw.data(), db.data(), dx.data(), true, input_db.data(), Exec{});
    EXPECT_EQ(y, (std::vector<float>{-1.5f, 0.f, 6.5f, -1.5f}));
    EXPECT_EQ(pred, (std::vector<int32_t>{1, 0}));

    std::vector<float> ry(4), rdy(4), rdw(6, 1.f), rdb(2, 1.f), rdx(6), rinput_db(3, 1.f), rloss(2);
    std::vector<int32_t> rpred(2);
    linear_forward_cpu(kShape, kX.data(), kW.data(), kB.data(), ry.data(), false);
    softmax_xent_cpu(XentShape{2, 2}, ry.data(), kLabels.data(), rloss.data(), rpred.data(),
                     rdy.data(), 0.5f, eps);
    linear_head_backward_cpu(kShape, kX.data(), rdy.data(), kW.data(), rdw.data(), rdb.data(),
                             rdx.data(), true, rinput_db.data());
    EXPECT_EQ(loss, rloss);
    EXPECT_EQ(dy, rdy);
    EXPECT_EQ(dw, rdw);
    EXPECT_EQ(db, rdb);
    EXPECT_EQ(dx, rdx);
    EXPECT_EQ(input_db, rinput_db);
    // Row 0 (label 1, the larger logit): loss log(1 + e^-1.5) without smoothing.
    if (eps == 0.f) {
      EXPECT_NEAR(loss[0], std::log1p(std::exp(-1.5)), 1e-6);
    }
  }
}

TEST(LinearHeadLoss, RefusesBadArguments) {
  std::vector<float> buf(size_t(4) * (kLinearHeadMaxOut + 1) * 3, 0.f);
  std::vector<int32_t> labels(4, 0);
  float* p = buf.data();
  const XentTargets t{labels.data(), p, labels.data(), 1.f, 0.f};
  try {
    linear_head_loss_step(LinearShape{2, 3, kLinearHeadMaxOut + 1}, p, p, p, p, t, p, p, p, p,
                          false, nullptr, Exec{});
    ADD_FAILURE() << "33 outputs accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(test::contains(msg, "33 outputs")) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  XentTargets no_labels = t;
  no_labels.labels = nullptr;
  EXPECT_THROW(
      linear_head_loss_step(kShape, p, p, p, p, no_labels, p, p, p, p, false, nullptr, Exec{}),
      Error);
  XentTargets smoothing = t;
  smoothing.label_smoothing = 1.f;
  EXPECT_THROW(
      linear_head_loss_step(kShape, p, p, p, p, smoothing, p, p, p, p, false, nullptr, Exec{}),
      Error);
  EXPECT_THROW(
      linear_head_loss_step(kShape, p, p, p, p, t, nullptr, p, p, p, false, nullptr, Exec{}),
      Error);
  EXPECT_THROW(linear_head_loss_step(kShape, p, p, p, p, t, p, p, p, p, false, p, Exec{}), Error);
}

TEST(LinearHeadLoss, PlanCutsTheBatch) {
  const auto plan = [](int n, bool deterministic, int rows = 0) {
    const LinearHeadLossPlan p = linear_head_loss_plan({n, 1024, 10}, deterministic, rows);
    return std::make_pair(p.rows_per_block, p.fused_backward);
  };
  // Normal mode: kLinearHeadLossRows rows a block, the backward fused.
  EXPECT_EQ(plan(128, false), std::make_pair(kLinearHeadLossRows, true));
  EXPECT_EQ(plan(7, false), std::make_pair(7, true));
  // Deterministic: one block while the batch fits it; else a row a warp, the backward apart.
  EXPECT_EQ(plan(1, true), std::make_pair(1, true));
  EXPECT_EQ(plan(kLinearHeadLossMaxRows, true), std::make_pair(kLinearHeadLossMaxRows, true));
  EXPECT_EQ(plan(kLinearHeadLossMaxRows + 1, true), std::make_pair(8, false));
  // Asked-for rows: the backward stays fused unless deterministic mode needs several blocks.
  EXPECT_EQ(plan(129, false, 5), std::make_pair(5, true));
  EXPECT_EQ(plan(3, false, 5), std::make_pair(3, true));
  EXPECT_EQ(plan(129, true, 32), std::make_pair(32, false));
  EXPECT_EQ(plan(20, true, 32), std::make_pair(20, true));
}

// On the CPU the network runs the loss on its own (the layers keep their separate passes); the
// option and CNN_HEAD_LOSS=0 turn the fused step off wherever it would run.
TEST(LinearHeadLoss, NetworkRunsItOnCudaHeadsOnly) {
  const std::vector<LayerSpec> specs = {layer_spec(LayerKind::Flatten, "flatten"),
                                        linear_spec("fc1", 12), layer_spec(LayerKind::Relu, "relu"),
                                        linear_spec("fc2", 5),
                                        layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
  NetworkOptions o;
  o.max_batch = 3;
  Network net(specs, {2, 3, 3}, o, Exec{});
  EXPECT_FALSE(net.layers()[3]->can_run_loss());
  EXPECT_FALSE(net.loss_in_last_layer());
  EXPECT_TRUE(with_env_switches(o, read_env_switches()).fuse_head_loss ==
              read_env_switches().head_loss);
  test::ScopedEnv off("CNN_HEAD_LOSS", "0");
  EXPECT_FALSE(with_env_switches(o, read_env_switches()).fuse_head_loss);
}
