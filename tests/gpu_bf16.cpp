// The BF16 tensor-core paths (Precision::BF16: mma.sync m16n8k16, operands rounded to nearest
// even, FP32 accumulation) against the CPU twins on awkward shapes: the implicit-GEMM conv
// forward, input gradient and weight gradient (both variants of each), and the dense GEMM's
// strided and 16-byte tile paths in every transpose combination (the linear layer's products).
//
// The generic kernels also run on both BF16 shared-memory tilings (float tiles, packed bf16
// pairs), against the twins and against each other bitwise where neither splits K.
//
// Two bounds per output element, S = sum over k of |a b| (the CPU twin run on |a| and |b|):
//   emulated: the CPU twin in double on operands rounded with round_to_bf16 (bit-exact model
//             of cvt.rn.bf16x2). The products of two BF16 values are exact in FP32, so only the
//             GPU's FP32 summation separates the two: |got - emu| <= (k + 8) 2^-23 S (k terms and
//             up to 8 split-K partials, each addition rounding by at most 2^-23). A kernel that
//             rounded differently (TF32, truncation, no rounding) misses this by orders of
//             magnitude.
//   unrounded: against the twin on the FP32 operands. BF16 keeps 8 significant bits, so an
//             operand's relative rounding error is at most 2^-8 (unit roundoff; 2^-9 would be
//             a 9-bit significand), a product's at most 2^-7 (+2^-16):
//             |got - ref| <= (2^-7 + (k + 8) 2^-23) S (with the same small terms as above).
// plus a Frobenius check ||got - ref|| <= 2^-7 ||ref||: the rounding errors are random, their
// rms about 0.43 2^-8 per operand for random significands, so the ratio lands near
// sqrt(2) 0.43 2^-8 = 2.3e-3, a third of the bound. Deterministic weight gradients must repeat
// bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/bf16_round.h"
#include "kernels/conv/conv2d.h"
#include "layers/gradcheck/gradcheck.h"
#include "runtime/exec.h"
#include "runtime/memory.h"
#include "tests/test_util.h"
#ifdef CNN_HAVE_CUDA
#include "kernels/conv/conv2d_igemm.h"
#include "kernels/gemm/gemm_cuda.h"
#endif

using namespace cnn;

namespace {

#ifdef CNN_HAVE_CUDA

constexpr double kUnit = 1.0 / (1 << 23);  // 2^-23: FP32 summation, per term
constexpr double kProd = 1.0 / (1 << 7);   // 2^-7: BF16 rounding of a product's two operands

std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}
std::vector<double> abs_of(const std::vector<double>& v) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = std::fabs(v[i]);
  return r;
}
std::vector<double> bf16_of(const std::vector<float>& v) {
  return to_double(round_to_bf16(v));
}

// One output checked against both bounds (see the top of the file). `base` is what the kernel
// accumulated onto (weight gradients), exact in both references; its FP32 addition costs one
// rounding of the result.
struct Refs {
  std::vector<double> emu, emu_abs, ref, ref_abs, base_abs;
};

void expect_within(const std::vector<float>& got, const Refs& r, int64_t k,
                   const std::string& what) {
  ASSERT_EQ(got.size(), r.ref.size()) << what;
  double worst_emu = 0, worst_ref = 0, num = 0, den = 0;
  size_t bad_emu = 0, bad_ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << ": element " << i << " is " << got[i];
    // Each of the <= k + 8 FP32 additions (k terms, up to 8 split-K partials) rounds at a
    // magnitude of at most base + S; the result's own rounding is in `tiny`.
    const double base = r.base_abs.empty() ? 0.0 : r.base_abs[i];
    const double adds = static_cast<double>(k + 8) * kUnit;
    const double tiny = 1e-30 + kUnit * std::fabs(r.ref[i]);
    const double e_emu = std::fabs(got[i] - r.emu[i]);
    const double b_emu = adds * (r.emu_abs[i] + base) + tiny;
    // A product of two rounded operands: (1 + d1)(1 + d2) - 1 <= 2^-7 + 2^-16, and the rounded
    // terms' S is at most (1 + 2^-7) times the unrounded one.
    const double e_ref = std::fabs(got[i] - r.ref[i]);
    const double b_ref =
        (kProd * (1 + 1.0 / 512) + adds * (1 + kProd)) * r.ref_abs[i] + adds * base + tiny;
    worst_emu = std::max(worst_emu, e_emu / b_emu);
    worst_ref = std::max(worst_ref, e_ref / b_ref);
    if (e_emu > b_emu && !bad_emu++)
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << ", BF16-operand twin "
                    << r.emu[i] << ", |diff| " << e_emu << " > bound " << b_emu;
    if (e_ref > b_ref && !bad_ref++)
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << ", FP32 twin " << r.ref[i]
                    << ", |diff| " << e_ref << " > bound " << b_ref;
    num += e_ref * e_ref;
    den += r.ref[i] * r.ref[i];
  }
  EXPECT_EQ(bad_emu, 0u) << what << ": elements over the BF16-operand bound (worst ratio "
                         << worst_emu << ")";
  EXPECT_EQ(bad_ref, 0u) << what << ": elements over the FP32 bound (worst ratio " << worst_ref
                         << ")";
  EXPECT_LE(std::sqrt(num), kProd * std::sqrt(den) + 1e-30) << what << ": Frobenius error";
}

