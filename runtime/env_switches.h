#pragma once
// Every CNN_* environment variable, in one table, parsed in one place (env_switches.cpp). Two
// kinds:
//  - overrides of options (algo, autotune, pool and batchnorm-relu fusion, CUDA graph, the autotune
//  and decoded-data
//    caches): the programs read the variables once when a run starts and apply them to the
//    options they override (with_env_switches() in layers/network.h, the trainer's CUDA-graph
//    decision, its autotune cache file, DataOptions::decoded_cache); layers, data loaders and
//    kernels never look at them;
//  - debugging switches of the kernels (GEMM path, generic conv gradients, CPU ISA and threads,
//    a sync after every launch), for bisecting a wrong answer or a slow run. They reach launchers
//    that take no options, so they are read once per process (process_env_switches()) and are
//    constant from then on; each program's main() reads them at start so that a bad value fails
//    before any work.
#include <optional>
#include <string>
#include <vector>

#include "runtime/exec.h"
#include "runtime/graph_overlap.h"

namespace cnn {

enum class GemmPathSwitch { Auto, Strided, Tile, Wgmma };       // CNN_GEMM_PATH
enum class CpuIsaSwitch { Best, Scalar, Avx2, Avx512 };         // CNN_CPU_ISA
enum class WgmmaConvGatherSwitch { Async, WaitGroup, Sync };    // CNN_WGMMA_CONV_GATHER
enum class DepthwiseKernelSwitch { Auto, Tile, Rows, Stream, Flat };  // CNN_DEPTHWISE_KERNEL
enum class DepthwiseStreamStripsSwitch { Auto, Fill, Long };    // CNN_DEPTHWISE_STREAM_STRIPS
enum class GroupedDenseSwitch { Auto, PerGroup, BlockDiagonal, Direct };  // CNN_GROUPED_DENSE
enum class WgmmaWgradBSwitch { ByAlgo, Gather, Tma };           // CNN_WGMMA_WGRAD_B

struct EnvSwitches {
  // Overrides of options.
  std::optional<Algo> algo;         // CNN_ALGO: every conv and linear layer's variant
  std::optional<Algo> algo_conv;    // CNN_ALGO_CONV: conv layers (before CNN_ALGO)
  std::optional<Algo> algo_linear;  // CNN_ALGO_LINEAR: linear layers (before CNN_ALGO)
  bool autotune = true;             // CNN_AUTOTUNE=0: no start-up timing of variants
  bool fuse_pool = true;            // CNN_FUSE_POOL=0: no fused conv-relu-maxpool
  bool fuse_bn_relu = true;         // CNN_FUSE_BN_RELU=0: no relu folded into a batchnorm
  bool fuse_residual = true;        // CNN_FUSE_RESIDUAL=0: no residual add run by a batchnorm
  bool cuda_graph = true;           // CNN_CUDA_GRAPH=0: launch each step's kernels directly
  // CNN_GRAPH_OVERLAP=exit (default) | start | 0: when the captured step's kernels launch, each
  // waiting in ptx::griddep_enter for the one before it (runtime/graph_overlap.h): once every
  // block of the one before has exited, or begun; 0: after it has completed.
  GraphOverlap graph_overlap = GraphOverlap::AtExit;
  std::string nccl_library;         // CNN_NCCL_LIBRARY: libnccl.so.2's path (or its folder)
  double nccl_timeout_s = 600;      // CNN_NCCL_TIMEOUT_S: a collective slower than this fails
  // CNN_AUTOTUNE_CACHE: unset: the user's cache file; "0" or "off": no cache (""); else this file.
  std::optional<std::string> autotune_cache;
  bool data_cache = true;  // CNN_DATA_CACHE=0: no decoded copy beside gzip IDX image files
  // CNN_GRAD_OVERWRITE=1 (default) | 0: the training step's backward writes the weight gradients
  // it can (a linear layer's GEMM, beta = 0) instead of adding to them, and its update leaves
  // those unzeroed (NetworkOptions::overwrite_grads); 0: every gradient accumulates, to compare.
  bool grad_overwrite = true;
  // CNN_CONV_SHARED_DY=1 (default) | 0: a convolution whose two gradients both run wgmma-nhwc at
  // BF16 computes them in one call that writes dy's channels-last copy once (the weight
  // gradient's, which the input gradient reads); 0: two calls, two copies, to compare.
  bool conv_shared_dy = true;
  // CNN_EARLY_UPDATE=0 (default) | 1: the training step's optimizer updates each range of
  // parameters as soon as backward has finished their gradients, on a second stream that runs
  // beside the rest of backward (ParamOptimizer::enable_early_updates; same bits); 0: one update
  // of every parameter after backward.
  bool early_update = false;
  // CNN_WGRAD_BESIDE=1 (default) | 0: training on a GPU runs convolutions' and linear layers'
  // weight gradients on a second stream beside their input gradients and the rest of backward
  // (NetworkOptions::weight_grads_beside; same bits); 0: in turn on the one stream.
  bool wgrad_beside = true;
  // CNN_TUNE_BACKWARD=1 (default) | 0: where weight gradients run beside, autotune then times
  // the whole backward pass with the backward passes' close runner-up variants and keeps those
  // that shorten it (NetworkOptions::tune_backward); 0: the variants fastest alone.
  bool tune_backward = true;
  // Debugging switches of the kernels.
  GemmPathSwitch gemm_path = GemmPathSwitch::Auto;  // CNN_GEMM_PATH=strided|tile|wgmma|auto
  // CNN_WGMMA_MN=tma (default) | gather: the wgmma GEMM loads an M/N-contiguous operand by TMA
  // and transposes it in shared memory, or with the producer's transposing loads (gather).
  bool wgmma_mn_tma = true;
  // CNN_WGMMA_SPLITS=1|2|4|8|16|auto: the wgmma GEMM's k splits where its caller leaves them
  // to it (0: auto, gemm_wgmma_pick_splits).
  int wgmma_gemm_splits = 0;
  // CNN_WGMMA_GROUPS=auto|1|2|4|8|16: the wgmma GEMM's k split further across that many
  // clusters, their sums added by a second kernel, where its caller gives it a workspace (0:
  // auto, the default, gemm_wgmma's pick; 1: none).
  int wgmma_gemm_groups = 0;
  // CNN_WGMMA_CONV_GATHER=async (default) | waitgroup | sync: how the wgmma convolution's
  // producer fills its stages (kernels/conv/conv2d_wgmma.h, WgmmaConvGather).
  WgmmaConvGatherSwitch wgmma_conv_gather = WgmmaConvGatherSwitch::Async;
  int wgmma_conv_block_n = 0;  // CNN_WGMMA_CONV_BN=64|128|auto: its block tile width (0: auto)
  // CNN_WGMMA_NHWC_PER_SM=1|2|auto: resident blocks an SM of the wgmma-nhwc convolution (0: auto)
  int wgmma_nhwc_blocks_per_sm = 0;
  // CNN_WGMMA_NHWC_BM=128|256|auto: the tile rows of the wgmma-nhwc convolution (0: auto)
  int wgmma_nhwc_block_m = 0;
  // CNN_WGMMA_NHWC_SPLITS=1|2|4|8|auto: the K splits (cluster size) of every launch of the
  // wgmma-nhwc convolution, for comparisons (0: auto, one wave at one block an SM)
  int wgmma_nhwc_splits = 0;
  // CNN_WGMMA_NHWC_BN32=1 (default) | 0: wgmma-nhwc picks its 32-column tile for N <= 32.
  bool wgmma_nhwc_bn32 = true;
  // CNN_WGMMA_NHWC_PHASES=1 (default) | 0: whether algo wgmma-nhwc (and so auto) takes strided
  // input gradients, as their phases (kernels/conv/conv2d_wgmma_nhwc.h); 0 leaves them to the
  // other variants. The kernel's own entry point runs them either way.
  bool wgmma_nhwc_phases = true;
  // CNN_WGMMA_NHWC_STACK=1 (default) | 0: a strided input gradient's phases on the wgmma-nhwc
  // kernel launch up to four in one grid at TF32 and BF16 (0: one launch a phase).
  bool wgmma_nhwc_stack = true;
  // CNN_WGMMA_NHWC_HALO=auto (default) | 1 | 0: how the wgmma-nhwc convolution loads A: halo
  // tiles where the shape allows (1), im2col copies (0), or its pick (-1, auto).
  int wgmma_nhwc_halo = -1;
  // CNN_WGMMA_WGRAD_NHWC_N=64|128|auto: the columns each consumer of the BF16 channels-last
  // weight gradient multiplies (0: auto).
  int wgmma_wgrad_nhwc_n = 0;
  // CNN_WGMMA_WGRAD_NHWC_HALO=auto (default) | 1 | 0: how the BF16 channels-last weight gradient
  // loads x: halo boxes that every tap reads where the shape allows (1), im2col copies per tap
  // (0), or its pick (-1, auto).
  int wgmma_wgrad_nhwc_halo = -1;
  // CNN_WGMMA_WGRAD_TF32_HALO=1 (default) | 0: whether algo wgmma-nhwc (and so auto) runs TF32
  // weight gradients on the TF32 halo kernel where it takes them
  // (kernels/conv/conv2d_wgmma_wgrad_tf32_halo.h); 0 leaves them to the im2col GEMM or wgmma's
  // boxes. The kernel's own entry point runs either way.
  bool wgmma_wgrad_tf32_halo = true;
  // CNN_WGMMA_WGRAD=async (default) | sync: the wgmma conv weight gradient's producer hands its
  // cp.async copies over by cp.async.mbarrier.arrive (async) or waits for them, fences and
  // arrives (sync), to bisect a wrong answer.
  bool wgmma_wgrad_sync = false;
  // CNN_WGMMA_WGRAD_B=algo (default) | gather | tma: where the wgmma weight gradient's im2col
  // operand comes from: algo: each algo's default (the gather for both, until the TMA boxes are
  // timed on the H200); gather / tma: that for both (tma falls back to the gather where the
  // shape cannot take boxes; its copies of x are counted in the weight gradient's scratch).
  WgmmaWgradBSwitch wgmma_wgrad_b = WgmmaWgradBSwitch::ByAlgo;
  // CNN_WGMMA_WGRAD_BOX_RUN=auto (default) | 8 | 16 | 32 | 64 | 128: the channels a piece of the
  // boxed B holds (kernels/conv/conv2d_wgrad_box.h: fewer, larger TMA boxes a stage); 0: auto
  // (wgrad_box_choose_run), 8: the one-box-per-8-channel layout, to measure against.
  int wgmma_wgrad_box_run = 0;
  // CNN_WGMMA_WGRAD_BOX_X=direct (default) | copies: the boxed B's direct tap class (stride 1,
  // column shift 0) reads x itself, or a copy of x as the other classes do (to bisect).
  bool wgmma_wgrad_box_direct = true;
  // CNN_WGMMA_WGRAD_MULTICAST=1 (default) | 0: the boxed TF32 weight gradient's blocks share dy's
  // tiles and B's boxes in thread-block clusters by TMA multicast, or each loads its own.
  bool wgmma_wgrad_multicast = true;
  bool conv_generic = false;  // CNN_CONV_GENERIC=1: generic implicit-GEMM conv gradients
  // CNN_LINEAR_HEAD=0: a CUDA linear layer of at most 32 outputs runs its backward as the separate
  // passes (weight and bias gradient, input gradient, the ReLU mask and bias gradient of the
  // layer before) instead of the one fused kernel (kernels/gemm/linear_head.h).
  bool linear_head = true;
  // CNN_BN_ONE_PASS=0: CUDA BatchNorm training passes always run as the three-launch passes (sums,
  // finish, then the elementwise pass), never as the one-launch cluster kernels that hold a channel
  // in registers where it fits (kernels/norm/batchnorm_one_pass_plan.h).
  bool bn_one_pass = true;
  // CNN_BN_ONE_PASS=all: the one-launch passes on every shape that fits, whatever its cluster
  // size (to profile them); by default only where the cluster is small enough to win.
  bool bn_one_pass_any_cluster = false;
  // CNN_CONV_DGRAD_PHASES=0: the implicit-GEMM input gradient takes a stride above 1 by its
  // division path (every (pixel, tap) pair, most predicated zeros) instead of one GEMM a phase.
  bool conv_dgrad_phases = true;
  // CNN_CONV_WGRAD_WINDOW=1: the implicit-GEMM weight gradient picks its window kernel
  // (kernels/conv/conv2d_igemm_wgrad_window.h) where it applies; off by default, because on the
  // H200 it is 2-3x slower than the dedicated kernel on the shapes it was built for.
  bool conv_wgrad_window = false;
  // CNN_CRP_TENSOR_CORES=1: at precision tf32 / bf16 the fused conv-relu-maxpool of a
  // one-channel first layer runs its forward and weight gradient on the tensor cores
  // (kernels/conv/conv_relu_pool_mma.cu) instead of the FP32 kernels; off by default until
  // they have been timed on a GPU.
  bool crp_tensor_cores = false;
  // CNN_BF16_SMEM=bf16 (default) | f32: the BF16 implicit-GEMM convs keep their operand tiles as
  // packed bf16 pairs in shared memory (filled through registers), or as floats (cp.async).
  bool bf16_smem_packed = true;
  // CNN_DEPTHWISE_KERNEL=auto (default) | tile | rows | stream: the kernel the fast depthwise
  // convolution runs (kernels/conv/conv2d_grouped.h, DepthwiseKernel); the weight gradient has
  // no rows kernel and runs tile for it.
  DepthwiseKernelSwitch depthwise_kernel = DepthwiseKernelSwitch::Auto;
  // CNN_DEPTHWISE_STREAM_STRIPS=auto (default) | fill | long: how the depthwise stream kernels
  // cut their planes into strips (kernels/conv/conv2d_grouped_cuda.h, DepthwiseStreamStrips);
  // auto: long for the weight gradient, fill for the forward and input gradient.
  DepthwiseStreamStripsSwitch depthwise_stream_strips = DepthwiseStreamStripsSwitch::Auto;
  // CNN_GROUPED_DENSE=auto (default) | groups | diagonal | direct: how the dense variants serve a
  // grouped convolution (kernels/conv/conv2d_grouped_dense.h, GroupedDenseForm); direct: every
  // pass that wgmma-nhwc runs on the grouped shape itself, the others as auto.
  GroupedDenseSwitch grouped_dense = GroupedDenseSwitch::Auto;
  bool int8_direct = false;  // CNN_INT8_DIRECT=1: every int8 layer on the direct dp4a kernel
  // CNN_INT8_FUSE_CLASSIFIER=1: the int8 classifier runs inside the linear layer before it
  // instead of as a launch overlapping that layer's end (layers/quant/int8_network.h; off by
  // default: on the H200 the fused LeNet fc1 + fc2 took 14.3 us against 12.4 overlapped).
  bool int8_fuse_classifier = false;
  CpuIsaSwitch cpu_isa = CpuIsaSwitch::Best;  // CNN_CPU_ISA=scalar|avx2|avx512
  int cpu_threads = 0;                        // CNN_CPU_THREADS=1..256 (0: the hardware's)
  bool sync_check = false;                    // CNN_SYNC_CHECK=1: synchronize after every launch

  // The variant a conv ("conv") or linear ("linear") layer runs: CNN_ALGO_<OP>, else CNN_ALGO,
  // else the configured one.
  Algo algo_for(const char* op, Algo configured) const;
};

// Reads and validates the variables now. A bad value throws one line naming the variable, its
// value and the allowed ones.
EnvSwitches read_env_switches();

// The process's snapshot: read on the first call, the same afterwards.
const EnvSwitches& process_env_switches();

// The table printed in the README and by `--help`: name, values, effect.
struct EnvSwitchRow {
  const char* name;
  const char* values;
  const char* effect;
};
const std::vector<EnvSwitchRow>& env_switch_table();

}  // namespace cnn
