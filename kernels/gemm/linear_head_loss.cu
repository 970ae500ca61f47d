// The fused training tail of a classifier head (see linear_head_loss.h): a block's warps compute
// its rows' logits, each row's loss and dlogits in one warp (lane o: class o), then the block
// runs the backward of those rows column by column.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/gemm/linear_head.h"
#include "kernels/gemm/linear_head_cuda.h"
#include "kernels/gemm/linear_head_loss.h"
#include "kernels/gemm/linear_head_loss_cuda.h"
#include "kernels/loss/softmax_xent_row.cuh"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;

// The pointers and sizes of one call, as the kernel takes them.
struct Params {
  int n, in, out, rows;   // rows: a block's rows
  const float* x;         // (n, in)
  const float* w;         // (out, in)
  const float* b;         // (out) or null
  float* y;               // (n, out)
  const int32_t* labels;  // (n)
  float* loss_rows;       // (n)
  int32_t* pred;          // (n)
  float* dy;              // (n, out)
  float grad_scale, eps;  // dlogits' scale, label smoothing
  float* dw;              // (out, in)
  float* db;              // (out) or null
  float* dx;              // (n, in) or null
  bool mask;              // dx masked by the ReLU whose output x is
  float* input_db;        // (in) or null
};

// Thread mapping: block b owns the rows [b R, min(n, (b + 1) R)), R = p.rows. Forward and loss:
// warp w takes the rows w, w + 8, ... of them; lane l sums x[i][k] w[o][k] over k = l, l + 32, ...
// for every o, a butterfly gives every lane the sums, and lane o keeps logit o (+ b[o]) and
// writes y[i][o]; the warp then runs softmax_xent's row (lane o: class o) and lane o writes
// dy[i][o], also kept in shared memory (0 past out). Backward (kBackward, after a barrier):
// thread t owns the columns k = t, t + 256, ... of x, dx and dw (and of input_db), and for each
// walks the block's rows in order: dw[:, k] partials += dy[i][:] x[i][k], dx[i][k] = sum over o in
// order of dy[i][o] w[o][k] (0 where the mask applies and x <= 0, as relu_backward), input_db[k]
// partial += that dx; thread o < out sums db[o] over the rows in order. With one block every
// output has that one owner and is accumulated with +=, bitwise repeatable; with several, each
// block's sums go in by atomicAdd. kOut: out rounded up to a multiple of 4 (the extra terms are
// exact zeros).
template <int kOut, bool kBackward>
__global__ void __launch_bounds__(kThreads)
    linear_head_loss_kernel(const __grid_constant__ Params p) {
  ptx::griddep_enter();
  __shared__ xent::WarpStorage tmp[kWarps];
  __shared__ __align__(16) float s_dy[kBackward ? kLinearHeadLossMaxRows : 1][kOut];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int r0 = blockIdx.x * p.rows;
  const int rows = min(p.rows, p.n - r0);

  for (int r = warp; r < rows; r += kWarps) {  // whole warps: the warp collectives stay complete
    const int64_t i = int64_t(r0) + r;
    const float* xi = p.x + i * p.in;  // (in)
    float acc[kOut];
#pragma unroll
    for (int o = 0; o < kOut; ++o) acc[o] = 0.f;
#pragma unroll 2
    for (int k = lane; k < p.in; k += 32) {
      const float xv = __ldg(xi + k);
#pragma unroll
      for (int o = 0; o < kOut; ++o)
        if (o < p.out) acc[o] = fmaf(xv, __ldg(p.w + int64_t(o) * p.in + k), acc[o]);
    }
    float v = 0.f;  // lane o: logit o
#pragma unroll
    for (int o = 0; o < kOut; ++o) {
#pragma unroll
      for (int off = 16; off > 0; off /= 2) acc[o] += __shfl_xor_sync(0xffffffffu, acc[o], off);
      if (lane == o) v = acc[o];
    }
    if (lane < p.out) {
      if (p.b) v += __ldg(p.b + lane);
      p.y[i * p.out + lane] = v;
    }
    const int label = __ldg(p.labels + i);
    const bool valid = label >= 0 && label < p.out;
    const float at_label = __shfl_sync(0xffffffffu, v, valid ? label : 0);
    float g = 0.f;  // lane o: dy[i][o]
    xent::softmax_xent_row(
        tmp[warp], lane, p.out, [&](int) { return v; }, [&] { return valid ? at_label : 0.f; },
        label, p.eps, p.grad_scale, p.loss_rows + i, p.pred + i, true,
        [&](int, float gj) { g = gj; });
    if (lane < p.out) p.dy[i * p.out + lane] = g;
    if (kBackward && lane < kOut) s_dy[kBackward ? r : 0][lane] = g;
    __syncwarp();  // tmp[warp] is reused by the next row
  }
  if constexpr (!kBackward) return;

  __syncthreads();
  const bool atomic = gridDim.x > 1;
  const bool want_dx = p.dx != nullptr;
  for (int k = threadIdx.x; k < p.in; k += kThreads) {
    float wk[kOut], acc[kOut];  // w[:, k] (0 past out, and unused without dx); dw[:, k] partials
#pragma unroll
    for (int o = 0; o < kOut; ++o) {
      acc[o] = 0.f;
      wk[o] = (want_dx && o < p.out) ? __ldg(p.w + int64_t(o) * p.in + k) : 0.f;
    }
    float input_db_acc = 0.f;
#pragma unroll 4
    for (int r = 0; r < rows; ++r) {
      const int64_t i = int64_t(r0) + r;
      const float xv = __ldg(p.x + i * p.in + k);
      float s = 0.f;
#pragma unroll
      for (int o = 0; o < kOut; ++o) {
        const float go = s_dy[r][o];
        acc[o] = fmaf(go, xv, acc[o]);
        s = fmaf(go, wk[o], s);
      }
      if (want_dx) {
        // The mask is relu_backward's (y > 0 ? dy : 0) with y = x: a NaN x masks, a NaN s passes.
        const float v = (p.mask && !(xv > 0.f)) ? 0.f : s;
        p.dx[i * p.in + k] = v;
        input_db_acc += v;
      }
    }
#pragma unroll
    for (int o = 0; o < kOut; ++o) {
      if (o >= p.out) continue;
      float* q = p.dw + int64_t(o) * p.in + k;
      if (atomic)
        atomicAdd(q, acc[o]);
      else
        *q += acc[o];
    }
    if (p.input_db) {
      if (atomic)
        atomicAdd(p.input_db + k, input_db_acc);
      else
        p.input_db[k] += input_db_acc;
    }
  }
  if (p.db && int(threadIdx.x) < p.out) {
    float sum = 0.f;
    for (int r = 0; r < rows; ++r) sum += s_dy[r][threadIdx.x];
    if (atomic)
      atomicAdd(p.db + threadIdx.x, sum);
    else
      p.db[threadIdx.x] += sum;
  }
}

