// The BF16 weight gradient from channels-last copies (kernels/conv/conv2d_wgmma_wgrad_nhwc.h)
// against conv2d_backward_weight_cpu on the BF16-rounded x and dy. Skipped unless the device is
// compute capability 9.0 and the build has the sm_90a kernel. Cases:
//   Exact        small-integer inputs (exact in BF16, every partial sum exact in FP32): bit-equal
//                to the reference, accumulated into a nonzero dw; the first wrong (oc, c, tap)
//                is printed. One k-tile; the VGG layers at batch 2; C and OC not multiples of
//                64 (70, 130, 200), C = 1 and 3, 1x1 / 5x5 / 7x7, stride 2, padding 0..3,
//                OH*OW not a multiple of 64 (k-tiles across images, a ragged last one); every
//                tile form: one dy box (OC <= 64) or two, each consumer n64 or n128 (one x piece
//                or two side by side: the MN-major descriptor's M/N stride).
//   Random       the same shapes on random inputs, within the bound below.
//                Every stride-1 shape also runs the halo instance (WgradNhwcLoad::Halo: one dy
//                box and one x box a k-tile serving every tap at a row offset), with LeNet's
//                5x5 conv2, whole images a k-tile (4x4, 7x7), 1 tap, and taps split 1..4 a
//                consumer.
//   Splits       every split count (1, 2, 3, 7, 64, and more than the k-tiles) gives the exact
//                integer answer, in both instances.
//   Refusals     one line each, and the call throws: TF32 and FP32 precision, deterministic
//                mode, a stride the im2col TMA cannot express.
//   Dispatch     conv2d_backward_weight with Algo::WgmmaNhwc at bf16 runs this kernel (within
//                the bound), with db too (db within FP32 summation's bound of the exact sums);
//                the API's scratch covers this kernel's.
// Bound: a BF16 x BF16 product is exact in FP32, so the only error is the order of the FP32
// sums: |got - ref| <= 2 K 2^-24 sum_k |dy x| + 4 ulp (|ref| + |dw0|), K = N*OH*OW; and the
// relative Frobenius error under 1e-5 (a dropped k-tile or split is about sqrt(64 / K) or more).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/common/bf16_round.h"
#include "kernels/conv/conv2d.h"
#include "runtime/error.h"
#include "runtime/exec.h"
#include "runtime/tensor.h"
#include "tests/conv_test_check.h"
#include "tests/test_util.h"
#include "tests/wgmma_wgrad_check.h"
#ifdef CNN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/conv/conv2d_wgmma_wgrad_nhwc.h"
#include "kernels/conv/conv2d_wgrad_halo_layout.h"
#include "runtime/cuda_check.h"
#endif

using namespace cnn;

