#pragma once
// The per-value and per-channel arithmetic of the CUDA BatchNorm training passes, shared by the
// two-launch kernels (batchnorm.cu) and the one-launch cluster kernels (batchnorm_one_pass.cu):
// one copy, so that both paths run the same float operations on a value once its channel's sums
// are known (the sums themselves are added in different orders, so their bits may differ).
#include <cuda_runtime.h>

#include <cstdint>

namespace cnn::bn {

// The fused ReLU's forward, as relu_forward: "not (v <= 0)" lets NaN through.
__device__ __forceinline__ float relu_if(bool relu, float v) {
  return (relu && v <= 0.f) ? 0.f : v;
}

// dy as the fused ReLU's backward leaves it (relu_backward): 0 where relu_y is not > 0.
__device__ __forceinline__ float relu_masked(float dy, bool masked, float relu_y) {
  return (masked && !(relu_y > 0.f)) ? 0.f : dy;
}

// Where the backward's fused-ReLU mask comes from (batchnorm.h): nothing (no ReLU); the
// forward's output y, read; or, with beta, recomputed from the x the passes read anyway: the
// forward's pre-ReLU value (x - mean) * scale + beta, scale = invstd * gamma, in the forward's
// own float operations, is > 0 exactly where y is.
struct ReluMask {
  const float* y = nullptr;
  const float* beta = nullptr;  // set: recompute (the pass has gamma and the saved statistics)
  __device__ __forceinline__ bool on() const { return y != nullptr || beta != nullptr; }
};

// Channel c's recompute coefficients (scale, beta); zeros where the mask is read or absent.
__device__ __forceinline__ float2 mask_coefs(const ReluMask& m, int c,
                                             const float* __restrict__ d_gamma,
                                             const float* __restrict__ d_invstd) {
  return m.beta ? make_float2(d_invstd[c] * d_gamma[c], m.beta[c]) : make_float2(0.f, 0.f);
}

// The forward's pre-ReLU value from x - mean (normalized() without the ReLU): its sign is the mask.
__device__ __forceinline__ float pre_relu(float x_minus_mean, float2 coefs) {
  return __fmaf_rn(x_minus_mean, coefs.x, coefs.y);
}

// A channel's forward statistics from its shifted sums: mean, the biased variance, and what the
// normalize pass multiplies by (1 / sqrt(var + eps), rounded to float as d_save_invstd holds it).
struct ForwardStats {
  double mean, var;
  float invstd;
};

__device__ __forceinline__ ForwardStats forward_stats(double sum, double sq, int64_t m,
                                                      double shift, float eps) {
  ForwardStats st;
  const double shifted_mean = sum / double(m);                       // mean of x - K
  st.var = fmax(sq / double(m) - shifted_mean * shifted_mean, 0.0);  // biased
  st.mean = shift + shifted_mean;
  st.invstd = float(1.0 / sqrt(st.var + double(eps)));
  return st;
}

// Channel c's forward outputs: the saved statistics, the running statistics moved towards the
// batch's mean and unbiased variance.
__device__ __forceinline__ void write_forward_stats(int c, const ForwardStats& st, int64_t m,
                                                    float momentum, float* __restrict__ d_mean,
                                                    float* __restrict__ d_invstd,
                                                    float* __restrict__ d_running_mean,
                                                    float* __restrict__ d_running_var) {
  d_mean[c] = float(st.mean);
  d_invstd[c] = st.invstd;
  const double unbiased = st.var * double(m) / double(m - 1);
  if (d_running_mean)
    d_running_mean[c] = float((1.0 - momentum) * d_running_mean[c] + double(momentum) * st.mean);
  if (d_running_var)
    d_running_var[c] = float((1.0 - momentum) * d_running_var[c] + double(momentum) * unbiased);
}

// A channel's backward sums turned into dx's coefficients (dx = a * (dy - mdy - (x - mean) * b))
// and its dgamma term.
struct BackwardCoefs {
  double a, mdy, b, dgamma;
};

__device__ __forceinline__ BackwardCoefs backward_coefs(double sum_dy, double sum_dy_xmu, int64_t m,
                                                        float gamma, float invstd_f) {
  BackwardCoefs k;
  const double invstd = invstd_f;
  k.dgamma = sum_dy_xmu * invstd;       // sum of dy * xhat
  k.a = double(gamma) * invstd;         // gamma * invstd
  k.mdy = sum_dy / double(m);           // mean of dy
  k.b = invstd * k.dgamma / double(m);  // xhat's coefficient, per (x - mean)
  return k;
}

// (x - mean) * scale + beta with one rounding (the FMA the compiler would contract it to, spelled
// out so that the 16-byte and scalar paths cannot differ), plus the residual in a rounding of its
// own (as the separate add pass), then the fused ReLU.
__device__ __forceinline__ float normalized(float x, float mean, float scale, float beta, bool add,
                                            float residual, bool relu) {
  const float v = __fmaf_rn(x - mean, scale, beta);
  return relu_if(relu, add ? __fadd_rn(v, residual) : v);
}

// dx = a * (dy - mean(dy) - (x - mean) * b), the product (x - mean) * b fused into the
// subtraction (one FMA, spelled out as in normalized()).
__device__ __forceinline__ float backward_value(float a, float mdy, float b, float mean, float x,
                                                float dy, bool masked, float relu_y) {
  return __fmul_rn(a, __fmaf_rn(-(x - mean), b, relu_masked(dy, masked, relu_y) - mdy));
}

}  // namespace cnn::bn
