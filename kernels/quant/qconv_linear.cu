// Int8 linear layers on CUDA cores, for the shapes whose tensor-core tile would be mostly empty:
// few columns (a classifier: N <= 16 of a 64-wide tile) or few rows (batch <= 8 of a 128-row
// tile, where the layer is bound by reading its weights once). The layer is the GEMM
// y = x (M, K) . w (N, K)^T of qconv_is_linear (x's row the image's H * W * CP bytes, w's row
// the output channel's KH * KW * CGP, the same order). Loads are 16-byte chunks (4-byte words
// where K or a pointer is not 16-byte aligned) multiplied with __dp4a into int32 sums, reduced
// with shuffles (integers: exact in any order), then the epilogue of qconv.h
// (qconv_epilogue.cuh).
//   few columns, K <= 2 KB (1 KB of 4-byte words) (qconv_linear_cols_regs): a warp a row, all
//     (up to 16) columns, two warps a block; each lane loads its x chunks and the weight chunks
//     of the same K positions straight into registers, every load of a pass issued before the
//     first dp4a, so the kernel is one or two round trips to L2, the dp4a, the butterfly below
//     and the epilogue (a classifier is a latency chain: LeNet's fc2 is 256 x 1024 x 10, one
//     pass)
//   few columns, larger K (qconv_linear_cols): a warp a row, all columns; the block's four
//     warps share the columns' weights, staged once per 2 KB slab of K in shared memory (a
//     round trip a slab where the register kernel would take one a 1 KB pass)
//   both few-column kernels end with each lane holding one (row, column) sum after 16 shuffles
//     (a transposing butterfly instead of 16 separate 5-step reductions)
//   few rows (qconv_linear_dp4a): a block of four warps 8 rows x 1 column; consecutive blocks
//     take consecutive columns, w read once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/quant/qconv_cuda.h"
#include "kernels/quant/qconv_epilogue.cuh"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kWarps = 4, kThreads = kWarps * 32;

__device__ __forceinline__ int32_t dot(int a, int b, int32_t acc) {
  return __dp4a(a, b, acc);
}
__device__ __forceinline__ int32_t dot(int4 a, int4 b, int32_t acc) {
  acc = __dp4a(a.x, b.x, acc);
  acc = __dp4a(a.y, b.y, acc);
  acc = __dp4a(a.z, b.z, acc);
  return __dp4a(a.w, b.w, acc);
}

template <class V>
__device__ __forceinline__ V zero();
template <>
__device__ __forceinline__ int zero<int>() {
  return 0;
}
template <>
__device__ __forceinline__ int4 zero<int4>() {
  return make_int4(0, 0, 0, 0);
}

struct LinearDims {
  int m, n;        // rows (images) and columns (output channels)
  int chunks;      // K / sizeof(V)
  int col_groups;  // ceil(n / kCols)
  int out_stride;  // y's row stride: OCP (int8) or OC (float)
};

