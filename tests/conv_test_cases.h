#pragma once
// The convolution cases the wgmma convolution tests share (gpu_conv_wgmma*.cpp): a shape
// builder, the two passes, the two kinds of operand values (small integers, whose products
// and sums every precision represents exactly, and uniform random values), one pass's random
// operands and the line that names a case in failures and summaries.
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

// Whether an options struct has a blocks_per_sm field (WgmmaNhwcOptions does).
template <class Options, class = void>
struct HasBlocksPerSm : std::false_type {};
template <class Options>
struct HasBlocksPerSm<Options, std::void_t<decltype(Options::blocks_per_sm)>> : std::true_type {};

// The tile settings of a wgmma options struct (WgmmaConvOptions, WgmmaNhwcOptions), for the
// summary lines.
template <class Options>
std::string describe_tiles(const Options& o) {
  std::string d = "block_n=" + std::to_string(o.block_n) + " splits=" + std::to_string(o.splits);
  if constexpr (HasBlocksPerSm<Options>::value)
    d += " blocks_per_sm=" + std::to_string(o.blocks_per_sm);
  return d;
}

}  // namespace cnn::conv_test
