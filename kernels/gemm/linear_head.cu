// The fused backward of a linear layer with few outputs (see linear_head.h). Per row i of the
// batch and column k of x, one thread reads x[i][k] once and uses it for both products: the
// weight gradient's dw[:, k] += dy[i][:] x[i][k] and the input gradient's
// dx[i][k] = dy[i][:] . w[:, k], with w[:, k] and the dw[:, k] partials held in registers.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/gemm/linear_head.h"
#include "kernels/gemm/linear_head_cuda.h"
#include "kernels/gemm/wgmma_ptx.cuh"  // wgmma::sm_count
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kThreads = 32 * kLinearHeadWarps;
constexpr int kRowGroup = 4;
static_assert(kLinearHeadColumns == 32, "a block's columns are the lanes of a warp");

// Thread mapping: block (bx, by) owns columns k = 32 bx + lane of x, dx and dw (block column 0
// also db) over the rows [by R, min(n, (by + 1) R)), R = rows_per_split; warp w takes the rows
// w, w + 8, ... of that range. Per row, lane o < out loads dy[i][o] and shuffles broadcast it
// to the other lanes; each thread adds dy[i][o] x[i][k] to its kOut dw partials and writes
// dx[i][k] = sum over o in order of dy[i][o] w[o][k] (0 where the mask applies and x <= 0, as
// relu_backward). kOut: out rounded up to a multiple of 4 (lanes past out load 0, so the extra
// terms add exact zeros). Then the 8 warps' partials of dw and db are added in warp order
// through shared memory, thread t owning (o, k) = (e / 32, 32 bx + e % 32) for e = t, t + 256,
// ...: with one row split (gridDim.y == 1) every output has that one owner and is accumulated
// with +=, bitwise repeatable; with several, each split's sum goes in by atomicAdd. With
// input_db, each thread also sums the dx it writes over its rows in order (rows w, w + 8, ...,
// as db_colsum sums a column) and lane c of warp 0 adds the 8 warps' sums in warp order into
// input_db[32 bx + c], owner or atomic as dw.
template <int kOut>
__global__ void __launch_bounds__(kThreads)
    linear_head_backward_kernel(int n, int in, int out, int rows_per_split,
                                const float* __restrict__ d_x, const float* __restrict__ d_dy,
                                const float* __restrict__ d_w, float* __restrict__ d_dw,
                                float* __restrict__ d_db, float* __restrict__ d_dx, bool mask,
                                float* __restrict__ d_input_db) {
  ptx::griddep_enter();
  __shared__ float part_dw[kLinearHeadWarps][kOut][32];  // 32 KB at kOut = 32
  __shared__ float part_db[kLinearHeadWarps][32];
  __shared__ float part_input_db[kLinearHeadWarps][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int k = blockIdx.x * 32 + lane;
  const bool col = k < in;
  const bool want_dx = d_dx != nullptr;

  float wk[kOut], acc[kOut];  // w[:, k] (0 past out, and unused without dx); dw[:, k] partials
#pragma unroll
  for (int o = 0; o < kOut; ++o) {
    acc[o] = 0.f;
    wk[o] = (want_dx && col && o < out) ? __ldg(d_w + int64_t(o) * in + k) : 0.f;
  }
  float db_acc = 0.f;        // lane o: db[o]'s partial
  float input_db_acc = 0.f;  // input_db[k]'s partial
  const int r0 = blockIdx.y * rows_per_split;
  const int r1 = static_cast<int>(min(int64_t(n), int64_t(r0) + rows_per_split));
  // Rows in groups of kRowGroup a warp: all their loads are issued before the first is used, so
  // that they wait on memory together. A row past the range loads zeros (exact zero terms).
  for (int i0 = r0 + warp; i0 < r1; i0 += kRowGroup * kLinearHeadWarps) {
    float g[kRowGroup], xv[kRowGroup];
#pragma unroll
    for (int u = 0; u < kRowGroup; ++u) {
      const int i = i0 + u * kLinearHeadWarps;
      g[u] = (i < r1 && lane < out) ? __ldg(d_dy + int64_t(i) * out + lane) : 0.f;
      xv[u] = (i < r1 && col) ? __ldg(d_x + int64_t(i) * in + k) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kRowGroup; ++u) {
      const int i = i0 + u * kLinearHeadWarps;
      db_acc += g[u];
      float s = 0.f;
#pragma unroll
      for (int o = 0; o < kOut; ++o) {
        const float go = __shfl_sync(0xffffffffu, g[u], o);
        acc[o] = fmaf(go, xv[u], acc[o]);
        s = fmaf(go, wk[o], s);
      }
      // The mask is relu_backward's (y > 0 ? dy : 0) with y = x: a NaN x masks, a NaN s passes.
      if (want_dx && col && i < r1) {
        const float v = (mask && !(xv[u] > 0.f)) ? 0.f : s;
        d_dx[int64_t(i) * in + k] = v;
        input_db_acc += v;
      }
    }
  }

#pragma unroll
  for (int o = 0; o < kOut; ++o) part_dw[warp][o][lane] = acc[o];
  part_db[warp][lane] = db_acc;
  part_input_db[warp][lane] = input_db_acc;
  __syncthreads();
  const bool atomic = gridDim.y > 1;
  for (int e = threadIdx.x; e < kOut * 32; e += kThreads) {
    const int o = e / 32, c = e % 32, kk = blockIdx.x * 32 + c;
    if (o >= out || kk >= in) continue;
    float sum = 0.f;
#pragma unroll
    for (int q = 0; q < kLinearHeadWarps; ++q) sum += part_dw[q][o][c];
    float* p = d_dw + int64_t(o) * in + kk;
    if (atomic)
      atomicAdd(p, sum);
    else
      *p += sum;
  }
  if (d_db && blockIdx.x == 0 && int(threadIdx.x) < out) {
    float sum = 0.f;
#pragma unroll
    for (int q = 0; q < kLinearHeadWarps; ++q) sum += part_db[q][threadIdx.x];
    if (atomic)
      atomicAdd(d_db + threadIdx.x, sum);
    else
      d_db[threadIdx.x] += sum;
  }
  if (d_input_db && warp == 0 && col) {
    float sum = 0.f;
#pragma unroll
    for (int q = 0; q < kLinearHeadWarps; ++q) sum += part_input_db[q][lane];
    if (atomic)
      atomicAdd(d_input_db + k, sum);
    else
      d_input_db[k] += sum;
  }
}

// The pointers of one call, as the kernel takes them.
struct HeadArgs {
  const float* x;   // (n, in)
  const float* dy;  // (n, out)
  const float* w;   // (out, in)
  float* dw;        // (out, in)
  float* db;        // (out) or null
  float* dx;        // (n, in) or null
  bool mask;
  float* input_db;  // (in) or null
};

template <int kOut>
void launch(const LinearShape& s, int rows_per_split, dim3 grid, const HeadArgs& a,
            cudaStream_t stream) {
  linear_head_backward_kernel<kOut><<<grid, kThreads, 0, stream>>>(
      s.n, s.in, s.out, rows_per_split, a.x, a.dy, a.w, a.dw, a.db, a.dx, a.mask, a.input_db);
  CNN_LAUNCH_CHECK("linear_head_backward_kernel");
}

}  // namespace

