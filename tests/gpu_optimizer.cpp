// Optimizer CUDA kernels against the CPU reference over flat buffers whose sizes are not
// multiples of 4 or of the block size: SGD (momentum, Nesterov, masked weight decay, grad
// scale), Adam and AdamW over three steps; the gradient ranges an update leaves unzeroed; the
// two-stage sum of squares (bitwise repeatable) and the NaN/Inf watch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "runtime/memory.h"
#include "kernels/optimizer/optimizer.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

// max |got - ref| / max(max |ref|, floor): float (GPU) and double (CPU) updates differ by a few
// ulps of the terms, which matters relative to the terms' scale, not to an element that cancelled
// to ~0. max |ref| stands for that scale in a large buffer; `floor`, the typical size of the
// buffer's terms (inputs are in [-1, 1]), stands for it when one element is all there is (a
// count-1 momentum that cancelled to 1e-3 over three steps once read as a 1.2e-5 error).
double scaled_error(const std::vector<float>& got, const std::vector<float>& ref,
                    double floor) {
  double worst = 0, scale = floor;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    worst = std::max(worst, std::fabs(double(got[i]) - ref[i]));
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  return worst / scale;
}

const float kZero = 0.f;

struct State {
  std::vector<float> w, m, v;
};

std::vector<uint8_t> random_mask(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> mask(n);
  for (auto& b : mask) b = uint8_t(rng() & 1);
  return mask;
}

// kind 0: SGD momentum + masked decay; 1: SGD Nesterov; 2: Adam (coupled decay); 3: AdamW.
void check_optimizer(int64_t count, int kind, bool use_mask) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " count " << count << " kind " << kind
                                    << (use_mask ? " mask" : ""));
  const size_t n = size_t(count);
  State cpu{test::random_vector(n, seed), std::vector<float>(n, 0.f), std::vector<float>(n, 0.f)};
  const std::vector<uint8_t> mask = random_mask(n, seed + 7);
  SgdParams sp;
  sp.lr = 0.05f;
  sp.momentum = 0.9f;
  sp.weight_decay = 1e-2f;
  sp.nesterov = kind == 1;
  AdamParams ap;
  ap.lr = 1e-2f;
  ap.weight_decay = 0.05f;
  ap.decoupled = kind == 3;
  const float grad_scale = 0.75f;

  Tensor d_w = test::to_device(cpu.w);                                // (count)
  Tensor d_m = test::to_device(cpu.m), d_v = test::to_device(cpu.v);  // (count)
  Buffer<float> d_g(n, Device::CUDA);                                 // (count)
  Buffer<uint8_t> d_mask(n, Device::CUDA);                            // (count)
  d_mask.copy_from(mask.data(), Device::CPU, n);
  const uint8_t* h_mask = use_mask ? mask.data() : nullptr;
  const uint8_t* dev_mask = use_mask ? d_mask.data() : nullptr;
  Exec ex;
  ex.device = Device::CUDA;

  for (int step = 1; step <= 3; ++step) {
    std::vector<float> g = test::random_vector(n, seed + 100 + step);
    d_g.copy_from(g.data(), Device::CPU, n);
    ap.step = step;
    if (kind <= 1) {
      sgd_update_cpu(count, cpu.w.data(), g.data(), cpu.m.data(), h_mask, sp, grad_scale);
      sgd_update(count, d_w.data(), d_g.data(), d_m.data(), dev_mask, sp, grad_scale, ex);
    } else {
      adam_update_cpu(count, cpu.w.data(), g.data(), cpu.m.data(), cpu.v.data(), h_mask, ap,
                      grad_scale);
      adam_update(count, d_w.data(), d_g.data(), d_m.data(), d_v.data(), dev_mask, ap, grad_scale,
                  ex);
    }
  }
  // Term sizes: w ~1; SGD's momentum sums gradients (~1); Adam's m ~(1 - beta1), v ~(1 - beta2).
  const double ew = scaled_error(d_w.to_vector(), cpu.w, 1.0);
  const double em = scaled_error(d_m.to_vector(), cpu.m, kind <= 1 ? 1.0 : 0.1);
  const double ev = kind >= 2 ? scaled_error(d_v.to_vector(), cpu.v, 1e-3) : 0.0;
  std::printf("optimizer kind %d count %lld%s: scaled error w %.3g m %.3g v %.3g\n", kind,
              (long long)count, use_mask ? " mask" : "", ew, em, ev);
  EXPECT_LT(ew, 1e-5);
  EXPECT_LT(em, 1e-5);
  EXPECT_LT(ev, 1e-5);
  const std::vector<float> g_after = test::to_host(d_g.data(), n);
  EXPECT_EQ(g_after, std::vector<float>(n, 0.f)) << "gradients must be zeroed";
}

}  // namespace

