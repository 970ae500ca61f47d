// Grouped and depthwise conv2d on the GPU: every CUDA variant (naive, tiled, fast, auto) against
// the CPU reference over awkward shapes (batch 1, odd sizes, kernels 1/3/5/7, stride 2, padding
// 0/1/2, dilation 2, channel multiplier 2, groups 4 of 8 channels), misaligned buffers for the
// fast kernels' scalar path, and the deterministic weight gradient's bitwise repeatability. The
// fast variant's forward / input-gradient kernels (tile, rows, stream) and its weight-gradient
// kernels (tile, stream) are also forced one by one. Depthwise stride 2 (3x3, 5x5, 7x7, padding
// 0 to K-1, multiplier 2) runs the fast variant's flat kernels.
// Outputs are poisoned with NaN before each run; tolerances scale with the reduction length.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/conv/conv2d_grouped.h"
#include "kernels/conv/conv2d_grouped_narrow.h"
#ifdef CNN_HAVE_CUDA
#include "kernels/conv/conv2d_grouped_cuda.h"
#endif
#include "layers/gradcheck/gradcheck.h"
#include "layers/layer_spec.h"
#include "runtime/error.h"
#include "runtime/memory.h"
#include "runtime/tensor.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

struct Case {
  int n, c, h, w, oc, k, stride, pad, dil, groups;
};

Conv2dGroupedShape shape_of(const Case& k) {
  Conv2dGroupedShape s;
  s.n = k.n, s.c = k.c, s.h = k.h, s.w = k.w, s.oc = k.oc, s.kh = s.kw = k.k;
  s.stride_h = s.stride_w = k.stride;
  s.pad_h = s.pad_w = k.pad;
  s.dil_h = s.dil_w = k.dil;
  s.groups = k.groups;
  return s;
}

std::string describe(const Conv2dGroupedShape& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "N%d C%d %dx%d -> OC%d k%dx%d s%d p%d d%d g%d%s", s.n, s.c, s.h,
                s.w, s.oc, s.kh, s.kw, s.stride_h, s.pad_h, s.dil_h, s.groups,
                conv2d_grouped_strided_applicable(s)                       ? " (fast: stride 2)"
                : grouped_narrow_forward_applicable(s)                     ? " (fast: narrow)"
                : !conv2d_grouped_fast_applicable(s)                       ? ""
                : conv2d_grouped_fast_kernel(s) == DepthwiseKernel::Rows   ? " (fast: rows)"
                : conv2d_grouped_fast_kernel(s) == DepthwiseKernel::Stream ? " (fast: stream)"
                                                                           : " (fast: tile)");
  return buf;
}

size_t x_size(const Conv2dGroupedShape& s) {
  return size_t(s.n) * s.c * s.h * s.w;
}
size_t w_size(const Conv2dGroupedShape& s) {
  return size_t(s.oc) * s.cg() * s.kh * s.kw;
}
size_t y_size(const Conv2dGroupedShape& s) {
  return size_t(s.n) * s.oc * s.oh() * s.ow();
}

Exec cuda_exec(bool deterministic = false) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.deterministic = deterministic;
  return ex;
}

// Relative to |ref| plus a tenth of the reference's rms; tolerance 1e-5 * sqrt(reduction length).
void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double k,
                  const std::string& what) {
  double sq = 0;
  for (float v : ref) sq += double(v) * v;
  const double floor = std::max(0.1 * std::sqrt(sq / std::max<size_t>(ref.size(), 1)), 1e-6);
  const double tol = 1e-5 * std::sqrt(std::max(k, 1.0));
  double worst = 0;
  size_t nan = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++nan;
      continue;
    }
    worst =
        std::max(worst, std::fabs(double(got[i]) - ref[i]) / (std::fabs(double(ref[i])) + floor));
  }
  std::printf("  %-40s worst rel error %.2e (tol %.1e)\n", what.c_str(), worst, tol);
  EXPECT_EQ(nan, 0u) << what << ": NaN/Inf left in the output (unwritten element?)";
  EXPECT_LE(worst, tol) << what;
}

struct Problem {
  Conv2dGroupedShape s;
  std::vector<float> x, w, b, dy, dw0, db0;
  std::vector<float> y_plain, y_bias_relu, dx, dw, db;
};

Problem make_problem(const Conv2dGroupedShape& s, uint64_t seed) {
  Problem p;
  p.s = s;
  p.x = test::random_vector(x_size(s), seed);
  p.w = test::random_vector(w_size(s), seed + 1);
  p.b = test::random_vector(s.oc, seed + 2);
  p.dy = test::random_vector(y_size(s), seed + 3);
  p.dw0 = test::random_vector(w_size(s), seed + 4);
  p.db0 = test::random_vector(s.oc, seed + 5);
  p.y_plain.resize(y_size(s));
  conv2d_grouped_forward_cpu(s, p.x.data(), p.w.data(), nullptr, p.y_plain.data(), false);
  p.y_bias_relu.resize(y_size(s));
  conv2d_grouped_forward_cpu(s, p.x.data(), p.w.data(), p.b.data(), p.y_bias_relu.data(), true);
  p.dx.resize(x_size(s));
  conv2d_grouped_backward_data_cpu(s, p.dy.data(), p.w.data(), p.dx.data());
  p.dw = p.dw0;
  p.db = p.db0;
  conv2d_grouped_backward_weight_cpu(s, p.x.data(), p.dy.data(), p.dw.data(), p.db.data());
  return p;
}

