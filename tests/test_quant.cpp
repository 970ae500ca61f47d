// Int8 inference on the CPU: the integer twin against a plain reference, the rounding, a small
// trained network quantized (arg-max agreement with FP32), the quantized file's round trip and
// its refusals of files that are not what they claim.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>

#include "data/synthetic.h"
#include "kernels/quant/qadd.h"
#include "kernels/quant/qconv.h"
#include "kernels/quant/qconv_fused_classifier.h"
#include "kernels/quant/quantize.h"
#include "layers/checkpoint/safetensors.h"
#include "layers/fold_batchnorm.h"
#include "layers/network.h"
#include "layers/param_optimizer.h"
#include "layers/quant/calibration.h"
#include "layers/quant/int8_network.h"
#include "layers/quant/quant_file.h"
#include "layers/quant/quant_model.h"
#include "runtime/error.h"
#include "tests/test_util.h"

namespace cnn {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<int8_t> random_int8(size_t n, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<int8_t> v(n);
  for (auto& x : v) x = int8_t(d(rng));
  return v;
}

// x (N, H, W, CP) with zero padding channels; w (OC, KH, KW, CGP) with zero padding.
struct QConvCase {
  QConvShape s;
  std::vector<int8_t> x, w;
  std::vector<float> mult, add;
};

QConvCase make_case(QConvShape s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  s.cp = round_up4(s.c);
  s.ocp = round_up4(s.oc);
  s.cgp = qconv_weight_inner(s.c, s.groups);
  QConvCase k;
  k.x = random_int8(size_t(s.n) * s.h * s.w * s.cp, rng);
  for (size_t i = 0; i < k.x.size(); ++i)
    if (int(i % size_t(s.cp)) >= s.c) k.x[i] = 0;
  k.w = random_int8(size_t(s.oc) * s.kh * s.kw * s.cgp, rng);
  for (size_t i = 0; i < k.w.size(); ++i)
    if (int(i % size_t(s.cgp)) >= s.cg()) k.w[i] = 0;
  std::uniform_real_distribution<float> m(1e-4f, 3e-3f), a(-20.f, 20.f);
  for (int o = 0; o < s.oc; ++o) k.mult.push_back(m(rng)), k.add.push_back(a(rng));
  k.s = s;
  return k;
}

// Plain reference: the definition, one output at a time, in int64.
int64_t ref_sum(const QConvCase& k, int img, int y, int xo, int o) {
  const QConvShape& s = k.s;
  const int g = o / s.ocg();
  int64_t sum = 0;
  for (int ci = 0; ci < s.cg(); ++ci)
    for (int r = 0; r < s.kh; ++r)
      for (int q = 0; q < s.kw; ++q) {
        const int iy = y * s.stride_h - s.pad_h + r * s.dil_h;
        const int ix = xo * s.stride_w - s.pad_w + q * s.dil_w;
        if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
        const int c = g * s.cg() + ci;
        sum += int64_t(k.x[((size_t(img) * s.h + iy) * s.w + ix) * s.cp + c]) *
               k.w[((size_t(o) * s.kh + r) * s.kw + q) * s.cgp + ci];
      }
  return sum;
}

std::vector<QConvShape> awkward_shapes() {
  std::vector<QConvShape> v;
  auto add = [&](int n, int c, int h, int w, int oc, int k, int stride, int pad, int groups,
                 int pool) {
    QConvShape s;
    s.n = n, s.c = c, s.h = h, s.w = w, s.oc = oc, s.kh = s.kw = k;
    s.stride_h = s.stride_w = stride, s.pad_h = s.pad_w = pad, s.groups = groups;
    if (pool) s.pool_kh = s.pool_kw = s.pool_sh = s.pool_sw = pool;
    v.push_back(s);
  };
  add(2, 1, 9, 7, 5, 3, 1, 1, 1, 2);   // one input channel, odd sizes, pool
  add(3, 6, 8, 5, 7, 3, 2, 1, 1, 0);   // stride 2, channels not multiples of 4
  add(1, 8, 7, 7, 12, 3, 1, 1, 2, 2);  // groups of 4 channels (dp4a) + pool over odd size
  add(2, 6, 6, 9, 6, 5, 1, 2, 6, 0);   // depthwise, kernel 5
  add(2, 9, 5, 5, 6, 1, 1, 0, 3, 0);   // groups of 3 channels, 1x1
  add(4, 5, 3, 3, 10, 3, 1, 0, 1, 0);  // a linear layer: kernel = image
  QConvShape d;                        // dilation 2, pool with padding
  d.n = 2, d.c = 4, d.h = 9, d.w = 8, d.oc = 3, d.kh = d.kw = 3, d.pad_h = d.pad_w = 2;
  d.dil_h = d.dil_w = 2, d.pool_kh = d.pool_kw = 3, d.pool_sh = d.pool_sw = 2;
  d.pool_ph = d.pool_pw = 1;
  v.push_back(d);
  return v;
}

TEST(Quant, AccumulatorsMatchPlainReference) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const QConvShape& shape : awkward_shapes()) {
    const QConvCase k = make_case(shape, seed);
    const QConvShape& s = k.s;
    std::vector<int32_t> acc(size_t(s.n) * s.oh() * s.ow() * s.oc);
    qconv_accumulate_cpu(s, k.x.data(), k.w.data(), acc.data());
    for (int i = 0; i < s.n; ++i)
      for (int y = 0; y < s.oh(); ++y)
        for (int x = 0; x < s.ow(); ++x)
          for (int o = 0; o < s.oc; ++o)
            ASSERT_EQ(acc[((size_t(i) * s.oh() + y) * s.ow() + x) * s.oc + o],
                      ref_sum(k, i, y, x, o))
                << "c=" << s.c << " groups=" << s.groups << " at " << i << "," << y << "," << x
                << "," << o;
  }
}

TEST(Quant, EpilogueMatchesPlainReference) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const QConvShape& shape : awkward_shapes())
    for (bool relu : {false, true}) {
      const QConvCase k = make_case(shape, seed + 1);
      const QConvShape& s = k.s;
      const QEpilogue ep{k.mult.data(), k.add.data(), relu};
      std::vector<int8_t> y(size_t(s.n) * s.ph() * s.pw() * s.ocp, int8_t(99));
      std::vector<float> yf(size_t(s.n) * s.ph() * s.pw() * s.oc, NAN);
      qconv_forward(s, k.x.data(), k.w.data(), ep, y.data(), Exec{});
      qconv_forward_float(s, k.x.data(), k.w.data(), ep, yf.data(), Exec{});
      for (int i = 0; i < s.n; ++i)
        for (int py = 0; py < s.ph(); ++py)
          for (int px = 0; px < s.pw(); ++px)
            for (int o = 0; o < s.ocp; ++o) {
              const size_t at = ((size_t(i) * s.ph() + py) * s.pw() + px) * s.ocp + o;
              if (o >= s.oc) {
                ASSERT_EQ(y[at], 0) << "padding channel " << o;
                continue;
              }
              int best = -1000;
              float bestf = -INFINITY;
              for (int r = 0; r < s.pool_kh; ++r)
                for (int q = 0; q < s.pool_kw; ++q) {
                  const int oy = py * s.pool_sh - s.pool_ph + r;
                  const int ox = px * s.pool_sw - s.pool_pw + q;
                  if (oy < 0 || oy >= s.oh() || ox < 0 || ox >= s.ow()) continue;
                  float v = std::fma(float(ref_sum(k, i, oy, ox, o)), k.mult[size_t(o)],
                                     k.add[size_t(o)]);
                  if (relu) v = std::max(v, 0.f);
                  bestf = std::max(bestf, v);
                  const double clamped = std::min(127.0, std::max(-127.0, double(v)));
                  best = std::max(best, int(std::nearbyint(clamped)));
                }
              ASSERT_EQ(int(y[at]), best) << "groups=" << s.groups << " o=" << o;
              ASSERT_EQ(yf[((size_t(i) * s.ph() + py) * s.pw() + px) * s.oc + o], bestf);
            }
    }
}