std::vector<float> download(const Buffer<float>& b) {
  return test::to_host(b.data(), b.size());
}
Buffer<float> upload(const std::vector<float>& v) {
  Buffer<float> b(v.size(), Device::CUDA);
  b.copy_from(v.data(), Device::CPU, v.size());
  return b;
}
Buffer<float> poisoned(size_t n) {
  Buffer<float> b(n, Device::CUDA);
  test::poison_device(b.data(), n);
  return b;
}

Exec bf16_exec(bool deterministic = false) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = Precision::BF16;
  ex.deterministic = deterministic;
  return ex;
}

// ---- convolution ------------------------------------------------------------------------------

constexpr auto shape = test::square_conv;

std::string describe(const Conv2dShape& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "N=%d C=%d %dx%d OC=%d K=%dx%d stride %d pad %d", s.n, s.c, s.h,
                s.w, s.oc, s.kh, s.kw, s.stride_h, s.pad_h);
  return buf;
}

// Channels not multiples of 8, 3 input channels, a 7x7 stride-2 stem, 1x1, 5x5 (K = C*25 not a
// multiple of 16), stride 2 with odd images, batch 1 and 257, and a 64-channel 3x3 (the shapes
// the dedicated weight-gradient kernel and the wide tiles take).
std::vector<Conv2dShape> conv_cases() {
  return {shape(1, 3, 19, 17, 13, 7, 2, 3), shape(5, 10, 12, 11, 20, 3, 1, 1),
          shape(3, 33, 9, 9, 70, 1, 1, 0),  shape(2, 6, 15, 13, 9, 3, 2, 1),
          shape(257, 2, 5, 5, 4, 3, 1, 1),  shape(2, 5, 9, 7, 11, 5, 1, 2),
          shape(4, 64, 8, 8, 64, 3, 1, 1),  shape(2, 17, 10, 10, 40, 3, 2, 0)};
}

size_t x_size(const Conv2dShape& s) {
  return size_t(s.n) * s.c * s.h * s.w;
}
size_t w_size(const Conv2dShape& s) {
  return size_t(s.oc) * s.c * s.kh * s.kw;
}
size_t y_size(const Conv2dShape& s) {
  return size_t(s.n) * s.oc * s.oh() * s.ow();
}

// The twins of each conv pass: FP32 operands in double, their BF16 roundings, and both on |a|, |b|.
Refs forward_refs(const Conv2dShape& s, const std::vector<float>& x, const std::vector<float>& w) {
  Refs r;
  r.ref.resize(y_size(s));
  r.ref_abs.resize(y_size(s));
  r.emu.resize(y_size(s));
  r.emu_abs.resize(y_size(s));
  const auto xd = to_double(x), wd = to_double(w), xe = bf16_of(x), we = bf16_of(w);
  conv2d_forward_cpu(s, xd.data(), wd.data(), nullptr, r.ref.data(), false);
  conv2d_forward_cpu(s, abs_of(xd).data(), abs_of(wd).data(), nullptr, r.ref_abs.data(), false);
  conv2d_forward_cpu(s, xe.data(), we.data(), nullptr, r.emu.data(), false);
  conv2d_forward_cpu(s, abs_of(xe).data(), abs_of(we).data(), nullptr, r.emu_abs.data(), false);
  return r;
}

