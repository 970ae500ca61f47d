// The fast CPU convolution and linear kernels against the plain-loop references: stride 2,
// padding 0/1/2, kernels 1/3/5, batch 1/3 and more than the weight-gradient groups, non-square
// images and kernels. Errors are held to the worst-case float summation bound, computed by
// running the reference on absolute values. Also: bitwise repeatable, and the same bits when the
// pool runs everything on one thread.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_cpu_fast.h"
#include "kernels/gemm/linear.h"
#include "kernels/gemm/linear_cpu_fast.h"
#include "runtime/thread_pool.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

std::vector<float> abs_of(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = std::fabs(v[i]);
  return out;
}

// |got - ref| <= (terms + 4) * 2^-23 * mag elementwise, mag being the sum of |products| (plus
// |initial value| for accumulating outputs).
void expect_within_bound(const std::vector<float>& got, const std::vector<float>& ref,
                         const std::vector<float>& mag, int64_t terms, const char* what) {
  ASSERT_EQ(got.size(), ref.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = (terms + 4) * std::ldexp(1.0, -23) * mag[i] + 1e-30;
    const double err = std::fabs(double(got[i]) - double(ref[i]));
    worst = std::max(worst, err / bound);
    ASSERT_LE(err, bound) << what << "[" << i << "] = " << got[i] << ", reference " << ref[i];
  }
  ::testing::Test::RecordProperty(what, std::to_string(worst));
}

// Runs fn as one task of a two-task parallel call, so that every nested parallel call inside it
// runs on this one thread: the single-thread result, for comparison with the pooled one.
template <class Fn>
void on_one_thread(Fn fn) {
  parallel_tasks(2, [&](int64_t t) {
    if (t == 0) fn();
  });
}

std::vector<float> nan_vector(size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

// n, c, h, w, oc, kh, kw, stride_h, stride_w, pad_h, pad_w
Conv2dShape conv(int n, int c, int h, int w, int oc, int kh, int kw, int sh, int sw, int ph,
                 int pw) {
  Conv2dShape s;
  s.n = n, s.c = c, s.h = h, s.w = w, s.oc = oc, s.kh = kh, s.kw = kw;
  s.stride_h = sh, s.stride_w = sw, s.pad_h = ph, s.pad_w = pw;
  return s;
}

const Conv2dShape kConvShapes[] = {
    conv(1, 1, 28, 28, 32, 5, 5, 1, 1, 2, 2),   // MNIST conv1, batch 1
    conv(3, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2),  // MNIST conv2, batch 3
    conv(3, 3, 9, 13, 5, 3, 3, 2, 2, 1, 1),     // stride 2, pad 1, non-square
    conv(1, 4, 7, 10, 6, 1, 1, 1, 1, 0, 0),     // 1x1 direct (no im2col)
    conv(3, 5, 11, 6, 7, 1, 1, 2, 2, 0, 0),     // 1x1 stride 2
    conv(2, 2, 10, 9, 3, 3, 5, 1, 2, 0, 2),     // non-square kernel, mixed stride/pad
    conv(3, 3, 8, 12, 4, 5, 3, 2, 1, 2, 1),
    conv(19, 2, 6, 5, 3, 3, 3, 1, 1, 1, 1),   // more images than weight-gradient groups
    conv(1, 2, 3, 3, 2, 5, 5, 1, 1, 2, 2),    // kernel larger than the image
    conv(2, 1, 5, 5, 1, 5, 5, 2, 2, 0, 0),    // 1x1 output
    conv(3, 7, 12, 11, 9, 3, 3, 2, 2, 2, 0),  // stride 2, pad 2/0
};

struct ConvData {
  std::vector<float> x, w, b, dy, dw0, db0;
};

ConvData conv_data(const Conv2dShape& s, uint64_t seed) {
  const size_t xs = size_t(s.n) * s.c * s.h * s.w, ws = size_t(s.oc) * s.c * s.kh * s.kw;
  const size_t ys = size_t(s.n) * s.oc * s.oh() * s.ow();
  return {test::random_vector(xs, seed),       test::random_vector(ws, seed + 1),
          test::random_vector(s.oc, seed + 2), test::random_vector(ys, seed + 3),
          test::random_vector(ws, seed + 4),   test::random_vector(s.oc, seed + 5)};
}

std::string describe(const Conv2dShape& s) {
  return ::testing::PrintToString(std::vector<int>{s.n, s.c, s.h, s.w, s.oc, s.kh, s.kw, s.stride_h,
                                                   s.stride_w, s.pad_h, s.pad_w});
}

}  // namespace

