// Gradient checks on the CPU: the double-precision references against central differences
// (rel error < 1e-6), and the float Network's backward on the CPU (< 1e-2).
#include <gtest/gtest.h>

#include "layers/gradcheck/gradcheck.h"
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

TEST(Gradcheck, EveryLayerFloatOnCpu) {
  for (const auto& c : gradcheck_layer_cases()) {
    GradcheckOptions o = options();
    SCOPED_TRACE(c.title + " seed " + std::to_string(o.seed));
    GradcheckResult r = gradcheck_network(c.specs, c.input_chw, o, Exec{}, false);
    EXPECT_TRUE(r.passed()) << format_gradcheck(r);
  }
}
