#pragma once
// Hopper (sm_90a) tensor-core GEMM: wgmma.mma_async fed from shared memory by TMA
// (cp.async.bulk.tensor) through a multi-stage mbarrier pipeline, one producer warpgroup and two
// consumer warpgroups, split-K across the blocks of a thread-block cluster. Same contract as
// gemm_cuda.h (row-major, op(A) (m, k), op(B) (k, n), alpha/beta, bias + ReLU epilogue, beta == 0
// writes C without reading it), FP32 in memory, FP32 accumulation, and one of two operand
// precisions (WgmmaOptions::precision):
//   TF32: the tensor cores read the top 19 bits of each operand (truncation, not rounding);
//   BF16: the producer warpgroup rounds each operand to BF16 (nearest, ties to even, as
//     __float2bfloat16_rn and the mma.sync BF16 path) on its way into shared memory, and the
//     consumers run wgmma k16 BF16; a k-tile is 64 k instead of 32 (still 128-byte rows);
//   FP32: 3xTF32, FP32 accuracy on the tensor cores: each operand value v is split into
//     big = TF32(v) (nearest), written back in place, and small = TF32(v - big), written to a
//     second tile (B^T by the producer warpgroup, each consumer warpgroup its own rows of A),
//     and the consumers run three wgmma k8 TF32 a k-step (small_A big_B, big_A small_B,
//     big_A big_B). Both operands must be TMA-aligned.
// Results are bitwise repeatable: the split-K partial tiles are summed in cluster-rank order,
// and split groups (WgmmaOptions::groups) in group order, never with atomics.
//
// wgmma reads TF32 operands K-major only. An operand stored K-contiguous (A without trans_a, B
// with trans_b) whose base is 16-byte aligned and whose leading dimension is a multiple of 4 is
// loaded by TMA; any other operand (stored M/N-contiguous, or misaligned) is gathered by the
// producer warpgroup with ordinary loads and transposed into the same swizzled layout, so every
// transpose combination and any alignment runs on this kernel. WgmmaMnLoad::Tma instead loads an
// aligned M/N-contiguous operand by TMA into staging and transposes it in shared memory.
// BF16 stages every operand (the FP32 tile must be converted, K-contiguous or not) when both are
// TMA-aligned and no M/N-contiguous one is to be gathered; otherwise it gathers both, converting
// on the way.
//
// The convolutions on the same design are kernels/conv/conv2d_wgmma.h.
//
// Only compiled for the device when the build's CUDA architectures include 90 (then this file
// gets an sm_90a cubin and no plain sm_90 one); gemm_wgmma_available() says whether it can run
// on the current device (compute capability 9.0 exactly).
#include <cstddef>

#include "runtime/exec.h"
#include "runtime/stream.h"

namespace cnn {

// True when this build has the sm_90a kernel and the current device is compute capability 9.0.
bool gemm_wgmma_available();

// How an M/N-contiguous operand (dgrad's w, wgrad's dy and x) reaches its K-major tile:
//   Gather: the producer's transposing loads (verified on the H200);
//   Tma: TMA of the tile as it lies into a staging buffer (four 32 x 32 boxes), transposed shared
//        -> shared by the producer warpgroup, kStages - 1 k-tiles of TMA in flight; taken when
//        both operands are TMA-aligned (16-byte base, leading dimension a multiple of 4);
//   Default: Tma unless CNN_WGMMA_MN=gather.
enum class WgmmaMnLoad { Default, Gather, Tma };

struct WgmmaOptions {
  int splits =
      0;  // k split across a cluster: 0 picks (CNN_WGMMA_SPLITS, else 1..8), else 1, 2, 4, 8 or 16
  bool force_gather = false;  // load both operands with the producer's gather, never TMA (tests)
  WgmmaMnLoad mn_load = WgmmaMnLoad::Default;
  Precision precision = Precision::TF32;  // TF32, BF16, or FP32 (3xTF32)
  // k split further, across `groups` clusters of `splits` blocks each (grid z = groups x
  // splits): each cluster sums its splits as above and writes the sum, its group's partial
  // product, raw into `work`; split_k_reduce (split_k_reduce.h) then sums the groups in order and
  // applies alpha, beta, bias and ReLU. For the shapes whose tiles and cluster splits leave SMs
  // idle (a linear layer at batch 128: 4 tiles of 128 x 128), or whose clusters the GPCs cannot
  // all hold at once. 0 picks: with splits picked too and CNN_WGMMA_GROUPS=auto, the total of
  // gemm_wgmma_pick_total_splits in the largest clusters the device holds in one wave; with
  // CNN_WGMMA_GROUPS=N, N (fewer where a split would get under 2 k-tiles); 1 without a workspace
  // big enough. 1: none. `work`: 16-byte aligned, at least gemm_wgmma_work_floats(m, n, groups)
  // floats.
  int groups = 0;
  float* work = nullptr;
  std::size_t work_floats = 0;
};

// C (m, n) = epilogue(alpha * op(A) * op(B) + beta * C), as gemm_cuda. m, n, k > 0. Throws
// cnn::Error when !gemm_wgmma_available(), or at FP32 when an operand is not TMA-aligned (base
// 16-byte aligned, leading dimension a multiple of 4) or opt.force_gather is set.
void gemm_wgmma(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* d_a,
                int lda, const float* d_b, int ldb, float beta, float* d_c, int ldc,
                const float* d_bias, bool relu, cudaStream_t stream,
                const WgmmaOptions& opt = WgmmaOptions{});

// The split count gemm_wgmma picks for this shape on the current device (opt.splits == 0).
int gemm_wgmma_pick_splits(int m, int n, int k, Precision precision = Precision::TF32);

// The most groups gemm_wgmma may pick for this shape (opt.groups == 0), what its workspace is
// sized for: 1 under CNN_WGMMA_GROUPS=1 or a forced CNN_WGMMA_SPLITS; under auto (the default)
// gemm_wgmma_pick_total_splits (all in groups of one block where no larger cluster fits); under
// N, N halved until each block keeps at least 2 k-tiles.
int gemm_wgmma_pick_groups(int m, int n, int k, Precision precision = Precision::TF32);

// The k splits a tile gets in all, clusters and groups together: gemm_wgmma_pick_splits, then
// doubled up to 16 while the grid stays within half the SMs and each split keeps 128 of k
// (4 TF32 k-tiles, 2 BF16 ones).
int gemm_wgmma_pick_total_splits(int m, int n, int k, Precision precision = Precision::TF32);

// Floats of the workspace `groups` split groups of an (m, n) output take (0 for one group).
std::size_t gemm_wgmma_work_floats(int m, int n, int groups);

}  // namespace cnn
