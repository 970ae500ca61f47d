// Optimizer kernels over the one flat parameter buffer: a grid-stride loop per update rule that
// also zeroes the gradient (outside the kept ranges), a fixed-order two-stage sum of squares
// (gradient clipping) and a NaN/Inf watch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/cub.cuh>
#include <initializer_list>

#include "kernels/common/ptx.cuh"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"
#include "kernels/optimizer/optimizer_cuda.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

// The per-parameter rules, shared by the scalar and the 4-wide loops below. Every multiply-add
// is spelled out (fmaf, __fmul_rn, __fdiv_rn, __fadd_rn), so no instantiation is left to the
// compiler's choice of which products to contract: the 4-wide and scalar loops, and the kernels
// taking lr / step by value or from the device, give the same bits for every parameter.
struct SgdRule {
  SgdParams p;
  float grad_scale, lr;
  // Updates w and the momentum m of one parameter from its gradient g (no second moment).
  __device__ __forceinline__ void operator()(float& w, float g, float& m, float& /*v*/,
                                             bool decay) const {
    float d = __fmul_rn(g, grad_scale);
    if (p.weight_decay != 0.f && decay) d = fmaf(p.weight_decay, w, d);
    if (p.momentum != 0.f) {
      const float buf = fmaf(p.momentum, m, d);
      m = buf;
      d = p.nesterov ? fmaf(p.momentum, buf, d) : buf;
    }
    w = fmaf(-lr, d, w);
  }
};

struct AdamRule {
  AdamParams p;
  float grad_scale, lr, step_size, bc2_sqrt;
  __device__ __forceinline__ void operator()(float& w, float g, float& m, float& v,
                                             bool decay) const {
    float d = __fmul_rn(g, grad_scale);
    if (p.weight_decay != 0.f && decay) {
      if (p.decoupled)
        w = __fmul_rn(w, fmaf(-lr, p.weight_decay, 1.f));
      else
        d = fmaf(p.weight_decay, w, d);
    }
    m = fmaf(p.beta1, m, __fmul_rn(1.f - p.beta1, d));
    v = fmaf(p.beta2, v, __fmul_rn(__fmul_rn(1.f - p.beta2, d), d));
    const float denom = __fadd_rn(__fdiv_rn(sqrtf(v), bc2_sqrt), p.eps);
    w = fmaf(-step_size, __fdiv_rn(m, denom), w);
  }
};

// 4-wide path: w, g, m (and v) 16-byte aligned, the mask (if any) 4-byte aligned. The update is
// bandwidth-bound (6 or 8 floats moved per parameter); 16-byte accesses and one quad per thread
// take it from 72% of the HBM peak towards the copy rate.
__device__ __forceinline__ uchar4 load_mask4(const uint8_t* d_mask, int64_t q) {
  return d_mask ? reinterpret_cast<const uchar4*>(d_mask)[q] : make_uchar4(1, 1, 1, 1);
}

// Whether element i lies in one of kept's ranges (its gradient is not zeroed). The loops here
// and in kept_bits4 are unrolled over kMax with the uniform bound count, so the ranges are read
// straight from the kernel's parameters and the usual 0 or 1 ranges cost a compare or two.
__device__ __forceinline__ bool is_kept(const KeptGrads& kept, int64_t i) {
  bool in = false;
#pragma unroll
  for (int r = 0; r < KeptGrads::kMax; ++r) {
    if (r >= kept.count) break;
    in |= i >= kept.begin[r] && i < kept.end[r];
  }
  return in;
}

// Bit j (j < 4) set where element i + j lies in one of kept's ranges.
__device__ __forceinline__ unsigned kept_bits4(const KeptGrads& kept, int64_t i) {
  unsigned bits = 0;
#pragma unroll
  for (int r = 0; r < KeptGrads::kMax; ++r) {
    if (r >= kept.count) break;
    const int64_t lo = max(kept.begin[r] - i, int64_t(0)), hi = min(kept.end[r] - i, int64_t(4));
    if (lo < hi) bits |= (0xFu >> (4 - int(hi - lo))) << int(lo);
  }
  return bits;
}