// Thread mapping: block b owns rows [kRows (b / col_groups), +kRows) and columns
// [kCols (b % col_groups), +kCols) of y; thread t sums chunks t, t + 128, ... of K for all of
// them; after the reduction, thread t < kRows * kCols writes the output (row t / kCols, column
// t % kCols), and the writer of column OC - 1 of an int8 output also zeroes the row's padding
// channels OC..OCP-1.
template <class T, class V, int kRows, int kCols>
__global__ void __launch_bounds__(kThreads)
    qconv_linear_dp4a(LinearDims d, const int8_t* __restrict__ d_x, const int8_t* __restrict__ d_w,
                      const float* __restrict__ d_mult, const float* __restrict__ d_add, bool relu,
                      T* __restrict__ d_y) {
  ptx::griddep_enter();
  static_assert(kRows * kCols <= 32, "one lane a (row, column) in the epilogue");
  __shared__ int32_t red[kWarps][32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int m0 = int(blockIdx.x / unsigned(d.col_groups)) * kRows;
  const int o0 = int(blockIdx.x % unsigned(d.col_groups)) * kCols;
  const int rows = min(kRows, d.m - m0), cols = min(kCols, d.n - o0);
  const V* const xr = reinterpret_cast<const V*>(d_x) + int64_t(m0) * d.chunks;
  const V* const wr = reinterpret_cast<const V*>(d_w) + int64_t(o0) * d.chunks;
  // The epilogue's lane and its scale and offset, loaded now so that their latency hides behind
  // the reduction's.
  const int er = lane / kCols, ej = lane % kCols;
  const bool writer = warp == 0 && lane < kRows * kCols && er < rows && ej < cols;
  const int o = o0 + ej;
  const float mult = writer ? __ldg(d_mult + o) : 0.f, add = writer ? __ldg(d_add + o) : 0.f;

  int32_t acc[kRows][kCols];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int j = 0; j < kCols; ++j) acc[r][j] = 0;
  for (int c = tid; c < d.chunks; c += kThreads) {
    V xv[kRows], wv[kCols];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      xv[r] = r < rows ? __ldg(xr + int64_t(r) * d.chunks + c) : zero<V>();
#pragma unroll
    for (int j = 0; j < kCols; ++j)
      wv[j] = j < cols ? __ldg(wr + int64_t(j) * d.chunks + c) : zero<V>();
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int j = 0; j < kCols; ++j) acc[r][j] = dot(xv[r], wv[j], acc[r][j]);
  }

  // Lane r * kCols + j of each warp ends with the warp's sum of (r, j).
  int32_t mine = 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      if (r >= rows || j >= cols) continue;  // uniform over the block
      int32_t v = acc[r][j];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == r * kCols + j) mine = v;
    }
  red[warp][lane] = mine;
  __syncthreads();
  if (!writer) return;
  int32_t sum = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) sum += red[w][lane];
  const T v = qepilogue::value<T>(sum, mult, add, relu);
  T* const row = d_y + int64_t(m0 + er) * d.out_stride;
  row[o] = v;
  if constexpr (sizeof(T) == 1) {
    if (o == d.n - 1)
      for (int z = d.n; z < d.out_stride; ++z) row[z] = T(0);
  }
}

// The few-column kernel's shapes: a block of kColsWarps warps, a warp a row; the weights staged
// kColsSlab bytes of K at a time for all 16 columns (16 x 2 KB = 32 KB of shared memory).
constexpr int kColsWarps = 4, kColsThreads = kColsWarps * 32, kColsSlab = 2048;
// A thread's weight loads in flight at once while filling a slab: all of an int4 slab.
constexpr int kFillBatch = 16;
constexpr int kColsMax = kQLinearDp4aMaxCols;
static_assert(kColsMax == 16, "the butterfly below reduces 16 columns over 32 lanes");

struct ColsDims {
  int m, n;        // rows (images), columns (output channels, <= 16)
  int chunks;      // K / sizeof(V)
  int out_stride;  // y's row stride: OCP (int8) or OC (float)
};

// One step of the few-column kernel's transposing butterfly over the lanes at distance
// 2 kHalf: each lane keeps the half of its first 2 kHalf sums that its lane bit selects and
// adds its partner's copy of that half (compile-time indices keep the sums in registers).
template <int kHalf>
__device__ __forceinline__ void butterfly_step(int32_t (&acc)[kColsMax], int lane) {
  const bool upper = (lane & (2 * kHalf)) != 0;
#pragma unroll
  for (int j = 0; j < kHalf; ++j) {
    const int32_t send = upper ? acc[j] : acc[j + kHalf];
    const int32_t keep = upper ? acc[j + kHalf] : acc[j];
    acc[j] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * kHalf);
  }
}

// The column whose sum lane l holds after the butterfly: bitreverse4(l / 2) (odd lanes hold the
// same sums as their even partners).
__device__ __forceinline__ int butterfly_column(int lane) {
  return ((lane >> 4) & 1) * 8 + ((lane >> 3) & 1) * 4 + ((lane >> 2) & 1) * 2 + ((lane >> 1) & 1);
}

// The few-column kernels' end for a warp's row: the transposing butterfly (distances 16, 8, 4,
// 2, then 1 adds the pair), then even lanes apply the epilogue to their column (mult and add
// loaded by the caller, zero past N) and write it; columns N..OCP-1 of an int8 output are zero.
template <class T>
__device__ __forceinline__ void cols_finish(int32_t (&acc)[kColsMax], int lane, int n,
                                            int out_stride, float mult, float add, bool relu,
                                            T* __restrict__ out) {
  butterfly_step<8>(acc, lane);
  butterfly_step<4>(acc, lane);
  butterfly_step<2>(acc, lane);
  butterfly_step<1>(acc, lane);
  const int32_t sum = acc[0] + __shfl_xor_sync(0xffffffffu, acc[0], 1);
  if (lane & 1) return;
  const int col = butterfly_column(lane);
  if (col < n)
    out[col] = qepilogue::value<T>(sum, mult, add, relu);
  else if (col < out_stride)
    out[col] = T(0);
  if (lane == 0)
    for (int z = kColsMax; z < out_stride; ++z) out[z] = T(0);  // an OCP past 16
}