// A device copy of v starting `offset` floats into its allocation, so that offset 1 breaks the
// 16-byte alignment the fast kernels' float4 path needs (they must fall back to scalar loads).
struct Shifted {
  Tensor mem;
  float* ptr;
  Shifted(const std::vector<float>& v, int offset)
      : mem({int64_t(v.size() + 4)}, Device::CUDA), ptr(mem.data() + offset) {
    raw_copy(ptr, Device::CUDA, v.data(), Device::CPU, v.size() * sizeof(float));
  }
};

void check_all_variants(const Problem& p, int offset) {
  const Conv2dGroupedShape& s = p.s;
  const Exec ex = cuda_exec();
  Shifted x(p.x, offset), dy(p.dy, offset), y(std::vector<float>(y_size(s)), offset),
      dx(std::vector<float>(x_size(s)), offset);
  Tensor w = test::to_device(p.w), b = test::to_device(p.b);
  const double k_fwd = double(s.cg()) * s.kh * s.kw + 1;
  const double k_data = double(s.ocg()) * s.kh * s.kw;
  const double k_wgt = double(s.n) * s.oh() * s.ow() + 1;
  const struct {
    Algo algo;
    const char* name;
  } algos[] = {
      {Algo::Naive, "naive"}, {Algo::Tiled, "tiled"}, {Algo::Fast, "fast"}, {Algo::Auto, "auto"}};
  for (const auto& a : algos) {
    const std::string tag = std::string(a.name) + (offset ? " misaligned" : "");
    // auto may run the dense kernels a group, which take scratch (the other variants none).
    const size_t pass_scratch =
        std::max(conv2d_grouped_forward_scratch_floats(s, a.algo, ex),
                 conv2d_grouped_backward_data_scratch_floats(s, a.algo, ex));
    Tensor fd_scratch({int64_t(std::max<size_t>(pass_scratch, 1))}, Device::CUDA);
    float* const fd = pass_scratch ? fd_scratch.data() : nullptr;
    test::poison_device(y.ptr, y_size(s));
    conv2d_grouped_forward(s, x.ptr, w.data(), nullptr, y.ptr, false, fd, a.algo, ex);
    expect_close(test::to_host(y.ptr, y_size(s)), p.y_plain, k_fwd, "forward " + tag);

    test::poison_device(y.ptr, y_size(s));
    conv2d_grouped_forward(s, x.ptr, w.data(), b.data(), y.ptr, true, fd, a.algo, ex);
    expect_close(test::to_host(y.ptr, y_size(s)), p.y_bias_relu, k_fwd, "forward+bias+relu " + tag);

    test::poison_device(dx.ptr, x_size(s));
    conv2d_grouped_backward_data(s, dy.ptr, w.data(), dx.ptr, fd, a.algo, ex);
    expect_close(test::to_host(dx.ptr, x_size(s)), p.dx, k_data, "backward_data " + tag);

    for (bool det : {false, true}) {
      const Exec wex = cuda_exec(det);
      const std::string wtag = tag + (det ? " deterministic" : " atomic");
      const size_t scratch_n = conv2d_grouped_backward_weight_scratch_floats(s, a.algo, wex);
      Tensor scratch({int64_t(std::max<size_t>(scratch_n, 1))}, Device::CUDA);
      test::poison_device(scratch.data(), scratch.numel());  // stage 2 reads only stage-1 writes
      Tensor dw = test::to_device(p.dw0), db = test::to_device(p.db0);
      conv2d_grouped_backward_weight(s, x.ptr, dy.ptr, dw.data(), db.data(),
                                     scratch_n ? scratch.data() : nullptr, a.algo, wex);
      expect_close(test::to_host(dw.data(), w_size(s)), p.dw, k_wgt, "dw " + wtag);
      expect_close(test::to_host(db.data(), s.oc), p.db, k_wgt, "db " + wtag);
      // Without a bias gradient the weights come out the same.
      Tensor dw2 = test::to_device(p.dw0);
      test::poison_device(scratch.data(), scratch.numel());
      conv2d_grouped_backward_weight(s, x.ptr, dy.ptr, dw2.data(), nullptr,
                                     scratch_n ? scratch.data() : nullptr, a.algo, wex);
      expect_close(test::to_host(dw2.data(), w_size(s)), p.dw, k_wgt, "dw (no db) " + wtag);
    }
  }
}

void run_case(const Case& k) {
  const Conv2dGroupedShape s = shape_of(k);
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", shape " + describe(s));
  std::printf("%s (seed %llu)\n", describe(s).c_str(), static_cast<unsigned long long>(seed));
  const Problem p = make_problem(s, seed);
  check_all_variants(p, 0);
  if (conv2d_grouped_fast_applicable(s) || grouped_narrow_forward_applicable(s) ||
      grouped_narrow_backward_data_applicable(s))
    check_all_variants(p, 1);
}

}  // namespace