TEST(GpuOptimizer, UpdatesMatchCpu) {
  CNN_REQUIRE_GPU();
  for (int64_t count : {int64_t(1), int64_t(4099), int64_t(3000017)})
    for (int kind = 0; kind < 4; ++kind)
      for (bool mask : {false, true}) check_optimizer(count, kind, mask);
}

// The launcher takes a 4-wide kernel when every array is 16-byte aligned and a scalar one
// otherwise; both must give the same bits. The same update runs on buffers at offset 0 (4-wide,
// count % 4 tail included) and at offset 1 float (scalar), mask at offset 0 and 1 likewise.
TEST(GpuOptimizer, VectorAndScalarPathsAreBitwiseEqual) {
  CNN_REQUIRE_GPU();
  Exec ex;
  ex.device = Device::CUDA;
  for (int64_t count : {int64_t(3), int64_t(4), int64_t(1023), int64_t(100003)})
    for (int kind = 0; kind < 4; ++kind) {
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " count " << count << " kind " << kind);
      const size_t n = size_t(count);
      const std::vector<float> w0 = test::random_vector(n, seed);
      const std::vector<uint8_t> mask = random_mask(n, seed + 3);
      std::vector<float> result[2][3];  // [offset][w, m, v]
      auto up = [](auto* dst, const auto* src, size_t count) {
        raw_copy(dst, Device::CUDA, src, Device::CPU, count * sizeof(*src));
      };
      for (int off = 0; off < 2; ++off) {
        Buffer<float> w(n + 1, Device::CUDA), g(n + 1, Device::CUDA);  // (count + 1) each
        Buffer<float> m(n + 1, Device::CUDA), v(n + 1, Device::CUDA);
        Buffer<uint8_t> mk(n + 1, Device::CUDA);  // (count + 1)
        const std::vector<float> zeros(n, 0.f);
        up(w.data() + off, w0.data(), n);
        up(m.data() + off, zeros.data(), n);
        up(v.data() + off, zeros.data(), n);
        up(mk.data() + off, mask.data(), n);
        SgdParams sp;
        sp.momentum = 0.9f;
        sp.weight_decay = 1e-2f;
        sp.nesterov = kind == 1;
        AdamParams ap;
        ap.weight_decay = 0.05f;
        ap.decoupled = kind == 3;
        for (int step = 1; step <= 2; ++step) {
          const std::vector<float> gh = test::random_vector(n, seed + 10 + step);
          up(g.data() + off, gh.data(), n);
          ap.step = step;
          if (kind <= 1)
            sgd_update(count, w.data() + off, g.data() + off, m.data() + off, mk.data() + off,
                       sp, 0.5f, ex);
          else
            adam_update(count, w.data() + off, g.data() + off, m.data() + off, v.data() + off,
                        mk.data() + off, ap, 0.5f, ex);
        }
        result[off][0] = test::to_host(w.data() + off, n);
        result[off][1] = test::to_host(m.data() + off, n);
        result[off][2] = test::to_host(v.data() + off, n);
        EXPECT_EQ(test::to_host(g.data() + off, n), zeros) << "gradients must be zeroed";
      }
      for (int t = 0; t < 3; ++t)
        EXPECT_EQ(0, std::memcmp(result[0][t].data(), result[1][t].data(), n * sizeof(float)))
            << "the 4-wide and scalar paths differ in " << "wmv"[t];
    }
}

