// The split-K group reduction (kernels/gemm/split_k_reduce.h) on the GPU against its CPU twin:
// the same float operations in the same order, so the outputs must agree bit for bit (a NaN
// matches any NaN). Awkward
// sizes (columns not a multiple of 4, a single row), 1 to 7 groups, a C whose rows are not
// 16-byte aligned (scalar stores), alpha, beta, bias and ReLU, NaN and infinities in the
// partial sums; C's padding must stay untouched and beta == 0 must not read C (NaN there).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/gemm/split_k_reduce.h"
#include "runtime/memory.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

#ifdef CNN_HAVE_CUDA

struct ReduceCase {
  int groups = 1, m = 1, n = 1;
  int c_pad = 0, c_offset = 0;  // C's extra row floats; floats C starts past a 16-byte boundary
  GemmEpilogue e;
  bool specials = false;  // NaN and +-inf in the partial sums
};

std::string describe(const ReduceCase& c) {
  return "groups " + std::to_string(c.groups) + " m " + std::to_string(c.m) + " n " +
         std::to_string(c.n) + " c_pad " + std::to_string(c.c_pad) + " c_offset " +
         std::to_string(c.c_offset) + " alpha " + std::to_string(c.e.alpha) + " beta " +
         std::to_string(c.e.beta) + " bias " + std::to_string(c.e.bias != nullptr) + " relu " +
         std::to_string(c.e.relu) + " specials " + std::to_string(c.specials);
}

void check_reduce(ReduceCase c, bool with_bias) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(describe(c) + " bias " + std::to_string(with_bias) + " seed " +
               std::to_string(seed));
  SplitKReduceShape s;
  s.groups = c.groups;
  s.m = c.m;
  s.n = c.n;
  s.ldw = (c.n + 3) / 4 * 4;
  s.ldc = c.n + c.c_pad;
  ASSERT_EQ(split_k_work_floats(c.groups, c.m, c.n), size_t(c.groups) * c.m * s.ldw);
  std::vector<float> work = test::random_vector(size_t(c.groups) * c.m * s.ldw, seed);
  if (c.specials) {
    work[0] = NAN;
    work[work.size() / 2] = INFINITY;
    work.back() = -INFINITY;
  }
  const size_t off = size_t(c.c_offset), nc = off + size_t(c.m) * s.ldc;
  std::vector<float> c0 = test::random_vector(nc, seed + 1);
  if (c.e.beta == 0.f)  // must be overwritten without being read
    for (int i = 0; i < c.m; ++i)
      for (int j = 0; j < c.n; ++j) c0[off + size_t(i) * s.ldc + j] = NAN;
  const std::vector<float> bias = test::random_vector(size_t(c.n), seed + 2);

  std::vector<float> want = c0;
  GemmEpilogue e = c.e;
  e.bias = with_bias ? bias.data() : nullptr;
  split_k_reduce_cpu(s, work.data(), e, want.data() + off);

  Tensor d_work = test::to_device(work), d_c = test::to_device(c0), d_bias = test::to_device(bias);
  e.bias = with_bias ? d_bias.data() : nullptr;
  split_k_reduce_cuda(s, d_work.data(), e, d_c.data() + off, nullptr);
  const std::vector<float> got = d_c.to_vector();
  ASSERT_EQ(got.size(), want.size());
  // Bit for bit, except that a NaN matches any NaN (the GPU writes its canonical NaN, the CPU
  // keeps an operand's payload).
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool same = std::memcmp(&got[i], &want[i], sizeof(float)) == 0 ||
                      (std::isnan(got[i]) && std::isnan(want[i]));
    if (!same && differ++ == 0) first = i;
  }
  EXPECT_EQ(differ, 0u) << "first at float " << first << ": got " << got[first] << ", want "
                        << want[first];
}

#endif  // CNN_HAVE_CUDA

}  // namespace

TEST(GpuSplitKReduce, MatchesCpuBitwise) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_GPU();
  const int sizes[][2] = {{1, 1}, {1, 5}, {3, 4}, {7, 130}, {129, 127}, {128, 512}};
  int which = 0;
  for (const auto& sz : sizes)
    for (int groups : {1, 2, 3, 7}) {
      ReduceCase c;
      c.groups = groups;
      c.m = sz[0];
      c.n = sz[1];
      c.c_pad = which % 3 == 1 ? 3 : 4 * (which % 2);
      c.c_offset = which % 4 == 2 ? 1 : 0;
      c.e.alpha = which % 2 ? 1.5f : 1.f;
      c.e.beta = which % 3 == 0 ? 0.f : (which % 3 == 1 ? 1.f : -0.75f);
      c.e.relu = which % 5 < 2;
      c.specials = which % 4 == 3;
      check_reduce(c, which % 3 != 1);
      ++which;
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuSplitKReduce, RefusesAMisalignedWorkspace) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_GPU();
  Buffer<float> work(64, Device::CUDA), c(16, Device::CUDA);
  const SplitKReduceShape s{2, 2, 4, 4, 4};
  EXPECT_THROW(split_k_reduce_cuda(s, work.data() + 1, GemmEpilogue{}, c.data(), nullptr), Error);
  const SplitKReduceShape odd_ldw{2, 2, 3, 3, 4};
  EXPECT_THROW(split_k_reduce_cuda(odd_ldw, work.data(), GemmEpilogue{}, c.data(), nullptr), Error);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}