TEST(GpuConv2dGrouped, AllVariantsMatchCpuOnShapeTable) {
  CNN_REQUIRE_GPU();
  const Case cases[] = {
      // n   c   h    w   oc  k  s  p  d  groups
      {1, 8, 13, 17, 8, 3, 1, 1, 1, 8},     // depthwise 3x3, odd sizes, batch 1 (fast)
      {2, 12, 13, 17, 12, 5, 1, 2, 1, 12},  // 12 channels 5x5 (the seed's case, fast)
      {2, 4, 16, 20, 4, 3, 1, 1, 1, 4},     // W a multiple of 4: the float4 path
      {1, 6, 19, 24, 6, 7, 1, 3, 1, 6},     // 7x7 (fast)
      {2, 6, 13, 17, 12, 3, 1, 1, 1, 6},    // channel multiplier 2 (fast)
      {2, 5, 12, 16, 10, 5, 1, 2, 1, 5},    // multiplier 2, 5x5, W % 4 == 0
      {2, 8, 13, 17, 8, 3, 2, 1, 1, 8},     // depthwise stride 2, odd sizes (fast: stride 2)
      {1, 6, 28, 28, 6, 3, 2, 1, 1, 6},     // stride 2, even sizes (MobileNet's)
      {2, 5, 15, 12, 10, 3, 2, 1, 1, 5},    // stride 2, multiplier 2
      {1, 4, 17, 19, 4, 5, 2, 2, 1, 4},     // stride 2, 5x5
      {1, 3, 16, 21, 3, 7, 2, 3, 1, 3},     // stride 2, 7x7
      {2, 4, 9, 10, 4, 3, 2, 0, 1, 4},      // stride 2, pad 0 (odd taps reach no output)
      {1, 4, 7, 7, 4, 5, 2, 4, 1, 4},       // stride 2, pad 4 of a 5x5 (rows of padding only)
      {3, 16, 14, 14, 16, 3, 2, 1, 1, 16},  // stride 2 on 14x14 -> 7x7
      {1, 2, 2, 2, 2, 3, 2, 1, 1, 2},       // stride 2 on a 2x2 plane
      {1, 8, 13, 17, 8, 3, 1, 0, 1, 8},     // pad 0 (tiled)
      {1, 8, 13, 17, 8, 3, 1, 2, 2, 8},     // dilation 2, pad 2
      {2, 8, 13, 17, 16, 3, 1, 1, 1, 4},    // groups 4 of 8 channels, 2 in -> 4 out per group
      {2, 8, 13, 17, 8, 5, 2, 2, 1, 4},     // groups 4, 5x5, stride 2
      {1, 8, 13, 17, 4, 1, 1, 0, 1, 2},     // 1x1, groups 2
      {2, 6, 15, 11, 6, 3, 1, 1, 3, 1},     // dilation 3 without groups
      {1, 3, 5, 6, 3, 3, 1, 2, 1, 3},       // outputs that see only padding
      {1, 12, 64, 64, 12, 5, 1, 2, 1, 12},  // several fast tiles
      {3, 4, 70, 150, 4, 3, 1, 1, 1, 4},    // several fast tiles along W with a ragged edge
      {1, 1, 1, 1, 1, 1, 1, 0, 1, 1},       // a single pixel
  };
  for (const Case& k : cases) run_case(k);
}

// The bench's largest case shape at a smaller batch, so the fast kernels run full-size tiles.
TEST(GpuConv2dGrouped, SeedShapesMatchCpu) {
  CNN_REQUIRE_GPU();
  run_case({1, 64, 32, 32, 64, 3, 1, 1, 1, 64});
  if (test::light_sweeps()) return;  // under the sanitizers: the small one covers the code paths
  run_case({2, 64, 128, 128, 64, 3, 1, 1, 1, 64});
}