// Kept ranges (gradients the next backward overwrites) on the 4-wide path (offset 0) and the
// scalar one (offset 1), with range ends inside quads, touching and empty ranges, and one
// covering whole quads: the kept gradients are left as they were (not written), every other one
// is zeroed, and w, m and v have the bits of the same update without ranges. SGD, Adam with the
// step by value, AdamW with lr and step read from the device.
TEST(GpuOptimizer, KeptRangesOnBothPaths) {
  CNN_REQUIRE_GPU();
  Exec ex;
  ex.device = Device::CUDA;
  const float lr = 2e-3f;
  const int64_t step = 4;
  Buffer<float> d_lr(1, Device::CUDA);      // (1)
  Buffer<int64_t> d_step(1, Device::CUDA);  // (1)
  d_lr.copy_from(&lr, Device::CPU, 1);
  d_step.copy_from(&step, Device::CPU, 1);
  for (int64_t count : {int64_t(5), int64_t(4099), int64_t(3000017)})
    for (int kind = 0; kind < 3; ++kind) {
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(::testing::Message()
                   << "seed " << seed << " count " << count << " kind " << kind);
      const size_t n = size_t(count);
      KeptGrads kept;
      const int64_t ranges[][2] = {{1, 3},
                                   {6, 17},
                                   {17, 18},
                                   {count / 3, count / 3},
                                   {count / 2 - 1, count / 2 + 41},
                                   {count - 2, count}};
      for (const auto& r : ranges) {
        const int64_t begin = std::min(r[0], count);
        kept.begin[kept.count] = begin;
        kept.end[kept.count] = std::max(begin, std::min(r[1], count));
        ++kept.count;
      }
      std::vector<bool> keep(n, false);
      for (int r = 0; r < kept.count; ++r)
        for (int64_t i = kept.begin[r]; i < kept.end[r]; ++i) keep[size_t(i)] = true;
      const std::vector<float> w0 = test::random_vector(n, seed),
                               g0 = test::random_vector(n, seed + 1);
      const std::vector<float> m0 = test::random_vector(n, seed + 2);
      const std::vector<float> v0 = test::random_vector(n, seed + 3, 0.f, 1.f);
      auto up = [](float* dst, const std::vector<float>& src) {
        raw_copy(dst, Device::CUDA, src.data(), Device::CPU, src.size() * sizeof(float));
      };
      std::vector<float> result[2][2][3];  // [offset][with ranges][w, m, v]
      for (int off = 0; off < 2; ++off)
        for (int with = 0; with < 2; ++with) {
          Buffer<float> w(n + 1, Device::CUDA), g(n + 1, Device::CUDA);  // (count + 1) each
          Buffer<float> m(n + 1, Device::CUDA), v(n + 1, Device::CUDA);
          up(w.data() + off, w0);
          up(g.data() + off, g0);
          up(m.data() + off, m0);
          up(v.data() + off, v0);
          const KeptGrads k = with ? kept : KeptGrads{};
          if (kind == 0) {
            SgdParams sp;
            sp.lr = 0.05f;
            sp.momentum = 0.9f;
            sp.weight_decay = 1e-2f;
            sgd_update(count, w.data() + off, g.data() + off, m.data() + off, nullptr, sp, 0.5f, ex,
                       nullptr, k);
          } else {
            AdamParams ap;
            ap.lr = lr;
            ap.step = step;
            ap.weight_decay = 0.05f;
            ap.decoupled = kind == 2;
            adam_update(count, w.data() + off, g.data() + off, m.data() + off, v.data() + off,
                        nullptr, ap, 0.5f, ex, kind == 2 ? d_lr.data() : nullptr,
                        kind == 2 ? d_step.data() : nullptr, k);
          }
          result[off][with][0] = test::to_host(w.data() + off, n);
          result[off][with][1] = test::to_host(m.data() + off, n);
          result[off][with][2] = test::to_host(v.data() + off, n);
          const std::vector<float> g_after = test::to_host(g.data() + off, n);
          size_t wrong = 0;
          for (size_t i = 0; i < n; ++i)
            wrong += std::memcmp(&g_after[i], with && keep[i] ? &g0[i] : &kZero, 4) != 0;
          EXPECT_EQ(wrong, 0u) << "gradients not kept or not zeroed, offset " << off
                               << (with ? " with ranges" : "");
        }
      for (int off = 0; off < 2; ++off)
        for (int t = 0; t < 3; ++t)
          EXPECT_EQ(
              0, std::memcmp(result[off][0][t].data(), result[off][1][t].data(), n * sizeof(float)))
              << "kept ranges changed "
              << "wmv"[t] << " at offset " << off;
    }
}

