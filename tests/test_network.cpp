#include <gtest/gtest.h>

#include "runtime/error.h"
#include "layers/gradcheck/gradcheck.h"
#include "layers/network.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

std::vector<float> run_forward(Network& net, const std::vector<float>& x, int n) {
  const float* logits = net.forward(n, x.data());
  return std::vector<float>(logits, logits + size_t(n) * net.num_classes());
}

}  // namespace

TEST(Network, SameSeedSameWeightsOtherSeedOther) {
  GradcheckCase c = gradcheck_small_network_case();
  NetworkOptions o;
  o.max_batch = 4;
  o.seed = 42;
  Network a(c.specs, c.input_chw, o, Exec{}), b(c.specs, c.input_chw, o, Exec{});
  EXPECT_EQ(a.params_to_host(), b.params_to_host());
  o.seed = 43;
  Network d(c.specs, c.input_chw, o, Exec{});
  EXPECT_NE(a.params_to_host(), d.params_to_host());
  // torch.nn names and layouts, weight before bias.
  ASSERT_EQ(a.param_infos().size(), 8u);
  EXPECT_EQ(a.param_infos()[0].name, "conv1.weight");
  EXPECT_EQ(shape_str(a.param_infos()[0].shape), "(4, 1, 3, 3)");
  EXPECT_EQ(a.param_infos()[7].name, "fc2.bias");
}

TEST(Network, FusedReluGivesSameOutputsAndGradients) {
  GradcheckCase c = gradcheck_small_network_case();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  NetworkOptions o;
  o.max_batch = 5;
  o.seed = seed;
  Network fused(c.specs, c.input_chw, o, Exec{});
  o.fuse_relu = false;
  Network plain(c.specs, c.input_chw, o, Exec{});
  auto x = test::random_vector(5 * 144, seed);
  auto labels = test::random_labels(5, 10, seed);
  EXPECT_EQ(run_forward(fused, x, 5), run_forward(plain, x, 5));
  fused.forward_backward(5, x.data(), labels.data(), 0.2f);
  plain.forward_backward(5, x.data(), labels.data(), 0.2f);
  EXPECT_EQ(fused.grads_to_host(), plain.grads_to_host());
}

TEST(Network, PartialBatchMatchesFullBatchRows) {
  GradcheckCase c = gradcheck_small_network_case();
  NetworkOptions o;
  o.max_batch = 6;
  Network net(c.specs, c.input_chw, o, Exec{});
  auto x = test::random_vector(6 * 144, test::fresh_seed());
  auto full = run_forward(net, x, 6);
  auto part = run_forward(net, x, 2);
  for (size_t i = 0; i < part.size(); ++i) EXPECT_EQ(part[i], full[i]);
  EXPECT_THROW(net.forward(7, x.data()), Error);
}