// The narrow-group kernels (the fast variant's for groups of up to 16 channels that are not
// depthwise; the input gradient up to 32 output channels): groups of 2 to 16 channels in and out,
// channels a group not a multiple of 4 (a partial quad of output channels), 8 or more out (8 a
// block), 1x1 to 7x7, stride 2 (the input gradient by phases), padding 0 to beyond K - 1 (the input
// gradient then runs tiled), planes of 1 x 70 and 40 x 300 (several tiles along W), tiny planes
// (several images a block), batch 1 to 5, W a multiple of 4 or not (rows copied as float4s or a
// float at a time); every variant, aligned and not.
TEST(GpuConv2dGrouped, NarrowGroupKernelsMatchCpu) {
  CNN_REQUIRE_GPU();
  const Case cases[] = {
      // n   c   h    w   oc  k  s  p  d  groups
      {2, 16, 13, 17, 16, 3, 1, 1, 1, 4},     // 4 channels a group in and out
      {1, 12, 9, 21, 24, 3, 1, 1, 1, 4},      // 3 in, 6 out: a partial second quad
      {3, 40, 11, 10, 40, 3, 2, 1, 1, 5},     // 8 in and out, stride 2
      {2, 32, 16, 16, 64, 3, 2, 1, 1, 2},     // 16 in (two warp blocks), 32 out, stride 2
      {1, 10, 7, 7, 15, 5, 1, 2, 1, 5},       // 5x5, 2 in, 3 out
      {2, 9, 12, 9, 6, 7, 1, 3, 1, 3},        // 7x7, 3 in, 2 out
      {2, 8, 15, 15, 8, 5, 2, 2, 1, 2},       // 5x5 stride 2
      {1, 24, 10, 12, 12, 1, 1, 0, 1, 4},     // 1x1, 6 in, 3 out
      {1, 8, 9, 9, 8, 1, 2, 0, 1, 4},         // 1x1 stride 2
      {5, 8, 3, 5, 8, 3, 1, 1, 1, 2},         // 3x5 planes: several images a block
      {1, 16, 1, 70, 16, 3, 1, 1, 1, 4},      // one row, several tiles along W
      {2, 8, 40, 300, 8, 3, 1, 1, 1, 2},      // 300 wide: two weight-gradient tiles a row
      {1, 12, 10, 10, 12, 3, 1, 0, 1, 3},     // padding 0
      {1, 12, 6, 6, 12, 3, 1, 2, 1, 3},       // padding 2 = K - 1
      {1, 6, 5, 5, 6, 3, 1, 3, 1, 2},         // padding 3 > K - 1
      {2, 64, 8, 8, 64, 3, 1, 1, 1, 16},      // 16 groups of 4 on 8x8
      {2, 128, 32, 32, 128, 3, 1, 1, 1, 32},  // ResNeXt's 32 groups of 4
      {2, 12, 9, 11, 12, 3, 2, 0, 1, 3},      // stride 2, padding 0, odd sizes
      {1, 8, 13, 13, 8, 7, 2, 3, 1, 2},       // 7x7 stride 2
      {2, 256, 16, 16, 256, 3, 2, 1, 1, 32},  // 32 groups of 8, stride 2
      // W a multiple of 4: rows copied as float4s, whose windows start 0-3 floats in.
      {2, 16, 12, 16, 16, 1, 2, 0, 1, 4},  // 1x1 stride 2
      {1, 12, 8, 8, 12, 5, 1, 2, 1, 3},    // 5x5: 2 floats in
      {2, 8, 12, 12, 8, 7, 1, 3, 1, 2},    // 7x7: 1 float in
      {1, 12, 12, 12, 12, 3, 1, 0, 1, 3},  // padding 0 (the weight gradient a float at a time)
      {1, 8, 5, 72, 8, 3, 1, 1, 1, 2},     // the last forward tile past the edge
      {1, 16, 6, 56, 16, 3, 1, 1, 1, 4},   // 64-wide weight-gradient tiles
      {5, 8, 3, 4, 8, 3, 1, 1, 1, 2},      // 3x4 planes: several images a block
      // Small planes: several images a weight-gradient tile, the last tile's slots past N.
      {6, 16, 7, 7, 16, 3, 1, 1, 1, 4},  // 7x7: 4 images a tile
      {3, 16, 8, 8, 32, 1, 2, 0, 1, 4},  // 1x1 stride 2 to 4x4: 8 images a tile, float4s
      // The input gradient of groups of 17 to 32 output channels (the other passes tiled).
      {2, 64, 12, 10, 64, 3, 2, 1, 1, 2},  // 32 in and out, stride 2
      {1, 16, 9, 11, 96, 3, 2, 1, 1, 4},   // 24 out, stride 2, odd planes
      {1, 8, 10, 12, 48, 3, 1, 1, 1, 2},   // 24 out, stride 1
  };
  for (const Case& k : cases) {
    // Under the sanitizers the small shapes cover the code paths; the large ones take minutes.
    if (test::light_sweeps() && int64_t(k.n) * k.c * k.h * k.w > 100000) continue;
    run_case(k);
  }
}

// Deterministic mode: two weight-gradient runs give bitwise equal dw and db, for every variant.
TEST(GpuConv2dGrouped, DeterministicWeightGradientIsBitwiseRepeatable) {
  CNN_REQUIRE_GPU();
  for (const Case& k :
       {Case{4, 16, 33, 36, 16, 3, 1, 1, 1, 16}, Case{4, 8, 33, 37, 8, 3, 2, 1, 1, 4},
        Case{4, 16, 33, 36, 32, 3, 1, 1, 1, 4}, Case{8, 12, 64, 64, 12, 5, 1, 2, 1, 12},
        Case{6, 16, 7, 7, 16, 3, 1, 1, 1, 4}}) {
    const Conv2dGroupedShape s = shape_of(k);
    SCOPED_TRACE(describe(s));
    const Problem p = make_problem(s, test::fresh_seed());
    const Exec ex = cuda_exec(true);
    Tensor x = test::to_device(p.x), dy = test::to_device(p.dy);
    const size_t scratch_n = conv2d_grouped_backward_weight_scratch_floats(s, Algo::Fast, ex);
    Tensor scratch({int64_t(std::max<size_t>(scratch_n, 1))}, Device::CUDA);
    for (Algo a : {Algo::Naive, Algo::Tiled, Algo::Fast}) {
      std::vector<float> first_w, first_b;
      for (int run = 0; run < 2; ++run) {
        Tensor dw = test::to_device(p.dw0), db = test::to_device(p.db0);
        conv2d_grouped_backward_weight(s, x.data(), dy.data(), dw.data(), db.data(), scratch.data(),
                                       a, ex);
        std::vector<float> hw = test::to_host(dw.data(), w_size(s));
        std::vector<float> hb = test::to_host(db.data(), s.oc);
        if (run == 0) {
          first_w = hw;
          first_b = hb;
          continue;
        }
        EXPECT_EQ(0, std::memcmp(hw.data(), first_w.data(), hw.size() * sizeof(float)))
            << algo_name(a) << ": dw differs between two deterministic runs";
        EXPECT_EQ(0, std::memcmp(hb.data(), first_b.data(), hb.size() * sizeof(float)))
            << algo_name(a) << ": db differs between two deterministic runs";
      }
    }
  }
}

// N*C planes beyond 65535 (the y/z grid limit): every launch covers them all.
TEST(GpuConv2dGrouped, ManyPlanesBeyondGridLimit) {
  CNN_REQUIRE_GPU();
  run_case({300, 256, 4, 4, 256, 3, 1, 1, 1, 256});
}

