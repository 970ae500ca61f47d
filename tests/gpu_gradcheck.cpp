// Gradient checks on the GPU: the float Network's CUDA backward against the CPU-double numerical
// gradient (rel error < 1e-2), every layer case and the small network, atomic and deterministic.
#include <gtest/gtest.h>

#include "layers/gradcheck/gradcheck.h"
#include "tests/test_util.h"

using namespace cnn;

TEST(GpuGradcheck, EveryLayerAndSmallNetwork) {
  CNN_REQUIRE_GPU();
  auto cases = gradcheck_layer_cases();
  cases.push_back(gradcheck_small_network_case());
  for (bool deterministic : {false, true}) {
    for (bool fuse : {false, true}) {
      for (const auto& c : cases) {
        GradcheckOptions o;
        o.seed = test::fresh_seed();
        o.batch = 3;
        Exec ex;
        ex.device = Device::CUDA;
        ex.deterministic = deterministic;
        SCOPED_TRACE(c.title + " det " + std::to_string(deterministic) + " fuse " +
                     std::to_string(fuse) + " seed " + std::to_string(o.seed));
        GradcheckResult r = gradcheck_network(c.specs, c.input_chw, o, ex, fuse);
        std::printf("%s (deterministic=%d fuse=%d)\n%s", c.title.c_str(), deterministic, fuse,
                    format_gradcheck(r).c_str());
        EXPECT_TRUE(r.passed()) << format_gradcheck(r);
      }
    }
  }
}
