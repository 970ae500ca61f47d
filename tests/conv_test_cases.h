#pragma once
// The convolution cases the convolution tests share (gpu_conv_wgmma*.cpp, the weight-gradient
// tests): a shape builder, the NCHW -> NHWC pre-pass's copies, the two passes, the two kinds of
// operand values (small integers, whose products and sums every precision represents exactly,
// and uniform random values), one pass's random operands, a weight-gradient problem and the line
// that names a case in failures and summaries.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "tests/test_util.h"

namespace cnn::conv_test {

using test::Fill;
using test::make_values;
enum class Pass { Forward, BackwardData };

struct ConvCase {
  Conv2dShape s;
  bool bias = false, relu = false;  // forward only
};

inline Conv2dShape conv(int n, int c, int h, int w, int oc, int kh, int kw, int sh, int sw, int ph,
                        int pw) {
  Conv2dShape s;
  s.n = n, s.c = c, s.h = h, s.w = w, s.oc = oc, s.kh = kh, s.kw = kw;
  s.stride_h = sh, s.stride_w = sw, s.pad_h = ph, s.pad_w = pw;
  return s;
}

// One line naming a shape, for test traces.
inline std::string describe_shape(const Conv2dShape& s) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "N=%d C=%d H=%d W=%d OC=%d K=%dx%d stride=%dx%d pad=%dx%d", s.n,
                s.c, s.h, s.w, s.oc, s.kh, s.kw, s.stride_h, s.stride_w, s.pad_h, s.pad_w);
  return buf;
}

// One pass's operands, drawn from seed, seed + 1, seed + 2.
struct ConvOperands {
  std::vector<float> in;  // x (N, C, H, W) forward, dy (N, OC, OH, OW) input gradient
  std::vector<float> w;   // (OC, C, KH, KW)
  std::vector<float> b;   // (OC); used by the forward only where the case has a bias
};

inline ConvOperands make_operands(Pass pass, const Conv2dShape& s, Fill fill, uint64_t seed) {
  const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.oc * s.oh() * s.ow();
  const size_t nw = size_t(s.oc) * s.c * s.kh * s.kw;
  ConvOperands o;
  o.in = make_values(pass == Pass::Forward ? nx : ny, fill, seed);
  o.w = make_values(nw, fill, seed + 1);
  o.b = make_values(size_t(s.oc), fill, seed + 2);
  return o;
}

// A weight-gradient problem: x, dy, and the values dw and db start from (the passes accumulate),
// uniform in [-1, 1) from seed, seed + 1, seed + 2, seed + 3.
struct WgradProblem {
  std::vector<float> x, dy, dw0, db0;
};

inline WgradProblem make_wgrad_problem(const Conv2dShape& s, uint64_t seed) {
  WgradProblem pr;
  pr.x = test::random_vector(size_t(s.n) * s.c * s.h * s.w, seed);
  pr.dy = test::random_vector(size_t(s.n) * s.oc * s.oh() * s.ow(), seed + 1);
  pr.dw0 = test::random_vector(size_t(s.oc) * s.c * s.kh * s.kw, seed + 2);
  pr.db0 = test::random_vector(size_t(s.oc), seed + 3);
  return pr;
}

// The GEMM depth of a pass: C*KH*KW forward, OC*KH*KW input gradient.
inline int64_t gemm_depth(Pass pass, const Conv2dShape& s) {
  return int64_t(pass == Pass::Forward ? s.c : s.oc) * s.kh * s.kw;
}

// Names a case (pass, shape, epilogue, fill and seed), so that a failure can be rerun.
inline std::string describe_problem(Pass pass, const ConvCase& cc, Fill fill, uint64_t seed) {
  const Conv2dShape& s = cc.s;
  const bool fwd = pass == Pass::Forward;
  char buf[260];
  std::snprintf(buf, sizeof buf,
                "%s N=%d C=%d H=%d W=%d OC=%d k=%dx%d stride=%dx%d pad=%dx%d bias=%d relu=%d "
                "fill=%s seed=%llu",
                fwd ? "forward" : "input gradient", s.n, s.c, s.h, s.w, s.oc, s.kh, s.kw,
                s.stride_h, s.stride_w, s.pad_h, s.pad_w, fwd && cc.bias, fwd && cc.relu,
                fill == Fill::SmallInt ? "int" : "random", static_cast<unsigned long long>(seed));
  return buf;
}

