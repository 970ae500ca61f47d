// The fused classifier's checks and dispatch: the CPU twin is the two layers one after the other.
#include "kernels/quant/qconv_fused_classifier.h"

#include "kernels/quant/qconv_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {

bool qconv_classifier_fusable(const QConvShape& s1, const QConvShape& s2) {
  return qconv_is_linear(s1) && qconv_is_linear(s2) && s2.n == s1.n && s2.h == 1 && s2.w == 1 &&
         s2.c == s1.oc && s2.cp == s1.ocp && s2.oc <= kQLinearDp4aMaxCols;
}

int64_t qconv_classifier_acc_size(int rows, int classes) {
  return int64_t(rows) * classes;
}

int64_t qconv_classifier_arrivals_size(int rows) {
  // One counter a row tile of the smallest linear tile (64 rows).
  return (int64_t(rows) + 63) / 64;
}

void qconv_linear_classifier_forward(const QConvShape& s1, const int8_t* x, const int8_t* w1,
                                     const int8_t* w1_igemm, const QEpilogue& ep1, int8_t* y1,
                                     const QClassifierFusion& cls, const Exec& ex, QIgemmTile tile,
                                     int splits) {
  const QConvShape& s2 = cls.shape;
  check_qconv_shape(s1);
  check_qconv_shape(s2);
  CNN_CHECK(qconv_classifier_fusable(s1, s2),
            "qconv_linear_classifier_forward: the classifier ({} -> {} at batch {}) does not "
            "read the linear layer ({} -> {} at batch {}) or has more than {} outputs",
            s2.c, s2.oc, s2.n, s1.h * s1.w * s1.c, s1.oc, s1.n, kQLinearDp4aMaxCols);
  CNN_CHECK(x && w1 && y1 && ep1.mult && ep1.add && cls.w && cls.ep.mult && cls.ep.add && cls.y,
            "qconv_linear_classifier_forward: null pointer");
  if (ex.device == Device::CPU) {
    qconv_forward_cpu(s1, x, w1, ep1, y1);
    qconv_forward_float_cpu(s2, y1, cls.w, cls.ep, cls.y);
    return;
  }
  CNN_CHECK(w1_igemm && cls.acc && cls.arrivals,
            "qconv_linear_classifier_forward: CUDA needs the repacked weights and the "
            "accumulator and arrival buffers, got {} {} {}",
            w1_igemm ? "weights" : "no weights", cls.acc ? "acc" : "no acc",
            cls.arrivals ? "arrivals" : "no arrivals");
  CNN_CHECK(splits == 0 || splits == 1 || splits == 2 || splits == 4 || splits == 8,
            "qconv_linear_classifier_forward: splits={} (expected 0 for the rule, 1, 2, 4 or 8)",
            splits);
  CNN_CUDA_BRANCH("qconv_linear_classifier_forward", {
    qconv_linear_classifier_forward_cuda(s1, x, w1_igemm, ep1, y1, cls, tile, splits, ex.stream);
  });
}

}  // namespace cnn