Refs dgrad_refs(const Conv2dShape& s, const std::vector<float>& dy, const std::vector<float>& w) {
  Refs r;
  r.ref.resize(x_size(s));
  r.ref_abs.resize(x_size(s));
  r.emu.resize(x_size(s));
  r.emu_abs.resize(x_size(s));
  const auto yd = to_double(dy), wd = to_double(w), ye = bf16_of(dy), we = bf16_of(w);
  conv2d_backward_data_cpu(s, yd.data(), wd.data(), r.ref.data());
  conv2d_backward_data_cpu(s, abs_of(yd).data(), abs_of(wd).data(), r.ref_abs.data());
  conv2d_backward_data_cpu(s, ye.data(), we.data(), r.emu.data());
  conv2d_backward_data_cpu(s, abs_of(ye).data(), abs_of(we).data(), r.emu_abs.data());
  return r;
}

// dw and db as one vector, accumulated onto w0 and b0.
Refs wgrad_refs(const Conv2dShape& s, const std::vector<float>& x, const std::vector<float>& dy,
                const std::vector<float>& w0, const std::vector<float>& b0) {
  const size_t nw = w_size(s);
  Refs r;
  auto init = [&](std::vector<double>& v, bool with_base) {
    v.assign(nw + s.oc, 0.0);
    if (with_base) {
      std::copy(w0.begin(), w0.end(), v.begin());
      std::copy(b0.begin(), b0.end(), v.begin() + nw);
    }
  };
  init(r.ref, true);
  init(r.emu, true);
  init(r.ref_abs, false);
  init(r.emu_abs, false);
  r.base_abs = abs_of(r.ref);
  const auto xd = to_double(x), yd = to_double(dy), xe = bf16_of(x), ye = bf16_of(dy);
  conv2d_backward_weight_cpu(s, xd.data(), yd.data(), r.ref.data(), r.ref.data() + nw);
  conv2d_backward_weight_cpu(s, abs_of(xd).data(), abs_of(yd).data(), r.ref_abs.data(),
                             r.ref_abs.data() + nw);
  conv2d_backward_weight_cpu(s, xe.data(), ye.data(), r.emu.data(), r.emu.data() + nw);
  conv2d_backward_weight_cpu(s, abs_of(xe).data(), abs_of(ye).data(), r.emu_abs.data(),
                             r.emu_abs.data() + nw);
  return r;
}

TEST(GpuBf16, ConvForward) {
  CNN_REQUIRE_GPU();
  for (const Conv2dShape& s : conv_cases()) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(s) + " seed " + std::to_string(seed));
    const std::vector<float> x = test::random_vector(x_size(s), seed),
                             w = test::random_vector(w_size(s), seed + 1);
    const Refs r = forward_refs(s, x, w);

    Buffer<float> dx = upload(x), dw = upload(w), dy = poisoned(y_size(s));
    conv2d_forward_igemm_cuda(s, dx.data(), dw.data(), nullptr, dy.data(), false, bf16_exec());
    expect_within(download(dy), r, int64_t(s.c) * s.kh * s.kw, "forward");
  }
}

TEST(GpuBf16, ConvBackwardData) {
  CNN_REQUIRE_GPU();
  for (const Conv2dShape& s : conv_cases()) {
    for (IgemmVariant v : {IgemmVariant::Generic, IgemmVariant::Dedicated}) {
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(describe(s) + (v == IgemmVariant::Generic ? " generic" : " dedicated") +
                   " seed " + std::to_string(seed));
      const std::vector<float> dy = test::random_vector(y_size(s), seed),
                               w = test::random_vector(w_size(s), seed + 1);
      const Refs r = dgrad_refs(s, dy, w);

      Buffer<float> d_dy = upload(dy), d_w = upload(w), d_dx = poisoned(x_size(s));
      conv2d_backward_data_igemm_cuda(s, d_dy.data(), d_w.data(), d_dx.data(), bf16_exec(), v);
      expect_within(download(d_dx), r, int64_t(s.oc) * s.kh * s.kw, "input gradient");
    }
  }
}

