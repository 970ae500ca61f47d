// Evaluation over a split (app/train/evaluate.h): with test-time flipping each prediction is the
// argmax of the image's logits plus those of its mirror image, checked against forward passes
// run by hand; the loss stays that of the plain images.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "app/train/batch_source.h"
#include "app/train/evaluate.h"
#include "data/gather.h"
#include "layers/network.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

std::vector<LayerSpec> net_specs() {
  return {conv2d_spec("conv1", 3, 3, 3, 1, 1), layer_spec(LayerKind::Relu, "relu1"),
          layer_spec(LayerKind::Flatten, "flatten"), linear_spec("fc1", 4),
          layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
}

// The logits of every image of d, mirrored or not, by plain forward passes.
std::vector<float> logits_by_hand(Network& net, const Dataset& d, const Normalization& norm,
                                  bool mirror) {
  GatherParams p = make_gather_params(d.c, d.h, d.w, norm, nullptr, 0);
  p.mirror = mirror;
  std::vector<int32_t> idx(size_t(d.n));
  for (int i = 0; i < d.n; ++i) idx[size_t(i)] = i;
  std::vector<float> x(size_t(d.n) * d.c * d.h * d.w);
  std::vector<int32_t> y(size_t(d.n));
  gather_batch_cpu(p, d.images.data(), d.labels.data(), d.n, idx.data(), int(d.n), x.data(),
                   y.data());
  const float* logits = net.forward(int(d.n), x.data());
  return std::vector<float>(logits, logits + size_t(d.n) * 4);
}

}  // namespace

TEST(Evaluate, FlipPredictsFromTheSumOfPlainAndMirroredLogits) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = 23;  // one batch: the hand-run forward holds every image
  const Normalization norm{{0.4f}, {0.3f}};
  // Random images and weights; datasets are drawn until the mirror changes the accuracy, so that
  // the two modes can be told apart (a few draws at most).
  for (int attempt = 0; attempt < 40; ++attempt) {
    Dataset d = test::random_dataset(n, 1, 5, 6, 4, seed + 7 * uint64_t(attempt));
    NetworkOptions o;
    o.max_batch = n;
    o.seed = seed + uint64_t(attempt);
    Network net(net_specs(), {1, 5, 6}, o, Exec{});
    const std::vector<float> plain = logits_by_hand(net, d, norm, false);
    const std::vector<float> mirrored = logits_by_hand(net, d, norm, true);
    int64_t correct_flip = 0, correct_plain = 0;
    for (int i = 0; i < n; ++i) {
      const size_t a = size_t(i) * 4;
      int best_flip = 0, best_plain = 0;
      for (int k = 1; k < 4; ++k) {
        if (plain[a + k] + mirrored[a + k] > plain[a + best_flip] + mirrored[a + best_flip])
          best_flip = k;
        if (plain[a + k] > plain[a + best_plain]) best_plain = k;
      }
      correct_flip += best_flip == d.labels[size_t(i)];
      correct_plain += best_plain == d.labels[size_t(i)];
    }
    if (correct_flip == correct_plain) continue;

    BatchSource src(d, norm, nullptr, 0, n, false, false, Exec{}, true);
    const EvalResult with_flip = evaluate(net, src, true);
    const EvalResult without = evaluate(net, src, false);
    EXPECT_EQ(with_flip.count, n);
    EXPECT_DOUBLE_EQ(with_flip.accuracy, double(correct_flip) / n);
    EXPECT_DOUBLE_EQ(without.accuracy, double(correct_plain) / n);
    EXPECT_DOUBLE_EQ(with_flip.loss, without.loss);  // the plain images' loss either way
    int64_t diagonal = 0;
    for (int t = 0; t < 4; ++t) diagonal += with_flip.confusion[size_t(t) * 5];
    EXPECT_EQ(diagonal, correct_flip);
    return;
  }
  FAIL() << "the mirror never changed the accuracy of a random net on random images";
}