// The register kernel's shapes: two warps a block (LeNet's fc2, 256 rows, spreads over 128
// SMs), a lane kPerLane chunks of K a pass per column: up to 2 int4 (a pass of 1 KB; 4 x 16
// columns of int4 is past the 255 registers and spills) or 4 words (512 B).
constexpr int kRegsWarps = 2, kRegsThreads = kRegsWarps * 32, kRegsMaxPasses = 2;

// Thread mapping: block b owns rows [2 b, 2 b + 2), warp w row 2 b + w; lane l sums chunks
// c0 + l + 32 i (i < kPerLane) of each pass of 32 kPerLane chunks for all 16 columns (columns
// >= N and chunks past K load zeros). No shared memory, no barrier: the warps are independent,
// and a warp past M returns whole (the shuffles stay full-warp). ptxas -v (sm_90): 168 registers
// for <int4, 2> (room for 2 weight chunks of each of 16 columns and 2 of x), no spills.
template <class T, class V, int kPerLane>
__global__ void __launch_bounds__(kRegsThreads)
    qconv_linear_cols_regs(ColsDims d, const int8_t* __restrict__ d_x,
                           const int8_t* __restrict__ d_w, const float* __restrict__ d_mult,
                           const float* __restrict__ d_add, bool relu, T* __restrict__ d_y) {
  const int lane = int(threadIdx.x) & 31;
  const int row = int(blockIdx.x) * kRegsWarps + (int(threadIdx.x) >> 5);
  if (row >= d.m) return;
  // The epilogue's scale and offset first: their loads overlap the sums'.
  const int col = butterfly_column(lane);
  const bool col_ok = col < d.n && (lane & 1) == 0;
  const float mult = col_ok ? __ldg(d_mult + col) : 0.f, add = col_ok ? __ldg(d_add + col) : 0.f;
  const V* const xr = reinterpret_cast<const V*>(d_x) + int64_t(row) * d.chunks;
  const V* const wv = reinterpret_cast<const V*>(d_w);

  int32_t acc[kColsMax];
#pragma unroll
  for (int j = 0; j < kColsMax; ++j) acc[j] = 0;
  for (int c0 = 0; c0 < d.chunks; c0 += 32 * kPerLane) {
    V xv[kPerLane], wr[kPerLane][kColsMax];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = c0 + lane + 32 * i;
#pragma unroll
      for (int j = 0; j < kColsMax; ++j)
        wr[i][j] = c < d.chunks && j < d.n ? __ldg(wv + int64_t(j) * d.chunks + c) : zero<V>();
    }
    // Launched overlapped (QConvPath::overlap_launch), x is the output of the kernel before:
    // read only once that kernel has completed; the weights and the epilogue's scale above are
    // already in flight. A no-op otherwise.
    if (c0 == 0) ptx::griddep_wait();
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = c0 + lane + 32 * i;
      xv[i] = c < d.chunks ? ptx::ld_after_griddep(xr + c) : zero<V>();
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
#pragma unroll
      for (int j = 0; j < kColsMax; ++j)
        if (j < d.n) acc[j] = dot(xv[i], wr[i][j], acc[j]);
  }
  cols_finish<T>(acc, lane, d.n, d.out_stride, mult, add, relu, d_y + int64_t(row) * d.out_stride);
}

