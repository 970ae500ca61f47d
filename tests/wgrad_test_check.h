#pragma once
// The accumulate contract every weight-gradient kernel's GPU test checks
// (gpu_conv_wgrad_direct.cpp, gpu_conv_wgrad_window.cpp): dw and db accumulate onto their starting
// values, atomic and deterministic (two deterministic runs bitwise equal), and a null db is left
// alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "tests/conv_test_cases.h"
#include "tests/conv_test_check.h"
#include "tests/gemm_error_measure.h"

namespace cnn::conv_test {

// run(deterministic, with_db, dw, db): the kernel on pr, dw and db read back (db null on the
// device when !with_db). dw_ref/db_ref: the reference accumulated onto pr.dw0/pr.db0 over k
// products each. Checks both modes within tol (rel_to_max against typical(k)); returns the worst
// error seen.
using WgradRun = std::function<void(bool deterministic, bool with_db, std::vector<float>& dw,
                                    std::vector<float>& db)>;
inline double check_wgrad_contract(const WgradProblem& pr, const std::vector<float>& dw_ref,
                                   const std::vector<float>& db_ref, int64_t k, double tol,
                                   const WgradRun& run) {
  using test::rel_to_max;
  using test::typical;
  double worst = 0;
  for (bool det : {false, true}) {
    SCOPED_TRACE(det ? "deterministic" : "atomic");
    std::vector<float> dw, db;
    run(det, true, dw, db);
    const double e_dw = rel_to_max(dw, dw_ref, typical(k)),
                 e_db = rel_to_max(db, db_ref, typical(k));
    EXPECT_LE(e_dw, tol) << "dw";
    EXPECT_LE(e_db, tol) << "db";
    worst = std::max({worst, e_dw, e_db});
    if (det) {
      std::vector<float> dw2, db2;
      run(det, true, dw2, db2);
      EXPECT_TRUE(bitwise_equal(dw, dw2) && bitwise_equal(db, db2))
          << "deterministic weight gradient differs between two runs";
    }
    std::vector<float> dw_nodb, db_nodb;
    run(det, false, dw_nodb, db_nodb);
    EXPECT_LE(rel_to_max(dw_nodb, dw_ref, typical(k)), tol) << "dw without db";
    EXPECT_TRUE(bitwise_equal(db_nodb, pr.db0)) << "db was written although null";
  }
  return worst;
}

}  // namespace cnn::conv_test
