// The host prefetch path delivers exactly the batches of a direct CPU gather, in sampler order.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "data/batch_sampler.h"
#include "data/gather.h"
#include "data/prefetch.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

TEST(DataPrefetch, SameBatchesAsDirectGather) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Dataset d = test::random_dataset(101, 3, 6, 5, 7, seed);
  AugmentOptions aug{2, true};
  const Normalization norm{{0.2f, 0.3f, 0.4f}, {0.5f, 0.6f, 0.7f}};
  const int bs = 16;
  HostPrefetcher pf(d, bs, Device::CPU, 3);
  std::vector<float> x(bs * d.image_size()), ref(bs * d.image_size());
  std::vector<int32_t> y(bs), ref_y(bs);
  for (int64_t epoch : {0, 1}) {
    for (int64_t position : {int64_t(0), int64_t(4)}) {  // a fresh epoch and a resumed one
      GatherParams p = make_gather_params(3, 6, 5, norm, &aug, seed, epoch);
      BatchSampler s(d.n, bs, true, false, seed);
      s.start_epoch(epoch, position);
      pf.start_epoch(p, s);
      BatchSampler check(d.n, bs, true, false, seed);
      check.start_epoch(epoch, position);
      const int32_t* idx = nullptr;
      int count = 0, batches = 0;
      while (check.next(&idx, &count)) {
        ASSERT_EQ(pf.next(x.data(), y.data()), count);
        gather_batch_cpu(p, d.images.data(), d.labels.data(), d.n, idx, count, ref.data(),
                         ref_y.data());
        ASSERT_EQ(std::memcmp(x.data(), ref.data(), count * d.image_size() * sizeof(float)), 0);
        ASSERT_TRUE(std::equal(ref_y.begin(), ref_y.begin() + count, y.begin()));
        ++batches;
      }
      EXPECT_EQ(batches, 7 - position);  // ceil(101 / 16) = 7
      EXPECT_EQ(pf.next(x.data(), y.data()), 0);
      EXPECT_EQ(pf.next(x.data(), y.data()), 0);
    }
  }
  // Restarting while an epoch is in flight abandons it cleanly.
  BatchSampler s(d.n, bs, true, false, seed);
  s.start_epoch(3);
  GatherParams p = make_gather_params(3, 6, 5, norm, &aug, seed, 3);
  pf.start_epoch(p, s);
  pf.next(x.data(), y.data());
  pf.start_epoch(p, s);
  EXPECT_EQ(pf.next(x.data(), y.data()), bs);
}

TEST(DataPrefetch, WorkerErrorsReachTheCaller) {
  Dataset d = test::random_dataset(10, 1, 4, 4, 2, test::fresh_seed());
  HostPrefetcher pf(d, 4, Device::CPU);
  GatherParams p = make_gather_params(1, 4, 4, Normalization{{0.f}, {1.f}}, nullptr, 1);
  BatchSampler big(20, 4, false, false, 1);  // indices beyond the dataset
  big.start_epoch(0);
  EXPECT_THROW(pf.start_epoch(p, big), Error);  // caught up front: sampler size mismatch
  BatchSampler s(10, 8, false, false, 1);
  s.start_epoch(0);
  EXPECT_THROW(pf.start_epoch(p, s), Error);  // batch larger than the prefetcher's
  std::vector<float> x(64);
  std::vector<int32_t> y(4);
  EXPECT_THROW(pf.next(x.data(), y.data()), Error);  // before start_epoch
}

TEST(DataPrefetch, LoaderThroughputIsMeasured) {
  Dataset d = test::random_dataset(300, 1, 28, 28, 10, test::fresh_seed());
  GatherParams p = make_gather_params(1, 28, 28, Normalization{{0.1f}, {0.3f}}, nullptr, 1);
  const double ips = measure_loader_images_per_s(d, p, 64, 12, Device::CPU);
  std::printf("host loader: %.0f images/s (CPU)\n", ips);
  EXPECT_GT(ips, 0);
}