// The tensor-core kernel's weights: row o is w's row o, then zeros to KP; rows from OC on are
// zero; the size is whole 64 x 64 tiles.
TEST(Quant, PacksTensorCoreWeightsIntoZeroPaddedTiles) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  QConvShape s;
  s.n = 2, s.c = 5, s.h = 7, s.w = 6, s.oc = 67, s.kh = s.kw = 3;
  QConvCase k = make_case(s, seed);
  s = k.s;
  ASSERT_TRUE(qconv_igemm_supported(s));
  const int64_t kk = 3 * 3 * 8, kp = 128, oct = 128;  // K = 72 -> 128; OCP = 68 -> 128
  ASSERT_EQ(qconv_igemm_weight_size(s), oct * kp);
  std::vector<int8_t> packed(size_t(oct * kp), int8_t(55));
  qconv_pack_igemm_weights(s, k.w.data(), packed.data());
  size_t bad = 0;
  for (int64_t o = 0; o < oct; ++o)
    for (int64_t i = 0; i < kp; ++i)
      bad += packed[size_t(o * kp + i)] != (o < s.oc && i < kk ? k.w[size_t(o * kk + i)] : 0);
  EXPECT_EQ(bad, 0u);
  QConvShape dw = s;
  dw.c = dw.oc = dw.groups = 4, dw.cp = dw.ocp = 4, dw.cgp = 1;
  EXPECT_FALSE(qconv_igemm_supported(dw));
  EXPECT_NE(error_of([&] {
              qconv_pack_igemm_weights(dw, k.w.data(), packed.data());
            }).find("tensor-core path"),
            std::string::npos);
}

QConvShape linear_shape(int n, int c, int h, int w, int oc) {
  QConvShape s;
  s.n = n, s.c = c, s.h = s.kh = h, s.w = s.kw = w, s.oc = oc;
  s.cp = s.cgp = round_up4(c), s.ocp = round_up4(oc);
  return s;
}

// The split rule of the tensor-core kernel on an H200's 132 SMs: LeNet's fc1 at batch 256 (2 x 16
// tiles, 49 k-tiles) splits 8 ways into 256 blocks, at batch 512 (64 tiles) 4 ways; conv2 (392
// tiles of 32 pooled positions) and a short K (2 k-tiles) stay whole; 8 is the cap, and every
// split keeps >= 4 k-tiles.
TEST(Quant, TensorCoreSplitRuleFillsOneWave) {
  EXPECT_EQ(qconv_igemm_pick_splits(linear_shape(256, 64, 7, 7, 1024), 132), 4);
  EXPECT_EQ(qconv_igemm_pick_splits(linear_shape(512, 64, 7, 7, 1024), 132), 2);
  EXPECT_EQ(qconv_igemm_pick_splits(linear_shape(1024, 64, 7, 7, 1024), 132), 1);
  EXPECT_EQ(qconv_igemm_pick_splits(linear_shape(4096, 64, 7, 7, 1024), 132), 1);
  EXPECT_EQ(qconv_igemm_pick_splits(linear_shape(1, 64, 7, 7, 1024), 132), 8);
  EXPECT_EQ(qconv_igemm_pick_splits(linear_shape(256, 1024, 1, 1, 10), 132), 4);  // 16 k-tiles
  EXPECT_EQ(qconv_igemm_pick_splits(linear_shape(256, 1024, 1, 1, 10), 1), 1);
  EXPECT_EQ(qconv_igemm_pick_splits(linear_shape(256, 100, 1, 1, 64), 132), 1);  // 2 k-tiles
  QConvShape conv2 = linear_shape(256, 32, 14, 14, 64);
  conv2.kh = conv2.kw = 5, conv2.pad_h = conv2.pad_w = 2;
  conv2.pool_kh = conv2.pool_kw = conv2.pool_sh = conv2.pool_sw = 2;
  EXPECT_EQ(qconv_igemm_pick_splits(conv2, 132), 1);
  conv2.n = 1;  // 49 pooled positions: 2 tiles; 13 k-tiles: 2 splits of >= 4
  EXPECT_EQ(qconv_igemm_pick_splits(conv2, 132), 2);
}

// The tensor-core path's tile and split: convolutions keep the 128x64 tile and the split rule
// above; linear layers take the linear tile and split of least estimated time (qconv.cpp), which
// on an H200's 132 SMs spreads LeNet's fc1 at batch 256 over 4 x 16 tiles of 64 x 64 split 2
// ways (128 blocks), runs whole from batch 512 on and takes the widest tile for large batches;
// forced tiles and splits are kept, a forced tile choosing its own split.
// The fused classifier's shapes: a linear layer of at most kQLinearDp4aMaxCols outputs reading
// the output of a linear layer (its channel stride that layer's padded one, the same batch).
TEST(Quant, ClassifierFusionTakesAFewColumnLayerAfterALinearOne) {
  const QConvShape fc1 = linear_shape(256, 64, 7, 7, 1024);
  EXPECT_TRUE(qconv_classifier_fusable(fc1, linear_shape(256, 1024, 1, 1, 10)));
  EXPECT_TRUE(qconv_classifier_fusable(fc1, linear_shape(256, 1024, 1, 1, kQLinearDp4aMaxCols)));
  EXPECT_FALSE(qconv_classifier_fusable(fc1, linear_shape(256, 1024, 1, 1, 17)));  // too wide
  EXPECT_FALSE(qconv_classifier_fusable(fc1, linear_shape(255, 1024, 1, 1, 10)));  // batch
  EXPECT_FALSE(qconv_classifier_fusable(fc1, linear_shape(256, 1000, 1, 1, 10)));  // channels
  const QConvShape fc1_odd = linear_shape(3, 52, 1, 1, 10);                        // OCP 12
  EXPECT_TRUE(qconv_classifier_fusable(fc1_odd, linear_shape(3, 10, 1, 1, 1)));
  QConvShape conv = linear_shape(256, 32, 14, 14, 64);
  conv.kh = conv.kw = 5;  // not linear
  EXPECT_FALSE(qconv_classifier_fusable(conv, linear_shape(256, 64, 1, 1, 10)));
  EXPECT_EQ(qconv_classifier_arrivals_size(256), 4);
  EXPECT_EQ(qconv_classifier_arrivals_size(257), 5);
  EXPECT_EQ(qconv_classifier_acc_size(300, 16), 4800);
}

// On the CPU the fused call is the two layers one after the other; shapes that do not chain are
// refused naming both layers.
TEST(Quant, FusedClassifierOnCpuIsTheTwoLayers) {
  const QConvShape s1 = linear_shape(5, 52, 1, 1, 10), s2 = linear_shape(5, 10, 1, 1, 3);
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<int8_t> x(size_t(s1.n) * s1.cp), w1(size_t(s1.oc) * s1.cgp),
      w2(size_t(s2.oc) * s2.cgp);
  for (auto& v : x) v = int8_t(d(rng));
  for (auto& v : w1) v = int8_t(d(rng));
  for (size_t i = 0; i < w2.size(); ++i)
    w2[i] = int(i % size_t(s2.cgp)) < s2.c ? int8_t(d(rng)) : 0;
  const std::vector<float> m1(size_t(s1.oc), 2e-3f), a1(size_t(s1.oc), 1.f);
  const std::vector<float> m2(size_t(s2.oc), 1e-2f), a2(size_t(s2.oc), -0.5f);
  const QEpilogue ep1{m1.data(), a1.data(), true}, ep2{m2.data(), a2.data(), false};
  std::vector<int8_t> y1(size_t(s1.n) * s1.ocp), ref1(y1.size());
  std::vector<float> y2(size_t(s2.n) * s2.oc), ref2(y2.size());
  qconv_forward_cpu(s1, x.data(), w1.data(), ep1, ref1.data());
  qconv_forward_float_cpu(s2, ref1.data(), w2.data(), ep2, ref2.data());
  QClassifierFusion cls;
  cls.shape = s2, cls.w = w2.data(), cls.ep = ep2, cls.y = y2.data();
  qconv_linear_classifier_forward(s1, x.data(), w1.data(), nullptr, ep1, y1.data(), cls, Exec{});
  EXPECT_EQ(y1, ref1);
  EXPECT_EQ(y2, ref2);
  cls.shape = linear_shape(5, 10, 1, 1, 17);
  try {
    qconv_linear_classifier_forward(s1, x.data(), w1.data(), nullptr, ep1, y1.data(), cls, Exec{});
    FAIL() << "a 17-class classifier accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than 16 outputs"), std::string::npos) << e.what();
  }
}

