// The TMA-im2col convolution's fused pre-pass (conv_nhwc_prepass_cuda, conv2d_nhwc_prepass.h):
// one launch that packs the weights and writes the channels-last copy must write the bytes the
// two separate launchers write, and the CPU twins (conv2d_nhwc_layout.h).
//   FusedEqualsSeparate  every precision form (TF32; BF16; FP32 as 3xTF32 with the copy unrounded,
//                        and with the copy split into TF32 part and residual), forward and input
//                        gradient packing (flipped, transposed), on awkward sizes: n 1, 3, 129;
//                        c 1, 3, 7, 32, 33; hw 1, 5x7, 14x14; oc 1, 5, 64; kernels 1x1, 3x3, 5x5
//                        (every (c, n, hw) and every (c, oc, kernel) combination), x aligned and
//                        one float off (the 4-byte load path). Outputs poisoned (all bits set)
//                        first; compared byte for byte.
//   OnePartEmpty         the fused launch with no weights, or no copy, writes the other part alone
//                        (the same bytes) and leaves the empty part's buffers untouched.
//   Refusals             a residual at TF32 or BF16, a missing residual pack at FP32, a copy not
//                        16-byte aligned: one-line cnn::Error.
// The pre-pass kernels need no sm_90a code: they run on any GPU of this build.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_nhwc_layout.h"
#include "runtime/error.h"
#include "runtime/exec.h"
#include "runtime/tensor.h"
#include "tests/conv_test_cases.h"
#include "tests/test_util.h"
#ifdef CNN_HAVE_CUDA
#include "kernels/conv/conv2d_nhwc_prepass.h"
#endif

using namespace cnn;

