#pragma once
// Weight gradient of the dense convolution on the Hopper tensor cores (wgmma, sm_90a only; see
// conv2d_wgmma_wgrad.cu). Same contract as conv2d_backward_weight (kernels/conv/conv2d.h):
//   dw (OC, C, KH, KW) += sum over n, output pixels p of dy[n][oc][p] * im2col(x)[n][p][(c, kh,
//   kw)] db (OC) += sum of dy (db may be null)
// as the GEMM C (M = OC, N = C*KH*KW [+1 for db]) += A (M, K) B (K, N), K = N*OH*OW pixels, TF32
// operands (the top 19 bits of each FP32 value) and FP32 accumulation; at ex.precision fp32,
// 3xTF32 (each stage's operands split into TF32 parts in shared memory, three wgmmas a product:
// FP32 accuracy, conv2d_wgmma_wgrad.cu's WgPlan). K is split across many
// blocks; their partial tiles are atomicAdd-ed into dw/db, or with ex.deterministic written to a
// scratch slab per split and summed in split order (bitwise repeatable).
#include <cstddef>
#include <string>

#include "kernels/conv/conv2d.h"
#include "runtime/exec.h"

namespace cnn {

// A thread-block cluster of the boxed weight gradient's multicast: x blocks of a row of output
// tiles (grid x) by z of a column (grid z).
struct WgradCluster {
  int x = 1, z = 1;
};

struct WgmmaWgradOptions {
  // dy gathered by the producer's cp.async even where TMA could load it (tests compare both).
  bool force_gather = false;
  // How the producer hands its cp.async copies to the tensor cores:
  //   Async: cp.async.mbarrier.arrive.noinc on the stage's mbarrier, the consumers fence after
  //          their wait (the copies stay in flight while the producer fills the next stage);
  //   Sync:  each producer thread waits for its own copies, fences, then arrives (the pattern of
  //          the wgmma GEMM's gather), a fallback to bisect a wrong answer;
  //   Default: Async unless CNN_WGMMA_WGRAD=sync.
  enum class Copies { Default, Async, Sync } copies = Copies::Default;
  // Where the im2col operand B comes from:
  //   Gather: the producer's 4-byte cp.async per element (any shape; the only loader a dilated
  //           or grouped one takes: dilated taps from its column table, one group a block);
  //   Tma:    a pre-pass writes tap-class copies of x into the scratch, then tiled TMA boxes of
  //           them (conv2d_wgrad_box.h), one (or one per output row of the k-tile) per tap and
  //           run of channels per stage; throws where conv2d_wgrad_wgmma_box_refusal is not
  //           empty or the scratch is null;
  //   Auto:   Tma where it can and the input has at least 8 channels, else Gather;
  //   Default: what wgmma_wgrad_b_for says.
  enum class BLoad { Default, Gather, Tma, Auto } b = BLoad::Default;
  // Boxed B: the channels a piece of B (a box, or one box per output row) holds: 8, 16, 32, 64
  // or 128 forced, kBoxRunAuto (0) for wgrad_box_choose_run's pick, kBoxRunDefault for the
  // process's CNN_WGMMA_WGRAD_BOX_RUN (auto unless set). The scratch is the same for every run.
  static constexpr int kBoxRunDefault = -1, kBoxRunAuto = 0;
  int box_run = kBoxRunDefault;
  // Boxed B: whether the direct tap class (conv2d_wgrad_box.h: stride 1, W a multiple of 4, the
  // class of column shift 0) reads x itself instead of a copy written by the pre-pass (On, where
  // x is 16-byte aligned), or its copy too (Off); Default: CNN_WGMMA_WGRAD_BOX_X (direct unless
  // set to copies).
  enum class Direct { Default, On, Off } box_direct = Direct::Default;
  // Boxed B with dy by TMA at TF32: blocks in thread-block clusters get the dy tile of their row
  // of tiles and the boxes of their column by TMA multicast, one load for the cluster's blocks
  // (On, where the device places the clusters in as few waves as the blocks alone), or each
  // block loads its own (Off); Default:
  // CNN_WGMMA_WGRAD_MULTICAST (on unless 0). The same products either way. An Exec with
  // clusters off loads its own whatever this says.
  enum class Multicast { Default, On, Off } multicast = Multicast::Default;
  // Where not null, the call writes here the cluster its kernel ran in: 1 x 1 where the blocks
  // loaded their own (multicast off, a shape or precision without it, a grid no cluster divides,
  // or clusters the device would place in more waves than the blocks alone). For tests and the
  // benchmark's notes: a result equal to the blocks' own loads cannot tell the two apart.
  WgradCluster* ran_cluster = nullptr;
};

// Whether a call with `opt` may multicast (opt's multicast, else CNN_WGMMA_WGRAD_MULTICAST).
bool wgmma_wgrad_multicast(const WgmmaWgradOptions& opt);

// Whether a call with `opt` lets the direct class read x (opt's box_direct, else the process's
// CNN_WGMMA_WGRAD_BOX_X).
bool wgmma_wgrad_box_direct(const WgmmaWgradOptions& opt);

// The run of channels a call with `opt` gives boxed B's pieces (kBoxRunAuto, or 8..128): opt's,
// else CNN_WGMMA_WGRAD_BOX_RUN's; wgrad_box_geometry(s, this) is the geometry it runs.
int wgmma_wgrad_box_run(const WgmmaWgradOptions& opt);

// The B loader a conv2d_backward_weight call with `algo` (Wgmma or WgmmaNhwc) asks for, from
// CNN_WGMMA_WGRAD_B: gather -> Gather, tma or algo (default) -> Auto for both algos (the boxes
// beat the gather by 15-28% on every 64-256-channel VGG layer on the H200).
WgmmaWgradOptions::BLoad wgmma_wgrad_b_for(Algo algo);

// Why B cannot come by TMA boxes for this shape (past the kernel's 32-bit limits), or for x (a
// 1x1 stride-1 unpadded convolution reads x itself, which must then be 16-byte aligned), or ""
// when it can. d_x may be null (the shape alone is checked then). The scratch is the caller's:
// conv2d_backward_weight_wgmma checks it is there.
std::string conv2d_wgrad_wgmma_box_refusal(const Conv2dShape& s, const float* d_x);

// True when this build has the sm_90a kernel and the current device is compute capability 9.0.
bool conv2d_wgrad_wgmma_available();

// Why this call cannot run on the wgmma kernel (unavailable, not TF32 or FP32, sizes over its
// limits), or
// an empty string when it can.
std::string conv2d_wgrad_wgmma_refusal(const Conv2dShape& s, const Exec& ex);

// Scratch floats a call with B loader `b` needs: the copies of x where boxes run (Tma; Auto from
// 8 input channels up),
// then the deterministic slabs of the larger split (0 for Gather unless ex.deterministic).
// Default: the loaders wgmma_wgrad_b_for names (the process's CNN_WGMMA_WGRAD_B), as
// conv2d_backward_weight_scratch_floats counts it; a call with an explicit opt.b needs the
// scratch of that b. A function of the shape, ex.deterministic and b alone.
std::size_t conv2d_wgrad_wgmma_scratch_floats(
    const Conv2dShape& s, const Exec& ex,
    WgmmaWgradOptions::BLoad b = WgmmaWgradOptions::BLoad::Default);

// The split of K this shape gets (blocks per output tile) with B gathered, or (box) by TMA
// boxes in pieces of `run` channels (0: auto), with or without db; for tests and the benchmark's
// notes.
int conv2d_wgrad_wgmma_splits(const Conv2dShape& s, bool box = false, int run = 0, bool db = true);

// The multicast cluster (x, z) blocks a grid of tiles_n x tiles_m output tiles (grid x and z)
// takes: z = 2 where tiles_m is even (the two row tiles share B's boxes), x = 2 where tiles_n is
// even, else 3 where 3 divides it (the blocks of a row share dy's tile), at most 4 blocks; 1 x 1
// where neither divides. Host arithmetic; the launch falls back to 1 x 1 where the device would
// place the clusters in more waves than the blocks alone.
WgradCluster conv2d_wgrad_wgmma_cluster(int64_t tiles_n, int64_t tiles_m);

// The multicast cluster a call with `opt` at ex (with a bias gradient where db) asks for, with
// x, dy and the scratch 16-byte aligned: 1 x 1 where its blocks would load their own (as
// ran_cluster lists), else conv2d_wgrad_wgmma_cluster of its grid. The launch may still run 1 x 1
// where the device would place the clusters in more waves than the blocks alone. Host work: for
// the autotuner's question whether a layer's weight gradient has a cluster form to weigh.
WgradCluster conv2d_wgrad_wgmma_planned_cluster(const Conv2dShape& s, const Exec& ex, bool db,
                                                const WgmmaWgradOptions& opt = WgmmaWgradOptions{});

// d_scratch: conv2d_wgrad_wgmma_scratch_floats(s, ex, opt.b) floats (null allowed where that is
// 0), 16-byte aligned where it holds the copies of x (a Buffer's or Tensor's start is).
// Throws cnn::Error naming the reason when conv2d_wgrad_wgmma_refusal() is not empty.
void conv2d_backward_weight_wgmma(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                  float* d_dw, float* d_db, float* d_scratch, const Exec& ex,
                                  const WgmmaWgradOptions& opt = WgmmaWgradOptions{});

}  // namespace cnn
