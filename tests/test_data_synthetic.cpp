// The synthetic shapes dataset: deterministic from its seed, balanced, visibly different classes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "data/load_data.h"
#include "data/synthetic.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

TEST(DataSynthetic, DeterministicFromSeed) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Dataset a = make_synthetic(50, 6, seed, SyntheticSplit::Train);
  Dataset b = make_synthetic(50, 6, seed, SyntheticSplit::Train);
  EXPECT_EQ(a.images, b.images);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_NE(make_synthetic(50, 6, seed + 1, SyntheticSplit::Train).images, a.images);
  EXPECT_NE(make_synthetic(50, 6, seed, SyntheticSplit::Test).images, a.images);
  // Sample i does not depend on how many samples are made.
  Dataset c = make_synthetic(20, 6, seed, SyntheticSplit::Train);
  EXPECT_TRUE(std::equal(c.images.begin(), c.images.end(), a.images.begin()));
}

TEST(DataSynthetic, ShapesAndLabels) {
  Dataset d = make_synthetic(100, 10, 7, SyntheticSplit::Train);
  EXPECT_EQ(d.n, 100);
  EXPECT_EQ(d.c, 1);
  EXPECT_EQ(d.h, 28);
  EXPECT_EQ(d.w, 28);
  EXPECT_EQ(d.num_classes(), 10);
  validate_dataset(d, "synthetic");
  std::vector<int> per_class(10, 0);
  for (int32_t l : d.labels) ++per_class[l];
  for (int c : per_class) EXPECT_EQ(c, 10);
  // Every image shows a bright shape on a dark background.
  for (int i = 0; i < d.n; ++i) {
    const uint8_t* p = d.images.data() + i * 784;
    int bright = 0;
    for (int j = 0; j < 784; ++j) bright += p[j] > 128;
    EXPECT_GT(bright, 15) << "image " << i;
    EXPECT_LT(bright, 400) << "image " << i;
  }
  Dataset rgb = make_synthetic(4, 3, 7, SyntheticSplit::Test, 3, 32, 20);
  EXPECT_EQ(rgb.images.size(), 4u * 3 * 32 * 20);
  EXPECT_TRUE(std::equal(rgb.images.begin(), rgb.images.begin() + 640, rgb.images.begin() + 640));
  EXPECT_THROW(make_synthetic(10, 11, 1, SyntheticSplit::Train), Error);
  EXPECT_THROW(make_synthetic(10, 1, 1, SyntheticSplit::Train), Error);
}

TEST(DataSynthetic, ClassesAreSeparable) {
  // The class-mean images must differ clearly, and a nearest-class-mean classifier (far weaker
  // than a CNN) must already beat chance by a wide margin on the test split.
  const int classes = 4;
  Dataset train = make_synthetic(800, classes, 11, SyntheticSplit::Train);
  Dataset test = make_synthetic(400, classes, 11, SyntheticSplit::Test);
  std::vector<std::vector<double>> mean(classes, std::vector<double>(784, 0));
  for (int i = 0; i < train.n; ++i)
    for (int j = 0; j < 784; ++j) mean[train.labels[i]][j] += train.images[i * 784 + j];
  for (auto& m : mean)
    for (double& v : m) v /= train.n / classes;
  int correct = 0;
  for (int i = 0; i < test.n; ++i) {
    int best = 0;
    double best_d = 1e300;
    for (int k = 0; k < classes; ++k) {
      double dist = 0;
      for (int j = 0; j < 784; ++j) dist += std::pow(test.images[i * 784 + j] - mean[k][j], 2);
      if (dist < best_d) best_d = dist, best = k;
    }
    correct += best == test.labels[i];
  }
  EXPECT_GT(correct, test.n * 6 / 10) << correct << " of " << test.n;
}

TEST(DataSynthetic, LoadDataDispatch) {
  DataOptions opt;
  opt.format = DataFormat::Synthetic;
  opt.synthetic.train = 200;
  opt.synthetic.test = 60;
  opt.synthetic.classes = 5;
  opt.validation_split = 0.1;
  DataSplits s = load_data(opt);
  EXPECT_EQ(s.train.n, 180);
  EXPECT_EQ(s.val.n, 20);
  EXPECT_EQ(s.test.n, 60);
  EXPECT_EQ(s.train.class_names, synthetic_class_names(5));
  opt.validation_split = 1.0;
  EXPECT_THROW(load_data(opt), Error);
}
