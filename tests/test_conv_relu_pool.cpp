// The fused conv -> ReLU -> 2x2 max-pool on the CPU: when it applies, its CPU twin, and the
// Network's fusion (PoolFusion::On on the CPU runs the twin): bitwise the same logits, loss and
// gradients as the unfused network with the reference kernels (the twin composes exactly those),
// the relu / pool layers skipped, the CNN_FUSE_POOL=0 switch, and the shapes that must not fuse.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/conv/conv_relu_pool.h"
#include "layers/network.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;
using test::one_channel_conv;

namespace {

// The reference network's layout, narrower, with a k x k first conv.
std::vector<LayerSpec> small_net(int k, int pad, Algo algo) {
  ConvNetSizes z;
  z.conv1 = 6;
  z.kernel1 = k;
  z.pad1 = pad;
  z.conv2 = 4;
  z.kernel2 = 3;
  z.pad2 = 1;
  z.fc1 = 12;
  std::vector<LayerSpec> v = conv_net_specs(z);
  for (auto& s : v) s.algo = algo;
  return v;
}

}  // namespace

TEST(ConvReluPool, Applicability) {
  EXPECT_TRUE(
      conv_relu_pool_applicable(one_channel_conv(128, 32, 28, 28, 5, 2)));  // conv1 of mnist.yaml
  EXPECT_TRUE(conv_relu_pool_applicable(one_channel_conv(1, 1, 14, 2, 7, 3)));
  EXPECT_TRUE(conv_relu_pool_applicable(one_channel_conv(3, 5, 10, 8, 3, 0)));  // 8x6 output
  EXPECT_FALSE(conv_relu_pool_applicable(one_channel_conv(3, 5, 7, 8, 3, 1)));  // odd output height
  EXPECT_FALSE(conv_relu_pool_applicable(one_channel_conv(3, 5, 8, 8, 4, 2)));  // even kernel
  EXPECT_FALSE(conv_relu_pool_applicable(one_channel_conv(3, 5, 18, 18, 9, 4)));  // 9x9: no kernel
  Conv2dShape s = one_channel_conv(3, 5, 8, 8, 3, 1);
  s.c = 2;
  EXPECT_FALSE(conv_relu_pool_applicable(s));
  s = one_channel_conv(3, 5, 8, 8, 3, 1);
  s.stride_h = s.stride_w = 2;
  EXPECT_FALSE(conv_relu_pool_applicable(s));
  s = one_channel_conv(3, 5, 8, 8, 3, 1);
  s.kw = 5;
  s.pad_w = 2;
  EXPECT_FALSE(conv_relu_pool_applicable(s));
  const MaxPoolShape p = conv_relu_pool_pool_shape(one_channel_conv(3, 5, 10, 8, 3, 0));
  EXPECT_EQ(p.n, 3);
  EXPECT_EQ(p.c, 5);
  EXPECT_EQ(p.oh(), 4);
  EXPECT_EQ(p.ow(), 3);
  std::vector<float> buf(1000);
  std::vector<int32_t> am(1000);
  EXPECT_THROW(conv_relu_pool_forward(one_channel_conv(1, 1, 7, 8, 3, 1), buf.data(), buf.data(),
                                      nullptr, buf.data(), am.data(), Exec{}),
               Error);
}

// Windows whose pre-activations are all <= 0 pool to 0 at their FIRST element, exactly as
// conv -> relu -> maxpool does; a positive one wins.
TEST(ConvReluPool, CpuTwinTiesGoToTheFirstElement) {
  const Conv2dShape s = one_channel_conv(1, 2, 2, 4, 1, 0);  // 1x1 kernel: the conv is w * x + b
  const std::vector<float> x = {-1, -3, 2, 2,                //
                                -2, -1, 1, 3};
  const std::vector<float> w = {1, -1}, b = {0, 0};
  std::vector<float> y(4);
  std::vector<int32_t> am(4);
  conv_relu_pool_forward_cpu(s, x.data(), w.data(), b.data(), y.data(), am.data());
  // Channel 0 (w = 1): window 0 all negative -> 0 at index 0; window 1 max 3 at (1, 3).
  // Channel 1 (w = -1): window 0 max 3 at (0, 1); window 1 all negative -> 0 at index 2.
  EXPECT_EQ(y, (std::vector<float>{0, 3, 3, 0}));
  EXPECT_EQ(am, (std::vector<int32_t>{0, 7, 1, 2}));
  // Backward: only windows with y > 0 pass their gradient, to the argmax's input.
  const std::vector<float> dy = {10, 20, 30, 40};
  std::vector<float> dw = {0, 0}, db = {0, 0};
  conv_relu_pool_backward_weight_cpu(s, x.data(), y.data(), dy.data(), am.data(), dw.data(),
                                     db.data());
  EXPECT_EQ(dw, (std::vector<float>{20 * 3, 30 * -3}));
  EXPECT_EQ(db, (std::vector<float>{20, 30}));
}

