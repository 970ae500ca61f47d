// Max-pool CUDA kernels against the CPU reference: ties (inputs from a few integers), padding,
// stride != kernel, non-square, many planes, and bitwise repeatability of the gather backward;
// the exact-tiling 2x2 kernels at each width (4, 2 or 1 outputs a thread: OW a multiple of 4, of
// 2, odd) and each alignment of their pointers, with NaN inputs, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/pool/maxpool.h"
#include "runtime/memory.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

MaxPoolShape make_shape(int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph,
                        int pw) {
  MaxPoolShape s;
  s.n = n, s.c = c, s.h = h, s.w = w;
  s.kh = kh, s.kw = kw;
  s.stride_h = sh, s.stride_w = sw;
  s.pad_h = ph, s.pad_w = pw;
  return s;
}

void check_maxpool(const MaxPoolShape& s, bool few_values) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << " shape (" << s.n << ", " << s.c << ", " << s.h << ", " << s.w
               << ") k " << s.kh << "x" << s.kw << " stride " << s.stride_h << "x" << s.stride_w
               << " pad " << s.pad_h << "x" << s.pad_w);
  const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.c * s.oh() * s.ow();
  std::vector<float> x = test::random_vector(nx, seed);
  if (few_values) {  // values from {-2, -1, 0, 1}: many ties inside each window
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> d(-2, 1);
    for (auto& v : x) v = float(d(rng));
  }
  const std::vector<float> dy = test::random_vector(ny, seed + 1);
  std::vector<float> y_ref(ny), dx_ref(nx);
  std::vector<int32_t> am_ref(ny);
  maxpool_forward_cpu(s, x.data(), y_ref.data(), am_ref.data());
  maxpool_backward_cpu(s, dy.data(), am_ref.data(), dx_ref.data());

  Exec ex;
  ex.device = Device::CUDA;
  Tensor d_x = test::to_device(x);         // (N, C, H, W)
  Tensor d_dy = test::to_device(dy);       // (N, C, OH, OW)
  Buffer<float> d_y(ny, Device::CUDA);     // (N, C, OH, OW)
  Buffer<int32_t> d_am(ny, Device::CUDA);  // (N, C, OH, OW)
  Buffer<float> d_dx(nx, Device::CUDA);    // (N, C, H, W)
  test::poison_device(d_y.data(), ny);
  raw_zero(d_am.data(), Device::CUDA, d_am.bytes());
  test::poison_device(d_dx.data(), nx);
  maxpool_forward(s, d_x.data(), d_y.data(), d_am.data(), ex);
  maxpool_backward(s, d_dy.data(), d_am.data(), d_dx.data(), ex);
  const std::vector<float> y = test::to_host(d_y.data(), ny);
  std::vector<int32_t> am(ny);
  raw_copy(am.data(), Device::CPU, d_am.data(), Device::CUDA, ny * sizeof(int32_t));
  const std::vector<float> dx = test::to_host(d_dx.data(), nx);

  test::poison_device(d_dx.data(), nx);
  maxpool_backward(s, d_dy.data(), d_am.data(), d_dx.data(), ex);
  const std::vector<float> dx2 = test::to_host(d_dx.data(), nx);

  // With the fused ReLU mask (the pool's own output > 0 selects which gradients pass).
  std::vector<float> dxm_ref(nx);
  maxpool_backward_cpu(s, dy.data(), am_ref.data(), dxm_ref.data(), y_ref.data());
  test::poison_device(d_dx.data(), nx);
  maxpool_backward(s, d_dy.data(), d_am.data(), d_dx.data(), ex, d_y.data());
  const std::vector<float> dxm = test::to_host(d_dx.data(), nx);
  EXPECT_EQ(dxm, dxm_ref) << "backward with the fused ReLU mask differs from the CPU";

  const double ey = test::max_rel_error(y, y_ref), edx = test::max_rel_error(dx, dx_ref);
  std::printf("maxpool (%d,%d,%d,%d) k%dx%d s%dx%d p%dx%d%s: worst rel error y %.3g dx %.3g\n", s.n,
              s.c, s.h, s.w, s.kh, s.kw, s.stride_h, s.stride_w, s.pad_h, s.pad_w,
              few_values ? " ties" : "", ey, edx);
  EXPECT_EQ(ey, 0.0);
  EXPECT_EQ(am, am_ref) << "argmax differs (tie or padding rule)";
  EXPECT_EQ(edx, 0.0) << "the gather sums in double in the reference's order: exact";
  EXPECT_EQ(dx, dx2) << "backward is not bitwise repeatable";
}

}  // namespace

