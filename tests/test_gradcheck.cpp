// Gradient checks on the CPU: the double-precision references against central differences
// (rel error < 1e-6), and the float Network's backward on the CPU (< 1e-2).
#include <gtest/gtest.h>

#include "layers/gradcheck/gradcheck.h"
#include "layers/ref_network.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {
GradcheckOptions options() {
  GradcheckOptions o;
  o.seed = test::fresh_seed();
  return o;
}
}  // namespace

TEST(Gradcheck, EveryLayerReferenceInDouble) {
  for (const auto& c : gradcheck_layer_cases()) {
    GradcheckOptions o = options();
    SCOPED_TRACE(c.title + " seed " + std::to_string(o.seed));
    GradcheckResult r = gradcheck_reference(c.specs, c.input_chw, o);
    std::printf("%s\n%s", c.title.c_str(), format_gradcheck(r).c_str());
    EXPECT_TRUE(r.passed()) << format_gradcheck(r);
  }
}

TEST(Gradcheck, SmallNetworkReferenceInDouble) {
  GradcheckCase c = gradcheck_small_network_case();
  GradcheckOptions o = options();
  o.batch = 3;
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  GradcheckResult r = gradcheck_reference(c.specs, c.input_chw, o);
  std::printf("%s", format_gradcheck(r).c_str());
  EXPECT_TRUE(r.passed()) << format_gradcheck(r);
}

TEST(Gradcheck, FloatNetworkOnCpuFusedAndUnfused) {
  GradcheckCase c = gradcheck_small_network_case();
  for (bool fuse : {true, false}) {
    GradcheckOptions o = options();
    SCOPED_TRACE("fuse " + std::to_string(fuse) + " seed " + std::to_string(o.seed));
    GradcheckResult r = gradcheck_network(c.specs, c.input_chw, o, Exec{}, fuse);
    std::printf("%s", format_gradcheck(r).c_str());
    EXPECT_TRUE(r.passed()) << format_gradcheck(r);
  }
}

// Each case with its relus apart and folded (into a conv, linear or batchnorm), on one set of
// central differences.
TEST(Gradcheck, EveryLayerFloatOnCpu) {
  for (const auto& c : gradcheck_layer_cases()) {
    GradcheckOptions o = options();
    SCOPED_TRACE(c.title + " seed " + std::to_string(o.seed));
    Gradchecker check(c.specs, c.input_chw, o);
    for (const bool fuse : {false, true}) {
      const GradcheckResult r = check.network(Exec{}, fuse);
      EXPECT_TRUE(r.passed()) << "fuse " << fuse << "\n" << format_gradcheck(r);
    }
  }
}

// The check must be able to fail: a backward that is 5% off in any single parameter tensor (a
// missing term, a wrong scale) fails the float tolerance, and the failing row names the tensor.
TEST(Gradcheck, CatchesAWrongGradientInEveryTensor) {
  const GradcheckCase c = gradcheck_layer_cases().at(15);  // residual: both paths feed the prefix
  GradcheckOptions o = options();
  SCOPED_TRACE(c.title + " seed " + std::to_string(o.seed));
  Gradchecker check(c.specs, c.input_chw, o);
  const std::vector<double> right = check.reference_parameter_gradient();
  ASSERT_TRUE(check.parameters("right", right, 1e-6).passed());
  const RefNetwork ref(c.specs, c.input_chw, check.batch());
  for (const ParamInfo& info : ref.param_infos()) {
    std::vector<double> wrong = right;
    for (int64_t i = 0; i < info.numel(); ++i) wrong[size_t(info.offset + i)] *= 1.05;
    const GradcheckResult r = check.parameters("wrong " + info.name, wrong, 1e-2);
    EXPECT_FALSE(r.passed()) << format_gradcheck(r);
    for (const GradcheckRow& row : r.rows)
      if (row.what != info.name) {
        EXPECT_LT(row.rel_error, 1e-6) << row.what;
      }
  }
}

