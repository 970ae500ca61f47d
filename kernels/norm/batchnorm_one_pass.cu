// BatchNorm training passes in one launch each (sm_90 thread-block clusters), for channels of at
// most kBnOnePassMaxValues values (batchnorm_one_pass_plan.h). The three-launch passes
// (batchnorm.cu) read x twice (the backward x and dy twice) and pay two more launches, which are
// most of a small layer's time (~2-3 us a launch in a graph replay against ~2 us of traffic for a
// 3.2 MB tensor). Here a cluster of R blocks owns channel c: each thread loads V of the channel's
// values ONCE into registers, the block sums them (per-thread double accumulators, then a fixed
// tree: shuffles down each warp, the warps' sums in warp order), every block of the cluster reads
// the R block sums through distributed shared memory and adds them in rank order 0..R-1 (the same
// order in every block: all hold the same statistics, and the result is bitwise repeatable;
// `deterministic` changes nothing), then writes y or dx from its registers. The cluster's rank-0
// block writes the channel's outputs (saved statistics, running buffers, dgamma / dbeta).
//
// The sums and the per-value arithmetic are those of the three-launch passes (batchnorm_math.cuh:
// the forward sums x - K and (x - K)^2 in double with K the channel's first value; the backward
// dy' and dy' * (x - mean) with dy' the fused-ReLU-masked dy), only added in another order, so
// the bits may differ from CNN_BN_ONE_PASS=0's within rounding of the double sums.
//
// Values are taken in groups of 4 consecutive values of the channel (value j of channel c is
// plane n = j / HW, offset j % HW). Where HW % 4 == 0 and the pointers are 16-byte aligned a
// group is one 16-byte load inside one plane; otherwise 4 scalar loads (a group may then span two
// planes). Both add the same groups in the same order: alignment changes the speed, never the
// bits.
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/common/ptx.cuh"
#include "kernels/norm/batchnorm_math.cuh"
#include "kernels/norm/batchnorm_one_pass_cuda.h"
#include "kernels/norm/batchnorm_one_pass_plan.h"
#include "runtime/cuda_check.h"