TEST(GpuMaxPool, MatchesCpu) {
  CNN_REQUIRE_GPU();
  const MaxPoolShape shapes[] = {
      make_shape(1, 1, 1, 1, 1, 1, 1, 1, 0, 0),      // smallest
      make_shape(2, 3, 28, 28, 2, 2, 2, 2, 0, 0),    // the reference network's pool
      make_shape(2, 3, 7, 9, 2, 2, 2, 2, 0, 0),      // 2x2 fast path, last row/col unused
      make_shape(3, 5, 7, 9, 3, 3, 2, 2, 1, 1),      // 3x3 stride 2 pad 1, odd sizes
      make_shape(1, 2, 13, 6, 3, 3, 1, 1, 1, 1),     // stride 1: heavily overlapping windows
      make_shape(2, 4, 10, 15, 2, 3, 2, 1, 1, 1),    // non-square window, stride and padding
      make_shape(1, 1, 11, 5, 5, 3, 3, 2, 2, 0),     // stride < kernel, pad in h only
      make_shape(300, 256, 3, 3, 2, 2, 1, 1, 0, 0),  // N*C = 76800 planes
      make_shape(257, 3, 14, 10, 2, 2, 2, 2, 0, 0),  // 2x2 windows tiling the input exactly
      make_shape(1, 7, 2, 2, 2, 2, 2, 2, 0, 0),      // exact tiling, one window per plane
      make_shape(2, 64, 32, 32, 2, 2, 2, 2, 0, 0),   // VGG's pool: 4 outputs a thread
      make_shape(1, 1, 32, 32, 2, 2, 2, 2, 0, 0),    // N*C = 1, 4 outputs a thread
      make_shape(3, 5, 6, 8, 2, 2, 2, 2, 0, 0),      // W = 8: one 4-output group a row
      make_shape(2, 3, 10, 12, 2, 2, 2, 2, 0, 0),    // W = 12: 2 outputs a thread
      make_shape(2, 3, 4, 20, 2, 2, 2, 2, 0, 0),     // W = 20, OW = 10: 2 outputs a thread
      make_shape(1, 3, 8, 14, 2, 2, 2, 2, 0, 0),     // OW = 7: 1 output a thread
      make_shape(2, 3, 7, 16, 2, 2, 2, 2, 0, 0),     // H odd: the general kernels
      make_shape(2, 3, 8, 17, 2, 2, 2, 2, 0, 0),     // W odd: the general kernels
  };
  for (const MaxPoolShape& s : shapes)
    for (bool few : {false, true}) check_maxpool(s, few);
}

// The exact-tiling 2x2 kernels move float2; pointers off by one float must take the general path
// and still agree with the CPU.
TEST(GpuMaxPool, MisalignedPointersFallBack) {
  CNN_REQUIRE_GPU();
  const MaxPoolShape s = make_shape(3, 5, 8, 6, 2, 2, 2, 2, 0, 0);
  const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.c * s.oh() * s.ow();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const std::vector<float> x = test::random_vector(nx, seed),
                           dy = test::random_vector(ny, seed + 1);
  std::vector<float> y_ref(ny), dx_ref(nx);
  std::vector<int32_t> am_ref(ny);
  maxpool_forward_cpu(s, x.data(), y_ref.data(), am_ref.data());
  maxpool_backward_cpu(s, dy.data(), am_ref.data(), dx_ref.data(), y_ref.data());

  Exec ex;
  ex.device = Device::CUDA;
  std::vector<float> x1(nx + 1, 0.f);
  std::copy(x.begin(), x.end(), x1.begin() + 1);
  Tensor d_x1 = test::to_device(x1);  // the input starts one float into the buffer
  Tensor d_dy = test::to_device(dy);
  Buffer<float> d_y(ny, Device::CUDA), d_dx1(nx + 1, Device::CUDA);
  Buffer<int32_t> d_am(ny, Device::CUDA);
  test::poison_device(d_dx1.data(), nx + 1);
  maxpool_forward(s, d_x1.data() + 1, d_y.data(), d_am.data(), ex);
  maxpool_backward(s, d_dy.data(), d_am.data(), d_dx1.data() + 1, ex, d_y.data());
  EXPECT_EQ(test::to_host(d_y.data(), ny), y_ref);
  const std::vector<float> dx1 = test::to_host(d_dx1.data(), nx + 1);
  EXPECT_EQ(std::vector<float>(dx1.begin() + 1, dx1.end()), dx_ref);
}

