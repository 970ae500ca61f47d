// CPU reference for softmax cross-entropy: plain loops in double, one template for float and
// double outputs.
#include <cmath>
#include <limits>

#include "kernels/loss/softmax_xent.h"

namespace cnn {
namespace {

template <class T>
void forward_backward(const XentShape& s, const T* logits, const int32_t* labels, T* loss_rows,
                      int32_t* pred, T* dlogits, double grad_scale, double eps) {
  const double spread = eps / double(s.classes);  // every class's share of the smoothing
  for (int i = 0; i < s.n; ++i) {
    const T* l = logits + int64_t(i) * s.classes;  // (classes)
    int best = 0;
    for (int j = 1; j < s.classes; ++j)
      if (l[j] > l[best]) best = j;  // strictly greater: the first maximum wins
    const double mx = l[best];
    double sum = 0;
    for (int j = 0; j < s.classes; ++j) sum += std::exp(double(l[j]) - mx);
    const int label = labels[i];
    const bool valid = label >= 0 && label < s.classes;
    // log(sum) - (l[label] - max): the difference is exact, so large logits lose nothing.
    // Smoothing: -sum_j t_j (l_j - max - log(sum)) = log(sum) - (1 - eps)(l[label] - max)
    // - eps/K sum_j (l_j - max).
    double centered_sum = 0;
    if (eps > 0)
      for (int j = 0; j < s.classes; ++j) centered_sum += double(l[j]) - mx;
    loss_rows[i] = valid ? static_cast<T>(std::log(sum) - (1.0 - eps) * (double(l[label]) - mx) -
                                          spread * centered_sum)
                         : std::numeric_limits<T>::quiet_NaN();
    pred[i] = best;
    if (!dlogits) continue;
    T* d = dlogits + int64_t(i) * s.classes;
    for (int j = 0; j < s.classes; ++j) {
      const double p = std::exp(double(l[j]) - mx) / sum;
      d[j] = static_cast<T>((p - (j == label ? 1.0 - eps : 0.0) - spread) * grad_scale);
    }
  }
}

}  // namespace

void softmax_xent_cpu(const XentShape& s, const float* logits, const int32_t* labels,
                      float* loss_rows, int32_t* pred, float* dlogits, float grad_scale,
                      float label_smoothing) {
  forward_backward(s, logits, labels, loss_rows, pred, dlogits, grad_scale, label_smoothing);
}

void softmax_xent_cpu(const XentShape& s, const double* logits, const int32_t* labels,
                      double* loss_rows, int32_t* pred, double* dlogits, double grad_scale,
                      double label_smoothing) {
  forward_backward(s, logits, labels, loss_rows, pred, dlogits, grad_scale, label_smoothing);
}

void accumulate_metrics_cpu(int n, const float* loss_rows, const int32_t* pred,
                            const int32_t* labels, double* totals) {
  double loss = 0, correct = 0;
  for (int i = 0; i < n; ++i) {
    loss += loss_rows[i];
    correct += pred[i] == labels[i] ? 1.0 : 0.0;
  }
  totals[0] += loss;
  totals[1] += correct;
  totals[2] += n;
}

}  // namespace cnn