// Thread mapping (both rules): with kVec, thread t owns quads q = t, t + stride, ... (parameters
// 4q .. 4q+3) and then, grid-stride again, the count % 4 parameters after the last quad; without
// it, parameters i = t, t + stride, .... Each applies the rule and zeroes the gradients it used,
// except those in kept's ranges, which it does not write at all (a quad that a range boundary
// cuts zeroes its other elements one by one).
// A null m or v (SGD without momentum; SGD has no v) reads as 0 and is not written.
template <bool kVec, class Rule>
__device__ __forceinline__ void update_params(int64_t count, float* __restrict__ d_w,
                                              float* __restrict__ d_g, float* __restrict__ d_m,
                                              float* __restrict__ d_v,
                                              const uint8_t* __restrict__ d_mask,
                                              const KeptGrads& kept, const Rule& rule) {
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t tail = 0;
  if constexpr (kVec) {
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    const int64_t quads = count / 4;
    auto* w4 = reinterpret_cast<float4*>(d_w);
    auto* g4 = reinterpret_cast<float4*>(d_g);
    auto* m4 = reinterpret_cast<float4*>(d_m);
    auto* v4 = reinterpret_cast<float4*>(d_v);
    for (int64_t q = tid; q < quads; q += stride) {
      float4 w = w4[q], m = d_m ? m4[q] : zero, v = d_v ? v4[q] : zero;
      const float4 g = g4[q];
      const uchar4 k = load_mask4(d_mask, q);
      rule(w.x, g.x, m.x, v.x, k.x);
      rule(w.y, g.y, m.y, v.y, k.y);
      rule(w.z, g.z, m.z, v.z, k.z);
      rule(w.w, g.w, m.w, v.w, k.w);
      w4[q] = w;
      if (d_m) m4[q] = m;
      if (d_v) v4[q] = v;
      const unsigned keep = kept_bits4(kept, 4 * q);
      if (keep == 0) {
        g4[q] = zero;
      } else if (keep != 0xFu) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (!((keep >> j) & 1u)) d_g[4 * q + j] = 0.f;
      }
    }
    tail = quads * 4;
  }
  for (int64_t i = tail + tid; i < count; i += stride) {
    float w = d_w[i], m = d_m ? d_m[i] : 0.f, v = d_v ? d_v[i] : 0.f;
    rule(w, d_g[i], m, v, !d_mask || d_mask[i]);
    d_w[i] = w;
    if (d_m) d_m[i] = m;
    if (d_v) d_v[i] = v;
    if (!is_kept(kept, i)) d_g[i] = 0.f;
  }
}

// torch.optim.SGD. The learning rate comes from *d_lr when set (a captured graph's step), else
// from p.
template <bool kVec>
__global__ void sgd_update_kernel(int64_t count, float* __restrict__ d_w, float* __restrict__ d_g,
                                  float* __restrict__ d_m, const uint8_t* __restrict__ d_mask,
                                  SgdParams p, float grad_scale, const float* __restrict__ d_lr,
                                  const __grid_constant__ KeptGrads kept) {
  ptx::griddep_enter();
  const SgdRule rule{p, grad_scale, d_lr ? *d_lr : p.lr};
  // Without momentum m is neither read nor written (the caller may pass none).
  update_params<kVec>(count, d_w, d_g, p.momentum != 0.f ? d_m : nullptr, nullptr, d_mask, kept,
                      rule);
}