TEST(GpuBf16, ConvBackwardWeight) {
  CNN_REQUIRE_GPU();
  for (const Conv2dShape& s : conv_cases()) {
    for (IgemmVariant v : {IgemmVariant::Generic, IgemmVariant::Dedicated}) {
      for (bool det : {false, true}) {
        const uint64_t seed = test::fresh_seed();
        SCOPED_TRACE(describe(s) + (v == IgemmVariant::Generic ? " generic" : " dedicated") +
                     (det ? " deterministic" : " atomic") + " seed " + std::to_string(seed));
        const std::vector<float> x = test::random_vector(x_size(s), seed),
                                 dy = test::random_vector(y_size(s), seed + 1);
        const std::vector<float> w0 = test::random_vector(w_size(s), seed + 2),
                                 b0 = test::random_vector(size_t(s.oc), seed + 3);
        // dw and db checked as one vector: dw (OC*C*KH*KW) then db (OC).
        const Refs r = wgrad_refs(s, x, dy, w0, b0);

        const Exec ex = bf16_exec(det);
        Buffer<float> d_x = upload(x), d_dy = upload(dy);
        Buffer<float> scratch(
            std::max<size_t>(1, conv2d_backward_weight_igemm_scratch_floats(s, ex)), Device::CUDA);
        auto run = [&] {
          Buffer<float> d_dw = upload(w0), d_db = upload(b0);
          conv2d_backward_weight_igemm_cuda(s, d_x.data(), d_dy.data(), d_dw.data(), d_db.data(),
                                            det ? scratch.data() : nullptr, ex, v);
          std::vector<float> out = download(d_dw), db = download(d_db);
          out.insert(out.end(), db.begin(), db.end());
          return out;
        };
        const std::vector<float> got = run();
        expect_within(got, r, int64_t(s.n) * s.oh() * s.ow(), "weight gradient");
        if (det) {
          const std::vector<float> again = run();
          EXPECT_EQ(std::memcmp(got.data(), again.data(), got.size() * sizeof(float)), 0)
              << "deterministic weight gradient not bitwise repeatable";
        }
      }
    }
  }
}

// ---- packed BF16 tiles --------------------------------------------------------------------------
// The generic kernels on both shared-memory tilings (Bf16Tiles::Float: float tiles rounded at the
// fragment loads; Packed: bf16 pairs rounded by the loaders), whatever CNN_BF16_SMEM says.

const char* tiles_name(Bf16Tiles t) {
  return t == Bf16Tiles::Packed ? " packed" : " float";
}

std::vector<float> run_forward(const Conv2dShape& s, const std::vector<float>& x,
                               const std::vector<float>& w, Bf16Tiles t) {
  Buffer<float> d_x = upload(x), d_w = upload(w), d_y = poisoned(y_size(s));
  conv2d_forward_igemm_cuda(s, d_x.data(), d_w.data(), nullptr, d_y.data(), false, bf16_exec(), t);
  return download(d_y);
}

std::vector<float> run_dgrad(const Conv2dShape& s, const std::vector<float>& dy,
                             const std::vector<float>& w, Bf16Tiles t) {
  Buffer<float> d_dy = upload(dy), d_w = upload(w), d_dx = poisoned(x_size(s));
  conv2d_backward_data_igemm_cuda(s, d_dy.data(), d_w.data(), d_dx.data(), bf16_exec(),
                                  IgemmVariant::Generic, t);
  return download(d_dx);
}

std::vector<float> run_wgrad(const Conv2dShape& s, const std::vector<float>& x,
                             const std::vector<float>& dy, const std::vector<float>& w0,
                             const std::vector<float>& b0, bool det, Bf16Tiles t) {
  const Exec ex = bf16_exec(det);
  Buffer<float> d_x = upload(x), d_dy = upload(dy), d_dw = upload(w0), d_db = upload(b0);
  Buffer<float> scratch(std::max<size_t>(1, conv2d_backward_weight_igemm_scratch_floats(s, ex)),
                        Device::CUDA);
  conv2d_backward_weight_igemm_cuda(s, d_x.data(), d_dy.data(), d_dw.data(), d_db.data(),
                                    det ? scratch.data() : nullptr, ex, IgemmVariant::Generic, t);
  std::vector<float> out = download(d_dw), db = download(d_db);
  out.insert(out.end(), db.begin(), db.end());
  return out;
}