TEST(Quant, TensorCorePlanPicksLinearTiles) {
  QConvShape conv2 = linear_shape(256, 32, 14, 14, 64);
  conv2.kh = conv2.kw = 5, conv2.pad_h = conv2.pad_w = 2;
  QIgemmPlan p = qconv_igemm_plan(conv2, 132);
  EXPECT_EQ(p.tile, QIgemmTile::Conv128x64);
  EXPECT_EQ(p.splits, qconv_igemm_pick_splits(conv2, 132));
  const QConvShape fc1 = linear_shape(256, 64, 7, 7, 1024);
  p = qconv_igemm_plan(fc1, 132);
  EXPECT_EQ(p.tile, QIgemmTile::Linear64x64);
  EXPECT_EQ(p.splits, 2);
  p = qconv_igemm_plan(linear_shape(512, 64, 7, 7, 1024), 132);
  EXPECT_EQ(p.tile, QIgemmTile::Linear64x64);
  EXPECT_EQ(p.splits, 1);
  p = qconv_igemm_plan(linear_shape(4096, 64, 7, 7, 1024), 132);
  EXPECT_EQ(p.tile, QIgemmTile::Linear128x128);
  EXPECT_EQ(p.splits, 1);
  p = qconv_igemm_plan(linear_shape(32, 64, 7, 7, 1024), 132);  // few rows: split 8 ways
  EXPECT_EQ(p.tile, QIgemmTile::Linear64x64);
  EXPECT_EQ(p.splits, 8);
  p = qconv_igemm_plan(fc1, 1);  // one SM: every split only adds its sum
  EXPECT_EQ(p.splits, 1);
  // Forced: both, the tile alone (its best split), the split alone (its best tile), the conv tile.
  p = qconv_igemm_plan(fc1, 132, QIgemmTile::Linear128x128, 4);
  EXPECT_EQ(p.tile, QIgemmTile::Linear128x128);
  EXPECT_EQ(p.splits, 4);
  p = qconv_igemm_plan(fc1, 132, QIgemmTile::Linear128x128);
  EXPECT_EQ(p.tile, QIgemmTile::Linear128x128);
  EXPECT_EQ(p.splits, 8);
  p = qconv_igemm_plan(fc1, 132, QIgemmTile::Auto, 1);
  EXPECT_EQ(p.splits, 1);
  p = qconv_igemm_plan(fc1, 132, QIgemmTile::Conv128x64);
  EXPECT_EQ(p.tile, QIgemmTile::Conv128x64);
  EXPECT_EQ(p.splits, 4);
  // A linear tile forced on a convolution is refused, naming the tile.
  int8_t dummy = 0;
  EXPECT_NE(error_of([&] {
              qconv_resolve_kernel(
                  conv2, QConvPath(&dummy, QConvKernel::TensorCores, 0, QIgemmTile::Linear64x64));
            }).find("linear 64x64"),
            std::string::npos);
  EXPECT_EQ(qconv_resolve_kernel(
                fc1, QConvPath(&dummy, QConvKernel::TensorCores, 2, QIgemmTile::Linear64x128)),
            QConvKernel::TensorCores);
}

// Which kernel a CUDA call runs: direct unless the specialized kernels are allowed; then the
// few-channel tensor-core kernel for C <= 4 (the dp4a one where the mma kernel does not take the
// pool window or its tiles do not fit), the linear dp4a kernel for linear layers with <= 16 columns
// or
// <= 8 rows, tensor cores where they take the shape, else direct. Refusals name the mismatch.
TEST(Quant, KernelRulePicksByShape) {
  EXPECT_TRUE(qconv_is_linear(linear_shape(3, 64, 7, 7, 1024)));
  QConvShape conv = linear_shape(3, 64, 7, 7, 1024);
  conv.kh = conv.kw = 5;
  EXPECT_FALSE(qconv_is_linear(conv));
  QConvShape wide = linear_shape(3, 5, 2, 2, 7);
  wide.cp = 16;  // an activation stride wider than the weights' rows: x rows are not K long
  EXPECT_FALSE(qconv_is_linear(wide));
  const auto pick = [](int n, int c, int oc) {
    return qconv_pick_kernel(linear_shape(n, c, 1, 1, oc), true);
  };
  EXPECT_EQ(pick(256, 3136, 1024), QConvKernel::TensorCores);  // LeNet fc1
  EXPECT_EQ(pick(256, 1024, 10), QConvKernel::LinearDp4a);     // LeNet fc2
  EXPECT_EQ(pick(256, 1024, 16), QConvKernel::LinearDp4a);
  EXPECT_EQ(pick(256, 1024, 17), QConvKernel::TensorCores);
  EXPECT_EQ(pick(8, 3136, 1024), QConvKernel::LinearDp4a);  // batch 8
  EXPECT_EQ(pick(9, 3136, 1024), QConvKernel::TensorCores);
  EXPECT_EQ(qconv_pick_kernel(linear_shape(1, 1024, 1, 1, 10), false), QConvKernel::Direct);
  EXPECT_EQ(qconv_pick_kernel(conv, true), QConvKernel::TensorCores);
  QConvShape grouped = conv;
  grouped.groups = 4, grouped.cgp = qconv_weight_inner(64, 4);
  EXPECT_EQ(qconv_pick_kernel(grouped, true), QConvKernel::Direct);

  // Few channels: LeNet's conv1 (1 channel, 5x5, 2x2 pool) and an RGB stem go to the few-channel
  // tensor-core kernel, before the linear rule (a linear layer over a small 1-channel image) and
  // whatever the batch; a kernel wider than it takes (a 28x28 image into a linear layer) does not.
  constexpr QConvKernel kFewTc = QConvKernel::FewChannelsTensorCores;
  QConvShape lenet1 = linear_shape(256, 1, 28, 28, 32);
  lenet1.kh = lenet1.kw = 5, lenet1.pad_h = lenet1.pad_w = 2;
  lenet1.pool_kh = lenet1.pool_kw = lenet1.pool_sh = lenet1.pool_sw = 2;
  EXPECT_EQ(qconv_pick_kernel(lenet1, true), kFewTc);
  EXPECT_EQ(qconv_pick_kernel(lenet1, false), QConvKernel::Direct);
  for (int n : {1, 3, 4096}) {
    lenet1.n = n;
    EXPECT_EQ(qconv_pick_kernel(lenet1, true), kFewTc) << "batch " << n;
  }
  QConvShape stem = linear_shape(3, 3, 33, 31, 64);
  stem.kh = stem.kw = 7, stem.stride_h = stem.stride_w = 2, stem.pad_h = stem.pad_w = 3;
  EXPECT_EQ(qconv_pick_kernel(stem, true), kFewTc);
  QConvShape stem_pool = stem;  // ResNet's 3x3 stride-2 padded pool: 9 outputs, 16 mma rows
  stem_pool.pool_kh = stem_pool.pool_kw = 3, stem_pool.pool_sh = stem_pool.pool_sw = 2;
  stem_pool.pool_ph = stem_pool.pool_pw = 1;
  EXPECT_EQ(qconv_pick_kernel(stem_pool, true), kFewTc);
  EXPECT_EQ(qconv_pick_kernel(linear_shape(256, 1, 8, 8, 1000), true), kFewTc);
  // A pool window of more than 16 outputs (6 x 3) stays on the dp4a kernel, which takes any
  // height; forcing the tensor-core one on it is refused in one line.
  QConvShape tall = stem;
  tall.pool_kh = 6, tall.pool_kw = 3, tall.pool_sh = tall.pool_sw = 1;
  EXPECT_EQ(qconv_pick_kernel(tall, true), QConvKernel::FewChannels);
  EXPECT_NE(error_of([&] {
              qconv_resolve_kernel(tall, QConvPath(nullptr, kFewTc));
            }).find("few-channel tensor-core kernel takes"),
            std::string::npos);
  EXPECT_EQ(qconv_resolve_kernel(tall, QConvPath(nullptr)), QConvKernel::FewChannels);
  EXPECT_EQ(qconv_pick_kernel(linear_shape(256, 1, 28, 28, 32), true), QConvKernel::TensorCores);
  EXPECT_EQ(qconv_pick_kernel(linear_shape(256, 1, 28, 28, 10), true), QConvKernel::LinearDp4a);
  QConvShape five = stem;
  five.c = 5, five.cp = five.cgp = 8;
  EXPECT_EQ(qconv_pick_kernel(five, true), QConvKernel::TensorCores);

  const int8_t dummy = 0;
  EXPECT_EQ(qconv_resolve_kernel(conv, QConvPath{}), QConvKernel::Direct);
  // The default path is the direct kernel; the rule's few-channel choice needs no repacked
  // weights, its tensor-core choice does.
  EXPECT_EQ(qconv_resolve_kernel(stem, QConvPath{}), QConvKernel::Direct);
  EXPECT_EQ(qconv_resolve_kernel(stem, QConvPath(nullptr)), kFewTc);
  EXPECT_EQ(qconv_resolve_kernel(conv, QConvPath(&dummy)), QConvKernel::TensorCores);
  EXPECT_NE(error_of([&] {
              qconv_resolve_kernel(conv, QConvPath(nullptr));
            }).find("needs the repacked weights"),
            std::string::npos);
  EXPECT_EQ(qconv_resolve_kernel(stem, QConvPath(nullptr, QConvKernel::FewChannels)),
            QConvKernel::FewChannels);
  EXPECT_EQ(qconv_resolve_kernel(stem, QConvPath(nullptr, kFewTc)), kFewTc);
  EXPECT_NE(error_of([&] {
              qconv_resolve_kernel(five, QConvPath(nullptr, kFewTc));
            }).find("few-channel tensor-core kernel takes"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              qconv_resolve_kernel(five, QConvPath(nullptr, QConvKernel::FewChannels));
            }).find("few-channel kernel takes groups 1, c <= 4"),
            std::string::npos);
  EXPECT_EQ(qconv_resolve_kernel(conv, QConvPath{&dummy, QConvKernel::Direct}),
            QConvKernel::Direct);
  EXPECT_NE(error_of([&] {
              qconv_resolve_kernel(conv, QConvPath{&dummy, QConvKernel::LinearDp4a});
            }).find("linear dp4a kernel takes a linear layer"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              qconv_resolve_kernel(conv, QConvPath{nullptr, QConvKernel::TensorCores});
            }).find("needs the repacked weights"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              qconv_resolve_kernel(conv, QConvPath{&dummy, QConvKernel::TensorCores, 3});
            }).find("splits=3"),
            std::string::npos);
  EXPECT_STREQ(qconv_kernel_name(QConvKernel::LinearDp4a), "linear dp4a");
  EXPECT_STREQ(qconv_kernel_name(QConvKernel::FewChannels), "few-channel dp4a");
  EXPECT_STREQ(qconv_kernel_name(kFewTc), "few-channel tensor cores");
}

