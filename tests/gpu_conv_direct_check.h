#pragma once
// The GPU check that the dilated and grouped convolution tests share
// (gpu_conv2d_{dilated,grouped}_dense.cpp): the dense op on an extended shape (dilated or
// grouped, conv2d_*_runs_directly) under wgmma-nhwc, every pass it runs directly, against the
// double reference at FP32, TF32 and BF16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_grouped.h"
#include "kernels/conv/conv2d_grouped_dense.h"
#include "runtime/tensor.h"
#include "tests/grouped_conv_test_check.h"
#include "tests/nhwc_dispatch_rule.h"
#include "tests/test_util.h"

namespace cnn::grouped_test {

// The forward (bias included), the input gradient (a strided one only as wgmma-nhwc's phases,
// under CNN_WGMMA_NHWC_PHASES=1, and never dilated), the weight gradient accumulating onto a
// nonzero dw and db (deterministic mode too, bitwise the same twice) and, at BF16, both gradients
// on one copy of dy where conv2d_backward_shared takes the shape. `tag` names the case in failures.
inline void expect_direct_passes_match(const Conv2dGroupedShape& s, const std::string& tag) {
  const Conv2dShape d = conv2d_grouped_as_dense(s);
  ASSERT_EQ(d.oh(), s.oh());
  const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.oc * s.oh() * s.ow();
  const size_t nw = size_t(s.oc) * s.cg() * s.kh * s.kw;
  const Problem ref = make_problem(s);
  const double k_fwd = double(s.cg()) * s.kh * s.kw + 1, k_data = double(s.ocg()) * s.kh * s.kw;
  const double k_wgt = double(s.n) * s.oh() * s.ow();
  const bool data_direct = test::nhwc_dispatch_takes_input_gradient(d);
  Tensor d_x = test::to_device(ref.x), d_w = test::to_device(ref.w), d_b = test::to_device(ref.b),
         d_dy = test::to_device(ref.dy);
  Tensor d_y({int64_t(ny)}, Device::CUDA), d_dx({int64_t(nx)}, Device::CUDA);
  for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16}) {
    Exec ex;
    ex.device = Device::CUDA;
    ex.precision = p;
    const Algo a = Algo::WgmmaNhwc;
    const std::string what = tag + " " + precision_name(p);
    ASSERT_TRUE(conv2d_forward_runs_directly(d, a, ex)) << what;
    const size_t need = std::max({conv2d_forward_scratch_floats(d, a, ex),
                                  conv2d_backward_data_scratch_floats(d, a, ex),
                                  conv2d_backward_weight_scratch_floats(d, ex)});
    Tensor scratch({int64_t(std::max<size_t>(need, 1))}, Device::CUDA);
    test::poison_device(d_y.data(), ny);
    conv2d_forward(d, d_x.data(), d_w.data(), d_b.data(), d_y.data(), false, scratch.data(), a, ex);
    expect_within(test::to_host(d_y.data(), ny), ref.y, ref.y_abs, k_fwd, p, what + " forward");
    ASSERT_EQ(conv2d_backward_data_runs_directly(d, a, ex), data_direct) << what;
    if (data_direct) {
      test::poison_device(d_dx.data(), nx);
      conv2d_backward_data(d, d_dy.data(), d_w.data(), d_dx.data(), scratch.data(), a, ex);
      expect_within(test::to_host(d_dx.data(), nx), ref.dx, ref.dx_abs, k_data, p,
                    what + " input gradient");
    }
    for (bool deterministic : {false, true}) {
      Exec wx = ex;
      wx.deterministic = deterministic;
      const std::string wwhat = what + (deterministic ? " deterministic" : "");
      ASSERT_TRUE(conv2d_backward_weight_runs_directly(d, a, wx)) << wwhat;
      Tensor ws({int64_t(std::max<size_t>(conv2d_backward_weight_scratch_floats(d, wx), 1))},
                Device::CUDA);
      std::vector<float> first;
      for (int rep = 0; rep < (deterministic ? 2 : 1); ++rep) {
        Tensor d_dw = test::to_device(ref.dw0), d_db = test::to_device(ref.db0);
        conv2d_backward_weight(d, d_x.data(), d_dy.data(), d_dw.data(), d_db.data(), ws.data(), a,
                               wx);
        const std::vector<float> dw = test::to_host(d_dw.data(), nw);
        expect_within(dw, ref.dw, ref.dw_abs, k_wgt, p, wwhat + " weight gradient");
        expect_within(test::to_host(d_db.data(), s.oc), ref.db, ref.db_abs, k_wgt, p,
                      wwhat + " bias gradient");
        if (rep == 0)
          first = dw;
        else
          EXPECT_EQ(dw, first) << wwhat << ": deterministic mode not bitwise repeatable";
      }
    }
    if (p != Precision::BF16 || !data_direct) continue;
    Tensor d_dw = test::to_device(ref.dw0), d_db = test::to_device(ref.db0);
    test::poison_device(d_dx.data(), nx);
    if (conv2d_backward_shared(d, d_x.data(), d_dy.data(), d_w.data(), d_dw.data(), d_db.data(),
                               d_dx.data(), scratch.data(), a, a, ex)) {
      expect_within(test::to_host(d_dw.data(), nw), ref.dw, ref.dw_abs, k_wgt, p,
                    what + " shared weight gradient");
      expect_within(test::to_host(d_dx.data(), nx), ref.dx, ref.dx_abs, k_data, p,
                    what + " shared input gradient");
    }
  }
}

}  // namespace cnn::grouped_test