// PoolFusion::On on the CPU runs the CPU twin, which composes the reference kernels that the
// unfused network runs with algo naive: every output bit for bit equal.
TEST(ConvReluPool, CpuNetworkFusedEqualsUnfusedExactly) {
  test::ScopedEnv no_switch("CNN_FUSE_POOL", nullptr);
  for (int k : {3, 5}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("k " + std::to_string(k) + " seed " + std::to_string(seed));
    const auto specs = small_net(k, k / 2, Algo::Naive);
    const test::NetworkRun a =
        test::run_network_once(specs, {1, 12, 8}, Exec{}, PoolFusion::On, 5, seed);
    const test::NetworkRun b =
        test::run_network_once(specs, {1, 12, 8}, Exec{}, PoolFusion::Off, 5, seed);
    EXPECT_TRUE(a.fused);
    EXPECT_FALSE(b.fused);
    EXPECT_EQ(a.logits, b.logits);
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.grads, b.grads);
  }
}

TEST(ConvReluPool, NetworkFusesOnlyWhereItApplies) {
  test::ScopedEnv no_switch("CNN_FUSE_POOL", nullptr);
  NetworkOptions o;
  o.max_batch = 2;
  o.fuse_pool = PoolFusion::On;
  {
    Network net(small_net(5, 2, Algo::Auto), {1, 12, 8}, o, Exec{});
    ASSERT_EQ(net.fusion_notes().size(), 1u);
    EXPECT_NE(net.fusion_notes()[0].find("conv1 + relu1 + pool1"), std::string::npos);
    EXPECT_TRUE(net.layers()[0]->fused_pool());
  }
  {  // Auto: CUDA only.
    NetworkOptions a = o;
    a.fuse_pool = PoolFusion::Auto;
    Network net(small_net(5, 2, Algo::Auto), {1, 12, 8}, a, Exec{});
    EXPECT_TRUE(net.fusion_notes().empty());
  }
  {  // The switch.
    test::ScopedEnv env("CNN_FUSE_POOL", "0");
    Network net(small_net(5, 2, Algo::Auto), {1, 12, 8}, with_env_switches(o, read_env_switches()),
                Exec{});
    EXPECT_TRUE(net.fusion_notes().empty());
  }
  {  // ReLU not fused: nothing to fuse into.
    NetworkOptions f = o;
    f.fuse_relu = false;
    Network net(small_net(5, 2, Algo::Auto), {1, 12, 8}, f, Exec{});
    EXPECT_TRUE(net.fusion_notes().empty());
  }
  {  // Odd conv output (7x8 image, 'same' 3x3): the pool does not tile it; runs apart.
    Network net(small_net(3, 1, Algo::Auto), {1, 6, 8}, o, Exec{});
    EXPECT_FALSE(net.fusion_notes().empty());
    Network odd(small_net(3, 0, Algo::Auto), {1, 7, 10}, o, Exec{});
    EXPECT_TRUE(odd.fusion_notes().empty());
  }
  {  // Two input channels, or a 3x3 stride-2 pool: apart.
    Network two(small_net(5, 2, Algo::Auto), {2, 12, 8}, o, Exec{});
    EXPECT_TRUE(two.fusion_notes().empty());
    auto specs = small_net(5, 2, Algo::Auto);
    specs[2] = maxpool2d_spec("pool1", 3, 2);
    Network p3(specs, {1, 12, 8}, o, Exec{});
    EXPECT_TRUE(p3.fusion_notes().empty());
  }
  {  // Not the first layer (its input gradient would be needed): apart.
    auto specs = small_net(5, 2, Algo::Auto);
    specs.insert(specs.begin(), conv2d_spec("conv0", 1, 1, 1, 1, 0));
    Network net(specs, {1, 12, 8}, o, Exec{});
    EXPECT_TRUE(net.fusion_notes().empty());
  }
}