namespace {

#ifdef CNN_HAVE_CUDA

using conv_test::conv;

// The pre-pass forms of the convolution: its precision, and at FP32 whether the copy is split
// (two blocks an SM) or unrounded (one).
enum class Form { Tf32, Bf16, Fp32, Fp32SplitCopy };
const Form kForms[] = {Form::Tf32, Form::Bf16, Form::Fp32, Form::Fp32SplitCopy};

const char* form_name(Form f) {
  switch (f) {
    case Form::Tf32:
      return "tf32";
    case Form::Bf16:
      return "bf16";
    case Form::Fp32:
      return "fp32 (copy unrounded)";
    case Form::Fp32SplitCopy:
      return "fp32 (copy split)";
  }
  return "?";
}
Precision precision_of(Form f) {
  return f == Form::Tf32 ? Precision::TF32 : f == Form::Bf16 ? Precision::BF16 : Precision::FP32;
}
bool fp32(Form f) {
  return f == Form::Fp32 || f == Form::Fp32SplitCopy;
}
int elem_bytes(Form f) {
  return f == Form::Bf16 ? 2 : 4;
}
int channel_block(Form f) {
  return f == Form::Bf16 ? kNhwcChannelBlockBf16 : kNhwcChannelBlock;
}

// A device buffer of `bytes` bytes, every bit set (NaN floats, 0xffff bf16): an element that is
// not written shows.
struct Poisoned {
  explicit Poisoned(size_t b) : bytes(b) {
    if (b == 0) return;  // a part the form does not write
    std::vector<float> v((b + 3) / 4);
    const uint32_t ones = 0xffffffffu;
    for (float& x : v) std::memcpy(&x, &ones, 4);
    t = test::to_device(v);
  }
  void* data() { return t.data(); }
  float* f() { return t.data(); }
  std::vector<uint8_t> download() const {
    if (bytes == 0) return {};
    const std::vector<float> v = t.to_vector();
    std::vector<uint8_t> out(bytes);
    std::memcpy(out.data(), v.data(), bytes);
    return out;
  }
  size_t bytes;
  Tensor t;
};

template <class E>
std::vector<uint8_t> as_bytes(const std::vector<E>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(E));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// What one pre-pass writes: the pack (and at FP32 its residual), the copy (and at FP32 with the
// split copy its residual); empty where the form writes no such part.
struct Outputs {
  std::vector<uint8_t> pack, pack_small, copy, copy_small;
};

// One case: the weights w packed as wp, the copy of x (n, c, hw) to c_pad channels.
struct Problem {
  Form form;
  WeightPack wp;
  std::vector<float> w, x;
  int n, c, c_pad;
  int64_t hw;
  int x_offset;    // floats into x's device buffer: 1 takes the copy's 4-byte loads
  int groups = 1;  // > 1: x (n, groups c, hw), the copy group-major
  size_t pack_bytes() const { return size_t(wp.rows) * wp.taps * wp.k_pad * elem_bytes(form); }
  size_t copy_bytes() const { return size_t(n) * groups * size_t(hw) * c_pad * elem_bytes(form); }
};

Outputs cpu_outputs(const Problem& p) {
  Outputs o;
  const size_t npack = size_t(p.wp.rows) * p.wp.taps * p.wp.k_pad;
  const size_t ncopy = size_t(p.n) * p.groups * size_t(p.hw) * p.c_pad;
  if (p.form == Form::Bf16) {
    std::vector<uint16_t> pack(npack), copy(ncopy);
    pack_weights_bf16_cpu(p.wp, p.w.data(), pack.data());
    nchw_to_nhwc_bf16_cpu(p.x.data(), p.n, p.c, p.hw, p.c_pad, copy.data(), p.groups);
    o.pack = as_bytes(pack);
    o.copy = as_bytes(copy);
    return o;
  }
  std::vector<float> pack(npack), pack_small(npack), copy(ncopy), copy_small(ncopy);
  if (fp32(p.form)) {
    pack_weights_tf32_split_cpu(p.wp, p.w.data(), pack.data(), pack_small.data());
    o.pack_small = as_bytes(pack_small);
  } else {
    pack_weights_tf32_cpu(p.wp, p.w.data(), pack.data());
  }
  if (p.form == Form::Fp32SplitCopy) {
    nchw_to_nhwc_tf32_split_cpu(p.x.data(), p.n, p.c, p.hw, p.c_pad, copy.data(), copy_small.data(),
                                p.groups);
    o.copy_small = as_bytes(copy_small);
  } else if (p.form == Form::Fp32) {
    nchw_to_nhwc_fp32_cpu(p.x.data(), p.n, p.c, p.hw, p.c_pad, copy.data(), p.groups);
  } else {
    nchw_to_nhwc_tf32_cpu(p.x.data(), p.n, p.c, p.hw, p.c_pad, copy.data(), p.groups);
  }
  o.pack = as_bytes(pack);
  o.copy = as_bytes(copy);
  return o;
}

// The device buffers of one run: inputs uploaded, outputs poisoned.
struct DeviceRun {
  explicit DeviceRun(const Problem& p)
      : pack(p.pack_bytes()),
        pack_small(fp32(p.form) ? p.pack_bytes() : 0),
        copy(p.copy_bytes()),
        copy_small(p.form == Form::Fp32SplitCopy ? p.copy_bytes() : 0) {
    std::vector<float> shifted(size_t(p.x_offset), 0.f);
    shifted.insert(shifted.end(), p.x.begin(), p.x.end());
    d_w = test::to_device(p.w);
    d_x = test::to_device(shifted);
  }
  const float* x(const Problem& p) const { return d_x.data() + p.x_offset; }
  Outputs download() const {
    Outputs o;
    o.pack = pack.download();
    o.pack_small = pack_small.download();
    o.copy = copy.download();
    o.copy_small = copy_small.download();
    return o;
  }
  Tensor d_w, d_x;
  Poisoned pack, pack_small, copy, copy_small;
};

// The two separate launchers the convolution ran before the fusion.
Outputs run_separate(const Problem& p) {
  DeviceRun r(p);
  const float* x = r.x(p);
  switch (p.form) {
    case Form::Tf32:
      pack_weights_tf32_cuda(p.wp, r.d_w.data(), r.pack.f(), nullptr);
      nchw_to_nhwc_tf32_cuda(x, p.n, p.c, p.hw, p.c_pad, r.copy.f(), nullptr);
      break;
    case Form::Bf16:
      pack_weights_bf16_cuda(p.wp, r.d_w.data(), static_cast<uint16_t*>(r.pack.data()), nullptr);
      nchw_to_nhwc_bf16_cuda(x, p.n, p.c, p.hw, p.c_pad, static_cast<uint16_t*>(r.copy.data()),
                             nullptr);
      break;
    case Form::Fp32:
      pack_weights_tf32_split_cuda(p.wp, r.d_w.data(), r.pack.f(), r.pack_small.f(), nullptr);
      nchw_to_nhwc_fp32_cuda(x, p.n, p.c, p.hw, p.c_pad, r.copy.f(), nullptr);
      break;
    case Form::Fp32SplitCopy:
      pack_weights_tf32_split_cuda(p.wp, r.d_w.data(), r.pack.f(), r.pack_small.f(), nullptr);
      nchw_to_nhwc_tf32_split_cuda(x, p.n, p.c, p.hw, p.c_pad, r.copy.f(), r.copy_small.f(),
                                   nullptr);
      break;
  }
  return r.download();
}

// The fused launch; with_weights / with_copy false leave that job empty.
Outputs run_fused(const Problem& p, bool with_weights = true, bool with_copy = true) {
  DeviceRun r(p);
  NhwcWeightJob wj;
  wj.wp = p.wp;
  wj.d_w = with_weights ? r.d_w.data() : nullptr;
  wj.d_out = r.pack.data();
  wj.d_small = fp32(p.form) ? r.pack_small.f() : nullptr;
  NhwcCopyJob cj;
  cj.d_x = with_copy ? r.x(p) : nullptr;
  cj.n = p.n;
  cj.c = p.c;
  cj.hw = p.hw;
  cj.c_pad = p.c_pad;
  cj.d_out = r.copy.data();
  cj.d_small = p.form == Form::Fp32SplitCopy ? r.copy_small.f() : nullptr;
  cj.groups = p.groups;
  conv_nhwc_prepass_cuda(precision_of(p.form), wj, cj, nullptr);
  return r.download();
}

// The first byte where a and b differ, or -1.
long long first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return (long long)i;
  return -1;
}