TEST(CpuFastConv, ForwardMatchesReference) {
  for (const Conv2dShape& s : kConvShapes) {
    for (bool relu : {false, true}) {
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE("shape (n,c,h,w,oc,kh,kw,sh,sw,ph,pw) " + describe(s) +
                   " relu=" + std::to_string(relu) + " seed=" + std::to_string(seed));
      const ConvData d = conv_data(s, seed);
      const size_t ys = d.dy.size();
      std::vector<float> ref(ys), mag(ys), got = nan_vector(ys);
      conv2d_forward_cpu(s, d.x.data(), d.w.data(), d.b.data(), ref.data(), relu);
      conv2d_forward_cpu(s, abs_of(d.x).data(), abs_of(d.w).data(), abs_of(d.b).data(), mag.data(),
                         false);
      conv2d_forward_cpu_fast(s, d.x.data(), d.w.data(), d.b.data(), got.data(), relu);
      expect_within_bound(got, ref, mag, int64_t(s.c) * s.kh * s.kw, "forward");

      // Without bias, repeatable, and the same bits on one thread.
      conv2d_forward_cpu(s, d.x.data(), d.w.data(), nullptr, ref.data(), relu);
      std::vector<float> a = nan_vector(ys), b = nan_vector(ys), one = nan_vector(ys);
      conv2d_forward_cpu_fast(s, d.x.data(), d.w.data(), nullptr, a.data(), relu);
      conv2d_forward_cpu_fast(s, d.x.data(), d.w.data(), nullptr, b.data(), relu);
      on_one_thread(
          [&] { conv2d_forward_cpu_fast(s, d.x.data(), d.w.data(), nullptr, one.data(), relu); });
      expect_within_bound(a, ref, mag, int64_t(s.c) * s.kh * s.kw, "forward_nobias");
      EXPECT_EQ(a, b);
      EXPECT_EQ(a, one);
    }
  }
}

TEST(CpuFastConv, BackwardDataMatchesReference) {
  for (const Conv2dShape& s : kConvShapes) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("shape (n,c,h,w,oc,kh,kw,sh,sw,ph,pw) " + describe(s) +
                 " seed=" + std::to_string(seed));
    const ConvData d = conv_data(s, seed);
    const size_t xs = d.x.size();
    std::vector<float> ref(xs), mag(xs), got = nan_vector(xs), again = nan_vector(xs),
                                         one = nan_vector(xs);
    conv2d_backward_data_cpu(s, d.dy.data(), d.w.data(), ref.data());
    conv2d_backward_data_cpu(s, abs_of(d.dy).data(), abs_of(d.w).data(), mag.data());
    conv2d_backward_data_cpu_fast(s, d.dy.data(), d.w.data(), got.data());
    expect_within_bound(got, ref, mag, int64_t(s.oc) * s.kh * s.kw, "backward_data");
    conv2d_backward_data_cpu_fast(s, d.dy.data(), d.w.data(), again.data());
    on_one_thread([&] { conv2d_backward_data_cpu_fast(s, d.dy.data(), d.w.data(), one.data()); });
    EXPECT_EQ(got, again);
    EXPECT_EQ(got, one);
  }
}

TEST(CpuFastConv, BackwardWeightAccumulatesLikeReference) {
  for (const Conv2dShape& s : kConvShapes) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("shape (n,c,h,w,oc,kh,kw,sh,sw,ph,pw) " + describe(s) +
                 " seed=" + std::to_string(seed));
    const ConvData d = conv_data(s, seed);
    std::vector<float> dw_ref = d.dw0, db_ref = d.db0, dw = d.dw0, db = d.db0;
    conv2d_backward_weight_cpu(s, d.x.data(), d.dy.data(), dw_ref.data(), db_ref.data());
    conv2d_backward_weight_cpu_fast(s, d.x.data(), d.dy.data(), dw.data(), db.data());
    // Bound: sum of |x dy| over the batch, plus the initial |dw| (accumulation).
    std::vector<float> dw_mag = abs_of(d.dw0), db_mag = abs_of(d.db0);
    conv2d_backward_weight_cpu(s, abs_of(d.x).data(), abs_of(d.dy).data(), dw_mag.data(),
                               db_mag.data());
    const int64_t terms = int64_t(s.n) * s.oh() * s.ow();
    expect_within_bound(dw, dw_ref, dw_mag, terms, "backward_weight_dw");
    expect_within_bound(db, db_ref, db_mag, terms, "backward_weight_db");

    // db may be null; repeatable; the same bits on one thread.
    std::vector<float> dw2 = d.dw0, dw1 = d.dw0, db1 = d.db0;
    conv2d_backward_weight_cpu_fast(s, d.x.data(), d.dy.data(), dw2.data(), nullptr);
    on_one_thread([&] {
      conv2d_backward_weight_cpu_fast(s, d.x.data(), d.dy.data(), dw1.data(), db1.data());
    });
    EXPECT_EQ(dw2, dw);
    EXPECT_EQ(dw1, dw);
    EXPECT_EQ(db1, db);
  }
}

