#pragma once
// What the tests of the fused conv -> ReLU -> max-pool (tests/gpu_conv_relu_pool.cpp, the FP32
// kernels; tests/gpu_conv_relu_pool_mma.cpp, the tensor-core ones) share: the shapes they sweep,
// the exactly representable data, and the comparisons.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "runtime/memory.h"
#include "tests/test_util.h"

namespace cnn::crp_test {

inline Conv2dShape shape(int n, int oc, int h, int w, int k, int pad) {
  Conv2dShape s;
  s.n = n;
  s.c = 1;
  s.h = h;
  s.w = w;
  s.oc = oc;
  s.kh = s.kw = k;
  s.pad_h = s.pad_w = pad;
  return s;
}

inline std::string describe(const Conv2dShape& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "N=%d OC=%d H=%d W=%d K=%d pad=%d", s.n, s.oc, s.h, s.w, s.kh,
                s.pad_h);
  return buf;
}

// Values i * step for integer i in [-m, m].
inline std::vector<float> grid_vector(size_t n, uint64_t seed, int m, float step) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(-m, m);
  std::vector<float> v(n);
  for (auto& x : v) x = float(d(rng)) * step;
  return v;
}

// A problem's operands: the forward's x, w, b and the weight gradient's dy and initial dw, db.
// Quantized: on coarse binary grids, exact in TF32 and BF16, every sum exact in FP32, many ties;
// else uniform random.
struct Data {
  std::vector<float> x, w, b, dy, dw0, db0;
};

inline Data make_data(const Conv2dShape& s, uint64_t seed, bool quantized) {
  const size_t nx = size_t(s.n) * s.h * s.w, nw = size_t(s.oc) * s.kh * s.kw;
  const size_t np = size_t(s.n) * s.oc * (s.oh() / 2) * (s.ow() / 2);
  Data d;
  if (quantized) {
    d.x = grid_vector(nx, seed, 2, 0.25f);
    d.w = grid_vector(nw, seed + 1, 4, 0.125f);
    d.b = grid_vector(size_t(s.oc), seed + 2, 8, 1.f / 32);
    d.dy = grid_vector(np, seed + 3, 16, 1.f / 16);
    d.dw0 = grid_vector(nw, seed + 4, 64, 1.f / 64);
    d.db0 = grid_vector(size_t(s.oc), seed + 5, 64, 1.f / 64);
  } else {
    d.x = test::random_vector(nx, seed);
    d.w = test::random_vector(nw, seed + 1);
    d.b = test::random_vector(size_t(s.oc), seed + 2);
    d.dy = test::random_vector(np, seed + 3);
    d.dw0 = test::random_vector(nw, seed + 4);
    d.db0 = test::random_vector(size_t(s.oc), seed + 5);
  }
  return d;
}

// Equal value by value, NaN equal to any NaN (the CPU keeps the input NaN's payload, the GPU's
// arithmetic returns the canonical NaN).
inline bool same_value(float a, float b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}
inline bool same_values(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_value(a[i], b[i])) return false;
  return true;
}

// Equal bit for bit, NaN included.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline std::vector<int32_t> ints_to_host(const int32_t* d, size_t n) {
  std::vector<int32_t> h(n);
  raw_copy(h.data(), Device::CPU, d, Device::CUDA, n * sizeof(int32_t));
  return h;
}

// max |got - ref| / max |ref|; NaN in got gives infinity.
inline double rel_to_max(const std::vector<float>& got, const std::vector<float>& ref) {
  double worst = 0, scale = 1e-30;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    worst = std::max(worst, std::fabs(double(got[i]) - ref[i]));
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  return worst / scale;
}

// A problem's inputs on the GPU and its forward outputs poisoned (y NaN, argmax -7), so that an
// output the kernel under test never writes cannot pass.
struct DeviceForward {
  Tensor x, w, b;
  Buffer<float> y;
  Buffer<int32_t> am;
};

inline DeviceForward upload_poisoned(const Data& d, size_t np) {
  DeviceForward f{test::to_device(d.x), test::to_device(d.w), test::to_device(d.b),
                  Buffer<float>(np, Device::CUDA), Buffer<int32_t>(np, Device::CUDA)};
  test::poison_device(f.y.data(), np);
  const std::vector<int32_t> garbage(np, -7);
  f.am.copy_from(garbage.data(), Device::CPU, np);
  return f;
}

// Every kernel size and image with the batch / channel pairs (1, 1), (3, 5), (257, 32).
inline std::vector<Conv2dShape> sweep() {
  std::vector<Conv2dShape> v;
  const int images[][2] = {{28, 28}, {6, 10}, {14, 2}};
  const int pairs[][2] = {{1, 1}, {3, 5}, {257, 32}};
  for (int k : {1, 3, 5, 7})
    for (const auto& im : images)
      for (const auto& nc : pairs) {
        const int n = (nc[0] == 257 && im[0] == 28 && test::light_sweeps()) ? 3 : nc[0];
        v.push_back(shape(n, nc[1], im[0], im[1], k, k / 2));
      }
  // Unpadded (output smaller than the image), several tiles across and down, odd channels.
  v.push_back(shape(3, 5, 10, 8, 3, 0));    // 8x6 output
  v.push_back(shape(2, 7, 12, 14, 5, 0));   // 8x10 output
  v.push_back(shape(2, 9, 6, 130, 3, 1));   // pooled 3x65: three column tiles
  v.push_back(shape(2, 3, 600, 2, 5, 2));   // pooled 300x1: two row tiles
  v.push_back(shape(3, 33, 16, 70, 7, 3));  // 33 channels: a partial group (of 8 or 32)
  v.push_back(shape(2, 4, 2, 6, 3, 1));     // pooled 1x3
  // The weight gradient's lane mapping (lanes per pooled row: the power of two >= the tile
  // width; one warp per channel and image, 4 or 2 images per block): pooled 13x13, a half-used
  // last row step, 5 images (a chunk of one); pooled 20x20, 32 lanes per row and 3 row tiles;
  // 7x7 on pooled 5x68, 3 column tiles, the last 4 wide, 3 images (2 per block).
  v.push_back(shape(5, 12, 26, 26, 3, 1));
  v.push_back(shape(2, 16, 40, 40, 5, 2));
  v.push_back(shape(3, 4, 10, 136, 7, 3));
  return v;
}

}  // namespace cnn::crp_test