namespace {

#ifdef CNN_HAVE_CUDA

#define CNN_REQUIRE_WGRAD_NHWC()                                                           \
  do {                                                                                     \
    CNN_REQUIRE_GPU();                                                                     \
    if (!conv2d_wgrad_wgmma_nhwc_available())                                              \
      GTEST_SKIP() << "the BF16 channels-last weight gradient needs a compute capability " \
                      "9.0 GPU and an sm_90a build";                                       \
  } while (0)

using conv_test::Fill;
constexpr auto conv = test::square_conv;  // (n, c, h, w, oc, k, stride, pad)

using wgrad_test::describe;
using wgrad_test::Problem;

// x and dy rounded to BF16 (the kernel's operands): the products are then exact in FP32.
Problem make_problem(const Conv2dShape& s, Fill fill, uint64_t seed) {
  return wgrad_test::make_problem(s, fill, seed, [](std::vector<float> v) {
    return round_to_bf16(v);
  });
}

// The kernel itself (splits 0: its pick; consumer_n 0: its pick), into NaN-poisoned scratch.
std::vector<float> run_kernel(const Problem& p, int splits = 0, int consumer_n = 0,
                              WgradNhwcLoad load = WgradNhwcLoad::Im2col) {
  Tensor d_x = test::to_device(p.x), d_dy = test::to_device(p.dy), d_dw = test::to_device(p.dw0);
  const size_t floats = conv2d_wgrad_wgmma_nhwc_scratch_floats(p.s);
  Tensor scratch({int64_t(floats)}, Device::CUDA);
  test::poison_device(scratch.data(), floats);
  WgmmaWgradNhwcOptions opt;
  opt.splits = splits;
  opt.consumer_n = consumer_n;
  opt.b_load = load;
  conv2d_backward_weight_wgmma_nhwc(p.s, d_x.data(), d_dy.data(), d_dw.data(), nullptr,
                                    scratch.data(), wgrad_test::cuda_exec(Precision::BF16), opt);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return d_dw.to_vector();
}

// Exact for integer inputs, else the bound of the file comment.
void check(const Problem& p, const std::vector<float>& got, const std::string& what) {
  wgrad_test::check(p, got, what, 0.0, 1e-5);
}

std::vector<Conv2dShape> shapes() {
  return {
      conv(1, 64, 8, 8, 64, 3, 1, 1),      // one k-tile (64 output pixels)
      conv(1, 1, 6, 6, 5, 3, 1, 1),        // C = 1, OC = 5: padded channels, ragged k-tile
      conv(2, 64, 32, 32, 64, 3, 1, 1),    // VGG conv2 at batch 2 (one dy box, two pieces)
      conv(2, 128, 16, 16, 128, 3, 1, 1),  // VGG conv4 (two dy boxes, one piece)
      conv(3, 256, 8, 8, 256, 3, 1, 1),    // VGG conv6: two row tiles
      conv(2, 64, 16, 16, 128, 3, 1, 1),   // VGG conv3
      conv(3, 3, 17, 13, 64, 3, 1, 1),     // C = 3, OH*OW = 221: k-tiles across images
      conv(2, 70, 9, 11, 130, 1, 1, 0),    // 1x1, C = 70 (two chunks), OC = 130 (a last 128-tile)
      conv(1, 17, 20, 20, 96, 5, 1, 2),    // 5x5, OC = 96
      conv(2, 3, 40, 36, 64, 7, 2, 3),     // a 7x7 stride-2 stem
      conv(3, 17, 11, 9, 200, 3, 2, 0),    // stride 2, no padding, OH*OW = 20
      conv(2, 32, 6, 6, 48, 5, 1, 3),      // padding 3 > k / 2: all-padding taps
      conv(3, 32, 14, 14, 64, 5, 1, 2),    // LeNet's conv2: halo bands of 7 rows, 25 taps
      conv(5, 64, 4, 4, 72, 3, 1, 1),      // halo: 3 whole images a k-tile, a ragged last one
      conv(2, 96, 7, 7, 64, 7, 1, 3),      // halo: 7x7 kernel, 49 taps in 7 groups
  };
}

// The halo instance where the shape allows it (stride 1), as the second run of a case.
bool halo_runs(const Conv2dShape& s) {
  return wgrad_halo_refusal(s).empty();
}

TEST(GpuConvWgradNhwcBf16, Exact) {
  CNN_REQUIRE_WGRAD_NHWC();
  for (const Conv2dShape& s : shapes()) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(s) + " seed " + std::to_string(seed));
    const Problem p = make_problem(s, Fill::SmallInt, seed);
    for (int n : {64, 128}) check(p, run_kernel(p, 0, n), "int n" + std::to_string(n));
    if (halo_runs(s)) check(p, run_kernel(p, 0, 0, WgradNhwcLoad::Halo), "int halo");
  }
}

TEST(GpuConvWgradNhwcBf16, Random) {
  CNN_REQUIRE_WGRAD_NHWC();
  for (const Conv2dShape& s : shapes()) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(s) + " seed " + std::to_string(seed));
    const Problem p = make_problem(s, Fill::Random, seed);
    for (int n : {64, 128}) check(p, run_kernel(p, 0, n), "random n" + std::to_string(n));
    if (halo_runs(s)) check(p, run_kernel(p, 0, 0, WgradNhwcLoad::Halo), "random halo");
  }
}

TEST(GpuConvWgradNhwcBf16, Splits) {
  CNN_REQUIRE_WGRAD_NHWC();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Problem p = make_problem(conv(3, 64, 16, 16, 128, 3, 1, 1), Fill::SmallInt, seed);
  std::printf("picked splits %d\n", conv2d_wgrad_wgmma_nhwc_splits(p.s));
  for (int splits : {1, 2, 3, 7, 64, 1000})  // 12 k-tiles: 64 and 1000 run 12 splits
    for (int n : {64, 128})
      check(p, run_kernel(p, splits, n),
            "splits " + std::to_string(splits) + " n" + std::to_string(n));
  // The halo instance: 3 images x 2 bands of 7 rows, 6 k-tiles.
  const Problem q = make_problem(conv(3, 40, 14, 14, 70, 5, 1, 2), Fill::SmallInt, seed + 7);
  for (int splits : {1, 2, 5, 6, 1000})
    check(q, run_kernel(q, splits, 0, WgradNhwcLoad::Halo),
          "halo splits " + std::to_string(splits));
}

// One small halo call (3 k-tiles of 2 images) on one and on two splits: the case
// compute-sanitizer runs (the suites above take too long under racecheck).
TEST(GpuConvWgradNhwcBf16, HaloSmall) {
  CNN_REQUIRE_WGRAD_NHWC();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Problem p = make_problem(conv(5, 40, 6, 6, 70, 3, 1, 1), Fill::SmallInt, seed);
  for (int splits : {1, 2})
    check(p, run_kernel(p, splits, 0, WgradNhwcLoad::Halo),
          "halo small splits " + std::to_string(splits));
}