TEST(GpuOptimizer, SumSquaresIsFixedOrder) {
  CNN_REQUIRE_GPU();
  Exec ex;
  ex.device = Device::CUDA;
  Buffer<double> d_out(1, Device::CUDA);  // (1)
  for (int64_t count : {int64_t(0), int64_t(1), int64_t(4097), int64_t(10000003)}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " count " << count);
    const std::vector<float> g = test::random_vector(size_t(count), seed);
    double ref = 0;
    sum_squares_cpu(count, g.data(), &ref);
    Tensor d_g = test::to_device(g);
    const int64_t ns = sum_squares_scratch_doubles(count);
    Buffer<double> d_scratch(size_t(std::max<int64_t>(ns, 1)), Device::CUDA);  // (ns)
    double got[2];
    for (double& r : got) {
      const double poison = std::numeric_limits<double>::quiet_NaN();
      d_out.copy_from(&poison, Device::CPU, 1);
      sum_squares(count, count ? d_g.data() : nullptr, d_out.data(), d_scratch.data(), ex);
      raw_copy(&r, Device::CPU, d_out.data(), Device::CUDA, sizeof(double));
    }
    const double rel = std::fabs(got[0] - ref) / std::max(1e-300, std::fabs(ref));
    std::printf("sum_squares count %lld: %.17g vs cpu %.17g, rel error %.3g\n", (long long)count,
                got[0], ref, rel);
    if (count == 0)
      EXPECT_EQ(got[0], 0.0);
    else
      EXPECT_LT(rel, 1e-10);  // both sum in double, in different orders
    EXPECT_EQ(got[0], got[1]) << "sum_squares is not bitwise repeatable";
  }
}

TEST(GpuOptimizer, FindNonFinite) {
  CNN_REQUIRE_GPU();
  Exec ex;
  ex.device = Device::CUDA;
  const int64_t count = 1000003;
  std::vector<float> x = test::random_vector(size_t(count), test::fresh_seed());
  Buffer<int32_t> d_flag(1, Device::CUDA);  // (1)
  auto run = [&](const std::vector<float>& v) {
    Tensor d_x = test::to_device(v);
    const int32_t zero = 0;
    d_flag.copy_from(&zero, Device::CPU, 1);
    find_nonfinite(count, d_x.data(), d_flag.data(), ex);
    int32_t flag = -1;
    raw_copy(&flag, Device::CPU, d_flag.data(), Device::CUDA, sizeof(flag));
    return flag;
  };
  EXPECT_EQ(run(x), 0);
  x[size_t(count) - 1] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(run(x), 1);
  x[size_t(count) - 1] = 0.f;
  x[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(run(x), 1);
}
