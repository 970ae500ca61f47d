// CPU reference for batch normalization: plain loops, statistics in double, one template for
// float and double.
#include <cmath>
#include <vector>

#include "kernels/norm/batchnorm.h"

namespace cnn {
namespace {

// The fused ReLU, as relu_forward_cpu: "not (v <= 0)" lets NaN through.
template <class T>
T relu_if(bool relu, T v) {
  return (relu && v <= T(0)) ? T(0) : v;
}

// dy[k] as the fused ReLU's backward leaves it (relu_backward_cpu): 0 where relu_y[k] is not > 0.
template <class T>
T masked(const T* dy, const T* relu_y, int64_t k) {
  return (relu_y && !(relu_y[k] > T(0))) ? T(0) : dy[k];
}

// The normalized value v, plus residual[k] (when given) rounded as the separate add pass would,
// then the fused ReLU.
template <class T>
T finished(T v, const T* residual, int64_t k, bool relu) {
  return relu_if(relu, residual ? T(v + residual[k]) : v);
}

template <class T>
void forward_train(const BatchNormShape& s, const T* x, const T* gamma, const T* beta,
                   const T* residual, T* y, bool relu, T* save_mean, T* save_invstd, double eps,
                   std::vector<double>* batch_var) {
  const int64_t m = s.count();
  batch_var->assign(size_t(s.c), 0.0);
  for (int c = 0; c < s.c; ++c) {
    double sum = 0;
    for (int n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < s.hw; ++i) sum += x[(int64_t(n) * s.c + c) * s.hw + i];
    const double mean = sum / double(m);
    double sq = 0;
    for (int n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < s.hw; ++i) {
        const double d = x[(int64_t(n) * s.c + c) * s.hw + i] - mean;
        sq += d * d;
      }
    const double var = sq / double(m);  // biased: what the batch is normalized with
    const double invstd = 1.0 / std::sqrt(var + eps);
    (*batch_var)[size_t(c)] = var;
    save_mean[c] = static_cast<T>(mean);
    save_invstd[c] = static_cast<T>(invstd);
    for (int n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < s.hw; ++i) {
        const int64_t k = (int64_t(n) * s.c + c) * s.hw + i;
        y[k] = finished(static_cast<T>((x[k] - mean) * invstd * double(gamma[c]) + double(beta[c])),
                        residual, k, relu);
      }
  }
}

template <class T>
void backward(const BatchNormShape& s, const T* x, const T* dy, const T* gamma, const T* mean,
              const T* invstd, T* dx, T* dgamma, T* dbeta, const T* relu_y) {
  const double m = double(s.count());
  for (int c = 0; c < s.c; ++c) {
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < s.hw; ++i) {
        const int64_t k = (int64_t(n) * s.c + c) * s.hw + i;
        const T g = masked(dy, relu_y, k);
        sum_dy += g;
        sum_dy_xhat += double(g) * (double(x[k]) - double(mean[c])) * double(invstd[c]);
      }
    dgamma[c] = static_cast<T>(double(dgamma[c]) + sum_dy_xhat);
    dbeta[c] = static_cast<T>(double(dbeta[c]) + sum_dy);
    if (!dx) continue;
    const double k_scale = double(gamma[c]) * double(invstd[c]) / m;
    for (int n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < s.hw; ++i) {
        const int64_t k = (int64_t(n) * s.c + c) * s.hw + i;
        const double xhat = (double(x[k]) - double(mean[c])) * double(invstd[c]);
        dx[k] = static_cast<T>(k_scale *
                               (m * double(masked(dy, relu_y, k)) - sum_dy - xhat * sum_dy_xhat));
      }
  }
}

}  // namespace

void batchnorm_forward_train_cpu(const BatchNormShape& s, const float* x, const float* gamma,
                                 const float* beta, float* y, float* save_mean, float* save_invstd,
                                 const BatchNormTrainArgs& a, bool relu, const float* residual) {
  std::vector<double> var;
  forward_train(s, x, gamma, beta, residual, y, relu, save_mean, save_invstd, a.eps, &var);
  const double m = double(s.count());
  for (int c = 0; c < s.c; ++c) {
    const double unbiased = var[size_t(c)] * m / (m - 1);
    if (a.running_mean)
      a.running_mean[c] = static_cast<float>((1.0 - a.momentum) * a.running_mean[c] +
                                             double(a.momentum) * save_mean[c]);
    if (a.running_var)
      a.running_var[c] =
          static_cast<float>((1.0 - a.momentum) * a.running_var[c] + a.momentum * unbiased);
  }
  if (a.num_batches) *a.num_batches += 1.0f;
}

void batchnorm_forward_train_cpu(const BatchNormShape& s, const double* x, const double* gamma,
                                 const double* beta, double* y, double* save_mean,
                                 double* save_invstd, double eps, bool relu) {
  std::vector<double> var;
  forward_train<double>(s, x, gamma, beta, nullptr, y, relu, save_mean, save_invstd, eps, &var);
}

void batchnorm_forward_eval_cpu(const BatchNormShape& s, const float* x, const float* gamma,
                                const float* beta, const float* running_mean,
                                const float* running_var, float eps, float* y, bool relu,
                                const float* residual) {
  for (int n = 0; n < s.n; ++n)
    for (int c = 0; c < s.c; ++c) {
      const double invstd = 1.0 / std::sqrt(double(running_var[c]) + double(eps));
      for (int64_t i = 0; i < s.hw; ++i) {
        const int64_t k = (int64_t(n) * s.c + c) * s.hw + i;
        y[k] = finished(
            static_cast<float>((double(x[k]) - running_mean[c]) * invstd * gamma[c] + beta[c]),
            residual, k, relu);
      }
    }
}

void batchnorm_backward_cpu(const BatchNormShape& s, const float* x, const float* dy,
                            const float* gamma, const float* save_mean, const float* save_invstd,
                            float* dx, float* dgamma, float* dbeta, const float* relu_y) {
  backward(s, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, relu_y);
}

void batchnorm_backward_cpu(const BatchNormShape& s, const double* x, const double* dy,
                            const double* gamma, const double* save_mean, const double* save_invstd,
                            double* dx, double* dgamma, double* dbeta, const double* relu_y) {
  backward(s, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, relu_y);
}

}  // namespace cnn