// denominator_floor: an error that is large for its own tensor but small against the network's
// largest gradient passes only with the floor; an error of the network's own size still fails.
TEST(Gradcheck, DenominatorFloorMeasuresAgainstTheNetworksLargestGradient) {
  const GradcheckCase c = gradcheck_layer_cases().at(0);  // prefix conv, conv, head
  GradcheckOptions o = options();
  SCOPED_TRACE(c.title + " seed " + std::to_string(o.seed));
  Gradchecker plain(c.specs, c.input_chw, o);
  o.denominator_floor = 0.1;
  Gradchecker floored(c.specs, c.input_chw, o);
  const std::vector<double> right = plain.reference_parameter_gradient();
  const RefNetwork ref(c.specs, c.input_chw, plain.batch());
  double rms_max = 0;  // the largest per-coordinate RMS gradient of a tensor
  for (const ParamInfo& info : ref.param_infos()) {
    double sq = 0;
    for (int64_t i = 0; i < info.numel(); ++i)
      sq += right[size_t(info.offset + i)] * right[size_t(info.offset + i)];
    rms_max = std::max(rms_max, std::sqrt(sq / double(info.numel())));
  }
  ASSERT_GT(rms_max, 0);
  const ParamInfo& bias = ref.param_infos().at(1);  // prefix.bias
  ASSERT_EQ(bias.name, "prefix.bias");
  for (const double shift : {1e-3, 1.0}) {
    // Every coordinate of the bias moved by shift x rms_max: relative to the floor
    // (0.1 x rms_max per coordinate) that is an error of 10 x shift.
    std::vector<double> wrong = right;
    for (int64_t i = 0; i < bias.numel(); ++i) wrong[size_t(bias.offset + i)] += shift * rms_max;
    const GradcheckResult f = floored.parameters("floored", wrong, 1e-1);
    EXPECT_EQ(f.passed(), shift < 0.01) << format_gradcheck(f);
  }
  EXPECT_TRUE(plain.parameters("plain", right, 1e-6).passed());
}

// The shared numerical gradients give the same verdicts as the one-shot functions.
TEST(Gradcheck, SharedChecksMatchTheOneShotFunctions) {
  const GradcheckCase c = gradcheck_small_network_case();
  GradcheckOptions o = options();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  Gradchecker check(c.specs, c.input_chw, o);
  const GradcheckResult shared = check.network(Exec{}, true);
  const GradcheckResult alone = gradcheck_network(c.specs, c.input_chw, o, Exec{}, true);
  ASSERT_EQ(shared.rows.size(), alone.rows.size());
  for (size_t i = 0; i < shared.rows.size(); ++i) {
    EXPECT_EQ(shared.rows[i].what, alone.rows[i].what);
    EXPECT_EQ(shared.rows[i].checked, alone.rows[i].checked);
    EXPECT_DOUBLE_EQ(shared.rows[i].rel_error, alone.rows[i].rel_error);
  }
}

// The shortcut the numerical gradients take: after perturbing one parameter, running the network
// from that parameter's step on gives exactly the loss of a whole pass, in every tensor of a
// network with residual blocks (the add reads an activation from before the block).
TEST(Gradcheck, LossFromAParametersStepEqualsTheWholePass) {
  const GradcheckCase c = gradcheck_layer_cases().at(16);  // residual with projection
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = 2;
  const RefNetwork ref(c.specs, c.input_chw, n);
  const std::vector<float> pf = test::random_vector(size_t(ref.num_params()), seed, -0.5f, 0.5f);
  const std::vector<float> xf = test::random_vector(size_t(ref.input_count()), seed + 1);
  std::vector<double> params(pf.begin(), pf.end());
  const std::vector<double> x(xf.begin(), xf.end());
  const std::vector<int32_t> labels = {1, 3};
  const std::vector<double> probe;
  const auto acts = ref.activations(params, x);
  for (const ParamInfo& info : ref.param_infos()) {
    const int64_t i = info.offset + info.numel() / 2;
    params[size_t(i)] += 0.25;
    EXPECT_EQ(ref.loss_from(ref.step_of_param(i), acts, params, labels, probe),
              ref.loss(params, x, labels, probe))
        << info.name;
    params[size_t(i)] -= 0.25;
  }
}