// conv_cases() plus a 7x7 at stride 1 (no tap table: 49 taps > 31, the gathers divide), a 1x1 at
// stride 2 with batch 3, and K = 576 on a single tile (split over a cluster of 4 packed k-tile
// runs of 32).
std::vector<Conv2dShape> packed_cases() {
  std::vector<Conv2dShape> v = conv_cases();
  v.push_back(shape(3, 7, 13, 12, 9, 7, 1, 3));
  v.push_back(shape(3, 13, 10, 9, 5, 1, 2, 0));
  v.push_back(shape(2, 64, 8, 8, 64, 3, 1, 1));
  return v;
}

TEST(GpuBf16, TilingsMatchCpuTwinOnAwkwardShapes) {
  CNN_REQUIRE_GPU();
  for (const Conv2dShape& s : packed_cases()) {
    for (Bf16Tiles t : {Bf16Tiles::Float, Bf16Tiles::Packed}) {
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(describe(s) + tiles_name(t) + " seed " + std::to_string(seed));
      const std::vector<float> x = test::random_vector(x_size(s), seed),
                               w = test::random_vector(w_size(s), seed + 1),
                               dy = test::random_vector(y_size(s), seed + 2),
                               b0 = test::random_vector(size_t(s.oc), seed + 3);
      expect_within(run_forward(s, x, w, t), forward_refs(s, x, w), int64_t(s.c) * s.kh * s.kw,
                    "forward");
      expect_within(run_dgrad(s, dy, w, t), dgrad_refs(s, dy, w), int64_t(s.oc) * s.kh * s.kw,
                    "input gradient");
      const Refs wr = wgrad_refs(s, x, dy, w, b0);
      for (bool det : {false, true}) {
        const std::vector<float> got = run_wgrad(s, x, dy, w, b0, det, t);
        expect_within(got, wr, int64_t(s.n) * s.oh() * s.ow(),
                      det ? "weight gradient, deterministic" : "weight gradient, atomic");
        if (det) {
          const std::vector<float> again = run_wgrad(s, x, dy, w, b0, det, t);
          EXPECT_EQ(std::memcmp(got.data(), again.data(), got.size() * sizeof(float)), 0)
              << "deterministic weight gradient not bitwise repeatable";
        }
      }
    }
  }
}

// Both tilings feed the MMAs bitwise the same operands (one cvt.rn on the same bits) in the same
// k16 order, so where neither splits K the results are bitwise equal: forward and input gradient
// with K <= 224 (a cluster split needs 256 k: 16 k-tiles of 16, 8 of 32), the weight gradient
// with at most 512 output positions (one chunk) in deterministic mode. The packed tiles' extra
// all-zero k16 step (K rounded up to 32, not 16) adds exact zeros.
TEST(GpuBf16, PackedTilesMatchFloatTilesBitwiseWithoutSplit) {
  CNN_REQUIRE_GPU();
  constexpr int64_t kNoSplitK = 224;
  const std::vector<Conv2dShape> cases = {
      shape(1, 3, 19, 17, 4, 7, 2, 3),   shape(3, 5, 9, 7, 7, 5, 1, 2),
      shape(3, 33, 9, 9, 70, 1, 1, 0),   shape(2, 6, 15, 13, 9, 3, 2, 1),
      shape(1, 24, 11, 10, 20, 3, 1, 1), shape(2, 8, 12, 11, 40, 5, 1, 2),
      shape(3, 4, 7, 9, 4, 7, 1, 3)};
  int compared = 0;
  for (const Conv2dShape& s : cases) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe(s) + " seed " + std::to_string(seed));
    const std::vector<float> x = test::random_vector(x_size(s), seed),
                             w = test::random_vector(w_size(s), seed + 1),
                             dy = test::random_vector(y_size(s), seed + 2),
                             b0 = test::random_vector(size_t(s.oc), seed + 3);
    auto same = [&](const std::vector<float>& a, const std::vector<float>& b, const char* what) {
      ++compared;
      ASSERT_EQ(a.size(), b.size()) << what;
      for (size_t i = 0; i < a.size(); ++i)
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
          ADD_FAILURE() << what << ": element " << i << " packed " << a[i] << ", float " << b[i];
          return;
        }
    };
    if (int64_t(s.c) * s.kh * s.kw <= kNoSplitK)
      same(run_forward(s, x, w, Bf16Tiles::Packed), run_forward(s, x, w, Bf16Tiles::Float),
           "forward");
    if (int64_t(s.oc) * s.kh * s.kw <= kNoSplitK)
      same(run_dgrad(s, dy, w, Bf16Tiles::Packed), run_dgrad(s, dy, w, Bf16Tiles::Float),
           "input gradient");
    if (int64_t(s.n) * s.oh() * s.ow() <= 512)
      same(run_wgrad(s, x, dy, w, b0, true, Bf16Tiles::Packed),
           run_wgrad(s, x, dy, w, b0, true, Bf16Tiles::Float), "weight gradient");
  }
  EXPECT_EQ(compared, 20);  // the cases are chosen so that all but one input gradient compare
}