#ifdef CNN_HAVE_CUDA
// The fast variant's forward and input gradient through each kernel in turn (the shape picks one;
// these force tile, rows and flat), against the CPU reference: W not a multiple of 4, H = 1,
// channel multiplier 2, 5x5 and 7x7, batch 1 and 3, a row wider than one block's quads
// (W > 1024), float4 rows and misaligned buffers (the scalar path), and a stride-2 shape (the
// flat kernels whatever is forced). Each kernel's forward runs twice: bitwise the same.
TEST(GpuConv2dGrouped, ForcedKernelsMatchCpu) {
  CNN_REQUIRE_GPU();
  const Case cases[] = {
      // n   c   h     w   oc  k  s  p  d  groups
      {1, 64, 32, 32, 64, 3, 1, 1, 1, 64},  // the seed's small shape
      {3, 5, 13, 17, 5, 3, 1, 1, 1, 5},     // batch 3, W % 4 == 1
      {1, 4, 1, 22, 4, 3, 1, 1, 1, 4},      // H = 1, W % 4 == 2
      {2, 3, 9, 12, 6, 5, 1, 2, 1, 3},      // multiplier 2, 5x5, float4 rows
      {1, 6, 11, 7, 12, 7, 1, 3, 1, 6},     // multiplier 2, 7x7 wider than the image
      {3, 2, 5, 1030, 2, 3, 1, 1, 1, 2},    // 258 quads a row: threads take several
      {1, 2, 40, 8, 2, 7, 1, 3, 1, 2},      // 7x7, W = 8: several strips per plane
      {2, 4, 9, 10, 4, 3, 2, 1, 1, 4},      // stride 2: the flat kernels whatever is forced
  };
  const Exec ex = cuda_exec();
  for (const Case& k : cases) {
    const Conv2dGroupedShape s = shape_of(k);
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + ", shape " + describe(s));
    std::printf("%s (seed %llu)\n", describe(s).c_str(), static_cast<unsigned long long>(seed));
    const Problem p = make_problem(s, seed);
    const double k_fwd = double(s.cg()) * s.kh * s.kw + 1, k_data = double(s.ocg()) * s.kh * s.kw;
    Tensor w = test::to_device(p.w), b = test::to_device(p.b);
    for (int offset : {0, 1}) {
      Shifted x(p.x, offset), dy(p.dy, offset), y(std::vector<float>(y_size(s)), offset),
          dx(std::vector<float>(x_size(s)), offset);
      for (DepthwiseKernel kernel :
           {DepthwiseKernel::Tile, DepthwiseKernel::Rows, DepthwiseKernel::Flat}) {
        const std::string tag =
            std::string(depthwise_kernel_name(kernel)) + (offset ? " misaligned" : "");
        test::poison_device(y.ptr, y_size(s));
        conv2d_grouped_forward_cuda(s, x.ptr, w.data(), nullptr, y.ptr, false, Algo::Fast,
                                    ex.stream, kernel);
        expect_close(test::to_host(y.ptr, y_size(s)), p.y_plain, k_fwd, "forward " + tag);

        test::poison_device(y.ptr, y_size(s));
        conv2d_grouped_forward_cuda(s, x.ptr, w.data(), b.data(), y.ptr, true, Algo::Fast,
                                    ex.stream, kernel);
        const std::vector<float> first = test::to_host(y.ptr, y_size(s));
        expect_close(first, p.y_bias_relu, k_fwd, "forward+bias+relu " + tag);
        test::poison_device(y.ptr, y_size(s));
        conv2d_grouped_forward_cuda(s, x.ptr, w.data(), b.data(), y.ptr, true, Algo::Fast,
                                    ex.stream, kernel);
        const std::vector<float> again = test::to_host(y.ptr, y_size(s));
        EXPECT_EQ(0, std::memcmp(first.data(), again.data(), first.size() * sizeof(float)))
            << tag << ": two forward runs differ";

        test::poison_device(dx.ptr, x_size(s));
        conv2d_grouped_backward_data_cuda(s, dy.ptr, w.data(), dx.ptr, Algo::Fast, ex.stream,
                                          kernel);
        expect_close(test::to_host(dx.ptr, x_size(s)), p.dx, k_data, "backward_data " + tag);
      }
    }
  }
}
// The stream kernels (forward, input gradient, weight gradient) forced on every shape, against
// the CPU reference: W = 1, 3, 5 (a plane narrower than one quad), 127 and 130 (ragged last
// quad, scalar path), 128 (float4 path); H = 1, 2, 129; channel multiplier 1 and 2; 3x3, 5x5,
// 7x7 (padding 1, 2, 3); batch 1 and 3; aligned and misaligned buffers; the shape's own strips
// and long strips (rows per thread 4, 13 and 32: the register ring wraps several times and the
// last group is partial). Forward, input gradient and the deterministic weight gradient run twice
// and must agree bit for bit. Padding 0 is not a "same" convolution: a forced stream request
// must fall back (to the tiled kernels) and still match.
TEST(GpuConv2dGrouped, StreamKernelsMatchCpu) {
  CNN_REQUIRE_GPU();
  const Case cases[] = {
      // n   c   h     w   oc  k  s  p  d  groups
      {1, 3, 129, 130, 3, 3, 1, 1, 1, 3},  // W % 4 == 2, H odd
      {3, 2, 129, 128, 2, 3, 1, 1, 1, 2},  // float4 rows, batch 3
      {1, 2, 2, 127, 4, 3, 1, 1, 1, 2},    // H = 2, multiplier 2
      {3, 3, 1, 5, 3, 3, 1, 1, 1, 3},      // H = 1, W = 5
      {1, 4, 17, 1, 4, 3, 1, 1, 1, 4},     // W = 1
      {1, 2, 33, 3, 4, 5, 1, 2, 1, 2},     // W = 3, 5x5, multiplier 2
      {3, 2, 129, 130, 2, 5, 1, 2, 1, 2},  // 5x5, ragged
      {1, 3, 40, 128, 6, 5, 1, 2, 1, 3},   // 5x5 float4, multiplier 2
      {1, 2, 129, 127, 2, 7, 1, 3, 1, 2},  // 7x7, W % 4 == 3
      {3, 2, 2, 128, 4, 7, 1, 3, 1, 2},    // 7x7 float4, H = 2, multiplier 2
      {1, 2, 20, 5, 2, 7, 1, 3, 1, 2},     // 7x7 wider than the image
      {1, 3, 17, 130, 3, 3, 1, 0, 1, 3},   // pad 0: not fast, the request falls back
  };
  for (const Case& k : cases) {
    const Conv2dGroupedShape s = shape_of(k);
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + ", shape " + describe(s));
    std::printf("%s (seed %llu)\n", describe(s).c_str(), static_cast<unsigned long long>(seed));
    const Problem p = make_problem(s, seed);
    const double k_fwd = double(s.cg()) * s.kh * s.kw + 1, k_data = double(s.ocg()) * s.kh * s.kw;
    const double k_wgt = double(s.n) * s.oh() * s.ow() + 1;
    Tensor w = test::to_device(p.w), b = test::to_device(p.b);
    const size_t scratch_n =
        conv2d_grouped_backward_weight_scratch_floats(s, Algo::Fast, cuda_exec(true));
    Tensor scratch({int64_t(std::max<size_t>(scratch_n, 1))}, Device::CUDA);
    const cudaStream_t st = cuda_exec().stream;
    for (int offset : {0, 1}) {
      Shifted x(p.x, offset), dy(p.dy, offset), y(std::vector<float>(y_size(s)), offset),
          dx(std::vector<float>(x_size(s)), offset);
      for (int rows : {0, 4, 13, 32}) {
        const std::string tag =
            "stream rows " + std::to_string(rows) + (offset ? " misaligned" : "");
        const auto fwd = [&](const float* bias, bool relu) {
          test::poison_device(y.ptr, y_size(s));
          conv2d_grouped_forward_cuda(s, x.ptr, w.data(), bias, y.ptr, relu, Algo::Fast, st,
                                      DepthwiseKernel::Stream, rows);
          return test::to_host(y.ptr, y_size(s));
        };
        expect_close(fwd(nullptr, false), p.y_plain, k_fwd, "forward " + tag);
        const std::vector<float> first = fwd(b.data(), true);
        expect_close(first, p.y_bias_relu, k_fwd, "forward+bias+relu " + tag);
        const std::vector<float> again = fwd(b.data(), true);
        EXPECT_EQ(0, std::memcmp(first.data(), again.data(), first.size() * sizeof(float)))
            << tag << ": two forward runs differ";

        const auto dgrad = [&] {
          test::poison_device(dx.ptr, x_size(s));
          conv2d_grouped_backward_data_cuda(s, dy.ptr, w.data(), dx.ptr, Algo::Fast, st,
                                            DepthwiseKernel::Stream, rows);
          return test::to_host(dx.ptr, x_size(s));
        };
        const std::vector<float> dx1 = dgrad(), dx2 = dgrad();
        expect_close(dx1, p.dx, k_data, "backward_data " + tag);
        EXPECT_EQ(0, std::memcmp(dx1.data(), dx2.data(), dx1.size() * sizeof(float)))
            << tag << ": two input-gradient runs differ";

        for (bool det : {false, true}) {
          const std::string wtag = tag + (det ? " deterministic" : " atomic");
          std::vector<float> first_w, first_b;
          for (int run = 0; run < 2; ++run) {
            Tensor dw = test::to_device(p.dw0), db = test::to_device(p.db0);
            test::poison_device(scratch.data(), scratch.numel());
            conv2d_grouped_backward_weight_cuda(s, x.ptr, dy.ptr, dw.data(), db.data(),
                                                det ? scratch.data() : nullptr, Algo::Fast, det, st,
                                                DepthwiseKernel::Stream, rows);
            std::vector<float> hw = test::to_host(dw.data(), w_size(s));
            std::vector<float> hb = test::to_host(db.data(), s.oc);
            if (run == 0) {
              expect_close(hw, p.dw, k_wgt, "dw " + wtag);
              expect_close(hb, p.db, k_wgt, "db " + wtag);
              first_w = hw, first_b = hb;
              continue;
            }
            if (!det) continue;
            EXPECT_EQ(0, std::memcmp(hw.data(), first_w.data(), hw.size() * sizeof(float)))
                << wtag << ": dw differs between two deterministic runs";
            EXPECT_EQ(0, std::memcmp(hb.data(), first_b.data(), hb.size() * sizeof(float)))
                << wtag << ": db differs between two deterministic runs";
          }
          // Without a bias gradient the weights come out the same.
          Tensor dw2 = test::to_device(p.dw0);
          test::poison_device(scratch.data(), scratch.numel());
          conv2d_grouped_backward_weight_cuda(s, x.ptr, dy.ptr, dw2.data(), nullptr,
                                              det ? scratch.data() : nullptr, Algo::Fast, det, st,
                                              DepthwiseKernel::Stream, rows);
          expect_close(test::to_host(dw2.data(), w_size(s)), p.dw, k_wgt, "dw (no db) " + wtag);
        }
      }
    }
  }
}