// Thread mapping: block b owns rows [4 b, 4 b + 4), warp w row 4 b + w; lane l sums chunks
// l, l + 32, ... of each slab of K for all 16 columns (columns >= N sum zeros); after the
// butterfly, even lane l holds column bitreverse4(l / 2)'s sum of its warp's row and writes it
// (columns N..OCP-1 of an int8 output as zero). ptxas -v (sm_90): 96 registers (118 with
// 4-byte words), no spills, 32 KB of shared memory.
template <class T, class V>
__global__ void __launch_bounds__(kColsThreads)
    qconv_linear_cols(ColsDims d, const int8_t* __restrict__ d_x, const int8_t* __restrict__ d_w,
                      const float* __restrict__ d_mult, const float* __restrict__ d_add, bool relu,
                      T* __restrict__ d_y) {
  constexpr int kSlabChunks = kColsSlab / int(sizeof(V));  // chunks of a column a slab
  constexpr int kPerLane = kSlabChunks / 32;
  __shared__ __align__(16) V ws[kColsMax][kSlabChunks];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int row = int(blockIdx.x) * kColsWarps + warp;
  const bool row_ok = row < d.m;
  const V* const xr = reinterpret_cast<const V*>(d_x) + int64_t(row_ok ? row : 0) * d.chunks;
  const V* const wv = reinterpret_cast<const V*>(d_w);

  int32_t acc[kColsMax];
#pragma unroll
  for (int j = 0; j < kColsMax; ++j) acc[j] = 0;
  ptx::griddep_wait();  // launched overlapped: x only after the kernel before (a no-op otherwise)
  for (int c0 = 0; c0 < d.chunks; c0 += kSlabChunks) {
    const int len = min(kSlabChunks, d.chunks - c0);
    // This lane's x chunks of the slab, loaded before the weights' barrier to overlap the two.
    V xv[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + 32 * i;
      xv[i] = zero<V>();
      if (row_ok && c < len) xv[i] = ptx::ld_after_griddep(xr + c0 + c);
    }
    __syncthreads();  // the previous slab's weights are no longer read
    // The slab's weights in batches of kFillBatch loads a thread, each batch's loads issued
    // before its stores (a load-store loop waits one L2 round trip an element).
    const int fill = d.n * len;
    for (int base = 0; base < fill; base += kColsThreads * kFillBatch) {
      V v[kFillBatch];
#pragma unroll
      for (int b = 0; b < kFillBatch; ++b) {
        const int idx = base + tid + b * kColsThreads, j = idx / len, c = idx - j * len;
        v[b] = idx < fill ? __ldg(wv + int64_t(j) * d.chunks + c0 + c) : zero<V>();
      }
#pragma unroll
      for (int b = 0; b < kFillBatch; ++b) {
        const int idx = base + tid + b * kColsThreads, j = idx / len, c = idx - j * len;
        if (idx < fill) ws[j][c] = v[b];
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + 32 * i;
#pragma unroll
      for (int j = 0; j < kColsMax; ++j)
        if (c < len && j < d.n) acc[j] = dot(xv[i], ws[j][c], acc[j]);
    }
  }

  if (!row_ok) return;  // after the last barrier: the whole warp leaves
  const int col = butterfly_column(lane);
  const bool col_ok = col < d.n && (lane & 1) == 0;
  const float mult = col_ok ? __ldg(d_mult + col) : 0.f, add = col_ok ? __ldg(d_add + col) : 0.f;
  cols_finish<T>(acc, lane, d.n, d.out_stride, mult, add, relu, d_y + int64_t(row) * d.out_stride);
}

// A few-column kernel's launch: plain, or (overlap) as a programmatic dependent of the kernel
// before it in the stream (QConvPath::overlap_launch; the kernels wait for it before reading x).
template <class T, class Kernel>
void launch_few_cols(Kernel kernel, unsigned blocks, unsigned threads, bool overlap,
                     const ColsDims& d, const int8_t* d_x, const int8_t* d_w, const QEpilogue& ep,
                     T* d_y, cudaStream_t stream, const char* name) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = overlap ? 1 : 0;
  CNN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, d, d_x, d_w, ep.mult, ep.add, ep.relu, d_y));
  CNN_LAUNCH_CHECK(name);
}

template <class T, class V, int kPerLane>
void launch_regs(unsigned blocks, const ColsDims& d, const int8_t* d_x, const int8_t* d_w,
                 const QEpilogue& ep, T* d_y, bool overlap, cudaStream_t stream) {
  launch_few_cols<T>(qconv_linear_cols_regs<T, V, kPerLane>, blocks, kRegsThreads, overlap, d, d_x,
                     d_w, ep, d_y, stream, "qconv_linear_cols_regs");
}