// torch.optim.Adam / AdamW. kDeviceStep: lr and the step number come from
// *d_lr / *d_step (either may be null: p's value) when the kernel runs (a captured graph's step);
// thread 0 of each block derives step_size and bc2_sqrt from them in double, with the host
// path's expressions, and shares them through shared memory.
template <bool kVec, bool kDeviceStep>
__global__ void adam_update_kernel(int64_t count, float* __restrict__ d_w, float* __restrict__ d_g,
                                   float* __restrict__ d_m, float* __restrict__ d_v,
                                   const uint8_t* __restrict__ d_mask, AdamParams p,
                                   float step_size, float bc2_sqrt, float grad_scale,
                                   const float* __restrict__ d_lr,
                                   const int64_t* __restrict__ d_step,
                                   const __grid_constant__ KeptGrads kept) {
  ptx::griddep_enter();
  float lr = p.lr;
  if constexpr (kDeviceStep) {
    __shared__ float s_step[3];  // lr, step_size, bc2_sqrt
    if (threadIdx.x == 0) {
      const float l = d_lr ? *d_lr : p.lr;
      const double t = double(d_step ? *d_step : p.step);
      const double bc1 = 1.0 - pow(double(p.beta1), t);
      const double bc2 = 1.0 - pow(double(p.beta2), t);
      s_step[0] = l;
      s_step[1] = float(double(l) / bc1);
      s_step[2] = float(sqrt(bc2));
    }
    __syncthreads();
    lr = s_step[0];
    step_size = s_step[1];
    bc2_sqrt = s_step[2];
  }
  const AdamRule rule{p, grad_scale, lr, step_size, bc2_sqrt};
  update_params<kVec>(count, d_w, d_g, d_m, d_v, d_mask, kept, rule);
}

// Thread mapping: one thread advances the step counters (the last launch of a training step).
__global__ void advance_step_counters_single(StepCounters* __restrict__ d_c,
                                             const float* __restrict__ d_lr_table,
                                             int64_t table_len) {
  ptx::griddep_enter();
  const int64_t b = d_c->batch + 1;
  d_c->batch = b;
  d_c->update += 1;
  if (b >= 0 && b < table_len) d_c->lr = d_lr_table[b];
}

// Thread mapping: block b owns partial b; its thread t sums g[i]^2 for
// i = b*blockDim + t + r*gridDim*blockDim, r = 0, 1, ... in order; the block reduces in CUB's
// fixed tree into d_partials[b]. The grid size depends on the count alone, so the result is
// bitwise repeatable.
__global__ void __launch_bounds__(kSumSquaresThreads)
    sum_squares_partial(int64_t count, const float* __restrict__ d_g,
                        double* __restrict__ d_partials) {
  ptx::griddep_enter();
  using Reduce = cub::BlockReduce<double, kSumSquaresThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  double s = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const double x = d_g[i];
    s += x * x;
  }
  const double total = Reduce(tmp).Sum(s);
  if (threadIdx.x == 0) d_partials[blockIdx.x] = total;
}

// Thread mapping: a single block; thread t sums partials t, t+blockDim, ... in order, then the
// block reduces and thread 0 writes *d_out (0 for no partials).
__global__ void __launch_bounds__(kSumSquaresThreads)
    sum_squares_final(int64_t partials, const double* __restrict__ d_partials,
                      double* __restrict__ d_out) {
  ptx::griddep_enter();
  using Reduce = cub::BlockReduce<double, kSumSquaresThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  double s = 0;
  for (int64_t i = threadIdx.x; i < partials; i += kSumSquaresThreads) s += d_partials[i];
  const double total = Reduce(tmp).Sum(s);
  if (threadIdx.x == 0) *d_out = total;
}

// Thread mapping: each thread checks elements i = tid, tid + stride, ... (grid-stride); any that
// finds a NaN/Inf stores 1 (all writers store the same value, so the race is harmless).
__global__ void find_nonfinite_naive(int64_t count, const float* __restrict__ d_x,
                                     int32_t* __restrict__ d_flag) {
  ptx::griddep_enter();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  bool bad = false;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    bad |= !isfinite(d_x[i]);
  if (bad) *d_flag = 1;
}

unsigned grid_for(int64_t work) {
  return static_cast<unsigned>(
      std::clamp<int64_t>(ceil_div<int64_t>(work, kThreads), 1, kMaxBlocks));
}

bool aligned(const void* p, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// The 4-wide kernels need 16-byte aligned float arrays (and a 4-byte aligned mask); a parameter
// buffer from cudaMalloc is, a caller's sub-range may not be.
bool vec_ok(std::initializer_list<const float*> fs, const uint8_t* d_mask) {
  for (const float* f : fs)
    if (!aligned(f, 16)) return false;
  return aligned(d_mask, 4);
}

// Threads for the 4-wide path: one per quad plus the tail.
int64_t vec_work(int64_t count) {
  return count / 4 + count % 4;
}

}  // namespace

