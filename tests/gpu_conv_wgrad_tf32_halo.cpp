// The TF32 halo weight gradient (kernels/conv/conv2d_wgmma_wgrad_tf32_halo.h) against
// conv2d_backward_weight_cpu. Skipped unless the device is compute capability 9.0 and the build
// has the sm_90a kernel. Cases:
//   Exact        small-integer inputs (exact in TF32, every partial sum exact in FP32): bit-equal
//                to the reference, accumulated into a nonzero dw; the first wrong (oc, c, tap) is
//                printed. ResNet's 3x3 layers at batch 2-3 (32x32, 16x16, 8x8: 2, 4 and 8 output
//                rows a k-tile), C and OC not multiples of 64 (16, 20, 70, 130), a ragged last
//                band, OW 24 and 56 (6 and 7 k steps), 5x5 and 7x7 (tap groups of 4-5, padding
//                3), padding 0.
//   Random       the same shapes on FP32 random inputs: TF32 drops 13 mantissa bits of each
//                operand (at most 2^-10 of it), so |got - ref| <= (2^-9 + 2 K 2^-24) sum_k |dy x|
//                + 4 ulp (|ref| + |dw0|), K = N*OH*OW; and the relative Frobenius error under
//                2^-9 (a dropped k-tile or split is about sqrt(rows OW / K) or more).
//   Splits       every split count (1, 2, 3, 7, 12, more than the k-tiles) gives the exact answer.
//   Small        one small call on one and on two splits: the case compute-sanitizer runs.
//   Refusals     one line each, and the call throws: BF16 and FP32 precision, deterministic mode,
//                stride 2, OW not a multiple of 8.
//   Dispatch     conv2d_backward_weight with Algo::WgmmaNhwc at tf32 runs this kernel (within the
//                bound), with db too; x off 16 bytes falls back to another kernel, as correct.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "runtime/error.h"
#include "runtime/exec.h"
#include "runtime/tensor.h"
#include "tests/conv_test_check.h"
#include "tests/test_util.h"
#include "tests/wgmma_wgrad_check.h"
#ifdef CNN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/conv/conv2d_wgmma_wgrad_tf32_halo.h"
#include "kernels/conv/conv2d_wgrad_tf32_halo_layout.h"
#include "runtime/cuda_check.h"
#endif

using namespace cnn;

namespace {

#ifdef CNN_HAVE_CUDA

#define CNN_REQUIRE_WGRAD_TF32_HALO()                                                          \
  do {                                                                                         \
    CNN_REQUIRE_GPU();                                                                         \
    if (!conv2d_wgrad_tf32_halo_available())                                                   \
      GTEST_SKIP() << "the TF32 halo weight gradient needs a compute capability 9.0 GPU and an " \
                      "sm_90a build";                                                          \
  } while (0)

using test::Fill;
constexpr auto conv = test::square_conv;  // (n, c, h, w, oc, k, stride, pad)

using wgrad_test::describe;
using wgrad_test::make_problem;
using wgrad_test::Problem;

// The kernel itself (splits 0: its pick).
std::vector<float> run_kernel(const Problem& p, int splits = 0) {
  Tensor d_x = test::to_device(p.x), d_dy = test::to_device(p.dy), d_dw = test::to_device(p.dw0);
  EXPECT_TRUE(conv2d_backward_weight_tf32_halo(p.s, d_x.data(), d_dy.data(), d_dw.data(), nullptr,
                                               wgrad_test::cuda_exec(Precision::TF32), splits));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return d_dw.to_vector();
}

// Exact for integer inputs, else the bound of the file comment.
void check(const Problem& p, const std::vector<float>& got, const std::string& what) {
  wgrad_test::check(p, got, what, std::ldexp(1.0, -9), std::ldexp(1.0, -9));
}

std::vector<Conv2dShape> shapes() {
  return {
      conv(2, 64, 32, 32, 64, 3, 1, 1),    // ResNet's 64-channel layers: 2 rows a k-tile
      conv(2, 128, 16, 16, 128, 3, 1, 1),  // 128-channel: 4 rows
      conv(3, 256, 8, 8, 256, 3, 1, 1),    // 256-channel: a whole image, 4 channel chunks
      conv(1, 16, 8, 8, 5, 3, 1, 1),       // one k-tile, OC = 5
      conv(3, 20, 13, 16, 70, 3, 1, 1),    // OH 13: a last band of 1 row; OC = 70
      conv(2, 70, 8, 8, 130, 3, 1, 1),     // C = 70 (two chunks), OC = 130 (three tiles)
      conv(2, 32, 24, 24, 48, 3, 1, 1),    // OW 24: 48 pixels, 6 k steps
      conv(1, 16, 6, 56, 16, 3, 1, 1),     // OW 56: one row, 7 k steps
      conv(1, 17, 12, 16, 96, 5, 1, 2),    // 5x5: 5 tap groups
      conv(2, 16, 11, 16, 24, 7, 1, 3),    // 7x7, padding 3: 49 taps
      conv(2, 24, 10, 12, 16, 5, 1, 0),    // padding 0: OW 8
  };
}

TEST(GpuConvWgradTf32Halo, Exact) {
  CNN_REQUIRE_WGRAD_TF32_HALO();
  for (const Conv2dShape& s : shapes()) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(s) + " seed " + std::to_string(seed));
    ASSERT_EQ(conv2d_wgrad_tf32_halo_refusal(s, wgrad_test::cuda_exec(Precision::TF32)), "");
    const Problem p = make_problem(s, Fill::SmallInt, seed);
    check(p, run_kernel(p), "int");
  }
}