template <class T>
void launch_cols(const QConvShape& s, const int8_t* d_x, const int8_t* d_w, const QEpilogue& ep,
                 int out_stride, T* d_y, bool overlap, cudaStream_t stream) {
  const int64_t k = int64_t(s.h) * s.w * s.cp;
  const bool vec16 = k % 16 == 0 && reinterpret_cast<uintptr_t>(d_x) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(d_w) % 16 == 0;
  ColsDims d;
  d.m = s.n, d.n = s.oc, d.out_stride = out_stride;
  d.chunks = int(vec16 ? k / 16 : k / 4);
  // One pass of the register kernel takes up to 1 KB of int4 (LeNet's fc2) or 512 B of words.
  const int per_lane = ceil_div(d.chunks, 32);
  const int passes = vec16 ? ceil_div(per_lane, 2) : ceil_div(per_lane, 4);
  if (passes <= kRegsMaxPasses) {
    const unsigned blocks = unsigned(ceil_div(s.n, kRegsWarps));
    if (vec16) {
      if (per_lane <= 1)
        launch_regs<T, int4, 1>(blocks, d, d_x, d_w, ep, d_y, overlap, stream);
      else
        launch_regs<T, int4, 2>(blocks, d, d_x, d_w, ep, d_y, overlap, stream);
    } else {
      if (per_lane <= 1)
        launch_regs<T, int, 1>(blocks, d, d_x, d_w, ep, d_y, overlap, stream);
      else if (per_lane <= 2)
        launch_regs<T, int, 2>(blocks, d, d_x, d_w, ep, d_y, overlap, stream);
      else
        launch_regs<T, int, 4>(blocks, d, d_x, d_w, ep, d_y, overlap, stream);
    }
    return;
  }
  const unsigned blocks = unsigned(ceil_div(s.n, kColsWarps));
  if (vec16)
    launch_few_cols<T>(qconv_linear_cols<T, int4>, blocks, kColsThreads, overlap, d, d_x, d_w, ep,
                       d_y, stream, "qconv_linear_cols");
  else
    launch_few_cols<T>(qconv_linear_cols<T, int>, blocks, kColsThreads, overlap, d, d_x, d_w, ep,
                       d_y, stream, "qconv_linear_cols");
}

template <class T, int kRows, int kCols>
void launch_tile(const QConvShape& s, const int8_t* d_x, const int8_t* d_w, const QEpilogue& ep,
                 int out_stride, T* d_y, cudaStream_t stream) {
  const int64_t k = int64_t(s.h) * s.w * s.cp;
  const bool vec16 = k % 16 == 0 && reinterpret_cast<uintptr_t>(d_x) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(d_w) % 16 == 0;
  LinearDims d;
  d.m = s.n, d.n = s.oc, d.out_stride = out_stride;
  d.col_groups = ceil_div(s.oc, kCols);
  d.chunks = int(vec16 ? k / 16 : k / 4);
  const int64_t blocks = ceil_div<int64_t>(s.n, kRows) * d.col_groups;
  CNN_CHECK(blocks <= 0x7fffffff, "qconv linear: {} blocks exceed the grid limit", blocks);
  if (vec16)
    qconv_linear_dp4a<T, int4, kRows, kCols>
        <<<unsigned(blocks), kThreads, 0, stream>>>(d, d_x, d_w, ep.mult, ep.add, ep.relu, d_y);
  else
    qconv_linear_dp4a<T, int, kRows, kCols>
        <<<unsigned(blocks), kThreads, 0, stream>>>(d, d_x, d_w, ep.mult, ep.add, ep.relu, d_y);
  CNN_LAUNCH_CHECK("qconv_linear_dp4a");
}

template <class T>
void launch(const QConvShape& s, const int8_t* d_x, const int8_t* d_w, const QEpilogue& ep,
            int out_stride, T* d_y, bool overlap, cudaStream_t stream) {
  // Few columns: a warp a row, all columns (up to 16) at once; otherwise (few rows, or a shape
  // the caller forced here) all rows of a group of 8 for one column.
  if (s.oc <= kQLinearDp4aMaxCols)
    launch_cols<T>(s, d_x, d_w, ep, out_stride, d_y, overlap, stream);
  else
    launch_tile<T, kQLinearDp4aMaxRows, 1>(s, d_x, d_w, ep, out_stride, d_y, stream);
}

}  // namespace

void qconv_linear_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w,
                               const QEpilogue& ep, int8_t* d_y, cudaStream_t stream,
                               bool overlap_launch) {
  launch<int8_t>(s, d_x, d_w, ep, s.ocp, d_y, overlap_launch, stream);
}

void qconv_linear_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w,
                               const QEpilogue& ep, float* d_y, cudaStream_t stream,
                               bool overlap_launch) {
  launch<float>(s, d_x, d_w, ep, s.oc, d_y, overlap_launch, stream);
}

}  // namespace cnn
