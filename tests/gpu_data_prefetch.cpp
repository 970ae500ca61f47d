// The pinned-host prefetch path to the GPU: batches identical to the CPU gather.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "data/batch_sampler.h"
#include "data/gather.h"
#include "data/prefetch.h"
#include "runtime/memory.h"
#include "tests/test_util.h"

using namespace cnn;

TEST(GpuDataPrefetch, DeliversTheCpuBatchesToTheDevice) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Dataset d;
  d.n = 203;
  d.c = 1;
  d.h = 28;
  d.w = 28;
  auto px = test::random_labels(size_t(d.n) * 784, 256, seed);
  d.images.assign(px.begin(), px.end());
  d.labels = test::random_labels(d.n, 10, seed + 1);
  for (int k = 0; k < 10; ++k) d.class_names.push_back(std::to_string(k));
  AugmentOptions aug{2, true};
  GatherParams p = make_gather_params(1, 28, 28, Normalization{{0.13f}, {0.31f}}, &aug, seed, 2);
  const int bs = 32;
  HostPrefetcher pf(d, bs, Device::CUDA, 2);
  BatchSampler s(d.n, bs, true, false, seed);
  s.start_epoch(2);
  pf.start_epoch(p, s);
  Buffer<float> d_x(bs * 784, Device::CUDA);  // (B, 1, 28, 28)
  Buffer<int32_t> d_y(bs, Device::CUDA);      // (B)
  BatchSampler check(d.n, bs, true, false, seed);
  check.start_epoch(2);
  std::vector<float> ref(bs * 784);
  std::vector<int32_t> ref_y(bs), y(bs);
  const int32_t* idx = nullptr;
  int count = 0;
  while (check.next(&idx, &count)) {
    test::poison_device(d_x.data(), d_x.size());
    ASSERT_EQ(pf.next(d_x.data(), d_y.data()), count);
    stream_sync(Device::CUDA, nullptr);
    auto x = test::to_host(d_x.data(), size_t(count) * 784);
    raw_copy(y.data(), Device::CPU, d_y.data(), Device::CUDA, count * sizeof(int32_t));
    gather_batch_cpu(p, d.images.data(), d.labels.data(), d.n, idx, count, ref.data(),
                     ref_y.data());
    ASSERT_EQ(std::memcmp(x.data(), ref.data(), x.size() * sizeof(float)), 0);
    ASSERT_TRUE(std::equal(ref_y.begin(), ref_y.begin() + count, y.begin()));
  }
  EXPECT_EQ(pf.next(d_x.data(), d_y.data()), 0);
  std::printf("host loader to GPU: %.0f images/s\n",
              measure_loader_images_per_s(d, p, 64, 20, Device::CUDA));
}