TEST(GpuConvWgradTf32Halo, Random) {
  CNN_REQUIRE_WGRAD_TF32_HALO();
  for (const Conv2dShape& s : shapes()) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(s) + " seed " + std::to_string(seed));
    const Problem p = make_problem(s, Fill::Random, seed);
    check(p, run_kernel(p), "random");
  }
}

TEST(GpuConvWgradTf32Halo, Splits) {
  CNN_REQUIRE_WGRAD_TF32_HALO();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Problem p = make_problem(conv(3, 64, 16, 16, 128, 3, 1, 1), Fill::SmallInt, seed);
  std::printf("picked splits %d\n", conv2d_wgrad_tf32_halo_splits(p.s));
  for (int splits : {1, 2, 3, 7, 12, 1000})  // 3 images x 4 bands: 12 k-tiles
    check(p, run_kernel(p, splits), "splits " + std::to_string(splits));
}

// One small call (2 images, one k-tile each) on one and on two splits: the case compute-sanitizer
// runs.
TEST(GpuConvWgradTf32Halo, Small) {
  CNN_REQUIRE_WGRAD_TF32_HALO();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Problem p = make_problem(conv(2, 20, 8, 8, 70, 3, 1, 1), Fill::SmallInt, seed);
  for (int splits : {1, 2}) check(p, run_kernel(p, splits), "small splits " + std::to_string(splits));
}

TEST(GpuConvWgradTf32Halo, Refusals) {
  CNN_REQUIRE_WGRAD_TF32_HALO();
  const Conv2dShape s = conv(1, 16, 8, 8, 8, 3, 1, 1);
  EXPECT_EQ(conv2d_wgrad_tf32_halo_refusal(s, wgrad_test::cuda_exec(Precision::TF32)), "");
  struct Refused {
    Conv2dShape s;
    Exec ex;
    const char* word;
  };
  const Refused refused[] = {
      {s, wgrad_test::cuda_exec(Precision::BF16), "precision"},
      {s, wgrad_test::cuda_exec(Precision::FP32), "precision"},
      {s, wgrad_test::cuda_exec(Precision::TF32, true), "deterministic"},
      {conv(1, 16, 16, 16, 8, 3, 2, 1), wgrad_test::cuda_exec(Precision::TF32), "stride"},
      {conv(1, 16, 14, 14, 8, 3, 1, 1), wgrad_test::cuda_exec(Precision::TF32), "OW"},
  };
  std::vector<float> x(size_t(16) * 16 * 16, 1.f), dy(8 * 256, 1.f), dw(8 * 16 * 9, 0.f);
  Tensor d_x = test::to_device(x), d_dy = test::to_device(dy), d_dw = test::to_device(dw);
  for (const Refused& r : refused) {
    const std::string why = conv2d_wgrad_tf32_halo_refusal(r.s, r.ex);
    std::printf("refused: %s\n", why.c_str());
    EXPECT_NE(why.find(r.word), std::string::npos) << why;
    EXPECT_EQ(why.find('\n'), std::string::npos) << why;
    EXPECT_THROW(conv2d_backward_weight_tf32_halo(r.s, d_x.data(), d_dy.data(), d_dw.data(),
                                                  nullptr, r.ex),
                 Error);
  }
}

TEST(GpuConvWgradTf32Halo, Dispatch) {
  CNN_REQUIRE_WGRAD_TF32_HALO();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Problem p = make_problem(conv(2, 64, 16, 16, 96, 3, 1, 1), Fill::Random, seed);
  const Exec ex = wgrad_test::cuda_exec(Precision::TF32);
  const size_t floats = conv2d_backward_weight_scratch_floats(p.s, ex);
  Tensor scratch({int64_t(std::max<size_t>(floats, 1))}, Device::CUDA);
  for (bool with_db : {false, true}) {
    Tensor d_x = test::to_device(p.x), d_dy = test::to_device(p.dy);
    Tensor d_dw = test::to_device(p.dw0), d_db({int64_t(p.s.oc)}, Device::CUDA);
    CNN_CUDA_CHECK(cudaMemset(d_db.data(), 0, sizeof(float) * size_t(p.s.oc)));
    conv2d_backward_weight(p.s, d_x.data(), d_dy.data(), d_dw.data(),
                           with_db ? d_db.data() : nullptr, scratch.data(), Algo::WgmmaNhwc, ex);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    check(p, d_dw.to_vector(), with_db ? "api, db" : "api");
    if (!with_db) continue;
    wgrad_test::check_db(p, d_db.to_vector());
  }
  // x one float past a 16-byte boundary: the kernel declines it and the API runs another.
  std::vector<float> shifted(p.x.size() + 1, 0.f);
  std::copy(p.x.begin(), p.x.end(), shifted.begin() + 1);
  Tensor d_xs = test::to_device(shifted), d_dy = test::to_device(p.dy);
  Tensor d_dw = test::to_device(p.dw0);
  EXPECT_FALSE(conv2d_backward_weight_tf32_halo(p.s, d_xs.data() + 1, d_dy.data(), d_dw.data(),
                                                nullptr, ex));
  conv2d_backward_weight(p.s, d_xs.data() + 1, d_dy.data(), d_dw.data(), nullptr, scratch.data(),
                         Algo::WgmmaNhwc, ex);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  check(p, d_dw.to_vector(), "api, x off 16 bytes");
}

#endif  // CNN_HAVE_CUDA

}  // namespace