// The stream weight gradient's strip plans (DepthwiseStreamStrips): Fill's short strips and
// Long's, each forced through its rows per thread, and the launcher's own pick, atomic and
// deterministic (twice, bit for bit), against the CPU twin; the forward and input gradient on
// Long's rows too (CNN_DEPTHWISE_STREAM_STRIPS=long runs them so). Shapes where the plans
// differ: batch 1 with many channels (the seed's 1x256x128x128 regime, where Long takes one
// wave of 16-row strips), odd H so the last strip ends mid-block (131 = 128 + 3 rows: one
// thread row of the second strip), W % 4 == 2 and == 1 (the scalar path) and W = 128 (float4,
// aligned and misaligned), 3x3, 5x5 and 7x7. The deterministic scratch holds either plan.
TEST(GpuConv2dGrouped, StreamWeightGradientStripPlansMatchCpu) {
  CNN_REQUIRE_GPU();
  std::vector<Case> cases = {
      // n   c    h    w   oc  k  s  p  d  groups
      {1, 40, 37, 126, 40, 3, 1, 1, 1, 40},    // small: Fill 4 rows, Long 8
      {1, 96, 45, 61, 96, 7, 1, 3, 1, 96},     // 7x7, W % 4 == 1
  };
  if (!test::light_sweeps()) {
    cases.push_back({1, 200, 131, 126, 200, 3, 1, 1, 1, 200});  // Long 16 rows, 2 strips
    cases.push_back({1, 200, 131, 128, 200, 3, 1, 1, 1, 200});  // the same on float4 rows
    cases.push_back({1, 150, 67, 126, 150, 5, 1, 2, 1, 150});   // 5x5: Fill 4, Long 8
  }
  const cudaStream_t st = cuda_exec().stream;
  for (const Case& k : cases) {
    const Conv2dGroupedShape s = shape_of(k);
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + ", shape " + describe(s));
    const DepthwiseStreamTiling fill = depthwise_stream_tiling(s, 0, DepthwiseStreamStrips::Fill);
    const DepthwiseStreamTiling lng = depthwise_stream_tiling(s, 0, DepthwiseStreamStrips::Long);
    std::printf("%s (seed %llu): fill %d rows x %d strips, long %d rows x %d strips\n",
                describe(s).c_str(), static_cast<unsigned long long>(seed), fill.rows,
                fill.strips, lng.rows, lng.strips);
    ASSERT_LT(fill.rows, lng.rows) << "the plans must differ for this case to test them";
    const Problem p = make_problem(s, seed);
    const double k_fwd = double(s.cg()) * s.kh * s.kw + 1, k_data = double(s.ocg()) * s.kh * s.kw;
    const double k_wgt = double(s.n) * s.oh() * s.ow() + 1;
    Tensor w = test::to_device(p.w);
    const size_t scratch_n =
        conv2d_grouped_backward_weight_scratch_floats(s, Algo::Fast, cuda_exec(true));
    for (const DepthwiseStreamTiling& t : {fill, lng})
      ASSERT_GE(scratch_n, size_t(s.n) * t.strips * t.tiles_x * conv2d_grouped_wgrad_slots(s))
          << "the deterministic scratch must hold the partials of " << t.rows << "-row strips";
    Tensor scratch({int64_t(std::max<size_t>(scratch_n, 1))}, Device::CUDA);
    for (int offset : {0, 1}) {
      Shifted x(p.x, offset), dy(p.dy, offset), y(std::vector<float>(y_size(s)), offset),
          dx(std::vector<float>(x_size(s)), offset);
      // 0: the launcher's plan (Long unless CNN_DEPTHWISE_STREAM_STRIPS says otherwise).
      for (int rows : {fill.rows, lng.rows, 0}) {
        const std::string tag =
            "stream rows " + std::to_string(rows) + (offset ? " misaligned" : "");
        for (bool det : {false, true}) {
          const std::string wtag = tag + (det ? " deterministic" : " atomic");
          std::vector<float> first_w, first_b;
          for (int run = 0; run < (det ? 2 : 1); ++run) {
            Tensor dw = test::to_device(p.dw0), db = test::to_device(p.db0);
            test::poison_device(scratch.data(), scratch.numel());
            conv2d_grouped_backward_weight_cuda(s, x.ptr, dy.ptr, dw.data(), db.data(),
                                                det ? scratch.data() : nullptr, Algo::Fast, det, st,
                                                DepthwiseKernel::Stream, rows);
            std::vector<float> hw = test::to_host(dw.data(), w_size(s));
            std::vector<float> hb = test::to_host(db.data(), s.oc);
            if (run == 0) {
              expect_close(hw, p.dw, k_wgt, "dw " + wtag);
              expect_close(hb, p.db, k_wgt, "db " + wtag);
              first_w = hw, first_b = hb;
              continue;
            }
            EXPECT_EQ(0, std::memcmp(hw.data(), first_w.data(), hw.size() * sizeof(float)))
                << wtag << ": dw differs between two deterministic runs";
            EXPECT_EQ(0, std::memcmp(hb.data(), first_b.data(), hb.size() * sizeof(float)))
                << wtag << ": db differs between two deterministic runs";
          }
        }
      }
      const std::string tag = "stream long rows " + std::to_string(lng.rows) +
                              (offset ? " misaligned" : "");
      test::poison_device(y.ptr, y_size(s));
      conv2d_grouped_forward_cuda(s, x.ptr, w.data(), nullptr, y.ptr, false, Algo::Fast, st,
                                  DepthwiseKernel::Stream, lng.rows);
      expect_close(test::to_host(y.ptr, y_size(s)), p.y_plain, k_fwd, "forward " + tag);
      test::poison_device(dx.ptr, x_size(s));
      conv2d_grouped_backward_data_cuda(s, dy.ptr, w.data(), dx.ptr, Algo::Fast, st,
                                        DepthwiseKernel::Stream, lng.rows);
      expect_close(test::to_host(dx.ptr, x_size(s)), p.dx, k_data, "backward_data " + tag);
    }
  }
}

