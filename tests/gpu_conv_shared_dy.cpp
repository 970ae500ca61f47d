// Both BF16 gradients of a convolution with one channels-last copy of dy (conv2d_backward_shared,
// kernels/conv/conv2d.h, over conv2d_backward_wgmma_nhwc_shared_dy): dx bit for bit what
// conv2d_backward_data gives with algo wgmma-nhwc at bf16 (its own copy of dy holds the same
// bits), dw and db what conv2d_backward_weight gives within the order of their atomic sums.
// Shapes: LeNet's conv2 (halo tiles in both passes), 3x3 layers of 32 and 64 channels, channel
// counts that are not multiples of 64, a 1x1 layer, batch 2, stride 2 (3x3 and 1x1: the input
// gradient's phases). Where it does not apply it runs nothing and returns false: stride 2 with
// dilation, deterministic mode, TF32, another algo for either pass, no dx, and a weight pack
// larger than the x copy (a 7x7 130 -> 70 layer at batch 2; a 1x1 image).
// Skipped unless the device is compute capability 9.0 and the build has the sm_90a kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "runtime/exec.h"
#include "runtime/memory.h"
#include "runtime/tensor.h"
#include "tests/gemm_error_measure.h"
#include "tests/nhwc_dispatch_rule.h"
#include "tests/test_util.h"
#ifdef CNN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/conv/conv2d_wgmma_wgrad_nhwc.h"
#include "runtime/cuda_check.h"
#endif

using namespace cnn;