namespace {

// Raw bits, so that NaN outputs compare equal to the reference's NaN.
template <class T>
std::vector<uint32_t> bits(const std::vector<T>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

// x, y, argmax, dy and dx, each placed `off` 4-byte elements into its device buffer.
struct Offsets {
  int x, y, argmax, dy, dx;
};

void check_exact_2x2(const MaxPoolShape& s, const Offsets& off, uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << " shape (" << s.n << ", " << s.c << ", " << s.h << ", " << s.w
               << ") offsets x " << off.x << " y " << off.y << " argmax " << off.argmax << " dy "
               << off.dy << " dx " << off.dx);
  const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.c * s.oh() * s.ow();
  std::vector<float> x = test::random_vector(nx, seed);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> pick(0, 15);
  for (auto& v : x) {  // ties, and NaN in about one window in four (it wins and stays)
    const int r = pick(rng);
    if (r == 0) v = NAN;
    if (r == 1) v = 0.5f;
  }
  const std::vector<float> dy = test::random_vector(ny, seed + 1);
  std::vector<float> y_ref(ny), dx_ref(nx), dxm_ref(nx);
  std::vector<int32_t> am_ref(ny);
  maxpool_forward_cpu(s, x.data(), y_ref.data(), am_ref.data());
  maxpool_backward_cpu(s, dy.data(), am_ref.data(), dx_ref.data());
  maxpool_backward_cpu(s, dy.data(), am_ref.data(), dxm_ref.data(), y_ref.data());

  Exec ex;
  ex.device = Device::CUDA;
  std::vector<float> xs(off.x, 0.f), dys(off.dy, 0.f);
  xs.insert(xs.end(), x.begin(), x.end());
  dys.insert(dys.end(), dy.begin(), dy.end());
  Tensor d_x = test::to_device(xs), d_dy = test::to_device(dys);
  Buffer<float> d_y(ny + off.y, Device::CUDA), d_dx(nx + off.dx, Device::CUDA);
  Buffer<int32_t> d_am(ny + off.argmax, Device::CUDA);
  float* y = d_y.data() + off.y;
  int32_t* am = d_am.data() + off.argmax;
  float* dx = d_dx.data() + off.dx;
  test::poison_device(y, ny);
  raw_zero(am, Device::CUDA, ny * sizeof(int32_t));
  maxpool_forward(s, d_x.data() + off.x, y, am, ex);
  std::vector<int32_t> am_got(ny);
  raw_copy(am_got.data(), Device::CPU, am, Device::CUDA, ny * sizeof(int32_t));
  EXPECT_EQ(bits(test::to_host(y, ny)), bits(y_ref)) << "forward y";
  EXPECT_EQ(am_got, am_ref) << "forward argmax (tie or NaN rule)";
  for (bool mask : {false, true}) {
    test::poison_device(dx, nx);
    maxpool_backward(s, d_dy.data() + off.dy, am, dx, ex, mask ? y : nullptr);
    EXPECT_EQ(bits(test::to_host(dx, nx)), bits(mask ? dxm_ref : dx_ref))
        << "backward" << (mask ? " with the fused ReLU mask" : "");
  }
}

}  // namespace

// The exact-tiling 2x2 kernels take 4 outputs a thread where OW is a multiple of 4 and the
// pointers allow 16-byte accesses, else 2, else 1 (8-byte input rows, 4-byte outputs), else the
// general kernels: every width and fallback agrees with the CPU bit for bit, NaN included.
TEST(GpuMaxPool, ExactTwoByTwoWidthsAndAlignments) {
  CNN_REQUIRE_GPU();
  const MaxPoolShape shapes[] = {
      make_shape(2, 3, 6, 16, 2, 2, 2, 2, 0, 0),  // OW = 8
      make_shape(1, 1, 2, 8, 2, 2, 2, 2, 0, 0),   // N*C = 1, one window row of 4
      make_shape(3, 2, 4, 12, 2, 2, 2, 2, 0, 0),  // OW = 6
      make_shape(2, 3, 6, 10, 2, 2, 2, 2, 0, 0),  // OW = 5
  };
  const Offsets offsets[] = {
      {0, 0, 0, 0, 0},  // all aligned: the widest the shape allows
      {4, 4, 4, 4, 4},  // 16 bytes in: still aligned
      {2, 0, 0, 0, 2},  // x, dx 8-byte aligned only: 1 output a thread
      {0, 1, 0, 1, 0},  // y, dy 4-byte aligned: 1 output a thread
      {0, 2, 2, 2, 0},  // outputs 8-byte aligned: at most 2 outputs a thread
      {0, 0, 1, 0, 0},  // argmax 4-byte aligned: 1 output a thread
      {1, 0, 0, 0, 1},  // x, dx 4-byte aligned: the general kernels
  };
  for (const MaxPoolShape& s : shapes)
    for (const Offsets& off : offsets) check_exact_2x2(s, off, test::fresh_seed());
}