// The seed's large shapes go to the stream kernels under auto (fast) and match the CPU twin
// there; the pick rule's other side (multiplier 2, W < 28, under 2^21 outputs) keeps tile and
// rows.
TEST(GpuConv2dGrouped, StreamPickedForLargeShapes) {
  CNN_REQUIRE_GPU();
  const auto pick = [](const Case& k) { return conv2d_grouped_fast_kernel(shape_of(k)); };
  EXPECT_EQ(pick({8, 64, 128, 128, 64, 3, 1, 1, 1, 64}), DepthwiseKernel::Stream);
  EXPECT_EQ(pick({1, 256, 128, 128, 256, 3, 1, 1, 1, 256}), DepthwiseKernel::Stream);
  EXPECT_EQ(conv2d_grouped_fast_wgrad_kernel(shape_of({8, 64, 128, 128, 64, 3, 1, 1, 1, 64})),
            DepthwiseKernel::Stream);
  EXPECT_EQ(pick({1, 64, 32, 32, 64, 3, 1, 1, 1, 64}), DepthwiseKernel::Rows);
  EXPECT_EQ(pick({1, 64, 128, 128, 64, 3, 1, 1, 1, 64}), DepthwiseKernel::Tile);
  EXPECT_EQ(pick({8, 64, 128, 128, 128, 3, 1, 1, 1, 64}), DepthwiseKernel::Tile);
  EXPECT_EQ(pick({64, 64, 128, 16, 64, 3, 1, 1, 1, 64}), DepthwiseKernel::Tile);
  if (test::light_sweeps()) return;
  // Auto through the public API on a stream-picked ragged shape (W % 4 == 1: the scalar path;
  // 2.1M outputs); SeedShapesMatchCpu's 2x64x128x128 covers the float4 path.
  EXPECT_EQ(pick({1, 130, 127, 129, 130, 3, 1, 1, 1, 130}), DepthwiseKernel::Stream);
  run_case({1, 130, 127, 129, 130, 3, 1, 1, 1, 130});
}
#endif  // CNN_HAVE_CUDA

