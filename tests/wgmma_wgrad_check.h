#pragma once
// The weight-gradient problem and bound the wgmma weight-gradient GPU tests share
// (gpu_conv_wgrad_nhwc_bf16.cpp, gpu_conv_wgrad_tf32_halo.cpp): inputs, a nonzero dw0, the
// reference dw0 + sum dy x (conv2d_backward_weight_cpu) and the sums of |dy x| and (dy x)^2 that
// bound the error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "runtime/exec.h"
#include "tests/test_util.h"

namespace cnn::wgrad_test {

using test::Fill;

// A CUDA call at `precision`, atomic or deterministic.
inline Exec cuda_exec(Precision precision, bool deterministic = false) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = precision;
  ex.deterministic = deterministic;
  return ex;
}

struct Problem {
  Conv2dShape s;
  Fill fill;
  std::vector<float> x, dy, dw0, ref, abs, sq, db_ref, db_abs;
};

// `round` (may be empty) rounds x and dy to the kernel's operand precision before the reference
// sees them, where the check below leaves no room for the operands' own rounding.
inline Problem make_problem(const Conv2dShape& s, Fill fill, uint64_t seed,
                            const std::function<std::vector<float>(std::vector<float>)>& round =
                                {}) {
  Problem p{s, fill, {}, {}, {}, {}, {}, {}, {}, {}};
  const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.oc * s.oh() * s.ow();
  const size_t nw = size_t(s.oc) * s.c * s.kh * s.kw;
  p.x = test::make_values(nx, fill, seed);
  p.dy = test::make_values(ny, fill, seed + 1);
  if (round) {
    p.x = round(p.x);
    p.dy = round(p.dy);
  }
  p.dw0 = test::make_values(nw, fill, seed + 2);
  p.ref = p.dw0;
  std::vector<float> db(size_t(s.oc)), ax(nx), ady(ny), sx(nx), sdy(ny);
  conv2d_backward_weight_cpu(s, p.x.data(), p.dy.data(), p.ref.data(), db.data());
  p.db_ref = db;
  for (size_t i = 0; i < nx; ++i) ax[i] = std::fabs(p.x[i]), sx[i] = p.x[i] * p.x[i];
  for (size_t i = 0; i < ny; ++i) ady[i] = std::fabs(p.dy[i]), sdy[i] = p.dy[i] * p.dy[i];
  p.abs.assign(nw, 0.f);
  p.sq.assign(nw, 0.f);
  p.db_abs.assign(size_t(s.oc), 0.f);
  conv2d_backward_weight_cpu(s, ax.data(), ady.data(), p.abs.data(), p.db_abs.data());
  conv2d_backward_weight_cpu(s, sx.data(), sdy.data(), p.sq.data(), db.data());
  return p;
}

inline std::string describe(const Conv2dShape& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "N=%d C=%d H=%d W=%d OC=%d k=%dx%d stride=%d pad=%d (OH*OW=%d)",
                s.n, s.c, s.h, s.w, s.oc, s.kh, s.kw, s.stride_h, s.pad_h, s.oh() * s.ow());
  return buf;
}

// Checks got against the reference: exact for integer inputs; else
//   |got - ref| <= (operand_rel + 2 K 2^-24) sum_k |dy x| + 4 ulp (|ref| + |dw0|),  K = N OH OW
// (operand_rel: the products' own error, 0 where the operands are exact; the rest any order of
// FP32 sums) and the relative Frobenius error at most frob_max.
inline void check(const Problem& p, const std::vector<float>& got, const std::string& what,
                  double operand_rel, double frob_max) {
  const Conv2dShape& s = p.s;
  const double k = double(s.n) * s.oh() * s.ow();
  const double rel = operand_rel + 2 * k * std::ldexp(1.0, -24);
  int64_t bad = 0, inexact = 0;
  std::string first;
  double diff2 = 0, scale2 = 0;
  for (size_t i = 0; i < p.ref.size(); ++i) {
    const double e = std::fabs(double(got[i]) - p.ref[i]);
    const double mag = std::fabs(double(p.ref[i])) + std::fabs(double(p.dw0[i]));
    const bool over = !(e <= rel * p.abs[i] + 4 * std::ldexp(mag, -23));
    const bool wrong = !(got[i] == p.ref[i]);
    if (first.empty() && (over || (wrong && p.fill == Fill::SmallInt))) {
      const size_t taps = size_t(s.kh) * s.kw, oc = i / (size_t(s.c) * taps);
      char buf[200];
      std::snprintf(buf, sizeof buf, "dw[oc %zu][c %zu][tap %zu]: got %.9g, expected %.9g", oc,
                    (i / taps) % size_t(s.c), i % taps, double(got[i]), double(p.ref[i]));
      first = buf;
    }
    bad += over;
    inexact += wrong;
    diff2 += std::isnan(got[i]) ? INFINITY : e * e;
    scale2 += p.sq[i];
  }
  const double frob = std::sqrt(diff2 / std::max(scale2, 1e-30));
  std::printf("%s %s: %lld inexact, %lld over the bound, rel %.3g%s%s\n", what.c_str(),
              describe(s).c_str(), static_cast<long long>(inexact), static_cast<long long>(bad),
              frob, first.empty() ? "" : ", first ", first.c_str());
  EXPECT_EQ(bad, 0) << what << ": " << first;
  EXPECT_LE(frob, frob_max) << what;
  if (p.fill == Fill::SmallInt) {
    EXPECT_EQ(inexact, 0) << what << ": " << first;
  }
}

// db against its FP32 sums of the FP32 dy (2 N OH OW 2^-24 sum |dy| covers any order).
inline void check_db(const Problem& p, const std::vector<float>& db) {
  const double k = double(p.s.n) * p.s.oh() * p.s.ow();
  for (int o = 0; o < p.s.oc; ++o)
    EXPECT_LE(std::fabs(double(db[size_t(o)]) - p.db_ref[size_t(o)]),
              2 * k * std::ldexp(1.0, -24) * p.db_abs[size_t(o)] + 1e-30)
        << "db[" << o << "]: got " << db[size_t(o)] << ", expected " << p.db_ref[size_t(o)];
}

}  // namespace cnn::wgrad_test