// ---- dense GEMM ---------------------------------------------------------------------------------

struct GemmCase {
  bool ta, tb;
  int m, n, k;
};

// C (m, n) = op(A) op(B) in double; a_abs / b_abs: on |A|, |B|.
std::vector<double> gemm_ref(const GemmCase& c, const std::vector<double>& a,
                             const std::vector<double>& b, int lda, int ldb) {
  std::vector<double> out(size_t(c.m) * c.n, 0.0);
  for (int i = 0; i < c.m; ++i)
    for (int j = 0; j < c.n; ++j) {
      double acc = 0;
      for (int l = 0; l < c.k; ++l) {
        const double av = c.ta ? a[size_t(l) * lda + i] : a[size_t(i) * lda + l];
        const double bv = c.tb ? b[size_t(j) * ldb + l] : b[size_t(l) * ldb + j];
        acc += av * bv;
      }
      out[size_t(i) * c.n + j] = acc;
    }
  return out;
}

TEST(GpuBf16, GemmTilePaths) {
  CNN_REQUIRE_GPU();
  // The linear layer's products at odd sizes (k not a multiple of 16, m or n below a tile),
  // batch 1 and 257; leading dimensions multiples of 4 so that the 16-byte paths take them. The
  // last two span several wide (128 x 128) tiles with ragged edges: fc1's weight gradient at an
  // odd batch, and every transpose of another shape.
  const std::vector<GemmCase> cases = {{false, true, 37, 45, 77},      {false, false, 64, 48, 100},
                                       {true, false, 45, 52, 257},     {true, true, 20, 36, 33},
                                       {false, true, 1, 130, 300},     {false, true, 257, 10, 36},
                                       {true, false, 120, 84, 128},    {false, false, 130, 68, 17},
                                       {true, false, 1024, 3136, 129}, {true, true, 300, 260, 70}};
  for (const GemmCase& c : cases) {
    for (GemmPath path : {GemmPath::StridedTile, GemmPath::VecTile, GemmPath::VecTileWide}) {
      const uint64_t seed = test::fresh_seed();
      char buf[160];
      std::snprintf(buf, sizeof buf, "ta=%d tb=%d m=%d n=%d k=%d path %s seed %llu", c.ta, c.tb,
                    c.m, c.n, c.k, gemm_path_name(path), static_cast<unsigned long long>(seed));
      SCOPED_TRACE(buf);
      auto round4 = [](int v) { return (v + 3) / 4 * 4; };
      const int lda = round4(c.ta ? c.m : c.k), ldb = round4(c.tb ? c.k : c.n);
      const size_t na = size_t(c.ta ? c.k : c.m) * lda, nb = size_t(c.tb ? c.n : c.k) * ldb;
      const std::vector<float> a = test::random_vector(na, seed),
                               b = test::random_vector(nb, seed + 1);
      Refs r;
      const auto ad = to_double(a), bd = to_double(b), ae = bf16_of(a), be = bf16_of(b);
      r.ref = gemm_ref(c, ad, bd, lda, ldb);
      r.ref_abs = gemm_ref(c, abs_of(ad), abs_of(bd), lda, ldb);
      r.emu = gemm_ref(c, ae, be, lda, ldb);
      r.emu_abs = gemm_ref(c, abs_of(ae), abs_of(be), lda, ldb);

      Buffer<float> d_a = upload(a), d_b = upload(b), d_c = poisoned(size_t(c.m) * c.n);
      gemm_cuda_path(path, c.ta, c.tb, c.m, c.n, c.k, 1.f, d_a.data(), lda, d_b.data(), ldb, 0.f,
                     d_c.data(), c.n, nullptr, false, Precision::BF16, nullptr);
      expect_within(download(d_c), r, c.k, "gemm");
    }
  }
}