void linear_head_backward_cuda(const LinearShape& s, const float* d_x, const float* d_dy,
                               const float* d_w, float* d_dw, float* d_db, float* d_dx,
                               bool mask_input_relu, float* d_input_db, bool deterministic,
                               cudaStream_t stream, int row_splits) {
  CNN_CHECK(s.out >= 1 && s.out <= kLinearHeadMaxOut,
            "linear_head_backward: {} outputs; the fused kernel takes 1..{}", s.out,
            kLinearHeadMaxOut);
  CNN_CHECK(row_splits >= 0 && !(deterministic && row_splits > 1),
            "linear_head_backward: {} row splits; expected 0 (pick) or, deterministic, 1",
            row_splits);
  const int want = row_splits > 0
                       ? row_splits
                       : linear_head_pick_row_splits(s, deterministic, wgmma::sm_count());
  // Whole rounds of the 8 warps a split; the split count follows from that rounding.
  const int64_t round = kLinearHeadWarps;
  const int64_t rows = ceil_div<int64_t>(ceil_div<int64_t>(s.n, want), round) * round;
  const int64_t splits = ceil_div<int64_t>(s.n, rows);
  CNN_CHECK(splits <= 65535, "linear_head_backward: {} row splits (at most 65535)", splits);
  const dim3 grid(static_cast<unsigned>(ceil_div(s.in, kLinearHeadColumns)),
                  static_cast<unsigned>(splits));
  const int r = static_cast<int>(std::min<int64_t>(rows, s.n));
  const HeadArgs a{d_x, d_dy, d_w, d_dw, d_db, d_dx, mask_input_relu, d_input_db};
  switch (ceil_div(s.out, 4)) {
    case 1:
      return launch<4>(s, r, grid, a, stream);
    case 2:
      return launch<8>(s, r, grid, a, stream);
    case 3:
      return launch<12>(s, r, grid, a, stream);
    case 4:
      return launch<16>(s, r, grid, a, stream);
    case 5:
      return launch<20>(s, r, grid, a, stream);
    case 6:
      return launch<24>(s, r, grid, a, stream);
    case 7:
      return launch<28>(s, r, grid, a, stream);
    default:
      return launch<32>(s, r, grid, a, stream);
  }
}

}  // namespace cnn