// A case of the NCHW -> padded NHWC pre-pass (nchw_to_nhwc_*_cuda): n images of c channels of hw
// pixels, channels padded to the operand's block plus extra_blocks more, x read from x_offset
// floats into its buffer (an offset of 1 takes the 4-byte load path; so does hw % 4 != 0).
struct NhwcCopyCase {
  int n, c;
  int64_t hw;
  int extra_blocks = 0, x_offset = 0;
};

inline const std::vector<NhwcCopyCase>& nhwc_copy_cases() {
  static const std::vector<NhwcCopyCase> cases = {
      {1, 1, 1},              // one pixel, one channel
      {3, 5, 1},              // one pixel a plane: a 4-pixel group of one real pixel
      {1, 1, 49},             // 7x7
      {3, 64, 49},            // ResNet's 7x7 stage: 16-byte stores, 4-byte loads
      {3, 3, 169},            // 13x13, the first layer's 3 channels
      {2, 3, 1024},           // VGG's first layer: 16-byte loads of 3 of a group's channels
      {2, 3, 64, 1},          // c_pad a block past c's: a block of zeros only
      {1, 5, 6},              // hw = 2 (mod 4), c odd
      {2, 12, 28 * 28},       // c a multiple of 4, not of 8
      {3, 130, 13 * 33},      // 5 blocks of channels, the last of 2
      {2, 64, 1024},          // VGG's 64-channel 32x32 layers
      {2, 32, 28 * 28},       // ResNet's 32-channel 28x28 layers
      {1, 17, 33 * 32},       // c = 17
      {2, 70, 7 * 13},        // c = 70: one full BF16 block and a few channels
      {2, 64, 1024, 0, 1},    // x one float into its buffer: 4-byte loads
      {1, 9, 16 * 16, 1, 3},  // misaligned, and a block of zeros
  };
  return cases;
}

inline std::string describe(const NhwcCopyCase& k) {
  return "n=" + std::to_string(k.n) + " c=" + std::to_string(k.c) + " hw=" + std::to_string(k.hw) +
         " x_offset=" + std::to_string(k.x_offset);
}

// The TMA-im2col convolution's cases (gpu_conv_wgmma_nhwc*.cpp at TF32, FP32 and BF16): shapes of
// every kind its pre-passes, corners and tiles have to get right. The chunk counts in the
// comments are TF32's (32 channels a chunk; BF16's are 64).
inline const std::vector<ConvCase>& nhwc_forward_cases() {
  static const std::vector<ConvCase> c = {
      {conv(1, 1, 7, 7, 8, 1, 1, 1, 1, 0, 0)},                   // M = 49, one k-tile
      {conv(3, 3, 13, 13, 24, 3, 3, 1, 1, 1, 1), true, true},    // C = 3: 29 zero channels
      {conv(1, 17, 33, 32, 64, 5, 5, 1, 1, 2, 2), true},         // 25 taps, M = 1056
      {conv(3, 64, 13, 13, 200, 3, 3, 1, 1, 1, 1), true, true},  // 200 columns: 2 x 128 - 56
      {conv(3, 3, 33, 33, 64, 7, 7, 2, 2, 3, 3), true, true},    // a 7x7 stride-2 stem
      {conv(1, 17, 32, 33, 8, 5, 5, 2, 2, 2, 2)},                // stride 2, OC = 8
      {conv(3, 130, 7, 13, 24, 1, 1, 1, 1, 0, 0), true},         // 1x1, 130 channels: 5 chunks
      {conv(1, 1, 32, 32, 200, 5, 5, 1, 1, 2, 2), false, true},  // one input channel
      {conv(3, 64, 32, 32, 64, 3, 3, 1, 1, 1, 1)},               // M = 3072, 18 k-tiles
      {conv(3, 17, 13, 33, 24, 3, 5, 1, 2, 1, 2), false, true},  // 3x5, strides 1x2
      {conv(1, 3, 13, 7, 64, 3, 3, 2, 2, 3, 3), true},           // padding 3 > kernel / 2
      {conv(3, 130, 13, 13, 64, 3, 3, 2, 2, 0, 0), true, true},  // stride 2, padding 0
      {conv(1, 64, 33, 33, 24, 1, 1, 2, 2, 0, 0)},               // 1x1 stride 2 (projection)
      {conv(3, 17, 7, 7, 200, 7, 7, 1, 1, 3, 3), true},          // 7x7 on 7x7, same padding
      {conv(1, 3, 33, 13, 8, 5, 5, 2, 1, 0, 1)},                 // strides 2x1, padding 0x1
      {conv(3, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2), true, true},   // LeNet's conv2: halo 7 rows
  };
  return c;
}