// ---- whole networks ----------------------------------------------------------------------------

// The network checks below run smooth versions of the gradcheck cases: no ReLU, average instead
// of max pooling. BF16 moves a layer's outputs by ~2^-8 relative; wherever a ReLU input or a
// max-pool runner-up lies that close to its kink, the BF16 forward takes the other linear piece
// than the double reference whose derivative it is compared with, and every gradient upstream
// carries the difference. On the H200, 12 runs of the kinked cases measured 0.11-0.35 relative
// error in 7 of them (conv weights and biases upstream of a ReLU or max-pool), with the packed
// and the float shared-memory tiles alike, while the smooth nets exercise the same BF16
// convolution, linear and residual passes and leave only the rounding (~1e-2). The kinks
// themselves are checked at FP32 and TF32 (tolerance 1e-2), where flips are ~100x rarer.
GradcheckCase smooth(GradcheckCase c) {
  c.specs = test::smooth_specs(c.specs);
  c.title += " (smooth)";
  return c;
}

// Every gradcheck case and the small network, made smooth, at BF16 (tolerance
// gradcheck_network_tolerance: 1e-1), atomic and deterministic. Errors are measured against at
// least a tenth of the network's largest gradient (GradcheckOptions::denominator_floor): the
// H200 measured 0.49 on a smooth case's prefix.bias, whose gradient (through a softmax head, a
// sum over classes of terms that cancel) is far smaller than the BF16 rounding of its terms, while
// every weight of that case was within 1.4e-3.
TEST(GpuBf16, GradcheckEveryLayer) {
  CNN_REQUIRE_GPU();
  EXPECT_EQ(gradcheck_network_tolerance(Precision::BF16), 1e-1);
  std::vector<GradcheckCase> cases;
  for (const GradcheckCase& c : gradcheck_layer_cases()) cases.push_back(smooth(c));
  cases.push_back(smooth(gradcheck_small_network_case()));
  for (bool det : {false, true}) {
    for (const auto& c : cases) {
      GradcheckOptions o;
      o.seed = test::fresh_seed();
      o.batch = 3;
      o.denominator_floor = 0.1;
      SCOPED_TRACE(c.title + (det ? " deterministic" : " atomic") + " seed " +
                   std::to_string(o.seed));
      const GradcheckResult r = gradcheck_network(c.specs, c.input_chw, o, bf16_exec(det), true);
      EXPECT_TRUE(r.passed()) << format_gradcheck(r);
    }
  }
}

// A BF16 step of the small network (made smooth, see above) in deterministic mode repeats
// bitwise, and its gradients stay within BF16 reach of the FP32 ones (2^-7 per product, a few
// products deep: 5e-2 of the gradient vector's norm).
TEST(GpuBf16, NetworkStepRepeatsAndTracksFp32) {
  CNN_REQUIRE_GPU();
  const GradcheckCase c = smooth(gradcheck_small_network_case());
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = 37;
  const test::NetworkRun a =
      test::run_network_once(c.specs, c.input_chw, bf16_exec(true), PoolFusion::Auto, n, seed);
  const test::NetworkRun b =
      test::run_network_once(c.specs, c.input_chw, bf16_exec(true), PoolFusion::Auto, n, seed);
  ASSERT_EQ(a.grads.size(), b.grads.size());
  EXPECT_EQ(std::memcmp(a.grads.data(), b.grads.data(), a.grads.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)), 0);
  Exec fp32 = bf16_exec(true);
  fp32.precision = Precision::FP32;
  const test::NetworkRun f =
      test::run_network_once(c.specs, c.input_chw, fp32, PoolFusion::Auto, n, seed);
  double num = 0, den = 0;
  for (size_t i = 0; i < f.grads.size(); ++i) {
    num += (double(a.grads[i]) - f.grads[i]) * (double(a.grads[i]) - f.grads[i]);
    den += double(f.grads[i]) * f.grads[i];
  }
  EXPECT_LE(std::sqrt(num), 5e-2 * std::sqrt(den));
}

#endif  // CNN_HAVE_CUDA

}  // namespace