void sgd_update_cuda(int64_t count, float* d_w, float* d_g, float* d_m, const uint8_t* d_mask,
                     const SgdParams& p, float grad_scale, const float* d_lr, const KeptGrads& kept,
                     cudaStream_t stream) {
  if (vec_ok({d_w, d_g, d_m}, d_mask)) {
    sgd_update_kernel<true><<<grid_for(vec_work(count)), kThreads, 0, stream>>>(
        count, d_w, d_g, d_m, d_mask, p, grad_scale, d_lr, kept);
  } else {
    sgd_update_kernel<false><<<grid_for(count), kThreads, 0, stream>>>(count, d_w, d_g, d_m, d_mask,
                                                                       p, grad_scale, d_lr, kept);
  }
  CNN_LAUNCH_CHECK("sgd_update_kernel");
}

namespace {

template <bool kDeviceStep>
void launch_adam(int64_t count, float* d_w, float* d_g, float* d_m, float* d_v,
                 const uint8_t* d_mask, const AdamParams& p, float step_size, float bc2_sqrt,
                 float grad_scale, const float* d_lr, const int64_t* d_step, const KeptGrads& kept,
                 cudaStream_t stream) {
  if (vec_ok({d_w, d_g, d_m, d_v}, d_mask)) {
    adam_update_kernel<true, kDeviceStep><<<grid_for(vec_work(count)), kThreads, 0, stream>>>(
        count, d_w, d_g, d_m, d_v, d_mask, p, step_size, bc2_sqrt, grad_scale, d_lr, d_step, kept);
  } else {
    adam_update_kernel<false, kDeviceStep><<<grid_for(count), kThreads, 0, stream>>>(
        count, d_w, d_g, d_m, d_v, d_mask, p, step_size, bc2_sqrt, grad_scale, d_lr, d_step, kept);
  }
  CNN_LAUNCH_CHECK("adam_update_kernel");
}

}  // namespace

void adam_update_cuda(int64_t count, float* d_w, float* d_g, float* d_m, float* d_v,
                      const uint8_t* d_mask, const AdamParams& p, float step_size, float bc2_sqrt,
                      float grad_scale, const KeptGrads& kept, cudaStream_t stream) {
  launch_adam<false>(count, d_w, d_g, d_m, d_v, d_mask, p, step_size, bc2_sqrt, grad_scale, nullptr,
                     nullptr, kept, stream);
}

void adam_update_device_step_cuda(int64_t count, float* d_w, float* d_g, float* d_m, float* d_v,
                                  const uint8_t* d_mask, const AdamParams& p, float grad_scale,
                                  const float* d_lr, const int64_t* d_step, const KeptGrads& kept,
                                  cudaStream_t stream) {
  launch_adam<true>(count, d_w, d_g, d_m, d_v, d_mask, p, 0.f, 1.f, grad_scale, d_lr, d_step, kept,
                    stream);
}

void advance_step_counters_cuda(StepCounters* d_counters, const float* d_lr_table,
                                int64_t table_len, cudaStream_t stream) {
  advance_step_counters_single<<<1, 1, 0, stream>>>(d_counters, d_lr_table, table_len);
  CNN_LAUNCH_CHECK("advance_step_counters_single");
}

void sum_squares_cuda(int64_t count, const float* d_g, double* d_out, double* d_scratch,
                      cudaStream_t stream) {
  const int64_t partials = sum_squares_scratch_doubles(count);  // scratch: (partials) doubles
  if (partials > 0) {
    sum_squares_partial<<<unsigned(partials), kSumSquaresThreads, 0, stream>>>(count, d_g,
                                                                               d_scratch);
    CNN_LAUNCH_CHECK("sum_squares_partial");
  }
  sum_squares_final<<<1, kSumSquaresThreads, 0, stream>>>(partials, d_scratch, d_out);
  CNN_LAUNCH_CHECK("sum_squares_final");
}

void find_nonfinite_cuda(int64_t count, const float* d_x, int32_t* d_flag, cudaStream_t stream) {
  find_nonfinite_naive<<<grid_for(count), kThreads, 0, stream>>>(count, d_x, d_flag);
  CNN_LAUNCH_CHECK("find_nonfinite_naive");
}

}  // namespace cnn