TEST(Quant, RoundsHalfToEvenAndSaturates) {
  QuantizeShape s;
  s.n = 1, s.c = 1, s.h = 1, s.w = 8, s.cp = 4;
  const std::vector<float> x = {2.5f, 3.5f, -2.5f, -0.5f, 0.5f, 300.f, -300.f, 126.6f};
  std::vector<int8_t> y(size_t(8 * 4), int8_t(99));
  quantize_nchw_to_nhwc(s, x.data(), 1.f, y.data(), Exec{});
  const std::vector<int> want = {2, 4, -2, 0, 0, 127, -127, 127};
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(int(y[size_t(i) * 4]), want[size_t(i)]) << "x=" << x[size_t(i)];
    for (int c = 1; c < 4; ++c) EXPECT_EQ(y[size_t(i) * 4 + c], 0);
  }
}

// A small net with BatchNorm, a grouped conv and dropout, trained for a few SGD steps on
// synthetic 16x16 images.
struct Trained {
  std::vector<LayerSpec> specs;
  Shape input{1, 16, 16};
  FoldedNetwork folded;
  std::vector<float> params, buffers;  // the trained network's, before folding
  std::vector<float> train_x, test_x;
  std::vector<int32_t> test_labels;
  int n_train = 512, n_test = 400;
};