void expect_same(const Outputs& got, const Outputs& want, const std::string& what) {
  const struct {
    const char* name;
    const std::vector<uint8_t>& got;
    const std::vector<uint8_t>& want;
  } parts[] = {{"pack", got.pack, want.pack},
               {"residual pack", got.pack_small, want.pack_small},
               {"copy", got.copy, want.copy},
               {"residual copy", got.copy_small, want.copy_small}};
  for (const auto& part : parts) {
    const long long at = first_difference(part.got, part.want);
    EXPECT_EQ(at, -1) << what << ": " << part.name << " differs at byte " << at << " of "
                      << part.want.size();
  }
}

// A buffer still all ones: nothing was written to it.
bool untouched(const std::vector<uint8_t>& v) {
  for (uint8_t b : v)
    if (b != 0xff) return false;
  return true;
}

Problem make_problem(Form form, const Conv2dShape& s, bool fwd, int n, int64_t hw, int x_offset,
                     uint64_t seed) {
  Problem p;
  p.form = form;
  p.wp = fwd ? forward_weight_pack(s, channel_block(form))
             : backward_data_weight_pack(s, channel_block(form));
  p.n = n;
  p.groups = s.groups;
  p.c = fwd ? s.cg() : s.ocg();  // a group of the GEMM view's input: x forward, dy backward
  p.hw = hw;
  p.c_pad = (p.c + channel_block(form) - 1) / channel_block(form) * channel_block(form);
  p.x_offset = x_offset;
  // Values of every magnitude the rounding sees: [-8, 8), so the TF32 / BF16 residuals are
  // not all of one exponent.
  p.w = test::random_vector(size_t(s.oc) * s.cg() * s.kh * s.kw, seed, -8.f, 8.f);
  p.x = test::random_vector(size_t(n) * p.groups * p.c * size_t(hw), seed + 1, -8.f, 8.f);
  return p;
}

std::string describe(const Problem& p, const Conv2dShape& s, bool fwd, uint64_t seed) {
  return std::string(form_name(p.form)) + (fwd ? " forward" : " input gradient") +
         " n=" + std::to_string(p.n) + " c=" + std::to_string(s.c) + " oc=" + std::to_string(s.oc) +
         " k=" + std::to_string(s.kh) + "x" + std::to_string(s.kw) + " hw=" + std::to_string(p.hw) +
         " x_offset=" + std::to_string(p.x_offset) + " seed=" + std::to_string(seed);
}

#endif  // CNN_HAVE_CUDA

}  // namespace

TEST(GpuConvNhwcPrepass, FusedEqualsSeparate) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_GPU();
  const int ns[] = {1, 3, 129}, cs[] = {1, 3, 7, 32, 33}, ocs[] = {1, 5, 64}, ks[] = {1, 3, 5};
  const int64_t hws[] = {1, 5 * 7, 14 * 14};
  // Every (c, oc, kernel), each with one (n, hw, x offset) in turn: every c (the forward copy's
  // channels) meets every (n, hw), every oc (the input gradient's) every n and hw.
  int i = 0;
  for (int c : cs)
    for (int oc : ocs)
      for (int k : ks) {
        const int n = ns[(i / 3 + i / 9) % 3];
        const int64_t hw = hws[i % 3];
        const int x_offset = (i / 3) % 2;  // 14x14 at offset 0: the 16-byte loads; else 4-byte
        ++i;
        const Conv2dShape s = conv(n, c, 14, 14, oc, k, k, 1, 1, k / 2, k / 2);
        for (Form form : kForms)
          for (bool fwd : {true, false}) {
            const uint64_t seed = test::fresh_seed();
            const Problem p = make_problem(form, s, fwd, n, hw, x_offset, seed);
            const std::string what = describe(p, s, fwd, seed);
            const Outputs fused = run_fused(p);
            expect_same(fused, run_separate(p), what + " (fused vs separate)");
            expect_same(fused, cpu_outputs(p), what + " (fused vs CPU twin)");
          }
      }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// A grouped convolution's pre-pass: the group-major copy and the grouped packs (the input
