// The autotune cache on the GPU: a second network of the same shapes takes every choice from the
// cache (saved to and read from a file in between) without timing, picks the same variants, and
// computes the same gradients as the network that timed them (up to atomicAdd's ordering).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "layers/gradcheck/gradcheck.h"
#include "layers/network.h"
#include "layers/tune_cache.h"
#include "runtime/device_identity.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

std::vector<float> grads_after_one_step(Network& net, uint64_t seed) {
  const int n = net.max_batch();
  const size_t per_image = size_t(shape_numel(net.input_chw()));
  const auto x = test::random_vector(n * per_image, seed);
  const auto labels = test::random_labels(n, net.num_classes(), seed + 1);
  Tensor d_x = test::to_device(x);
  Buffer<int32_t> d_labels(labels.size(), Device::CUDA);
  d_labels.copy_from(labels.data(), Device::CPU, labels.size());
  net.forward_backward(n, d_x.data(), d_labels.data(), 1.0f / n);
  return test::to_host(net.grads(), size_t(net.num_params()));
}

}  // namespace

TEST(GpuTuneCache, SecondNetworkReadsEveryChoiceAndComputesTheSame) {
  CNN_REQUIRE_GPU();
  const GradcheckCase c = gradcheck_small_network_case();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  NetworkOptions o;
  o.max_batch = 9;
  o.seed = seed;
  Exec ex;
  ex.device = Device::CUDA;
  const auto dir = test::fresh_dir("gpu_tune_cache", "second");
  const std::string path = (dir / "autotune.json").string();
  TuneIdentity id = device_identity(true);
  id["build"] = "test";
  EXPECT_EQ(id.count("compute_capability"), 1u);

  TuneCache first_cache(id);
  Network first(c.specs, c.input_chw, o, ex);
  const std::vector<std::string> timed = first.autotune(&first_cache);
  ASSERT_FALSE(timed.empty());
  EXPECT_EQ(first_cache.size(), timed.size());
  for (const auto& l : timed) EXPECT_FALSE(test::contains(l, "[cached]")) << l;
  first_cache.save(path);

  std::string note;
  TuneCache second_cache = TuneCache::load(path, id, &note);
  EXPECT_EQ(note, "");
  Network second(c.specs, c.input_chw, o, ex);
  const std::vector<std::string> cached = second.autotune(&second_cache);
  ASSERT_EQ(cached.size(), timed.size());
  for (size_t i = 0; i < cached.size(); ++i) {
    std::printf("  %s\n", cached[i].c_str());
    EXPECT_TRUE(test::contains(cached[i], "[cached]")) << cached[i];
    // The same variant: the line starts "<layer> <pass>: <algo>" in both.
    EXPECT_EQ(cached[i].substr(0, cached[i].find(' ', cached[i].find(": ") + 2)),
              timed[i].substr(0, timed[i].find(' ', timed[i].find(": ") + 2)));
  }
  EXPECT_FALSE(second_cache.changed());

  const std::vector<float> g1 = grads_after_one_step(first, seed);
  const std::vector<float> g2 = grads_after_one_step(second, seed);
  ASSERT_EQ(g1.size(), g2.size());
  // atomicAdd reductions may differ in the last bits between any two runs; the choices, not the
  // summation order, are what the cache decides, so compare as the other GPU tests do.
  EXPECT_LT(test::max_rel_error(g2, g1), 1e-5);

  // Another precision is another key: nothing cached applies, everything is timed again.
  Exec tf32 = ex;
  tf32.precision = Precision::TF32;
  Network third(c.specs, c.input_chw, o, tf32);
  for (const auto& l : third.autotune(&second_cache))
    EXPECT_FALSE(test::contains(l, "[cached]")) << l;
}