std::vector<float> to_float(const Dataset& d) {
  std::vector<float> x(d.images.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = (float(d.images[i]) / 255.f - 0.2f) / 0.3f;
  return x;
}

Trained train_net(std::vector<LayerSpec> specs) {
  Trained t;
  t.specs = std::move(specs);
  const Dataset train = make_synthetic(t.n_train, 4, 11, SyntheticSplit::Train, 1, 16, 16);
  const Dataset test = make_synthetic(t.n_test, 4, 11, SyntheticSplit::Test, 1, 16, 16);
  t.train_x = to_float(train);
  t.test_x = to_float(test);
  t.test_labels = test.labels;
  NetworkOptions o;
  o.max_batch = 32;
  Network net(t.specs, t.input, o, Exec{});
  OptimizerOptions oo;
  oo.lr = 0.05;
  ParamOptimizer opt(oo, net);
  for (int step = 0; step < 80; ++step) {
    const int b = (step * 32) % t.n_train;
    net.forward_backward(32, t.train_x.data() + size_t(b) * 256, train.labels.data() + b, 1.f / 32);
    opt.step(oo.lr);
  }
  t.params = net.params_to_host();
  t.buffers = net.buffers_to_host();
  t.folded = fold_batchnorm(t.specs, t.input, t.params, t.buffers);
  return t;
}

const Trained& trained_net() {
  static const Trained t = [] {
    LayerSpec conv2 = conv2d_spec("conv2", 12, 3, 3, 2, 1);
    conv2.groups = 2;
    return train_net(
        {conv2d_spec("conv1", 8, 3, 3, 1, 1), batchnorm_spec(LayerKind::BatchNorm2d, "bn1"),
         layer_spec(LayerKind::Relu, "relu1"), maxpool2d_spec("pool1", 2, 2), conv2,
         layer_spec(LayerKind::Relu, "relu2"), layer_spec(LayerKind::Flatten, "flatten1"),
         linear_spec("fc1", 32), layer_spec(LayerKind::Relu, "relu3"), dropout_spec("drop1", 0.1),
         linear_spec("fc2", 4), layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")});
  }();
  return t;
}

// A MobileNet-like net: a depthwise and a pointwise conv with BatchNorm, global average pooling,
// dropout and the classifier (the pool runs inside the classifier's int8 sum).
std::vector<LayerSpec> pooled_specs() {
  LayerSpec dw = conv2d_spec("conv2", 8, 3, 3, 2, 1);
  dw.groups = 8;
  return {conv2d_spec("conv1", 8, 3, 3, 1, 1),
          batchnorm_spec(LayerKind::BatchNorm2d, "bn1"),
          layer_spec(LayerKind::Relu, "relu1"),
          dw,
          batchnorm_spec(LayerKind::BatchNorm2d, "bn2"),
          layer_spec(LayerKind::Relu, "relu2"),
          conv2d_spec("conv3", 16, 1, 1, 1, 0),
          batchnorm_spec(LayerKind::BatchNorm2d, "bn3"),
          layer_spec(LayerKind::Relu, "relu3"),
          layer_spec(LayerKind::GlobalAvgPool, "gap1"),
          layer_spec(LayerKind::Flatten, "flatten1"),
          dropout_spec("drop1", 0.2),
          linear_spec("fc1", 4),
          layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
}

std::vector<int> argmax_rows(const std::vector<float>& logits, int classes) {
  std::vector<int> out;
  for (size_t i = 0; i < logits.size(); i += size_t(classes))
    out.push_back(
        int(std::max_element(logits.begin() + long(i), logits.begin() + long(i) + classes) -
            (logits.begin() + long(i))));
  return out;
}

// How the float logits `ref` and the int8 logits `q` of n images (4 classes) classify them:
// images where their arg-maxes agree, and each one's correct answers; printed with `what`.
struct Predictions {
  int agree = 0, right32 = 0, right8 = 0;
};
Predictions compare_predictions(const std::vector<float>& ref, const std::vector<float>& q,
                                const std::vector<int32_t>& labels, int n, const char* what) {
  const std::vector<int> a = argmax_rows(ref, 4), b = argmax_rows(q, 4);
  Predictions p;
  for (int i = 0; i < n; ++i) {
    p.agree += a[size_t(i)] == b[size_t(i)];
    p.right32 += a[size_t(i)] == labels[size_t(i)];
    p.right8 += b[size_t(i)] == labels[size_t(i)];
  }
  std::printf("%sfp32 %.2f%%, int8 %.2f%%, arg-max agreement %.2f%% on %d images\n", what,
              100.0 * p.right32 / n, 100.0 * p.right8 / n, 100.0 * p.agree / n, n);
  return p;
}

std::vector<float> int8_logits(const QuantizedModel& m, const std::vector<float>& x, int n) {
  Int8Network q(m, n, Exec{});
  const float* y = q.forward(n, x.data());
  return std::vector<float>(y, y + size_t(n) * size_t(q.num_classes()));
}

TEST(Quant, TrainedNetworkKeepsItsPredictions) {
  const Trained& t = trained_net();
  const QuantizedModel m =
      quantize_network(t.folded, t.input, t.train_x.data(), 256, kDefaultCalibration);
  ASSERT_EQ(m.stages.size(), 4u);  // conv1 (+bn1, relu1, pool1), conv2 (+relu2), fc1, fc2
  EXPECT_TRUE(m.stages[0].relu && m.stages[0].pool);
  const std::vector<QuantStage> plan = plan_int8(t.folded.specs, t.input);
  const std::vector<float> ref = float_forward(plan, float_stages(plan, t.folded, t.input),
                                               t.test_x.data(), t.n_test, nullptr);
  const std::vector<float> q = int8_logits(m, t.test_x, t.n_test);
  const auto [agree, right32, right8] = compare_predictions(ref, q, t.test_labels, t.n_test, "");
  EXPECT_GT(right32, t.n_test / 2) << "the float network did not learn: the test proves nothing";
  EXPECT_GE(agree, int(std::ceil(0.99 * t.n_test)));
  // The float network of the Network class gives the same logits as the stages' float forward.
  NetworkOptions o;
  o.max_batch = t.n_test;
  Network net(t.folded.specs, t.input, o, Exec{});
  net.params_from_host(t.folded.params);
  net.buffers_from_host(t.folded.buffers);
  const float* y = net.forward(t.n_test, t.test_x.data());
  EXPECT_LT(test::max_rel_error(std::vector<float>(y, y + ref.size()), ref), 1e-4);
}

TEST(Quant, GlobalAveragePoolRunsInsideTheClassifier) {
  const Trained t = train_net(pooled_specs());
  const QuantizedModel m =
      quantize_network(t.folded, t.input, t.train_x.data(), 256, kDefaultCalibration);
  ASSERT_EQ(m.stages.size(), 4u);  // conv1, conv2 (depthwise), conv3, fc1 (+ gap1)
  const QuantStage& fc = m.stages[3];
  EXPECT_TRUE(fc.linear && fc.global_avg);
  EXPECT_EQ(fc.h, 8);
  EXPECT_EQ(fc.weight_shape(), (Shape{4, 16}));  // the float layer's shape
  const std::vector<QuantStage> plan = plan_int8(t.folded.specs, t.input);
  const std::vector<float> ref = float_forward(plan, float_stages(plan, t.folded, t.input),
                                               t.test_x.data(), t.n_test, nullptr);
  // The stages' float forward is the float network's (the pool included).
  NetworkOptions o;
  o.max_batch = t.n_test;
  Network net(t.folded.specs, t.input, o, Exec{});
  net.params_from_host(t.folded.params);
  net.buffers_from_host(t.folded.buffers);
  const float* y = net.forward(t.n_test, t.test_x.data());
  EXPECT_LT(test::max_rel_error(std::vector<float>(y, y + ref.size()), ref), 1e-4);
  // int8 keeps the float network's answers and its accuracy.
  const std::vector<float> q = int8_logits(m, t.test_x, t.n_test);
  const auto [agree, right32, right8] = compare_predictions(ref, q, t.test_labels, t.n_test, "");
  EXPECT_GT(right32, t.n_test / 2) << "the float network did not learn: the test proves nothing";
  EXPECT_GE(agree, int(std::ceil(0.98 * t.n_test)));
  EXPECT_GE(right8, right32 - int(std::ceil(0.01 * t.n_test)));
  // The logits themselves, relative to their size (not each to its own: some lie near zero).
  double diff = 0, size = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    diff = std::max(diff, double(std::fabs(q[i] - ref[i]))),
    size = std::max(size, double(std::fabs(ref[i])));
  EXPECT_LT(diff, 0.1 * size);
}

// The int8 residual add against its definition in double: equal wherever the exact value is not
// within float rounding of a rounding boundary (x.5), never more than 1 apart; the padding
// channels zero; the ReLU applied before rounding.
TEST(Quant, ResidualAddMatchesDefinition) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const QAddShape s :
       {QAddShape{1, 5, 7, 3, 4}, QAddShape{3, 4, 3, 10, 12}, QAddShape{2, 1, 1, 1, 8}}) {
    std::vector<int8_t> a = random_int8(size_t(s.n) * s.h * s.w * s.cp, rng);
    std::vector<int8_t> b = random_int8(a.size(), rng);
    std::uniform_real_distribution<float> m(0.05f, 1.6f);
    for (bool relu : {false, true}) {
      const QAddScales k{m(rng), m(rng), relu};
      std::vector<int8_t> y(a.size(), int8_t(99));
      qadd_forward(s, a.data(), b.data(), k, y.data(), Exec{});
      size_t bad = 0, ties = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        if (int(i % size_t(s.cp)) >= s.c) {
          bad += y[i] != 0;
          continue;
        }
        double v = double(a[i]) * k.mult_a + double(b[i]) * k.mult_b;
        if (relu) v = std::max(v, 0.0);
        v = std::min(127.0, std::max(-127.0, v));
        const double want = std::nearbyint(v);
        const bool near_tie = std::fabs(std::fabs(v - std::trunc(v)) - 0.5) < 1e-4;
        ties += near_tie;
        bad += near_tie ? std::fabs(double(y[i]) - want) > 1 : double(y[i]) != want;
        if (relu) bad += y[i] < 0;
      }
      EXPECT_EQ(bad, 0u) << "c=" << s.c << " cp=" << s.cp << " relu=" << relu;
      EXPECT_LT(ties, y.size() / 10 + 1);
    }
  }
  EXPECT_NE(error_of([] {
              int8_t v[4] = {};
              qadd_forward(QAddShape{1, 1, 1, 5, 4}, v, v, QAddScales{}, v, Exec{});
            }).find("qadd: bad shape"),
            std::string::npos);
}

// A small BatchNorm ResNet: a stem, one identity block and one projection block (stride 2, a
// 1x1 conv + BN shortcut), each followed by a ReLU, global average pooling and the classifier;
// channel counts that are not multiples of 4.
std::vector<LayerSpec> resnet_specs() {
  const auto bn = [](const std::string& n) { return batchnorm_spec(LayerKind::BatchNorm2d, n); };
  const auto relu = [](const std::string& n) { return layer_spec(LayerKind::Relu, n); };
  return {conv2d_spec("conv1", 6, 3, 3, 1, 1),
          bn("bn1"),
          relu("relu1"),
          residual_spec("res1", {conv2d_spec("conv2", 6, 3, 3, 1, 1), bn("bn2"), relu("relu2"),
                                 conv2d_spec("conv3", 6, 3, 3, 1, 1), bn("bn3")}),
          relu("relu3"),
          residual_spec("res2",
                        {conv2d_spec("conv4", 10, 3, 3, 2, 1), bn("bn4"), relu("relu4"),
                         conv2d_spec("conv5", 10, 3, 3, 1, 1), bn("bn5")},
                        {conv2d_spec("conv6", 10, 1, 1, 2, 0), bn("bn6")}),
          relu("relu5"),
          layer_spec(LayerKind::GlobalAvgPool, "gap1"),
          layer_spec(LayerKind::Flatten, "flatten1"),
          linear_spec("fc1", 4),
          layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
}

const Trained& trained_resnet() {
  static const Trained t = train_net(resnet_specs());
  return t;
}

TEST(Quant, ResidualNetworkKeepsItsPredictions) {
  const Trained& t = trained_resnet();
  // Every BatchNorm folds, those inside the blocks too, and the folded network computes what
  // the trained one does.
  EXPECT_EQ(t.folded.folded.size(), 6u);
  EXPECT_TRUE(t.folded.buffers.empty());
  NetworkOptions o;
  o.max_batch = t.n_test;
  Network trained(t.specs, t.input, o, Exec{});
  trained.params_from_host(t.params);
  trained.buffers_from_host(t.buffers);
  const float* yt = trained.forward(t.n_test, t.test_x.data());
  const std::vector<float> ref_trained(yt, yt + size_t(t.n_test) * 4);
  Network folded(t.folded.specs, t.input, o, Exec{});
  folded.params_from_host(t.folded.params);
  const float* yf = folded.forward(t.n_test, t.test_x.data());
  // (The fold rounds the products w * s in float: 1.3e-4 measured.)
  EXPECT_LT(test::max_rel_error(std::vector<float>(yf, yf + ref_trained.size()), ref_trained),
            1e-3);

  const QuantizedModel m =
      quantize_network(t.folded, t.input, t.train_x.data(), 256, kDefaultCalibration);
  // conv1, conv2, conv3, res1, conv4, conv5, conv6, res2, fc1 (+ gap1)
  ASSERT_EQ(m.stages.size(), 9u);
  const QuantStage &res1 = m.stages[3], &res2 = m.stages[7];
  EXPECT_TRUE(res1.add && res1.relu && res1.input == 2 && res1.shortcut == 0);
  EXPECT_TRUE(res2.add && res2.relu && res2.input == 5 && res2.shortcut == 6);
  EXPECT_EQ(m.stages[4].input, 3);  // the block's layers and its shortcut read res1's output
  EXPECT_EQ(m.stages[6].input, 3);
  EXPECT_EQ(res1.shortcut_scale, m.stages[1].input_scale);  // one scale per tensor
  EXPECT_EQ(res1.output_scale, m.stages[4].input_scale);
  EXPECT_EQ(res2.output_scale, m.stages[8].input_scale);
  EXPECT_TRUE(m.stages[8].global_avg);

  // The stages' float forward is the float network's.
  const std::vector<QuantStage> plan = plan_int8(t.folded.specs, t.input);
  const std::vector<float> ref = float_forward(plan, float_stages(plan, t.folded, t.input),
                                               t.test_x.data(), t.n_test, nullptr);
  EXPECT_LT(test::max_rel_error(ref, ref_trained), 1e-3);

  const std::vector<float> q = int8_logits(m, t.test_x, t.n_test);
  const auto [agree, right32, right8] =
      compare_predictions(ref, q, t.test_labels, t.n_test, "resnet: ");
  EXPECT_GT(right32, t.n_test / 2) << "the float network did not learn: the test proves nothing";
  EXPECT_GE(agree, int(std::ceil(0.97 * t.n_test)));
  EXPECT_GE(right8, right32 - int(std::ceil(0.01 * t.n_test)));
  // The logits themselves. With max calibration nothing is clipped and the error is rounding
  // alone (half a step of each of the 8 int8 tensors' scales, and of the weights'), carried to
  // the logits by the layers after it: measured at 2.5% of the logits' range at most and 0.5%
  // on average; the bounds leave a factor 2. (mse clips the rare outliers of the calibration
  // images and measured 10% at most, 0.3% on average: its rounding is finer where most values
  // lie, which is what the arg-max agreement above shows.)
  const QuantizedModel mx =
      quantize_network(t.folded, t.input, t.train_x.data(), 256, CalibrationMethod::Max);
  const std::vector<float> qx = int8_logits(mx, t.test_x, t.n_test);
  double diff = 0, size = 0, mean = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, double(std::fabs(qx[i] - ref[i])));
    size = std::max(size, double(std::fabs(ref[i])));
    mean += std::fabs(qx[i] - ref[i]) / double(ref.size());
  }
  std::printf(
      "resnet logits (max calibration): max |int8 - fp32| %.4f, mean %.4f, max |fp32| "
      "%.3f\n",
      diff, mean, size);
  EXPECT_LT(diff, 0.05 * size);
  EXPECT_LT(mean, 0.01 * size);
}