namespace {

#ifdef CNN_HAVE_CUDA

Exec bf16_exec() {
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = Precision::BF16;
  return ex;
}

struct Grads {
  std::vector<float> dw, db, dx;
};

// One backward on fresh copies of dw0 / db0: shared (conv2d_backward_shared) or the two passes.
Grads backward(const Conv2dShape& s, const Tensor& x, const Tensor& dy, const Tensor& w,
               const std::vector<float>& dw0, const std::vector<float>& db0, bool shared) {
  const Exec ex = bf16_exec();
  const size_t nx = size_t(s.n) * s.c * s.h * s.w;
  const size_t floats = std::max(conv2d_backward_weight_scratch_floats(s, ex),
                                 conv2d_backward_data_scratch_floats(s, Algo::WgmmaNhwc, ex));
  Buffer<float> scratch(floats, Device::CUDA);
  test::poison_device(scratch.data(), floats);
  Tensor dw = test::to_device(dw0), db = test::to_device(db0);
  Buffer<float> dx(nx, Device::CUDA);
  test::poison_device(dx.data(), nx);
  if (shared) {
    EXPECT_TRUE(conv2d_backward_shared(s, x.data(), dy.data(), w.data(), dw.data(), db.data(),
                                       dx.data(), scratch.data(), Algo::WgmmaNhwc, Algo::WgmmaNhwc,
                                       ex));
  } else {
    conv2d_backward_weight(s, x.data(), dy.data(), dw.data(), db.data(), scratch.data(),
                           Algo::WgmmaNhwc, ex);
    conv2d_backward_data(s, dy.data(), w.data(), dx.data(), scratch.data(), Algo::WgmmaNhwc, ex);
  }
  return {dw.to_vector(), db.to_vector(), test::to_host(dx.data(), nx)};
}

TEST(GpuConvSharedDy, MatchesTheTwoPasses) {
  CNN_REQUIRE_GPU();
  if (!conv2d_wgrad_wgmma_nhwc_available())
    GTEST_SKIP() << "the BF16 channels-last gradients need a compute capability 9.0 GPU and an "
                    "sm_90a build";
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Conv2dShape shapes[] = {
      test::square_conv(test::network_batch(), 32, 14, 14, 64, 5, 1, 2),  // LeNet's conv2
      test::square_conv(8, 32, 28, 28, 32, 3, 1, 1),
      test::square_conv(4, 64, 16, 16, 64, 3, 1, 1),
      test::square_conv(3, 24, 9, 11, 40, 3, 1, 1),  // channels not multiples of 64
      test::square_conv(16, 130, 9, 9, 70, 3, 1, 1),
      test::square_conv(5, 48, 6, 6, 80, 1, 1, 0),  // 1x1
      test::square_conv(2, 16, 16, 16, 24, 5, 1, 2),
      test::square_conv(4, 32, 16, 16, 64, 3, 2, 1),   // stride 2: four phases
      test::square_conv(3, 48, 14, 14, 96, 1, 2, 0),   // 1x1 stride 2: three phases zero
  };
  for (const Conv2dShape& s : shapes) {
    // A strided one shares the copy where the dispatch takes its input gradient.
    if (!test::nhwc_dispatch_takes_input_gradient(s)) continue;
    SCOPED_TRACE(::testing::Message() << "n=" << s.n << " c=" << s.c << " h=" << s.h << " w=" << s.w
                                      << " oc=" << s.oc << " k=" << s.kh << " pad=" << s.pad_h);
    ASSERT_TRUE(conv2d_backward_wgmma_nhwc_shares_dy(s, bf16_exec()));
    const size_t nx = size_t(s.n) * s.c * s.h * s.w, nw = size_t(s.oc) * s.c * s.kh * s.kw;
    const size_t ny = size_t(s.n) * s.oc * s.oh() * s.ow();
    const Tensor x = test::to_device(test::random_vector(nx, seed));
    const Tensor dy = test::to_device(test::random_vector(ny, seed + 1));
    const Tensor w = test::to_device(test::random_vector(nw, seed + 2));
    const std::vector<float> dw0 = test::random_vector(nw, seed + 3);
    const std::vector<float> db0 = test::random_vector(size_t(s.oc), seed + 4);
    const Grads two = backward(s, x, dy, w, dw0, db0, false);
    const Grads one = backward(s, x, dy, w, dw0, db0, true);
    ASSERT_FALSE(test::any_nan(one.dx));
    EXPECT_EQ(0, std::memcmp(one.dx.data(), two.dx.data(), nx * sizeof(float)))
        << "dx differs from the input gradient's own pass";
    // The atomic sums' order moves each element by rounding only.
    EXPECT_LT(test::rel_to_max(one.dw, two.dw), 1e-5);
    EXPECT_LT(test::rel_to_max(one.db, two.db), 1e-5);
  }
}

TEST(GpuConvSharedDy, RunsNothingWhereItDoesNotApply) {
  CNN_REQUIRE_GPU();
  if (!conv2d_wgrad_wgmma_nhwc_available())
    GTEST_SKIP() << "the BF16 channels-last gradients need a compute capability 9.0 GPU and an "
                    "sm_90a build";
  const Conv2dShape s = test::square_conv(4, 16, 8, 8, 16, 3, 1, 1);
  Conv2dShape strided = test::square_conv(4, 16, 8, 8, 16, 3, 2, 1);
  strided.dil_h = strided.dil_w = 2;  // the input gradient's phases refuse dilation
  // The input gradient's weight pack (c x 9 taps x oc rounded up to 64) larger than the x copy
  // (n h w x c rounded up to 64): 130 x 9 x 128 against 2 x 7 x 7 x 192 elements; and 64 x 9 x
  // 512 against 64.
  const Conv2dShape big_pack = test::square_conv(2, 130, 7, 7, 70, 3, 1, 0);
  const Conv2dShape tiny = test::square_conv(1, 64, 1, 1, 512, 3, 1, 1);
  Exec tf32 = bf16_exec(), det = bf16_exec();
  tf32.precision = Precision::TF32;
  det.deterministic = true;
  EXPECT_TRUE(conv2d_backward_wgmma_nhwc_shares_dy(s, bf16_exec()));
  EXPECT_FALSE(conv2d_backward_wgmma_nhwc_shares_dy(strided, bf16_exec()));
  EXPECT_FALSE(conv2d_backward_wgmma_nhwc_shares_dy(big_pack, bf16_exec()));
  EXPECT_FALSE(conv2d_backward_wgmma_nhwc_shares_dy(tiny, bf16_exec()));
  EXPECT_FALSE(conv2d_backward_wgmma_nhwc_shares_dy(s, tf32));
  EXPECT_FALSE(conv2d_backward_wgmma_nhwc_shares_dy(s, det));
  // Pointers that would fault if anything ran: nothing may.
  float* bad = reinterpret_cast<float*>(uintptr_t(16));
  const auto runs = [&](const Conv2dShape& shape, Algo dw_algo, Algo dx_algo, const Exec& ex,
                        float* dx) {
    return conv2d_backward_shared(shape, bad, bad, bad, bad, bad, dx, bad, dw_algo, dx_algo, ex);
  };
  const Algo nhwc = Algo::WgmmaNhwc;
  EXPECT_FALSE(runs(strided, nhwc, nhwc, bf16_exec(), bad));
  EXPECT_FALSE(runs(big_pack, nhwc, nhwc, bf16_exec(), bad));
  EXPECT_FALSE(runs(s, nhwc, nhwc, tf32, bad));
  EXPECT_FALSE(runs(s, nhwc, nhwc, det, bad));
  EXPECT_FALSE(runs(s, Algo::Fast, nhwc, bf16_exec(), bad));
  EXPECT_FALSE(runs(s, nhwc, Algo::Igemm, bf16_exec(), bad));
  EXPECT_FALSE(runs(s, nhwc, nhwc, bf16_exec(), nullptr));  // no input gradient asked for
  CNN_CUDA_CHECK(cudaDeviceSynchronize());
}

#endif  // CNN_HAVE_CUDA

}  // namespace