namespace cnn {
namespace {

using namespace bn;

constexpr int kThreads = kBnOnePassThreads;
constexpr int kPortableCluster = 8;
// Two blocks an SM at least (at most 128 registers a thread): a cluster of 16 then needs 8 SMs of
// one GPC, not 16 (an H200's GPCs have 16 to 18 enabled SMs, not every one 16 free).
constexpr int kMinBlocks = 2;

// Where a channel's values are: value j (0 <= j < M) of channel c sits at offset(j) from plane
// (0, c). M < 2^31 (the plan's limit), so indices are 32-bit and the division a FastDiv.
struct ChannelValues {
  int64_t hw = 1, plane_stride = 1;  // HW, C * HW (from plane (n, c) to (n + 1, c))
  int m = 0;                         // M = N * HW
  ptx::FastDiv by_hw;
  __device__ __forceinline__ int64_t offset(int j) const {
    const int n = by_hw.div(j);
    return int64_t(n) * plane_stride + (j - int64_t(n) * hw);
  }
};

// Value j of the channel at p, or `fill` past M. Branch-free: a value past M loads value 0
// instead (in bounds, cached) and is replaced, so that no lane of a warp skips a load and the
// warp reaches the barriers after it converged (compute-sanitizer's synccheck saw the warps of
// a cluster's last block, where some lanes are past M, arrive split). [[maybe_unused]]: only the
// sm_90 kernels read it.
[[maybe_unused]] __device__ __forceinline__ float load_value(const ChannelValues& cv,
                                                             const float* __restrict__ p, int j,
                                                             float fill) {
  const bool in = j < cv.m;
  const float v = __ldg(p + cv.offset(in ? j : 0));
  return in ? v : fill;
}

// Values j0 .. j0 + 3 of the channel at p, those past M set to `fill` (branch-free, as
// load_value). kVec: one 16-byte load (HW % 4 == 0, so M % 4 == 0 and a group is all in or all
// out, inside one plane).
template <bool kVec>
__device__ __forceinline__ float4 load_values(const ChannelValues& cv, const float* __restrict__ p,
                                              int j0, float fill) {
  if (kVec) {
    const bool in = j0 < cv.m;
    const float4 v = __ldg(reinterpret_cast<const float4*>(p + cv.offset(in ? j0 : 0)));
    return in ? v : make_float4(fill, fill, fill, fill);
  }
  return make_float4(load_value(cv, p, j0, fill), load_value(cv, p, j0 + 1, fill),
                     load_value(cv, p, j0 + 2, fill), load_value(cv, p, j0 + 3, fill));
}

template <bool kVec>
__device__ __forceinline__ void store_values(const ChannelValues& cv, float* __restrict__ p, int j0,
                                             float4 v) {
  if (kVec) {
    if (j0 < cv.m) *reinterpret_cast<float4*>(p + cv.offset(j0)) = v;
    return;
  }
  if (j0 < cv.m) p[cv.offset(j0)] = v.x;
  if (j0 + 1 < cv.m) p[cv.offset(j0 + 1)] = v.y;
  if (j0 + 2 < cv.m) p[cv.offset(j0 + 2)] = v.z;
  if (j0 + 3 < cv.m) p[cv.offset(j0 + 3)] = v.w;
}

// The first value of the thread's group u: block `rank` of the cluster owns the channel's
// values [rank * kGroups * 4 * kThreads, +kGroups * 4 * kThreads), round u of them the block's
// kThreads consecutive groups (coalesced).
template <int kGroups>
__device__ __forceinline__ int group_first(uint32_t rank, int u) {
  return 4 * ((int(rank) * kGroups + u) * kThreads + int(threadIdx.x));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The cluster's sums of (a, b): this block's by a fixed tree (shuffles down each warp, then the
// warps' sums in warp order), published in s_part, then every block's read back in rank order
// (the same bits in every block). Returns the sums to thread 0 (the other threads get
// meaningless values). Ends with the cluster's barrier still owed: the caller syncs once more
// before any block may leave (its s_part is read).
// The barriers here and after are the non-.aligned ones (ptx::*_divergent), which a warp may
// reach diverged: compute-sanitizer's synccheck saw warps arrive split at CUB's BlockReduce
// barriers in the one-group instances (__syncwarp() before them did not help); the loads are
// branch-free now too (load_values).
__device__ __forceinline__ double2 cluster_sums(double a, double b, double2* s_part) {
  __shared__ double2 s_warp[kThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_down_sync(0xffffffffu, a, o);
    b += __shfl_down_sync(0xffffffffu, b, o);
  }
  if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = make_double2(a, b);
  ptx::block_sync_divergent();
  if (threadIdx.x == 0) {
    double2 t = s_warp[0];
#pragma unroll
    for (int w = 1; w < kThreads / 32; ++w) {
      t.x += s_warp[w].x;
      t.y += s_warp[w].y;
    }
    *s_part = t;
  }
  ptx::cluster_sync_divergent();  // every block's s_part written
  double2 total = make_double2(0.0, 0.0);
  if (threadIdx.x == 0) {
    const uint32_t local = ptx::smem_u32(s_part), blocks = ptx::cluster_size();
    for (uint32_t r = 0; r < blocks; ++r) {
      const double2 p = ptx::ld_cluster_f64x2(ptx::map_rank(local, r));
      total.x += p.x;
      total.y += p.y;
    }
  }
  return total;
}
#endif

// Thread mapping: block (r, c) is rank r of channel c's cluster (R blocks along x); thread t holds
// the values of its kGroups groups (group_first) in registers (and the residual's, when given)
// from the load to the write of y. Rank 0 writes the channel's saved and running statistics, and
// channel 0's counts the batch.
template <int kGroups, bool kVec>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    bn_forward_one_pass(ChannelValues cv, float eps, float momentum, const float* __restrict__ d_x,
                        const float* __restrict__ d_res, const float* __restrict__ d_gamma,
                        const float* __restrict__ d_beta, bool relu, float* __restrict__ d_y,
                        float* __restrict__ d_mean, float* __restrict__ d_invstd,
                        float* __restrict__ d_running_mean, float* __restrict__ d_running_var,
                        float* __restrict__ d_num_batches) {
  ptx::griddep_enter();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ double2 s_part;
  __shared__ float s_coef[3];  // mean, scale = invstd * gamma, beta
  const int c = int(blockIdx.y);
  const uint32_t rank = ptx::cluster_rank();
  const int64_t first = int64_t(c) * cv.hw;  // plane (0, c)
  const float* __restrict__ x = d_x + first;
  // K: every block reads it before the first cluster barrier, and y is written after it, so y may
  // overwrite x.
  const float shift = __ldg(x);
  const bool add = d_res != nullptr;
  float4 v[kGroups], r[kGroups];
#pragma unroll
  for (int u = 0; u < kGroups; ++u) {
    const int j0 = group_first<kGroups>(rank, u);
    v[u] = load_values<kVec>(cv, x, j0, shift);  // past M: K, which adds 0
    r[u] = add ? load_values<kVec>(cv, d_res + first, j0, 0.f) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  double a = 0, b = 0;
#pragma unroll
  for (int u = 0; u < kGroups; ++u) {
    const float4 d = make_float4(v[u].x - shift, v[u].y - shift, v[u].z - shift, v[u].w - shift);
    a += (double(d.x) + double(d.y)) + (double(d.z) + double(d.w));
    b += (double(d.x) * double(d.x) + double(d.y) * double(d.y)) +
         (double(d.z) * double(d.z) + double(d.w) * double(d.w));
  }
  const double2 sums = cluster_sums(a, b, &s_part);
  if (threadIdx.x == 0) {
    const ForwardStats st = forward_stats(sums.x, sums.y, cv.m, shift, eps);
    s_coef[0] = float(st.mean);
    s_coef[1] = st.invstd * d_gamma[c];
    s_coef[2] = d_beta[c];
    if (rank == 0) {
      write_forward_stats(c, st, cv.m, momentum, d_mean, d_invstd, d_running_mean, d_running_var);
      if (c == 0 && d_num_batches) *d_num_batches += 1.0f;
    }
  }
  ptx::cluster_sync_divergent();  // s_coef filled; no block leaves while another reads s_part
  const float mean = s_coef[0], scale = s_coef[1], beta = s_coef[2];
#pragma unroll
  for (int u = 0; u < kGroups; ++u) {
    const float4 o = make_float4(normalized(v[u].x, mean, scale, beta, add, r[u].x, relu),
                                 normalized(v[u].y, mean, scale, beta, add, r[u].y, relu),
                                 normalized(v[u].z, mean, scale, beta, add, r[u].z, relu),
                                 normalized(v[u].w, mean, scale, beta, add, r[u].w, relu));
    store_values<kVec>(cv, d_y + first, group_first<kGroups>(rank, u), o);
  }
#endif
}

// Thread mapping as bn_forward_one_pass: thread t holds x and the masked dy' of its kGroups
// groups in registers from the load to the write of dx. Rank 0 accumulates the channel's dgamma
// and dbeta. d_dx null: the sums and the gradients of gamma and beta only.
template <int kGroups, bool kVec>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    bn_backward_one_pass(ChannelValues cv, const float* __restrict__ d_x,
                         const float* __restrict__ d_dy, ReluMask mask,
                         const float* __restrict__ d_gamma, const float* __restrict__ d_mean,
                         const float* __restrict__ d_invstd, float* __restrict__ d_dx,
                         float* __restrict__ d_dgamma, float* __restrict__ d_dbeta) {
  ptx::griddep_enter();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ double2 s_part;
  __shared__ float s_coef[3];  // dx's a, mdy, b
  const int c = int(blockIdx.y);
  const uint32_t rank = ptx::cluster_rank();
  const int64_t first = int64_t(c) * cv.hw;
  const float mean = d_mean[c];
  const float2 mc = mask_coefs(mask, c, d_gamma, d_invstd);
  float4 v[kGroups], e[kGroups];  // x; dy' (dy masked by the fused ReLU)
#pragma unroll
  for (int u = 0; u < kGroups; ++u) {
    const int j0 = group_first<kGroups>(rank, u);
    // Past M: x = mean and dy = 0, which add 0.
    v[u] = load_values<kVec>(cv, d_x + first, j0, mean);
    e[u] = load_values<kVec>(cv, d_dy + first, j0, 0.f);
    if (mask.y) {
      const float4 ry = load_values<kVec>(cv, mask.y + first, j0, 0.f);
      e[u] = make_float4(relu_masked(e[u].x, true, ry.x), relu_masked(e[u].y, true, ry.y),
                         relu_masked(e[u].z, true, ry.z), relu_masked(e[u].w, true, ry.w));
    } else if (mask.beta) {
      e[u] = make_float4(relu_masked(e[u].x, true, pre_relu(v[u].x - mean, mc)),
                         relu_masked(e[u].y, true, pre_relu(v[u].y - mean, mc)),
                         relu_masked(e[u].z, true, pre_relu(v[u].z - mean, mc)),
                         relu_masked(e[u].w, true, pre_relu(v[u].w - mean, mc)));
    }
  }
  double a = 0, b = 0;
#pragma unroll
  for (int u = 0; u < kGroups; ++u) {
    const float4 d = make_float4(v[u].x - mean, v[u].y - mean, v[u].z - mean, v[u].w - mean);
    a += (double(e[u].x) + double(e[u].y)) + (double(e[u].z) + double(e[u].w));
    b += (double(e[u].x) * double(d.x) + double(e[u].y) * double(d.y)) +
         (double(e[u].z) * double(d.z) + double(e[u].w) * double(d.w));
  }
  const double2 sums = cluster_sums(a, b, &s_part);
  if (threadIdx.x == 0) {
    const BackwardCoefs q = backward_coefs(sums.x, sums.y, cv.m, d_gamma[c], d_invstd[c]);
    s_coef[0] = float(q.a);
    s_coef[1] = float(q.mdy);
    s_coef[2] = float(q.b);
    if (rank == 0) {
      d_dgamma[c] += float(q.dgamma);
      d_dbeta[c] += float(sums.x);
    }
  }
  ptx::cluster_sync_divergent();  // s_coef filled; no block leaves while another reads s_part
  if (!d_dx) return;
  const float ca = s_coef[0], mdy = s_coef[1], cb = s_coef[2];
#pragma unroll
  for (int u = 0; u < kGroups; ++u) {
    // dy' is masked already: backward_value's own mask off gives the three-launch pass's floats.
    const float4 o = make_float4(backward_value(ca, mdy, cb, mean, v[u].x, e[u].x, false, 0.f),
                                 backward_value(ca, mdy, cb, mean, v[u].y, e[u].y, false, 0.f),
                                 backward_value(ca, mdy, cb, mean, v[u].z, e[u].z, false, 0.f),
                                 backward_value(ca, mdy, cb, mean, v[u].w, e[u].w, false, 0.f));
    store_values<kVec>(cv, d_dx + first, group_first<kGroups>(rank, u), o);
  }
#endif
}

// ---- launch -------------------------------------------------------------------------------------

using ForwardKernel = decltype(&bn_forward_one_pass<1, true>);
using BackwardKernel = decltype(&bn_backward_one_pass<1, true>);

// The instance for V values a thread (kBnOnePassPerThread: kGroups = V / 4).
ForwardKernel forward_kernel(int per_thread, bool vec) {
  switch (per_thread) {
    case 4:
      return vec ? bn_forward_one_pass<1, true> : bn_forward_one_pass<1, false>;
    case 8:
      return vec ? bn_forward_one_pass<2, true> : bn_forward_one_pass<2, false>;
    case 16:
      return vec ? bn_forward_one_pass<4, true> : bn_forward_one_pass<4, false>;
    default:
      return vec ? bn_forward_one_pass<8, true> : bn_forward_one_pass<8, false>;
  }
}

BackwardKernel backward_kernel(int per_thread, bool vec) {
  switch (per_thread) {
    case 4:
      return vec ? bn_backward_one_pass<1, true> : bn_backward_one_pass<1, false>;
    case 8:
      return vec ? bn_backward_one_pass<2, true> : bn_backward_one_pass<2, false>;
    case 16:
      return vec ? bn_backward_one_pass<4, true> : bn_backward_one_pass<4, false>;
    default:
      return vec ? bn_backward_one_pass<8, true> : bn_backward_one_pass<8, false>;
  }
}

// Whether the device runs `kernel` in clusters of r blocks: clusters at all (sm_90+, the kernel
// built for it), and one that fits (past the portable 8 blocks, with the non-portable attribute
// set here, a GPC must hold it). Kept per (kernel, device, r): a fact of the device and the binary,
// asked once (the occupancy query costs host time on every launch otherwise).
bool cluster_launchable(const void* kernel, int r) {
  int dev = 0;
  CNN_CUDA_CHECK(cudaGetDevice(&dev));
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, int>, bool> known;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(kernel, dev, r);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  int clusters = 0;
  CNN_CUDA_CHECK(cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, dev));
  bool ok = clusters != 0;
  // The kernel must come from sm_90+ code: built for an older architecture (its PTX run here) the
  // body is empty (the cluster functions are sm_90 only), and ptxVersion says so where
  // binaryVersion (the JIT's target) would not.
  cudaFuncAttributes fa{};
  ok = ok && cudaFuncGetAttributes(&fa, kernel) == cudaSuccess && fa.ptxVersion >= 90;
  if (ok && r > kPortableCluster)
    ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
         cudaSuccess;
  if (ok) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(r));
    cfg.blockDim = dim3(kThreads);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(r);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int active = 0;
    ok = cudaOccupancyMaxActiveClusters(&active, kernel, &cfg) == cudaSuccess && active > 0;
  }
  if (!ok) (void)cudaGetLastError();  // a refused query is an answer, not the next launch's error
  known.emplace(key, ok);
  return ok;
}

// Grid (R, C), clusters of (R, 1, 1): one cluster per channel.
template <class Kernel, class... Args>
void launch_clusters(Kernel kernel, const BatchNormOnePassPlan& plan, int channels,
                     cudaStream_t stream, const char* name, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(plan.cluster), unsigned(channels));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(plan.cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CNN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
  CNN_LAUNCH_CHECK(name);
}

bool aligned16(const void* p) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

ChannelValues channel_values(const BatchNormShape& s) {
  ChannelValues cv;
  cv.hw = s.hw;
  cv.plane_stride = int64_t(s.c) * s.hw;
  cv.m = int(s.count());
  cv.by_hw = ptx::FastDiv(int(s.hw));
  return cv;
}

}  // namespace

bool batchnorm_one_pass_available(const BatchNormShape& s) {
  const BatchNormOnePassPlan plan = plan_batchnorm_one_pass(s);
  if (!plan.fits) return false;
  for (bool vec : {false, true})
    if (!cluster_launchable(reinterpret_cast<const void*>(forward_kernel(plan.per_thread, vec)),
                            plan.cluster) ||
        !cluster_launchable(reinterpret_cast<const void*>(backward_kernel(plan.per_thread, vec)),
                            plan.cluster))
      return false;
  return true;
}

bool batchnorm_forward_one_pass_cuda(const BatchNormShape& s, const float* d_x,
                                     const float* d_gamma, const float* d_beta, float* d_y,
                                     bool relu, const float* d_residual, float* d_save_mean,
                                     float* d_save_invstd, const BatchNormTrainArgs& a,
                                     cudaStream_t stream) {
  const BatchNormOnePassPlan plan = plan_batchnorm_one_pass(s);
  if (!plan.fits) return false;
  const bool vec = s.hw % 4 == 0 && aligned16(d_x) && aligned16(d_residual) && aligned16(d_y);
  const ForwardKernel kernel = forward_kernel(plan.per_thread, vec);
  if (!cluster_launchable(reinterpret_cast<const void*>(kernel), plan.cluster)) return false;
  launch_clusters(kernel, plan, s.c, stream, "bn_forward_one_pass", channel_values(s), a.eps,
                  a.momentum, d_x, d_residual, d_gamma, d_beta, relu, d_y, d_save_mean,
                  d_save_invstd, a.running_mean, a.running_var, a.num_batches);
  return true;
}

bool batchnorm_backward_one_pass_cuda(const BatchNormShape& s, const float* d_x, const float* d_dy,
                                      const float* d_relu_y, const float* d_relu_beta,
                                      const float* d_gamma, const float* d_save_mean,
                                      const float* d_save_invstd, float* d_dx, float* d_dgamma,
                                      float* d_dbeta, cudaStream_t stream) {
  const BatchNormOnePassPlan plan = plan_batchnorm_one_pass(s);
  if (!plan.fits) return false;
  // With the forward's beta the mask is recomputed from x and relu_y is not read.
  ReluMask mask;
  if (d_relu_y && d_relu_beta)
    mask.beta = d_relu_beta;
  else
    mask.y = d_relu_y;
  const bool vec =
      s.hw % 4 == 0 && aligned16(d_x) && aligned16(d_dy) && aligned16(mask.y) && aligned16(d_dx);
  const BackwardKernel kernel = backward_kernel(plan.per_thread, vec);
  if (!cluster_launchable(reinterpret_cast<const void*>(kernel), plan.cluster)) return false;
  launch_clusters(kernel, plan, s.c, stream, "bn_backward_one_pass", channel_values(s), d_x, d_dy,
                  mask, d_gamma, d_save_mean, d_save_invstd, d_dx, d_dgamma, d_dbeta);
  return true;
}

}  // namespace cnn