// Halo boxes asked for on a shape they cannot run are refused with the reason; the pick takes
// them for LeNet's conv2 and leaves them out of 1x1 and strided layers.
TEST(GpuConvWgradNhwcBf16, HaloRefusalsAndPicks) {
  CNN_REQUIRE_WGRAD_NHWC();
  const Conv2dShape strided = conv(1, 8, 9, 9, 8, 3, 2, 1);
  std::vector<float> x(size_t(8) * 81, 1.f), dy(8 * 25, 1.f), dw(8 * 8 * 9, 0.f);
  Tensor d_x = test::to_device(x), d_dy = test::to_device(dy), d_dw = test::to_device(dw);
  Tensor scratch({int64_t(1 << 16)}, Device::CUDA);
  WgmmaWgradNhwcOptions opt;
  opt.b_load = WgradNhwcLoad::Halo;
  try {
    conv2d_backward_weight_wgmma_nhwc(strided, d_x.data(), d_dy.data(), d_dw.data(), nullptr,
                                      scratch.data(), wgrad_test::cuda_exec(Precision::BF16), opt);
    ADD_FAILURE() << "halo boxes on stride 2 were not refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("stride"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_TRUE(conv2d_wgrad_wgmma_nhwc_pick_halo(conv(128, 32, 14, 14, 64, 5, 1, 2)));
  EXPECT_FALSE(conv2d_wgrad_wgmma_nhwc_pick_halo(conv(128, 64, 14, 14, 64, 1, 1, 0)));
  EXPECT_FALSE(conv2d_wgrad_wgmma_nhwc_pick_halo(strided));
  // 4x4 planes, 3x3: 49.6% of the multiplied k rows are pixels, above kWgradHaloMinUseful.
  EXPECT_TRUE(conv2d_wgrad_wgmma_nhwc_pick_halo(conv(128, 512, 4, 4, 512, 3, 1, 1)));
}

TEST(GpuConvWgradNhwcBf16, Refusals) {
  CNN_REQUIRE_WGRAD_NHWC();
  const Conv2dShape s = conv(1, 8, 8, 8, 8, 3, 1, 1);
  EXPECT_EQ(conv2d_wgrad_wgmma_nhwc_refusal(s, wgrad_test::cuda_exec(Precision::BF16)), "");
  struct Refused {
    Conv2dShape s;
    Exec ex;
  };
  const Refused refused[] = {
      {s, wgrad_test::cuda_exec(Precision::TF32)},
      {s, wgrad_test::cuda_exec(Precision::FP32)},
      {s, wgrad_test::cuda_exec(Precision::BF16, true)},
      {conv(1, 8, 40, 40, 8, 3, 9, 1),
       wgrad_test::cuda_exec(Precision::BF16)},  // stride 9: past the TMA's 8
  };
  std::vector<float> x(size_t(1) * 8 * 40 * 40, 1.f), dy(8 * 64, 1.f), dw(8 * 8 * 9, 0.f);
  Tensor d_x = test::to_device(x), d_dy = test::to_device(dy), d_dw = test::to_device(dw);
  Tensor scratch({int64_t(1 << 16)}, Device::CUDA);
  for (const Refused& r : refused) {
    const std::string why = conv2d_wgrad_wgmma_nhwc_refusal(r.s, r.ex);
    std::printf("refused: %s\n", why.c_str());
    EXPECT_FALSE(why.empty()) << describe(r.s);
    EXPECT_EQ(why.find('\n'), std::string::npos) << why;
    EXPECT_THROW(conv2d_backward_weight_wgmma_nhwc(r.s, d_x.data(), d_dy.data(), d_dw.data(),
                                                   nullptr, scratch.data(), r.ex),
                 Error);
  }
}

TEST(GpuConvWgradNhwcBf16, Dispatch) {
  CNN_REQUIRE_WGRAD_NHWC();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Problem p = make_problem(conv(2, 64, 16, 16, 96, 3, 1, 1), Fill::Random, seed);
  const Exec ex = wgrad_test::cuda_exec(Precision::BF16);
  const size_t floats = conv2d_backward_weight_scratch_floats(p.s, ex);
  EXPECT_GE(floats, conv2d_wgrad_wgmma_nhwc_scratch_floats(p.s));
  Tensor scratch({int64_t(floats)}, Device::CUDA);
  for (bool with_db : {false, true}) {
    Tensor d_x = test::to_device(p.x), d_dy = test::to_device(p.dy);
    Tensor d_dw = test::to_device(p.dw0), d_db({int64_t(p.s.oc)}, Device::CUDA);
    test::poison_device(scratch.data(), floats);
    CNN_CUDA_CHECK(cudaMemset(d_db.data(), 0, sizeof(float) * size_t(p.s.oc)));
    conv2d_backward_weight(p.s, d_x.data(), d_dy.data(), d_dw.data(),
                           with_db ? d_db.data() : nullptr, scratch.data(), Algo::WgmmaNhwc, ex);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    check(p, d_dw.to_vector(), with_db ? "api, db" : "api");
    if (!with_db) continue;
    wgrad_test::check_db(p, d_db.to_vector());
  }
}

#endif  // CNN_HAVE_CUDA

}  // namespace