TEST(CpuFastLinear, MatchesReference) {
  const LinearShape shapes[] = {
      {1, 1, 1}, {3, 7, 5}, {17, 300, 33}, {130, 520, 70}, {40, 1100, 300}};
  for (const LinearShape& s : shapes) {
    for (bool relu : {false, true}) {
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(::testing::Message() << "n=" << s.n << " in=" << s.in << " out=" << s.out
                                        << " relu=" << relu << " seed=" << seed);
      const size_t xs = size_t(s.n) * s.in, ys = size_t(s.n) * s.out, ws = size_t(s.out) * s.in;
      const auto x = test::random_vector(xs, seed), w = test::random_vector(ws, seed + 1);
      const auto b = test::random_vector(s.out, seed + 2), dy = test::random_vector(ys, seed + 3);
      const auto dw0 = test::random_vector(ws, seed + 4),
                 db0 = test::random_vector(s.out, seed + 5);

      std::vector<float> ref(ys), mag(ys), got = nan_vector(ys), one = nan_vector(ys);
      linear_forward_cpu(s, x.data(), w.data(), b.data(), ref.data(), relu);
      linear_forward_cpu(s, abs_of(x).data(), abs_of(w).data(), abs_of(b).data(), mag.data(),
                         false);
      linear_forward_cpu_fast(s, x.data(), w.data(), b.data(), got.data(), relu);
      expect_within_bound(got, ref, mag, s.in, "linear_forward");
      on_one_thread(
          [&] { linear_forward_cpu_fast(s, x.data(), w.data(), b.data(), one.data(), relu); });
      EXPECT_EQ(got, one);
      if (relu) continue;  // the backward passes do not depend on relu

      std::vector<float> dx_ref(xs), dx_mag(xs), dx = nan_vector(xs), dx1 = nan_vector(xs);
      linear_backward_data_cpu(s, dy.data(), w.data(), dx_ref.data());
      linear_backward_data_cpu(s, abs_of(dy).data(), abs_of(w).data(), dx_mag.data());
      linear_backward_data_cpu_fast(s, dy.data(), w.data(), dx.data());
      expect_within_bound(dx, dx_ref, dx_mag, s.out, "linear_backward_data");
      on_one_thread([&] { linear_backward_data_cpu_fast(s, dy.data(), w.data(), dx1.data()); });
      EXPECT_EQ(dx, dx1);

      std::vector<float> dw_ref = dw0, db_ref = db0, dw = dw0, db = db0, dw_mag = abs_of(dw0),
                         db_mag = abs_of(db0), dw1 = dw0, db1 = db0, dw2 = dw0;
      linear_backward_weight_cpu(s, x.data(), dy.data(), dw_ref.data(), db_ref.data());
      linear_backward_weight_cpu(s, abs_of(x).data(), abs_of(dy).data(), dw_mag.data(),
                                 db_mag.data());
      linear_backward_weight_cpu_fast(s, x.data(), dy.data(), dw.data(), db.data());
      expect_within_bound(dw, dw_ref, dw_mag, s.n, "linear_backward_weight_dw");
      expect_within_bound(db, db_ref, db_mag, s.n, "linear_backward_weight_db");
      on_one_thread(
          [&] { linear_backward_weight_cpu_fast(s, x.data(), dy.data(), dw1.data(), db1.data()); });
      linear_backward_weight_cpu_fast(s, x.data(), dy.data(), dw2.data(), nullptr);
      EXPECT_EQ(dw, dw1);
      EXPECT_EQ(db, db1);
      EXPECT_EQ(dw, dw2);
    }
  }
}