template <int kOut>
void launch(const Params& p, unsigned blocks, bool backward, cudaStream_t stream) {
  if (backward) {
    linear_head_loss_kernel<kOut, true><<<blocks, kThreads, 0, stream>>>(p);
    CNN_LAUNCH_CHECK("linear_head_loss_kernel<backward>");
  } else {
    linear_head_loss_kernel<kOut, false><<<blocks, kThreads, 0, stream>>>(p);
    CNN_LAUNCH_CHECK("linear_head_loss_kernel");
  }
}

}  // namespace

void linear_head_loss_step_cuda(const LinearShape& s, const float* d_x, const float* d_w,
                                const float* d_b, float* d_y, const XentTargets& t, float* d_dy,
                                float* d_dw, float* d_db, float* d_dx, bool mask_input_relu,
                                float* d_input_db, bool deterministic, cudaStream_t stream,
                                int rows_per_block) {
  CNN_CHECK(s.out >= 1 && s.out <= kLinearHeadMaxOut,
            "linear_head_loss_step: {} outputs; the fused kernel takes 1..{}", s.out,
            kLinearHeadMaxOut);
  CNN_CHECK(rows_per_block >= 0 && rows_per_block <= kLinearHeadLossMaxRows,
            "linear_head_loss_step: {} rows a block; expected 0 (pick) .. {}", rows_per_block,
            kLinearHeadLossMaxRows);
  const LinearHeadLossPlan plan = linear_head_loss_plan(s, deterministic, rows_per_block);
  Params p;
  p.n = s.n;
  p.in = s.in;
  p.out = s.out;
  p.rows = plan.rows_per_block;
  p.x = d_x;
  p.w = d_w;
  p.b = d_b;
  p.y = d_y;
  p.labels = t.labels;
  p.loss_rows = t.loss_rows;
  p.pred = t.pred;
  p.dy = d_dy;
  p.grad_scale = t.grad_scale;
  p.eps = t.label_smoothing;
  p.dw = d_dw;
  p.db = d_db;
  p.dx = d_dx;
  p.mask = mask_input_relu;
  p.input_db = d_input_db;
  const unsigned blocks = static_cast<unsigned>(ceil_div(s.n, plan.rows_per_block));
  const bool backward = plan.fused_backward;
  switch (ceil_div(s.out, 4)) {
    case 1:
      launch<4>(p, blocks, backward, stream);
      break;
    case 2:
      launch<8>(p, blocks, backward, stream);
      break;
    case 3:
      launch<12>(p, blocks, backward, stream);
      break;
    case 4:
      launch<16>(p, blocks, backward, stream);
      break;
    case 5:
      launch<20>(p, blocks, backward, stream);
      break;
    case 6:
      launch<24>(p, blocks, backward, stream);
      break;
    case 7:
      launch<28>(p, blocks, backward, stream);
      break;
    default:
      launch<32>(p, blocks, backward, stream);
      break;
  }
  if (!backward)
    linear_head_backward_cuda(s, d_x, d_dy, d_w, d_dw, d_db, d_dx, mask_input_relu, d_input_db,
                              deterministic, stream);
}

}  // namespace cnn