TEST(Quant, RefusesAReluThatStartsABlock) {
  // A pre-activation block: its first ReLU would also change what the shortcut reads.
  const std::vector<LayerSpec> specs = {
      conv2d_spec("conv1", 4, 3, 3, 1, 1),
      residual_spec("res1",
                    {layer_spec(LayerKind::Relu, "relu1"), conv2d_spec("conv2", 4, 3, 3, 1, 1)}),
      layer_spec(LayerKind::Flatten, "flatten1"), linear_spec("fc1", 2),
      layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
  const std::string e = error_of([&] { plan_int8(specs, Shape{1, 6, 6}); });
  EXPECT_TRUE(test::contains(e, "layer 'relu1' (relu) does not follow")) << e;
}

TEST(Quant, RefusesWhatComesBetweenGlobalPoolAndClassifier) {
  std::vector<LayerSpec> specs = fold_batchnorm_specs(pooled_specs());
  const auto gap = std::find_if(specs.begin(), specs.end(), [](const LayerSpec& s) {
    return s.kind == LayerKind::GlobalAvgPool;
  });
  ASSERT_NE(gap, specs.end());
  specs.insert(gap + 1, layer_spec(LayerKind::Relu, "relu9"));
  const std::string e = error_of([&] { plan_int8(specs, Shape{1, 16, 16}); });
  EXPECT_NE(e.find("relu9"), std::string::npos) << e;
  EXPECT_NE(e.find("gap1"), std::string::npos) << e;
}

TEST(Quant, CalibrationMethodsOrderTheirClips) {
  std::vector<float> v(10000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i % 100) / 100.f;
  v[0] = 50.f;  // one outlier
  const float mx = calibrate_scale(v, 50.f, CalibrationMethod::Max);
  const float pc = calibrate_scale(v, 50.f, CalibrationMethod::Percentile);
  const float ms = calibrate_scale(v, 50.f, CalibrationMethod::Mse);
  EXPECT_FLOAT_EQ(mx, 50.f / 127.f);
  EXPECT_LT(pc, mx / 10);  // the outlier is clipped
  EXPECT_LT(ms, mx);
  EXPECT_EQ(calibrate_scale({0.f, 0.f}, 0.f, CalibrationMethod::Mse), 1.f);
}

struct SavedModel {
  std::filesystem::path dir, path;
  QuantizedModel model;
};

SavedModel saved_model(const std::string& name, const Trained& t = trained_net()) {
  SavedModel s;
  s.dir = test::fresh_dir("quant", name);
  s.path = s.dir / "model.int8.safetensors";
  s.model = quantize_network(t.folded, t.input, t.train_x.data(), 64, CalibrationMethod::Max);
  CheckpointMeta meta;
  meta.config_yaml = "model: {}";
  meta.class_names = {"a", "b", "c", "d"};
  meta.input_chw = t.input;
  meta.mean = {0.2f};
  meta.std = {0.3f};
  save_quantized(s.path.string(), s.model, meta, t.folded.folded);
  return s;
}

TEST(Quant, FileRoundTrips) {
  const Trained& t = trained_net();
  const SavedModel s = saved_model("roundtrip");
  const QuantizedModel back = load_quantized(s.path.string(), t.specs, t.input);
  ASSERT_EQ(back.stages.size(), s.model.stages.size());
  for (size_t i = 0; i < back.stages.size(); ++i) {
    EXPECT_EQ(back.stages[i].weight, s.model.stages[i].weight);
    EXPECT_EQ(back.stages[i].weight_scale, s.model.stages[i].weight_scale);
    EXPECT_EQ(back.stages[i].input_scale, s.model.stages[i].input_scale);
    EXPECT_EQ(back.stages[i].bias, s.model.stages[i].bias);
  }
  EXPECT_EQ(back.method, "max");
  EXPECT_EQ(int8_logits(back, t.test_x, 37), int8_logits(s.model, t.test_x, 37));
  const CheckpointMeta meta = read_quantized_meta(s.path.string());
  EXPECT_EQ(meta.class_names.size(), 4u);
  // A float loader refuses it by name instead of reading int8 bytes as floats.
  NetworkOptions o;
  o.max_batch = 1;
  const Network net(t.specs, t.input, o, Exec{});
  const std::string e = error_of([&] { load_checkpoint_for(s.path.string(), net); });
  EXPECT_TRUE(test::contains(e, "--precision int8")) << e;
}

// Rewrites the saved file with `edit` applied to its tensors and metadata.
std::string rewritten(const SavedModel& s, const std::string& name,
                      const std::function<void(std::vector<NamedTensor>&,
                                               std::map<std::string, std::string>&)>& edit) {
  const SafetensorsFile f = read_safetensors(s.path.string());
  std::vector<NamedTensor> tensors;
  for (const auto& e : f.entries())
    tensors.push_back(e.dtype == "I8" ? f.tensor_i8(e.name) : f.tensor_f32(e.name));
  std::map<std::string, std::string> md = f.metadata();
  edit(tensors, md);
  const std::string out = (s.dir / (name + ".safetensors")).string();
  write_safetensors(out, tensors, md);
  return out;
}

NamedTensor* find(std::vector<NamedTensor>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return &t;
  return nullptr;
}

TEST(Quant, RefusesFilesThatAreNotWhatTheyClaim) {
  const Trained& t = trained_net();
  const SavedModel s = saved_model("bad");
  struct Case {
    std::string name, expect;
    std::function<void(std::vector<NamedTensor>&, std::map<std::string, std::string>&)> edit;
  };
  const std::vector<Case> cases = {
      {"scale_missing", "no tensor 'conv2.weight_scale'",
       [](auto& ts, auto&) {
         ts.erase(std::remove_if(ts.begin(), ts.end(),
                                 [](auto& x) { return x.name == "conv2.weight_scale"; }),
                  ts.end());
       }},
      {"scale_shape", "tensor 'fc1.weight_scale' has shape (31)",
       [](auto& ts, auto&) {
         NamedTensor* x = find(ts, "fc1.weight_scale");
         x->data.pop_back();
         x->shape = {31};
       }},
      {"input_scale_zero", "'conv1.input_scale' is 0",
       [](auto& ts, auto&) { find(ts, "conv1.input_scale")->data = {0.f}; }},
      {"scale_nan", "'fc2.weight_scale' holds nan",
       [](auto& ts, auto&) { find(ts, "fc2.weight_scale")->data[1] = NAN; }},
      {"float_weights", "tensor 'conv1.weight' has dtype F32, expected I8",
       [](auto& ts, auto&) {
         NamedTensor* x = find(ts, "conv1.weight");
         std::vector<float> f(x->bytes.begin(), x->bytes.end());
         *x = NamedTensor(x->name, x->shape, f);
       }},
      {"weight_shape", "tensor 'conv2.weight' has shape (12, 8, 3, 3), expected (12, 4, 3, 3)",
       [](auto& ts, auto&) {
         NamedTensor* x = find(ts, "conv2.weight");
         x->bytes.resize(x->bytes.size() * 2);
         x->shape = {12, 8, 3, 3};
       }},
      {"minus_128", "'fc1.weight' holds -128",
       [](auto& ts, auto&) { find(ts, "fc1.weight")->bytes[5] = -128; }},
      {"extra_tensor", "tensor 'bn1.running_mean' belongs to no int8 layer",
       [](auto& ts, auto&) {
         ts.push_back({"bn1.running_mean", {8}, std::vector<float>(8)});
       }},
      {"not_quantized", "not a quantized model", [](auto&, auto& md) { md.erase("quantization"); }},
      {"version", "quantization_version is '7'",
       [](auto&, auto& md) { md["quantization_version"] = "7"; }},
  };
  for (const Case& c : cases) {
    const std::string path = rewritten(s, c.name, c.edit);
    const std::string e = error_of([&] { load_quantized(path, t.specs, t.input); });
    EXPECT_TRUE(test::contains(e, c.expect)) << c.name << ": " << e;
    EXPECT_TRUE(test::contains(e, path)) << c.name << ": " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << c.name << ": " << e;
  }
  // int8 with a layer it has no kernel for: named, with what int8 runs (a batchnorm that does
  // not follow a conv folds nowhere).
  std::vector<LayerSpec> with_bn = t.specs;
  with_bn.insert(with_bn.begin() + 4, batchnorm_spec(LayerKind::BatchNorm2d, "bn9"));
  const std::string e = error_of([&] { load_quantized(s.path.string(), with_bn, t.input); });
  EXPECT_TRUE(test::contains(e, "layer 'bn9' (batchnorm2d) has no int8 kernel")) << e;
  EXPECT_TRUE(test::contains(e, "avgpool2d")) << e;
  // An avgpool2d after flatten (int8 pools images only).
  std::vector<LayerSpec> flat_avg = t.specs;
  const auto flatten = std::find_if(flat_avg.begin(), flat_avg.end(), [](const LayerSpec& l) {
    return l.kind == LayerKind::Flatten;
  });
  ASSERT_NE(flatten, flat_avg.end());
  flat_avg.insert(flatten + 1, avgpool2d_spec("avg9", 1, 1));
  const std::string e3 = error_of([&] { plan_int8(fold_batchnorm_specs(flat_avg), t.input); });
  EXPECT_TRUE(test::contains(e3, "layer 'avg9' (avgpool2d) follows flatten")) << e3;
  const std::string e2 = error_of([&] {
    plan_int8({conv2d_spec("conv1", 4, 3, 3, 1, 1), layer_spec(LayerKind::Relu, "r"),
               layer_spec(LayerKind::Relu, "r2"), layer_spec(LayerKind::Flatten, "f"),
               linear_spec("fc", 2), layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")},
              t.input);
  });
  EXPECT_TRUE(test::contains(e2, "layer 'r2' (relu) does not follow")) << e2;
}

// A residual network's file: the blocks' scales round-trip, the logits are the same bits, and a
// file missing a block's scale, or whose scales of one tensor disagree, is refused by name.
TEST(Quant, ResidualFileRoundTripsAndRefusesDamage) {
  const Trained& t = trained_resnet();
  const SavedModel s = saved_model("resnet", t);
  const QuantizedModel back = load_quantized(s.path.string(), t.specs, t.input);
  ASSERT_EQ(back.stages.size(), s.model.stages.size());
  for (size_t i = 0; i < back.stages.size(); ++i) {
    const QuantStage &a = back.stages[i], &b = s.model.stages[i];
    EXPECT_EQ(a.add, b.add);
    EXPECT_EQ(a.input, b.input);
    EXPECT_EQ(a.shortcut, b.shortcut);
    EXPECT_EQ(a.weight, b.weight);
    EXPECT_EQ(a.input_scale, b.input_scale);
    EXPECT_EQ(a.shortcut_scale, b.shortcut_scale);
    EXPECT_EQ(a.output_scale, b.output_scale);
    EXPECT_EQ(a.bias, b.bias);
  }
  EXPECT_EQ(int8_logits(back, t.test_x, 37), int8_logits(s.model, t.test_x, 37));
  const SafetensorsFile f = read_safetensors(s.path.string());
  for (const char* name :
       {"res1.input_scale", "res1.shortcut_scale", "res1.output_scale", "res2.output_scale"})
    EXPECT_NE(f.find(name), nullptr) << name;

  struct Case {
    std::string name, expect;
    std::function<void(std::vector<NamedTensor>&, std::map<std::string, std::string>&)> edit;
  };
  const auto drop = [](const std::string& name) {
    return [name](std::vector<NamedTensor>& ts, std::map<std::string, std::string>&) {
      ts.erase(std::remove_if(ts.begin(), ts.end(), [&](auto& x) { return x.name == name; }),
               ts.end());
    };
  };
  const std::vector<Case> cases = {
      {"block_scale_missing", "has no tensor 'res2.output_scale'", drop("res2.output_scale")},
      {"shortcut_scale_missing", "has no tensor 'res1.shortcut_scale'",
       drop("res1.shortcut_scale")},
      {"block_scale_nan", "tensor 'res1.output_scale' is nan",
       [](auto& ts, auto&) { find(ts, "res1.output_scale")->data = {NAN}; }},
      {"block_scale_negative", "tensor 'res2.shortcut_scale' is -1",
       [](auto& ts, auto&) { find(ts, "res2.shortcut_scale")->data = {-1.f}; }},
      {"block_scale_shape", "tensor 'res1.input_scale' has shape (2)",
       [](auto& ts, auto&) {
         NamedTensor* x = find(ts, "res1.input_scale");
         x->data = {1.f, 1.f};
         x->shape = {2};
       }},
      // res1's output is read by conv4 (res2's layers) and conv6 (its shortcut): one scale.
      {"scales_disagree", "both are the scale of the activations 'res1' writes",
       [](auto& ts, auto&) { find(ts, "conv6.input_scale")->data[0] *= 2; }},
  };
  for (const Case& c : cases) {
    const std::string path = rewritten(s, c.name, c.edit);
    const std::string e = error_of([&] { load_quantized(path, t.specs, t.input); });
    EXPECT_TRUE(test::contains(e, c.expect)) << c.name << ": " << e;
    EXPECT_TRUE(test::contains(e, path)) << c.name << ": " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << c.name << ": " << e;
  }
}

// A net with two average pools: one after a conv's ReLU (2x2), one between a BatchNorm'd conv
// and its ReLU (3x3, stride 2, padding 1: negative inputs, padded zeros, the ReLU fused).
std::vector<LayerSpec> avgpool_specs() {
  return {conv2d_spec("conv1", 8, 3, 3, 1, 1),
          batchnorm_spec(LayerKind::BatchNorm2d, "bn1"),
          layer_spec(LayerKind::Relu, "relu1"),
          avgpool2d_spec("avg1", 2, 2),
          conv2d_spec("conv2", 10, 3, 3, 1, 1),
          batchnorm_spec(LayerKind::BatchNorm2d, "bn2"),
          avgpool2d_spec("avg2", 3, 2, 1),
          layer_spec(LayerKind::Relu, "relu2"),
          layer_spec(LayerKind::Flatten, "flatten1"),
          linear_spec("fc1", 4),
          layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
}

const Trained& trained_avgpool_net() {
  static const Trained t = train_net(avgpool_specs());
  return t;
}

TEST(Quant, AveragePoolRunsInInt8) {
  const Trained& t = trained_avgpool_net();
  const QuantizedModel m =
      quantize_network(t.folded, t.input, t.train_x.data(), 256, kDefaultCalibration);
  // conv1 (+relu1), avg1, conv2, avg2 (+relu2), fc1
  ASSERT_EQ(m.stages.size(), 5u);
  const QuantStage &avg1 = m.stages[1], &avg2 = m.stages[3];
  EXPECT_TRUE(avg1.avgpool && !avg1.relu && avg1.input == 0 && avg1.out_h() == 8);
  EXPECT_TRUE(avg2.avgpool && avg2.relu && avg2.input == 2 && avg2.out_h() == 4);
  EXPECT_EQ(avg2.fused, std::vector<std::string>{"relu2"});
  // The avg pools' output scales are their readers' input scales.
  EXPECT_EQ(avg1.output_scale, m.stages[2].input_scale);
  EXPECT_EQ(avg2.output_scale, m.stages[4].input_scale);
  const std::vector<QuantStage> plan = plan_int8(t.folded.specs, t.input);
  const std::vector<float> ref = float_forward(plan, float_stages(plan, t.folded, t.input),
                                               t.test_x.data(), t.n_test, nullptr);
  // The stages' float forward (avgpool included) is the Network's.
  NetworkOptions o;
  o.max_batch = t.n_test;
  Network net(t.folded.specs, t.input, o, Exec{});
  net.params_from_host(t.folded.params);
  const float* y = net.forward(t.n_test, t.test_x.data());
  double diff = 0, size = 0;  // against the logits' range: summation order moves small ones
  for (size_t i = 0; i < ref.size(); ++i)
    diff = std::max(diff, double(std::fabs(y[i] - ref[i]))),
    size = std::max(size, double(std::fabs(ref[i])));
  EXPECT_LT(diff, 1e-5 * size);
  const std::vector<float> q = int8_logits(m, t.test_x, t.n_test);
  const auto [agree, right32, right8] =
      compare_predictions(ref, q, t.test_labels, t.n_test, "avgpool net: ");
  EXPECT_GT(right32, t.n_test / 2) << "the float network did not learn: the test proves nothing";
  EXPECT_GE(agree, int(std::ceil(0.98 * t.n_test)));
}

TEST(Quant, AveragePoolFileRoundTripsAndRefusesDamage) {
  const Trained& t = trained_avgpool_net();
  const SavedModel s = saved_model("avgpool", t);
  const QuantizedModel back = load_quantized(s.path.string(), t.specs, t.input);
  ASSERT_EQ(back.stages.size(), s.model.stages.size());
  for (size_t i = 0; i < back.stages.size(); ++i) {
    EXPECT_EQ(back.stages[i].avgpool, s.model.stages[i].avgpool);
    EXPECT_EQ(back.stages[i].input_scale, s.model.stages[i].input_scale);
    EXPECT_EQ(back.stages[i].output_scale, s.model.stages[i].output_scale);
  }
  EXPECT_EQ(int8_logits(back, t.test_x, 37), int8_logits(s.model, t.test_x, 37));
  const auto drop = [](const std::string& name) {
    return [name](std::vector<NamedTensor>& ts, std::map<std::string, std::string>&) {
      ts.erase(std::remove_if(ts.begin(), ts.end(), [&](auto& x) { return x.name == name; }),
               ts.end());
    };
  };
  const std::string missing = rewritten(s, "avg_missing", drop("avg2.output_scale"));
  std::string e = error_of([&] { load_quantized(missing, t.specs, t.input); });
  EXPECT_TRUE(test::contains(e, "has no tensor 'avg2.output_scale'")) << e;
  const std::string disagree = rewritten(
      s, "avg_disagree", [](auto& ts, auto&) { find(ts, "conv2.input_scale")->data[0] *= 2; });
  e = error_of([&] { load_quantized(disagree, t.specs, t.input); });
  EXPECT_TRUE(test::contains(e, "both are the scale of the activations 'avg1' writes")) << e;
}

// Calibration through the training Network's forward (the GPU's path; here on the CPU) gives
// the scales of the stages' own float forward: max and percentile up to float rounding, mse up
// to one step of its 200-candidate search where rounding tips a near tie. Every int8 tensor:
// the input, convs, residual adds, average pools.
TEST(Quant, CalibrationThroughTheNetworkGivesTheSameScales) {
  for (const Trained* t : {&trained_resnet(), &trained_avgpool_net(), &trained_net()}) {
    const std::vector<QuantStage> plan = plan_int8(t->folded.specs, t->input);
    const auto scales = [&](CalibrationMethod method, CalibrationForward fwd) {
      return calibrate_activation_scales(plan, t->folded, t->input, t->train_x.data(), 300, method,
                                         Exec{}, fwd);
    };
    const std::vector<float> max_scale = scales(CalibrationMethod::Max, CalibrationForward::Stages);
    ASSERT_EQ(max_scale.size(), plan.size());
    for (CalibrationMethod method :
         {CalibrationMethod::Max, CalibrationMethod::Percentile, CalibrationMethod::Mse}) {
      const std::vector<float> a =
          method == CalibrationMethod::Max ? max_scale : scales(method, CalibrationForward::Stages);
      const std::vector<float> b = scales(method, CalibrationForward::Network);
      ASSERT_EQ(a.size(), b.size());
      for (size_t k = 0; k < a.size(); ++k) {
        SCOPED_TRACE(::testing::Message() << calibration_method_name(method) << " tensor " << k
                                          << " (" << (k ? plan[k - 1].name : "input") << ")");
        const double tol =
            method == CalibrationMethod::Mse ? max_scale[k] / 200.0 * 1.001 : 1e-5 * a[k];
        EXPECT_NEAR(b[k], a[k], tol);
        EXPECT_NE(a[k], 1.f);  // a tensor of zeros would prove nothing
      }
    }
  }
  // The stages' output nodes: a fused ReLU's, a block's ReLU after the add, the classifier.
  const Trained& r = trained_resnet();
  const std::vector<QuantStage> plan = plan_int8(r.folded.specs, r.input);
  const std::vector<size_t> nodes = stage_output_nodes(plan, r.folded.specs);
  const std::vector<GraphNode> graph = layer_graph(r.folded.specs);
  std::vector<std::string> names;
  for (size_t k : nodes) names.push_back(graph[k].spec.name);
  EXPECT_EQ(names, (std::vector<std::string>{"relu1", "relu2", "conv3", "relu3", "relu4", "conv5",
                                             "conv6", "relu5", "fc1"}));
}

}  // namespace
}  // namespace cnn
