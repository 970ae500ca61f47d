#include "runtime/env_switches.h"

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include "runtime/error.h"

namespace cnn {
namespace {

const char* get(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

// "0" turns an on-by-default switch off; anything else set leaves it on.
bool on_unless_zero(const char* name) {
  const char* v = get(name);
  return !(v && std::strcmp(v, "0") == 0);
}

// Set to anything but "0" turns an off-by-default switch on.
bool off_unless_set(const char* name) {
  const char* v = get(name);
  return v && std::strcmp(v, "0") != 0;
}

// "0" or "1" (anything else is refused); unset keeps `fallback`.
bool zero_or_one(const char* name, bool fallback) {
  const char* v = get(name);
  if (!v) return fallback;
  const std::string s(v);
  CNN_CHECK(s == "0" || s == "1", "{}='{}': expected 0 or 1", name, s);
  return s == "1";
}

// "auto" or unset: -1; "1" or "0": that (anything else is refused).
int auto_one_zero(const char* name) {
  const char* v = get(name);
  if (!v) return -1;
  const std::string s(v);
  if (s == "auto") return -1;
  CNN_CHECK(s == "0" || s == "1", "{}='{}': expected 1, 0 or auto", name, s);
  return s == "1" ? 1 : 0;
}

// "auto": 0; "1", "2", "4", "8" or "16": that (anything else is refused); unset keeps `fallback`.
int auto_or_power_of_two(const char* name, int fallback) {
  const char* v = get(name);
  if (!v) return fallback;
  const std::string s(v);
  if (s == "auto") return 0;
  CNN_CHECK(s == "1" || s == "2" || s == "4" || s == "8" || s == "16",
            "{}='{}': expected auto, 1, 2, 4, 8 or 16", name, s);
  return std::stoi(s);
}

// "auto": 0; one of `values`: that (anything else is refused, naming the values); unset keeps
// `fallback`.
int auto_or_one_of(const char* name, int fallback, std::initializer_list<int> values) {
  const char* v = get(name);
  if (!v) return fallback;
  const std::string s(v);
  if (s == "auto") return 0;
  std::string expected;
  for (int x : values) {
    if (s == std::to_string(x)) return x;
    expected += (expected.empty() ? "" : ", ") + std::to_string(x);
  }
  CNN_FAIL("{}='{}': expected {} or auto", name, s, expected);
}

std::optional<Algo> algo_of(const char* name) {
  const char* v = get(name);
  if (!v) return std::nullopt;
  try {
    return parse_algo(v);
  } catch (const Error& e) {
    CNN_FAIL("{}: {}", name, e.what());
  }
}

}  // namespace

Algo EnvSwitches::algo_for(const char* op, Algo configured) const {
  const std::optional<Algo>& own = std::strcmp(op, "conv") == 0 ? algo_conv : algo_linear;
  if (own) return *own;
  if (algo) return *algo;
  return configured;
}

EnvSwitches read_env_switches() {
  EnvSwitches e;
  e.algo = algo_of("CNN_ALGO");
  e.algo_conv = algo_of("CNN_ALGO_CONV");
  e.algo_linear = algo_of("CNN_ALGO_LINEAR");
  e.autotune = on_unless_zero("CNN_AUTOTUNE");
  e.fuse_pool = on_unless_zero("CNN_FUSE_POOL");
  e.fuse_bn_relu = on_unless_zero("CNN_FUSE_BN_RELU");
  e.fuse_residual = on_unless_zero("CNN_FUSE_RESIDUAL");
  e.cuda_graph = on_unless_zero("CNN_CUDA_GRAPH");
  if (const char* v = get("CNN_GRAPH_OVERLAP")) {
    const std::string s(v);
    if (s == "exit")
      e.graph_overlap = GraphOverlap::AtExit;
    else if (s == "start")
      e.graph_overlap = GraphOverlap::AtStart;
    else if (s == "0")
      e.graph_overlap = GraphOverlap::Off;
    else
      CNN_FAIL("CNN_GRAPH_OVERLAP='{}': expected exit, start or 0", s);
  }
  if (const char* v = get("CNN_AUTOTUNE_CACHE")) {
    const std::string s(v);
    e.autotune_cache = (s == "0" || s == "off") ? std::string() : s;
  }
  e.data_cache = on_unless_zero("CNN_DATA_CACHE");
  e.grad_overwrite = zero_or_one("CNN_GRAD_OVERWRITE", e.grad_overwrite);
  e.conv_shared_dy = zero_or_one("CNN_CONV_SHARED_DY", e.conv_shared_dy);
  e.early_update = zero_or_one("CNN_EARLY_UPDATE", e.early_update);
  e.wgrad_beside = zero_or_one("CNN_WGRAD_BESIDE", e.wgrad_beside);
  e.tune_backward = zero_or_one("CNN_TUNE_BACKWARD", e.tune_backward);
  if (const char* v = get("CNN_GEMM_PATH")) {
    const std::string s(v);
    if (s == "auto")
      e.gemm_path = GemmPathSwitch::Auto;
    else if (s == "strided")
      e.gemm_path = GemmPathSwitch::Strided;
    else if (s == "tile")
      e.gemm_path = GemmPathSwitch::Tile;
    else if (s == "wgmma")
      e.gemm_path = GemmPathSwitch::Wgmma;
    else
      CNN_FAIL("CNN_GEMM_PATH='{}': expected strided, tile, wgmma or auto", s);
  }
  if (const char* v = get("CNN_WGMMA_MN")) {
    const std::string s(v);
    if (s == "tma")
      e.wgmma_mn_tma = true;
    else if (s == "gather")
      e.wgmma_mn_tma = false;
    else
      CNN_FAIL("CNN_WGMMA_MN='{}': expected tma or gather", s);
  }
  e.wgmma_gemm_splits = auto_or_power_of_two("CNN_WGMMA_SPLITS", e.wgmma_gemm_splits);
  e.wgmma_gemm_groups = auto_or_power_of_two("CNN_WGMMA_GROUPS", e.wgmma_gemm_groups);
  if (const char* v = get("CNN_WGMMA_CONV_GATHER")) {
    const std::string s(v);
    if (s == "async")
      e.wgmma_conv_gather = WgmmaConvGatherSwitch::Async;
    else if (s == "waitgroup")
      e.wgmma_conv_gather = WgmmaConvGatherSwitch::WaitGroup;
    else if (s == "sync")
      e.wgmma_conv_gather = WgmmaConvGatherSwitch::Sync;
    else
      CNN_FAIL("CNN_WGMMA_CONV_GATHER='{}': expected async, waitgroup or sync", s);
  }
  e.wgmma_conv_block_n = auto_or_one_of("CNN_WGMMA_CONV_BN", e.wgmma_conv_block_n, {64, 128});
  e.wgmma_nhwc_blocks_per_sm =
      auto_or_one_of("CNN_WGMMA_NHWC_PER_SM", e.wgmma_nhwc_blocks_per_sm, {1, 2});
  e.wgmma_nhwc_splits = auto_or_one_of("CNN_WGMMA_NHWC_SPLITS", e.wgmma_nhwc_splits, {1, 2, 4, 8});
  e.wgmma_nhwc_block_m = auto_or_one_of("CNN_WGMMA_NHWC_BM", e.wgmma_nhwc_block_m, {128, 256});
  e.wgmma_wgrad_nhwc_n = auto_or_one_of("CNN_WGMMA_WGRAD_NHWC_N", e.wgmma_wgrad_nhwc_n, {64, 128});
  e.wgmma_nhwc_bn32 = zero_or_one("CNN_WGMMA_NHWC_BN32", e.wgmma_nhwc_bn32);
  e.wgmma_nhwc_phases = zero_or_one("CNN_WGMMA_NHWC_PHASES", e.wgmma_nhwc_phases);
  e.wgmma_nhwc_stack = zero_or_one("CNN_WGMMA_NHWC_STACK", e.wgmma_nhwc_stack);
  e.wgmma_nhwc_halo = auto_one_zero("CNN_WGMMA_NHWC_HALO");
  e.wgmma_wgrad_nhwc_halo = auto_one_zero("CNN_WGMMA_WGRAD_NHWC_HALO");
  e.wgmma_wgrad_tf32_halo = zero_or_one("CNN_WGMMA_WGRAD_TF32_HALO", e.wgmma_wgrad_tf32_halo);
  if (const char* v = get("CNN_WGMMA_WGRAD")) {
    const std::string s(v);
    if (s == "async")
      e.wgmma_wgrad_sync = false;
    else if (s == "sync")
      e.wgmma_wgrad_sync = true;
    else
      CNN_FAIL("CNN_WGMMA_WGRAD='{}': expected async or sync", s);
  }
  if (const char* v = get("CNN_WGMMA_WGRAD_B")) {
    const std::string s(v);
    if (s == "algo")
      e.wgmma_wgrad_b = WgmmaWgradBSwitch::ByAlgo;
    else if (s == "gather")
      e.wgmma_wgrad_b = WgmmaWgradBSwitch::Gather;
    else if (s == "tma")
      e.wgmma_wgrad_b = WgmmaWgradBSwitch::Tma;
    else
      CNN_FAIL("CNN_WGMMA_WGRAD_B='{}': expected algo, gather or tma", s);
  }
  e.wgmma_wgrad_box_run =
      auto_or_one_of("CNN_WGMMA_WGRAD_BOX_RUN", e.wgmma_wgrad_box_run, {8, 16, 32, 64, 128});
  if (const char* v = get("CNN_WGMMA_WGRAD_BOX_X")) {
    const std::string s(v);
    if (s == "direct")
      e.wgmma_wgrad_box_direct = true;
    else if (s == "copies")
      e.wgmma_wgrad_box_direct = false;
    else
      CNN_FAIL("CNN_WGMMA_WGRAD_BOX_X='{}': expected direct or copies", s);
  }
  e.wgmma_wgrad_multicast = zero_or_one("CNN_WGMMA_WGRAD_MULTICAST", e.wgmma_wgrad_multicast);
  e.conv_generic = off_unless_set("CNN_CONV_GENERIC");
  e.linear_head = on_unless_zero("CNN_LINEAR_HEAD");
  if (const char* v = get("CNN_BN_ONE_PASS")) {
    const std::string s(v);
    CNN_CHECK(s == "0" || s == "1" || s == "all", "CNN_BN_ONE_PASS='{}': expected 0, 1 or all", s);
    e.bn_one_pass = s != "0";
    e.bn_one_pass_any_cluster = s == "all";
  }
  e.conv_dgrad_phases = on_unless_zero("CNN_CONV_DGRAD_PHASES");
  e.conv_wgrad_window = off_unless_set("CNN_CONV_WGRAD_WINDOW");
  e.crp_tensor_cores = off_unless_set("CNN_CRP_TENSOR_CORES");
  if (const char* v = get("CNN_BF16_SMEM")) {
    const std::string s(v);
    if (s == "bf16")
      e.bf16_smem_packed = true;
    else if (s == "f32")
      e.bf16_smem_packed = false;
    else
      CNN_FAIL("CNN_BF16_SMEM='{}': expected bf16 or f32", s);
  }
  if (const char* v = get("CNN_DEPTHWISE_KERNEL")) {
    const std::string s(v);
    if (s == "auto")
      e.depthwise_kernel = DepthwiseKernelSwitch::Auto;
    else if (s == "tile")
      e.depthwise_kernel = DepthwiseKernelSwitch::Tile;
    else if (s == "rows")
      e.depthwise_kernel = DepthwiseKernelSwitch::Rows;
    else if (s == "stream")
      e.depthwise_kernel = DepthwiseKernelSwitch::Stream;
    else if (s == "flat")
      e.depthwise_kernel = DepthwiseKernelSwitch::Flat;
    else
      CNN_FAIL("CNN_DEPTHWISE_KERNEL='{}': expected tile, rows, stream, flat or auto", s);
  }
  if (const char* v = get("CNN_DEPTHWISE_STREAM_STRIPS")) {
    const std::string s(v);
    if (s == "auto")
      e.depthwise_stream_strips = DepthwiseStreamStripsSwitch::Auto;
    else if (s == "fill")
      e.depthwise_stream_strips = DepthwiseStreamStripsSwitch::Fill;
    else if (s == "long")
      e.depthwise_stream_strips = DepthwiseStreamStripsSwitch::Long;
    else
      CNN_FAIL("CNN_DEPTHWISE_STREAM_STRIPS='{}': expected fill, long or auto", s);
  }
  if (const char* v = get("CNN_GROUPED_DENSE")) {
    const std::string s(v);
    if (s == "auto")
      e.grouped_dense = GroupedDenseSwitch::Auto;
    else if (s == "groups")
      e.grouped_dense = GroupedDenseSwitch::PerGroup;
    else if (s == "diagonal")
      e.grouped_dense = GroupedDenseSwitch::BlockDiagonal;
    else if (s == "direct")
      e.grouped_dense = GroupedDenseSwitch::Direct;
    else
      CNN_FAIL("CNN_GROUPED_DENSE='{}': expected groups, diagonal, direct or auto", s);
  }
  e.int8_direct = off_unless_set("CNN_INT8_DIRECT");
  e.int8_fuse_classifier = off_unless_set("CNN_INT8_FUSE_CLASSIFIER");
  if (const char* v = get("CNN_CPU_ISA")) {
    const std::string s(v);
    if (s == "scalar")
      e.cpu_isa = CpuIsaSwitch::Scalar;
    else if (s == "avx2")
      e.cpu_isa = CpuIsaSwitch::Avx2;
    else if (s == "avx512")
      e.cpu_isa = CpuIsaSwitch::Avx512;
    else
      CNN_FAIL("CNN_CPU_ISA='{}': expected scalar, avx2 or avx512", s);
  }
  if (const char* v = get("CNN_CPU_THREADS")) {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    CNN_CHECK(end != v && *end == '\0' && n >= 1 && n <= 256,
              "CNN_CPU_THREADS='{}': expected an integer from 1 to 256", v);
    e.cpu_threads = static_cast<int>(n);
  }
  e.sync_check = off_unless_set("CNN_SYNC_CHECK");
  if (const char* v = get("CNN_NCCL_LIBRARY")) e.nccl_library = v;
  if (const char* v = get("CNN_NCCL_TIMEOUT_S")) {
    char* end = nullptr;
    const double t = std::strtod(v, &end);
    CNN_CHECK(end != v && *end == '\0' && t >= 1 && t <= 86400,
              "CNN_NCCL_TIMEOUT_S='{}': expected seconds from 1 to 86400", v);
    e.nccl_timeout_s = t;
  }
  return e;
}

const EnvSwitches& process_env_switches() {
  static const EnvSwitches e = read_env_switches();
  return e;
}

const std::vector<EnvSwitchRow>& env_switch_table() {
  static const std::vector<EnvSwitchRow> rows = {
      {"CNN_ALGO", "auto|naive|tiled|igemm|fast|wgmma|wgmma-nhwc",
       "every conv and linear layer's kernel variant"},
      {"CNN_ALGO_CONV, CNN_ALGO_LINEAR", "as CNN_ALGO", "the variant of one kind of layer"},
      {"CNN_AUTOTUNE", "0", "no start-up timing of variants: each op's fixed rule picks"},
      {"CNN_FUSE_POOL", "0", "no fused conv-relu-maxpool kernel"},
      {"CNN_FUSE_BN_RELU", "0", "a relu after a batchnorm runs as its own pass, not folded in"},
      {"CNN_FUSE_RESIDUAL", "0",
       "a residual block's add and the relu after it run as their own passes, not in the "
       "batchnorm that ends the block's branch"},
      {"CNN_CUDA_GRAPH", "0", "launch each training step's kernels directly, no CUDA graph"},
      {"CNN_GRAD_OVERWRITE", "1|0",
       "1 (default): a training step's backward writes the weight gradients of linear layers "
       "(not a CUDA classifier head's) instead of adding to them, and its update leaves them "
       "unzeroed; 0: every gradient is added to, and zeroed by the update"},
      {"CNN_CONV_SHARED_DY", "1|0",
       "1 (default): a convolution whose weight and input gradients both run wgmma-nhwc at bf16 "
       "writes dy's channels-last copy once for both; 0: each pass writes its own"},
      {"CNN_EARLY_UPDATE", "0|1",
       "1: a training step updates each range of parameters as soon as backward has finished "
       "their gradients, on a second stream beside the rest of backward (SGD, Adam, AdamW "
       "without clip_grad_norm, one GPU; same bits); 0 (default): one update after backward"},
      {"CNN_WGRAD_BESIDE", "1|0",
       "1 (default): training on a GPU runs convolutions' and linear layers' weight gradients on "
       "a second stream beside their input gradients and the rest of backward (same bits); 0: "
       "in turn on the one stream"},
      {"CNN_TUNE_BACKWARD", "1|0",
       "1 (default): where weight gradients run beside (CNN_WGRAD_BESIDE), autotune also times "
       "the whole backward pass with the backward passes' runner-up variants and keeps those "
       "that shorten it; 0: the variants fastest alone"},
      {"CNN_GRAPH_OVERLAP", "exit|start|0",
       "when the training step's graph launches a kernel, which then waits on the GPU for the "
       "one before it (programmatic dependent launch; same results): once every block of the "
       "one before has exited (exit, the default) or begun (start); 0: after it has completed"},
      {"CNN_GEMM_PATH", "strided|tile|wgmma|auto",
       "the CUDA GEMM's path (strided: any alignment; wgmma: Hopper, TF32)"},
      {"CNN_WGMMA_MN", "tma|gather",
       "how the wgmma GEMM loads M/N-contiguous operands (tma: TMA, then a shared-memory "
       "transpose)"},
      {"CNN_WGMMA_SPLITS", "auto|1|2|4|8|16",
       "the k splits (blocks of one cluster) of every wgmma GEMM launch, where the caller leaves "
       "the count to the GEMM (auto: its pick)"},
      {"CNN_WGMMA_GROUPS", "auto|1|2|4|8|16",
       "the wgmma GEMM's k split further across that many clusters, summed by a second kernel, "
       "where its caller gives it a workspace (the linear layers; 1: none; auto: its pick)"},
      {"CNN_WGMMA_CONV_GATHER", "async|waitgroup|sync",
       "how the wgmma convolution gathers im2col (async: cp.async + mbarrier; waitgroup: "
       "cp.async groups; sync: loads and stores)"},
      {"CNN_WGMMA_CONV_BN", "64|128|auto", "the wgmma convolution's block tile width"},
      {"CNN_WGMMA_NHWC_BN32", "1|0",
       "whether the wgmma-nhwc convolution picks its 32-column tile where N <= 32"},
      {"CNN_WGMMA_NHWC_PHASES", "1|0",
       "1 (default): algo wgmma-nhwc (and auto) takes strided input gradients, as their "
       "phases; 0: they are left to the other variants"},
      {"CNN_WGMMA_NHWC_STACK", "1|0",
       "1 (default): a strided input gradient's phases on the wgmma-nhwc kernel launch up to "
       "four in one grid at TF32 and BF16; 0: one launch a phase"},
      {"CNN_WGMMA_NHWC_HALO", "auto|1|0",
       "how the wgmma-nhwc convolution loads its input: one TMA box of a tile's rows with their "
       "halo per channel chunk (1, stride 1), one im2col copy per filter tap (0), or its pick"},
      {"CNN_WGMMA_NHWC_PER_SM", "1|2|auto",
       "resident blocks an SM of the wgmma-nhwc convolution (auto: 2 past one wave)"},
      {"CNN_WGMMA_NHWC_SPLITS", "1|2|4|8|auto",
       "K splits of each launch of the wgmma-nhwc convolution (auto: as many as "
       "keep one wave at one block an SM and 4 k-tiles a split)"},
      {"CNN_WGMMA_NHWC_BM", "128|256|auto",
       "tile rows of the wgmma-nhwc convolution's 128-column tiles (auto: 256 where that grid, "
       "split at most in two, covers 90% of the SMs)"},
      {"CNN_WGMMA_WGRAD_NHWC_N", "64|128|auto",
       "the columns each consumer of the BF16 channels-last weight gradient multiplies (auto: "
       "64)"},
      {"CNN_WGMMA_WGRAD_NHWC_HALO", "auto|1|0",
       "how the BF16 channels-last weight gradient loads x: one TMA box of a k-tile's rows with "
       "their halo that every filter tap reads (1, stride 1), one im2col copy per tap (0), or its "
       "pick"},
      {"CNN_WGMMA_WGRAD_TF32_HALO", "1|0",
       "1 (default): algo wgmma-nhwc (and auto) runs TF32 weight gradients of stride-1 layers "
       "on the TF32 halo kernel where it takes them; 0: on the im2col GEMM or wgmma's boxes"},
      {"CNN_WGMMA_WGRAD", "async|sync",
       "how the wgmma conv weight gradient hands its cp.async copies to the tensor cores (sync: "
       "each producer thread waits for its copies, then arrives)"},
      {"CNN_WGMMA_WGRAD_B", "algo|gather|tma",
       "where the wgmma conv weight gradient's im2col operand comes from (algo, the default, "
       "and tma: TMA boxes of copies of x where the shape allows and C >= 8, else the cp.async "
       "gather; gather: the gather everywhere)"},
      {"CNN_WGMMA_WGRAD_BOX_RUN", "8|16|32|64|128|auto",
       "channels a TMA box of the wgmma conv weight gradient's im2col operand holds (auto: the "
       "fewest boxes a stage for at most a quarter more zero columns, or a cost model's run "
       "where it predicts 7% less; 8: one box per 8 channels)"},
      {"CNN_WGMMA_WGRAD_BOX_X", "direct|copies",
       "whether the wgmma conv weight gradient's TMA boxes read x itself for the tap class that "
       "needs no copy (stride 1, W a multiple of 4), or a copy of x for every class"},
      {"CNN_WGMMA_WGRAD_MULTICAST", "1|0",
       "1 (default): the wgmma conv weight gradient's TMA-box blocks (TF32) share dy's tiles and "
       "x's boxes in thread-block clusters by TMA multicast; 0: each block loads its own"},
      {"CNN_CONV_GENERIC", "1", "implicit-GEMM conv gradients on the generic main loop"},
      {"CNN_LINEAR_HEAD", "0",
       "a CUDA linear layer of at most 32 outputs runs its backward as separate passes (weight "
       "and bias gradient, input gradient, the previous layer's ReLU mask and bias gradient), not "
       "as one kernel"},
      {"CNN_BN_ONE_PASS", "0|all",
       "0: BatchNorm training passes on the three-launch kernels (sums, finish, then elementwise) "
       "for every shape, never in one launch on thread-block clusters (channels of <= 131072 "
       "values); all: in one launch wherever a channel fits, whatever its cluster size (default: "
       "clusters of at most 4 blocks)"},
      {"CNN_CONV_DGRAD_PHASES", "0",
       "strided implicit-GEMM input gradients by division (every tap) instead of by phases"},
      {"CNN_CONV_WGRAD_WINDOW", "1",
       "implicit-GEMM weight gradients on the window kernel where it applies (stride 1, small "
       "OC, TF32/BF16: its input window in shared memory read by every tap; slower today)"},
      {"CNN_CRP_TENSOR_CORES", "1",
       "the fused conv-relu-maxpool of a one-channel first layer (forward and weight gradient) "
       "on the tensor cores at precision tf32 / bf16 (default: the FP32 kernels)"},
      {"CNN_BF16_SMEM", "bf16|f32",
       "BF16 implicit-GEMM convs: operand tiles in shared memory as bf16 pairs (default) or "
       "floats"},
      {"CNN_DEPTHWISE_KERNEL", "tile|rows|stream|flat|auto",
       "the fast depthwise convolution's kernel (rows, flat: forward and input gradient only)"},
      {"CNN_DEPTHWISE_STREAM_STRIPS", "fill|long|auto",
       "how the depthwise stream kernels cut planes into strips (auto: long for the weight "
       "gradient, fill for the others)"},
      {"CNN_GROUPED_DENSE", "groups|diagonal|direct|auto",
       "how igemm / wgmma / wgmma-nhwc run a grouped convolution: one dense convolution a group, "
       "or one on block-diagonal weights (auto: also wgmma-nhwc on the grouped shape itself where "
       "the groups are wide; direct: wherever it can)"},
      {"CNN_INT8_DIRECT", "1",
       "int8 inference: every layer on the direct dp4a kernel, none on tensor cores"},
      {"CNN_INT8_FUSE_CLASSIFIER", "1",
       "int8 inference: the classifier runs inside the linear layer before it, not alone"},
      {"CNN_CPU_ISA", "scalar|avx2|avx512", "cap the CPU kernels' instruction set"},
      {"CNN_CPU_THREADS", "1..256", "threads of the CPU kernels (default: the cores, at most 16)"},
      {"CNN_SYNC_CHECK", "1", "synchronize after every launch, so a fault names its kernel"},
      {"CNN_NCCL_LIBRARY", "FILE|DIR",
       "multi-GPU training: libnccl.so.2 to load (over training.nccl_library)"},
      {"CNN_NCCL_TIMEOUT_S", "1..86400",
       "multi-GPU training: a step's collectives slower than this stop the run (default 600)"},
      // Set by train --gpus N for its rank processes (or taken from mpirun's OMPI_COMM_WORLD_*).
      {"CNN_RANK, CNN_WORLD_SIZE, CNN_LOCAL_RANK", "0..N-1, N, 0..",
       "this process is one rank of a data-parallel run (set by the launcher)"},
      {"CNN_AUTOTUNE_CACHE", "0|FILE", "no autotune cache, or this file instead of the user's"},
      {"CNN_DATA_CACHE", "0", "no decoded copy (<file>.decoded) beside gzip IDX image files"},
  };
  return rows;
}

}  // namespace cnn