// igemm on a depthwise layer (one channel a group, which the dense kernels a group do not take):
// refused with a clear error, not run.
TEST(GpuConv2dGrouped, IgemmIsRefused) {
  CNN_REQUIRE_GPU();
  const Conv2dGroupedShape s = shape_of({1, 4, 5, 5, 4, 3, 1, 1, 1, 4});
  Tensor x({int64_t(x_size(s))}, Device::CUDA), w({int64_t(w_size(s))}, Device::CUDA),
      y({int64_t(y_size(s))}, Device::CUDA);
  EXPECT_THROW(conv2d_grouped_forward(s, x.data(), w.data(), nullptr, y.data(), false, nullptr,
                                      Algo::Igemm, cuda_exec()),
               Error);
}

// The float Network on the GPU (grouped layer followed by a fused ReLU) against the double
// numerical gradient, once per variant of the grouped layer.
TEST(GpuConv2dGrouped, GradcheckFloatNetworkOnGpu) {
  CNN_REQUIRE_GPU();
  struct Net {
    const char* title;
    int out, k, stride, pad, dil, groups;
    Shape chw;
  };
  const Net nets[] = {{"depthwise 3x3", 6, 3, 1, 1, 1, 6, {6, 7, 8}},
                      {"depthwise 5x5 multiplier 2", 8, 5, 1, 2, 1, 4, {4, 9, 8}},
                      {"groups 2 of 4 dilation 2 stride 2", 6, 3, 2, 2, 2, 2, {4, 9, 9}}};
  for (const Net& n : nets)
    for (Algo a : {Algo::Naive, Algo::Tiled, Algo::Fast}) {
      LayerSpec conv = conv2d_spec("conv", n.out, n.k, n.k, n.stride, n.pad);
      conv.dil_h = conv.dil_w = n.dil;
      conv.groups = n.groups;
      conv.algo = a;
      const std::vector<LayerSpec> specs = test::conv_in_small_net(conv, int(n.chw[0]));
      GradcheckOptions o;
      o.seed = test::fresh_seed();
      SCOPED_TRACE(std::string(n.title) + " " + algo_name(a) + " seed " + std::to_string(o.seed));
      const GradcheckResult r = gradcheck_network(specs, n.chw, o, cuda_exec(), true);
      std::printf("%s %s\n%s", n.title, algo_name(a), format_gradcheck(r).c_str());
      EXPECT_TRUE(r.passed()) << format_gradcheck(r);
    }
}