inline const std::vector<ConvCase>& nhwc_backward_data_cases() {
  static const std::vector<ConvCase> c = {
      {conv(1, 1, 7, 7, 8, 1, 1, 1, 1, 0, 0)},       // dx has 1 channel: one output column
      {conv(3, 3, 13, 13, 64, 3, 3, 1, 1, 1, 1)},    // dy 64 channels, 3 dx columns
      {conv(1, 17, 33, 32, 200, 5, 5, 1, 1, 2, 2)},  // dy 200 channels: 7 chunks (24 zero)
      {conv(3, 64, 13, 13, 130, 3, 3, 1, 1, 1, 1)},  // K = 9 x 160
      {conv(1, 64, 13, 13, 8, 7, 7, 1, 1, 3, 3)},    // 7x7, OC = 8
      {conv(1, 130, 7, 7, 24, 3, 3, 1, 1, 0, 0)},    // 130 columns, padding 0 (flipped: 2)
      {conv(3, 17, 7, 13, 24, 1, 1, 1, 1, 2, 2)},    // padding 2 on 1x1: flipped padding -2
      {conv(3, 17, 13, 33, 64, 3, 5, 1, 1, 0, 2)},   // 3x5, padding 0x2
      {conv(3, 64, 32, 32, 64, 3, 3, 1, 1, 1, 1)},   // the VGG-style shape
      {conv(3, 1, 32, 33, 24, 5, 5, 1, 1, 2, 2)},    // the first layer's shape (C = 1)
      {conv(1, 3, 13, 7, 200, 7, 7, 1, 1, 3, 2)},    // 7x7, paddings 3x2
      {conv(3, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2)},   // LeNet's conv2: dy 64 channels, 2 chunks
      // Strided, as phases of dx (kernels/conv/conv2d_nhwc_layout.h, NhwcDgradPhase):
      {conv(3, 32, 16, 16, 64, 3, 3, 2, 2, 1, 1)},   // a ResNet stage entry: 1, 2, 2, 4 taps
      {conv(2, 17, 13, 15, 24, 3, 3, 2, 2, 1, 1)},   // odd sizes: phases of unequal pixels
      {conv(1, 64, 14, 14, 130, 1, 1, 2, 2, 0, 0)},  // 1x1: three phases without taps (zero)
      {conv(2, 3, 33, 31, 64, 7, 7, 2, 2, 3, 3)},    // a 7x7 stem: 9 to 16 taps a phase
      {conv(1, 24, 11, 13, 40, 4, 4, 3, 3, 1, 2)},   // stride 3, 4x4: 1 or 2 taps an axis
      {conv(2, 40, 9, 10, 24, 3, 5, 2, 1, 0, 2)},    // stride 2x1, padding 0x2
  };
  return c;
}

// Whether an options struct has a blocks_per_sm field (WgmmaNhwcOptions does).
template <class Options, class = void>
struct HasBlocksPerSm : std::false_type {};
template <class Options>
struct HasBlocksPerSm<Options, std::void_t<decltype(Options::blocks_per_sm)>> : std::true_type {};

// Whether an options struct has an a_load field (WgmmaNhwcOptions does).
template <class Options, class = void>
struct HasALoad : std::false_type {};
template <class Options>
struct HasALoad<Options, std::void_t<decltype(Options::a_load)>> : std::true_type {};

// The tile settings of a wgmma options struct (WgmmaConvOptions, WgmmaNhwcOptions), for the
// summary lines.
// Whether an options struct has a block_m field (WgmmaNhwcOptions does).
template <class Options, class = void>
struct HasBlockM : std::false_type {};
template <class Options>
struct HasBlockM<Options, std::void_t<decltype(Options::block_m)>> : std::true_type {};

template <class Options>
std::string describe_tiles(const Options& o) {
  std::string d = "block_n=" + std::to_string(o.block_n) + " splits=" + std::to_string(o.splits);
  if constexpr (HasBlocksPerSm<Options>::value)
    d += " blocks_per_sm=" + std::to_string(o.blocks_per_sm);
  if constexpr (HasBlockM<Options>::value) d += " block_m=" + std::to_string(o.block_m);
  if constexpr (HasALoad<Options>::value)
    d += o.a_load == decltype(o.a_load)::Halo ? " halo" : " im2col";
  return d;
}

}  // namespace cnn::conv_test