// gradient's rows reading their group's output channels) against the CPU twins, groups of 1 to
// 40 channels, both load widths.
TEST(GpuConvNhwcPrepass, GroupedEqualsCpuTwin) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_GPU();
  int i = 0;
  for (const auto& [c, oc, groups] : {std::array<int, 3>{12, 18, 3}, std::array<int, 3>{80, 40, 2},
                                      std::array<int, 3>{64, 128, 32}, std::array<int, 3>{8, 8, 8}})
    for (int64_t hw : {int64_t(5 * 7), int64_t(8 * 8)}) {
      const int n = i % 2 ? 3 : 1, x_offset = i % 3 == 2 ? 1 : 0;
      ++i;
      Conv2dShape s = conv(n, c, 7, 7, oc, 3, 3, 1, 1, 1, 1);
      s.groups = groups;
      for (Form form : kForms)
        for (bool fwd : {true, false}) {
          const uint64_t seed = test::fresh_seed();
          const Problem p = make_problem(form, s, fwd, n, hw, x_offset, seed);
          expect_same(run_fused(p), cpu_outputs(p),
                      describe(p, s, fwd, seed) + " groups=" + std::to_string(groups));
        }
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvNhwcPrepass, OnePartEmpty) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_GPU();
  for (const Conv2dShape& s :
       {conv(3, 7, 14, 14, 5, 3, 3, 1, 1, 1, 1), conv(129, 33, 14, 14, 64, 5, 5, 1, 1, 2, 2)})
    for (Form form : kForms) {
      const uint64_t seed = test::fresh_seed();
      const Problem p = make_problem(form, s, true, s.n, 14 * 14, 0, seed);
      const std::string what = describe(p, s, true, seed);
      const Outputs want = run_separate(p);
      const Outputs weights_only = run_fused(p, true, false);
      const Outputs copy_only = run_fused(p, false, true);
      EXPECT_TRUE(weights_only.pack == want.pack && weights_only.pack_small == want.pack_small)
          << what << ": the weights alone";
      EXPECT_TRUE(untouched(weights_only.copy) && untouched(weights_only.copy_small))
          << what << ": the copy was written without a copy job";
      EXPECT_TRUE(copy_only.copy == want.copy && copy_only.copy_small == want.copy_small)
          << what << ": the copy alone";
      EXPECT_TRUE(untouched(copy_only.pack) && untouched(copy_only.pack_small))
          << what << ": the pack was written without a weight job";
      // Neither: nothing launched, nothing written.
      const Outputs none = run_fused(p, false, false);
      EXPECT_TRUE(untouched(none.pack) && untouched(none.copy)) << what << ": no job";
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvNhwcPrepass, Refusals) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_GPU();
  const Conv2dShape s = conv(2, 3, 4, 4, 5, 3, 3, 1, 1, 1, 1);
  Tensor d_w = test::to_device(test::random_vector(5 * 3 * 9, 1));
  Tensor d_x = test::to_device(test::random_vector(2 * 3 * 16 + 1, 2));
  Tensor d_pack = test::to_device(std::vector<float>(5 * 9 * 64, 0.f));
  Tensor d_small = test::to_device(std::vector<float>(5 * 9 * 64, 0.f));
  Tensor d_copy = test::to_device(std::vector<float>(2 * 16 * 64 + 4, 0.f));
  const auto expect_refused = [](Precision precision, const NhwcWeightJob& wj,
                                 const NhwcCopyJob& cj, const char* what) {
    try {
      conv_nhwc_prepass_cuda(precision, wj, cj, nullptr);
      ADD_FAILURE() << what << ": not refused";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("conv_nhwc_prepass"), std::string::npos) << what << ": " << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << what << ": one line expected: " << msg;
    }
  };
  NhwcWeightJob wj;
  wj.wp = forward_weight_pack(s);
  wj.d_w = d_w.data();
  wj.d_out = d_pack.data();
  NhwcCopyJob cj;
  cj.d_x = d_x.data();
  cj.n = 2, cj.c = 3, cj.hw = 16, cj.c_pad = 32;
  cj.d_out = d_copy.data();
  NhwcWeightJob with_small = wj;
  with_small.d_small = d_small.data();
  NhwcCopyJob copy_small = cj;
  copy_small.d_small = d_copy.data() + 2 * 16 * 32;
  expect_refused(Precision::TF32, with_small, cj, "a residual pack at tf32");
  expect_refused(Precision::BF16, wj, copy_small, "a residual copy at bf16");
  expect_refused(Precision::FP32, wj, cj, "no residual pack at fp32");
  NhwcCopyJob misaligned = cj;
  misaligned.d_out = d_copy.data() + 1;
  expect_refused(Precision::TF32, wj, misaligned, "a copy one float off 16 bytes");
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}
