#pragma once
// Dense single-precision GEMM on the GPU (kernels/gemm_cuda.cu), row-major like gemm_cpu.h:
//   C (m, n) = epilogue(alpha * op(A) * op(B) + beta * C)
// op(A) is (m, k): A is stored (m, k) with row stride lda, or, with trans_a, (k, m).
// op(B) is (k, n): B is stored (k, n) with row stride ldb, or, with trans_b, (n, k).
// The epilogue then adds bias[col] (bias may be null) and applies ReLU when relu is set:
//   C[i][j] = relu(alpha * sum_l op(A)[i][l] op(B)[l][j] + beta * C[i][j] + bias[j]).
// beta == 0 writes C without reading it (NaN there is overwritten, as in BLAS). k == 0 gives
// C = beta * C (+ bias, relu). m or n == 0: nothing.
//
// Precision::FP32 runs FFMA on register micro-tiles, or, with Fp32Math::Tf32x3, 3xTF32: on the
// wgmma kernel where Auto would take it in TF32, else on the 16-byte tile's mma.sync (FFMA on
// the strided tile and the small-shape kernels); Precision::TF32 runs mma.sync
// m16n8k8 TF32 tensor-core instructions with FP32 accumulation (operands rounded to TF32, 10-bit
// mantissa) or the wgmma kernel.
// Small-m/n shapes split k across the blocks of a thread-block cluster (sm_90) and sum the splits
// in a fixed order, so results are bitwise repeatable run to run in every mode (no path uses
// atomics).
//
// Uses for the linear layer (x (N, IN), w (OUT, IN), y (N, OUT)):
//   forward:  gemm_cuda(false, true,  N, OUT, IN,  1, x, IN, w, IN, 0, y, OUT, b, relu, ...)
//   dx:       gemm_cuda(false, false, N, IN, OUT,  1, dy, OUT, w, IN, 0, dx, IN, nullptr, ...)
//   dw += :   gemm_cuda(true,  false, OUT, IN, N,  1, dy, OUT, x, IN, 1, dw, IN, nullptr, ...)
// All pointers are device pointers; the launch is asynchronous on `stream`.
#include <cstddef>

#include "runtime/exec.h"
#include "runtime/stream.h"

namespace cnn {

// Which kernel runs a gemm_cuda call.
//   Auto: the small-shape kernels where one dimension is small (SmallDot: both operands
//         contiguous along k and m*n <= 16384, k >= 32; SmallM: B contiguous along n,
//         m <= 16 and k <= 512; SmallK: B contiguous along n and k <= 16), else Vec where both
//         operands allow 16-byte copies (16-byte aligned base, leading dimension a multiple of 4;
//         VecTileWide for BF16 outputs of at least 4 64 x 64 tiles an SM, else VecTile),
//         else StridedTile. CNN_GEMM_PATH=strided makes Auto take StridedTile always;
//         CNN_GEMM_PATH=tile makes it skip the small-shape kernels (VecTile, else StridedTile);
//         CNN_GEMM_PATH=wgmma makes it take Wgmma.
//   StridedTile: the 4-byte-copy tile kernel of gemm_tile.cuh (any alignment).
//   VecTile: the 16-byte-copy tile kernel of gemm_tile_vec.cuh (64 x 64 tiles); runs
//        StridedTile where the operands are not aligned for it.
//   VecTileWide: its 128 x 128 tiles of 256 threads (tensor cores only: FP32 with
//        Fp32Math::Ffma runs VecTile; StridedTile where the operands are not aligned for it);
//        k is split only where its tiles number fewer than the SMs.
//   SmallDot / SmallM / SmallK: the kernels of gemm_small.h, for any shape (slow off their
//        shapes; FP32 arithmetic whatever the precision).
//   Wgmma: the Hopper wgmma + TMA kernel of gemm_wgmma.h (TF32 or BF16, any layout and
//        alignment; FP32 as 3xTF32 with TMA-aligned operands); where it cannot run (not a
//        compute capability 9.0 device, a build without architecture 90, FP32 with Fp32Math::Ffma
//        or misaligned operands, k == 0) the call takes what Auto would. Auto picks it
//        for TF32 and BF16 (and FP32 with Fp32Math::Tf32x3) problems whose operands are both
//        K-major (after the small-shape
//        kernels), and, with CNN_WGMMA_MN=tma, for transposed ones whose operands are
//        TMA-aligned (16-byte base, leading dimension a multiple of 4: staged by TMA, transposed
//        in shared memory) and whose A is K-major (the input gradient, not the weight gradient);
//        CNN_GEMM_PATH=wgmma makes Auto take it for every TF32 and BF16 problem.
enum class GemmPath { Auto, StridedTile, VecTile, VecTileWide, SmallDot, SmallM, SmallK, Wgmma };
const char* gemm_path_name(GemmPath path);

// Device memory a gemm_cuda call may use as workspace: the wgmma GEMM's split groups
// (CNN_WGMMA_GROUPS, WgmmaOptions::groups) write their partial products there. None (the
// default) or too small a one: no split groups.
struct GemmWorkspace {
  float* ptr = nullptr;  // 16-byte aligned
  std::size_t floats = 0;
};

// The workspace floats an (m, n, k) call at this precision can use on the current device (0 where
// the wgmma GEMM cannot run or splits no groups).
std::size_t gemm_cuda_work_floats(int m, int n, int k, Precision precision);

// Rows of the wgmma GEMM's block tile. Its split-group plan, and so gemm_cuda_work_floats, can
// change only where m crosses a multiple of this (the tile count), so a caller sizing workspace
// for every m up to some bound need only ask at these steps and at the bound.
inline constexpr int kGemmWorkRowStep = 128;

// The path a call with these arguments takes (Auto resolved, environment included).
GemmPath gemm_cuda_resolve(GemmPath path, bool trans_a, bool trans_b, int m, int n, int k,
                           const float* d_a, int lda, const float* d_b, int ldb,
                           Precision precision = Precision::TF32,
                           Fp32Math fp32 = Fp32Math::Ffma);

void gemm_cuda_path(GemmPath path, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                    const float* d_a, int lda, const float* d_b, int ldb, float beta, float* d_c,
                    int ldc, const float* d_bias, bool relu, Precision precision,
                    cudaStream_t stream, Fp32Math fp32 = Fp32Math::Ffma,
                    GemmWorkspace work = GemmWorkspace{});

// gemm_cuda_path(GemmPath::Auto, ...).
void gemm_cuda(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* d_a,
               int lda, const float* d_b, int ldb, float beta, float* d_c, int ldc,
               const float* d_bias, bool relu, Precision precision, cudaStream_t stream,
               Fp32Math fp32 = Fp32Math::Ffma, GemmWorkspace work = GemmWorkspace{});

}  // namespace cnn
