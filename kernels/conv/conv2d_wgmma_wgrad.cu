// Weight gradient on Hopper wgmma (see conv2d_wgmma_wgrad.h): C (M = OC, N = C*KH*KW [+1]) +=
// A (M, K) B (K, N), K = the pixels of all images, in k-tiles of 32 pixels. Two ways to cut K:
//   per image (OH*OW a multiple of 4 and >= 32): k-tiles never cross an image (each image's
//     OH*OW pixels padded with zeros to a multiple of 32), a k-tile is one image's pixels
//     [p0, p0 + 32), and dy can come by TMA;
//   packed (OH*OW not a multiple of 4, or < 32): k-tiles run over the N*OH*OW pixels of the
//     batch as one sequence, crossing images, both operands gathered. dy would be gathered there
//     anyway (TMA's stride rule), and for small images the per-image padding would waste most of
//     a k-tile (OH*OW = 16: half, 4: seven eighths) in both the gather and the tensor cores.
//   The choice depends on the shape alone, so the split and the scratch size do too.
//   A[oc][k] = dy[n][oc][p]: K-contiguous. Per image and dy 16-byte aligned: TMA with a 3-D
//     tensor map (OH*OW, OC, N), boxes (32 pixels, BM rows, 1 image), 128-byte swizzle, zero fill
//     past OH*OW and OC; else gathered like B (lanes = consecutive pixels, 4-byte cp.async).
//   B^T[j][k] = x[n][c][oy*sh - ph + kh][ox*sw - pw + kw] for column j = (c, kh, kw): the im2col
//     gather, by the producer warpgroup with 4-byte cp.async (zero fill for padding and pixels past
//     OH*OW) straight into the K-major 128-byte-swizzled layout wgmma reads: a warp copies 32
//     consecutive pixels (lanes) of one column j, i.e. 32 consecutive floats of a row of x for
//     stride 1, 128 contiguous bytes of one swizzled shared-memory row.
//   Column j = C*KH*KW is the bias gradient when db is given: a row of ones in every stage, written
//     once (A is zero for pixels that do not exist, so the ones there add nothing); columns past
//     it are zero rows.
// One block: one BM x 128 tile of C over its split's k-tiles; a producer warpgroup and BM / 64
// consumer warpgroups, each 4 wgmma.m64n128k8 per 32-pixel stage on its 64 rows; a ring of 4
// stages (6 for boxed B with BM = 128, WgPlan) on full/empty mbarriers as in gemm_wgmma.cu.
//
// Tile: BM = 64 (one consumer warpgroup, 256 threads, 2 blocks per SM) when OC <= 64, else 128
// (two consumer warpgroups, 384 threads, 1 block per SM). A 128-row tile for OC = 64 would gather
// the same B for half a tile of zero rows: the B gather (32 cp.async per producer thread and
// stage) is the producer's whole cost, and the 64-row tile keeps it at 128 columns for 64 useful
// rows, while two resident blocks per SM keep two producers and two consumers busy.
//
// Why the consumers fence: cp.async writes shared memory through the generic proxy, and wgmma
// reads its operands through the async proxy; the PTX memory model orders the two only across a
// proxy fence (fence.proxy.async), and the producer cannot execute one after its copies land
// without waiting for them (cp.async.mbarrier.arrive completes later, on its own). So each
// consumer thread, once its mbarrier wait has made the copies visible to it (the arrive-on has
// release semantics, the wait acquire), executes fence.proxy.async.shared::cta before its wgmmas
// of that stage. (CUTLASS's cp.async warp-specialized sm90 mainloop issues no fence at all; the
// fence costs a few cycles per stage and makes the ordering the one the model documents.) The TMA
// tile of A needs none: TMA writes through the async proxy. CNN_WGMMA_WGRAD=sync selects the
// other documented form: each producer thread waits for its own copies (cp.async.wait_all),
// fences, then arrives, as the wgmma GEMM's verified gather does.
//
// B by TMA boxes (opt.b Tma/Auto; conv2d_wgrad_box.h has the geometry and a CPU model): a k-tile is
// a box of br x bw output pixels of one image (bw br = 32) instead of 32 consecutive pixels, so
// that both operands are tiled TMA boxes: A = dy viewed (OW, OC, OH, N), box (bw, BM, br, 1), and
// per piece of the tile (run consecutive channels of one tap, run 8..128) one box (bw, run, br,
// 1) of a copy of x viewed (Wc, C, Hc, R N), or one box (bw, run, 1, 1) per output row where the
// descriptor's one stride could not read a whole box (conv2d_wgrad_box_smem.h). The
// alignment rule: a tiled TMA load whose innermost coordinate is not a multiple of 16 bytes stops
// Hopper with an illegal instruction (not in the driver's documentation; measured on the H200 by
// scripts/tma_coordinate_probe.cu, as triton-lang/triton#7385 and tile-ai/tilelang#2681 report),
// and a box of x itself would start at column ox0 sw - pw + kw (-1 for a padding-1 tap). TMA also
// ignores the traversal stride of the innermost dimension
// (cuda.h), which a stride-2 box of x needed. So a pre-pass (conv2d_wgrad_box_copies.cu) writes
// into the scratch one copy of x per tap class (kh mod sh, kw mod 4 sw), indexed by output pixel
// with the padding as zeros; tap (kh, kw) reads its class's copy at (ox0 + 4 mw, oy0 + mh):
// innermost coordinate a multiple of 4 floats, every coordinate >= 0, unit traversal strides,
// as the dy boxes (whose corner ox0 is a multiple of 8 already). Boxes past the output pixels
// or past C read TMA's out-of-bounds zeros. One class needs no copy where the stride is 1 and
// W a multiple of 4: the class of column shift 0 (qw = pw, the direct class of
// conv2d_wgrad_box.h) is x moved by ph rows, so its boxes read x itself through a third map
// (map_xd, plane = image, row oy0 + kh - ph: TMA's zero fill is the padding above x as below
// it; rows -1 and -3 measured by scripts/tma_coordinate_probe.cu) and the pre-pass skips its copy
// (3x3 padding 1: 2 copies written instead of 3). Where the boxes land (conv2d_wgrad_box_smem.h,
// and the CPU emulation in tests/test_conv_wgrad_box.cpp): the output row is the outermost box
// dimension, so a box lands as br slabs of [BM rows or run channels][bw floats]; the swizzle span
// is bw * 4 bytes (32B, 64B, 128B), because a box row narrower than the span takes the whole span
// in shared memory (scripts/tma_coordinate_probe.cu: 8 floats under the 128-byte swizzle land 128
// bytes apart). The consumers' k8 step s reads slab 8 s / bw at byte (8 s % bw) 4 with the span's
// descriptor layout type and SBO = 8 rows of the span (A, and B in pieces of 16..128) or 1024 bytes
// (B in groups of 8: the next group's box). Thread 0 issues the stage's arrive.expect_tx and then
// every box (B's from a table of box corners and destinations in shared memory, then A); few boxes
// matter: the TMA unit took ~2.4 us for a stage of 16 boxes of 1 KB (conv2d_wgrad_box.h), so 128
// channels come as one box. One thread issues them, as in every TMA load verified on the H200;
// where OW is not a multiple of 4 (dy's row stride is no multiple of 16 bytes) the producer gathers
// A into the same slabs instead. Columns are (tap, channel piece, channel) and map back to
// dw[oc][c][kh][kw] in the epilogue; the bias column follows the last piece.
//
// Multicast (boxed B with dy by TMA, TF32; WgmmaWgradOptions::multicast): each block reads 32 KB a
// k-tile from L2 for 2 x 128 x 128 x 32 FLOP, and on VGG's 256-channel 8x8 layer (108 blocks)
// ncu found L2 69% busy and the SMs' compute at 21%. The blocks of one split in a row of tiles
// multiply the same dy tile, those in a column the same boxes of x. So blocks run in clusters of
// (cx, 1, cz) (conv2d_wgrad_wgmma_cluster: at most 4, cz = 2 row tiles, cx = 2 or 3 column
// tiles) and each load goes once to all that use it: the block with rx = 0 of a row issues its
// dy tile to the row, the block with rz = 0 of a column its boxes to the column, with
// .multicast::cluster into the same offsets and barriers of each; every block still arrives
// expect_tx for its own whole stage (bytes may land before that arrival: the phase cannot
// complete without it). A stage is rewritten in several blocks at once, so lane 0 of each
// consumer warp releases it on every block's empty barrier of the cluster (remote
// mbarrier.arrive at CTA scope: at cluster scope the layer took 2.1x as long), and each producer
// waits until all of them have; the blocks meet at a cluster barrier after the barriers are
// initialized and before any exits. The products, and their order, are those of the blocks' own
// loads. That layer's pass: 129.3 -> 104.5 us on the H100 (docs/performance.md).
//
// Split-K, at least 4 k-tiles a split, on 132 SMs (a constant, not a device query, so that the
// deterministic scratch size depends on the shape alone): the split that fills one wave at most
// (split_k.h) over the grid's own tiles, the db column counted only where db is asked for
// (C*KH*KW a multiple of 128, as for 128 or 256 channels at 3x3, would otherwise count a tile
// of one column: VGG's 128-channel 16x16 layer took 13 splits for 10 tiles where 14 fit its 9,
// 108.1 -> 106.1 us on the H100). Partial tiles go from the
// accumulator registers to dw/db by atomicAdd, or into scratch[split][slot] (deterministic),
// summed in split order by wgrad_wgmma_reduce.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "kernels/common/ptx.cuh"
#include "kernels/common/split_k.h"
#include "kernels/conv/conv2d_wgmma_wgrad.h"
#include "kernels/conv/conv2d_wgrad_box.h"
#include "kernels/conv/conv2d_wgrad_box_copies.h"
#include "kernels/conv/conv2d_wgrad_dy_map.h"
#include "kernels/gemm/gemm_wgmma.h"
#include "kernels/gemm/wgmma_ptx.cuh"
#include "runtime/cuda_check.h"
#include "runtime/env_switches.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

using namespace wgmma;

constexpr int kBK = 32;    // pixels per stage: one 128-byte swizzle row of fp32
constexpr int kBN = 128;   // columns j per tile (B^T tile rows)
constexpr int kSms = 132;  // an H200's SMs: the split target (see the file comment)
constexpr int kMinKtilesPerSplit = 4;
constexpr int kBoxRuns[] = {8, 16, 32, 64, 128};  // the runs a piece of boxed B may have

// kBoxB: B by TMA boxes. Its 128-row tile (one block an SM, where shared memory has room past 4
// stages of 32 KB) keeps 6 stages in flight: its stages wait on TMA's latency (the file comment),
// not on the producer's issue as the gather's do.
//
// kSplit, the 3xTF32 instance (FP32 accuracy): the consumers round each stage to TF32 in place and
// write its TF32 residual into one of kSmallSets mirror copies of a stage (A_small, B_small at the
// stage's own offsets, so the descriptors only change base), then multiply small_A big_B + big_A
// small_B + big_A big_B. Three sets: a set is rewritten three stages on, when every consumer has
// passed the split barrier of the stage between and so waited for the wgmmas that read it
// (two would let one warpgroup overwrite a set the other still reads). One block an SM: 3 (BM 128)
// or 4 (BM 64) stages plus the sets.
template <int kBM, bool kBoxB, bool kSplit = false>
struct WgPlan {
  static constexpr int kConsumers = kBM / 64;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kMinBlocks = kBM == 64 && !kSplit ? 2 : 1;
  static constexpr int kStages = kSplit ? (kBM == 128 ? 3 : 4) : kBM == 128 && kBoxB ? 6 : 4;
  static constexpr int kSmallSets = kSplit ? 3 : 0;
  static constexpr int kATileBytes = kBM * kBK * 4;
  static constexpr int kBTileBytes = kBN * kBK * 4;
  static constexpr int kStageBytes = kATileBytes + kBTileBytes;
  static constexpr int kSmallOffset = kStages * kStageBytes;                    // the residual sets
  static constexpr int kTableOffset = kSmallOffset + kSmallSets * kStageBytes;  // int4 a column
  static constexpr int kDstOffset = kTableOffset + kBN * 16;  // box mode: uint32 per box of B
  static constexpr int kBarrierOffset = kDstOffset + kBN * 4;
  static constexpr int kSmemBytes = 1024 + kBarrierOffset + 2 * kStages * 8;  // + alignment
  static_assert(kATileBytes % 1024 == 0, "tiles must stay 1024-byte aligned for the swizzle");
  static_assert(kMinBlocks * (kSmemBytes + 1024) <= 228 * 1024, "blocks per SM do not fit");
};

struct WgradParams {
  const float* x;   // (N, C, H, W)
  const float* dy;  // (N, OC, OH, OW)
  float* dw;        // (OC, C*KH*KW), accumulated
  float* db;        // (OC) or null, accumulated
  float* scratch;   // deterministic: (splits, slots); else null
  int oc, h, w, kh, kw, khw, sh, sw, ph, pw, ow;
  int dil_h, dil_w;  // the gather reads tap (kh, kw) at (dil_h kh, dil_w kw) from the window origin
  // Groups (the gather only): oc is a group's output channels and tiles_m its row tiles; block z
  // runs row tile z % tiles_m of group z / tiles_m, on x's channels from group_x floats on, dy's
  // and dw's rows from z / tiles_m * oc on; oc_all: OC, dy's channels an image and dw's rows.
  int tiles_m, oc_all;
  int64_t group_x;
  int ohw, hw;
  int64_t chw;  // floats per image of x
  int ckhw;     // C*KH*KW
  int ncols;    // ckhw (+1 with db)
  int npix;     // N*OH*OW
  bool packed;  // k-tiles over all pixels of the batch, else per image (file comment)
  int kt_img;   // per image: k-tiles per image, ceil(OH*OW / 32)
  int ktiles;   // packed: ceil(npix / 32); per image: N * kt_img
  int splits;
  int64_t slots;  // scratch floats per split: OC*ckhw + OC
  // B by TMA boxes (conv2d_wgrad_box.h); live_cols: the columns B's boxes fill (ckhw gathered).
  int live_cols;
  int c, oh, bw, br, boxes_x, cgroups, groups;
  WgradBoxBLayout b;       // pieces of b.run channels (conv2d_wgrad_box_smem.h)
  int run_shift;           // log2(b.run)
  int n;                   // images: copy q's planes are [q N, q N + N) of the boxes' view
  int copies_h, copies_w;  // tap classes (kh mod sh, kw mod 4 sw) of the copies of x
  int direct_copy;         // the class whose boxes read x itself (map_xd), -1 none
  // The multicast cluster (cx, 1, cz) of boxed B with dy by TMA (file comment); 1, 1 elsewhere.
  int cx, cz;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CNN_WGMMA_WGRAD_DEVICE_CODE 1
#endif

// Thread mapping: see the file comment. Grid (tiles_n, splits, G tiles_m): block (x, z) owns C rows
// [BM (z % tiles_m), +BM) of group z / tiles_m (one group without groups) x columns [128 x, +128),
// split y its k-tiles [y T / splits, (y + 1) T / splits).
// Producer (warpgroup 0): lane l of warp w copies pixel l of the k-tile into rows j = w + 4 i.
// Consumer warpgroup g (1..BM/64): rows [64 (g - 1), +64), the wgmma fragment layout
// (wgmma_ptx.cuh), and each thread adds its own fragment elements to dw/db in the epilogue.
// kBoxB: B by TMA boxes (file comment); then lane 0 of producer warp 0 issues them, and with kTmaA
// (dy by the 4-D box map) it alone works, else all four gather A in box pixel order.
// kSplit: 3xTF32 (WgPlan).
template <int kBM, bool kTmaA, bool kBoxB, bool kSync, bool kSplit>
__global__ void __launch_bounds__(WgPlan<kBM, kBoxB, kSplit>::kThreads,
                                  WgPlan<kBM, kBoxB, kSplit>::kMinBlocks)
    wgrad_wgmma_kernel(const __grid_constant__ CUtensorMap map_dy,
                       const __grid_constant__ CUtensorMap map_x,
                       const __grid_constant__ CUtensorMap map_xd,
                       const __grid_constant__ WgradParams p) {
  ptx::griddep_enter();
#ifdef CNN_WGMMA_WGRAD_DEVICE_CODE
  using P = WgPlan<kBM, kBoxB, kSplit>;
  constexpr int kStages = P::kStages;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  int4* const table = reinterpret_cast<int4*>(smem_raw + (base - raw) + P::kTableOffset);
  uint32_t* const box_dst = reinterpret_cast<uint32_t*>(smem_raw + (base - raw) + P::kDstOffset);
  const uint32_t bars = base + P::kBarrierOffset;  // full[kStages], empty[kStages]
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (kStages + s); };
  auto tile_a = [&](int s) { return base + uint32_t(s) * P::kStageBytes; };
  auto tile_b = [&](int s) { return tile_a(s) + uint32_t(P::kATileBytes); };
  // kSplit: residual set q (A_small, then B_small, at a stage's offsets).
  auto residual_set = [&](int q) { return base + uint32_t(P::kSmallOffset + q * P::kStageBytes); };

  const int tid = threadIdx.x, lane = tid & 31, wg = tid / 128;
  const int n0 = int(blockIdx.x) * kBN, split = int(blockIdx.y);
  const int grp = int(blockIdx.z) / p.tiles_m, m0 = (int(blockIdx.z) - grp * p.tiles_m) * kBM;
  const int oc0 = grp * p.oc;                             // the group's first output channel
  const float* const x = p.x + int64_t(grp) * p.group_x;  // and its first input channel
  // This block's place (rx, rz) in its multicast cluster, cluster rank rx + cx rz.
  const int csize = p.cx * p.cz, rx = int(blockIdx.x) % p.cx, rz = int(blockIdx.z) % p.cz;
  const int own_rank = rx + rz * p.cx;
  const int kt_begin = int(int64_t(p.ktiles) * split / p.splits);
  const int kt_end = int(int64_t(p.ktiles) * (split + 1) / p.splits);
  const int nk = kt_end - kt_begin;

  // Box mode: the pieces of run columns of this tile that B's boxes fill (the rest are constant
  // rows), and the boxes that fill them (one or br a piece, conv2d_wgrad_box_smem.h).
  const int run = kBoxB ? p.b.run : 8;
  const int live_pieces = kBoxB ? max(0, min(kBN / run, p.groups - (n0 >> p.run_shift))) : 0;
  const int nboxes = live_pieces * (kBoxB ? p.b.boxes_per_piece : 1);
  // full: the 128 producer threads' cp.async arrivals (when they gather), plus thread 0's
  // expect_tx arrival for TMA. empty: lane 0 of each consumer warp; with kSplit every consumer
  // thread, each releasing its own in-place writes of the stage before the producer copies into
  // it again; in a multicast cluster lane 0 of every consumer warp of the cluster (a stage is
  // rewritten in every block of an A row or B column at once).
  if (tid == 0)
    mbar_init_ring(bars, kStages, (kBoxB && kTmaA ? 0 : 128) + (kTmaA || kBoxB ? 1 : 0),
                   (kSplit ? 128 * P::kConsumers : 4 * P::kConsumers) * csize);
  // Column table: thread t < 128 decomposes column n0 + t once, {offset of tap (c, kh, kw) from
  // the window origin in x, kh, kw, live}; a column past C*KH*KW gets its constant row (ones for
  // db, else zeros) in every stage now, never copied again. Box mode: entry b < nboxes is box
  // b % per of piece n0 / run + b / per (per = boxes_per_piece) instead, {x, y from the k-tile's
  // output origin, first channel, first plane of its tap's copy} (wgrad_box_corner, y one row on
  // a slab), and box_dst[b] where it lands in B (wgrad_box_b_dst).
  if (tid < kBN) {
    const int j = n0 + tid;
    int4 e = make_int4(0, 0, 0, 0);
    if (j < p.live_cols) {
      if constexpr (!kBoxB) {
        const int c = j / p.khw, rs = j - c * p.khw;
        const int r = (rs / p.kw) * p.dil_h, s = (rs - rs / p.kw * p.kw) * p.dil_w;
        e = make_int4(c * p.hw + r * p.w + s, r, s, 1);
      }
    } else {
      const float v = j < p.ncols ? 1.f : 0.f;
      for (int s = 0; s < kStages; ++s)
        for (int q = 0; q < kBK; q += 4)  // column tid's row, where B's boxes would land it
          st_shared_v4(
              tile_b(s) + wgrad_box_b_offset(kBoxB ? p.bw : kBK, kBoxB ? p.b.slab_rows : 8, tid, q),
              v, v, v, v);
    }
    if constexpr (kBoxB) {
      if (tid < nboxes) {
        const int piece = tid / p.b.boxes_per_piece, r = tid - piece * p.b.boxes_per_piece;
        const int group = (n0 >> p.run_shift) + piece;
        const int tap = group / p.cgroups, cg = group - tap * p.cgroups;
        const int kh = tap / p.kw, kw = tap - kh * p.kw;
        const int copy = (kh % p.copies_h) * p.copies_w + kw % p.copies_w;
        // The direct class reads x itself (plane -1: the image; rows ph up, wgrad_box_corner).
        const bool direct = copy == p.direct_copy;
        e = make_int4(4 * (kw / p.copies_w), kh / p.copies_h + r - (direct ? p.ph : 0), cg * run,
                      direct ? -1 : copy * p.n);
        box_dst[tid] = wgrad_box_b_dst(p.bw, p.b, piece, r);
      }
    }
    table[tid] = e;
  }
  // Rows of a gathered A past OC stay zero (TMA zero-fills them itself).
  if (!kTmaA && tid < kBM && m0 + tid >= p.oc)
    for (int s = 0; s < kStages; ++s)
      for (int q = 0; q < kBK; q += 4)
        st_shared_v4(tile_a(s) + wgrad_box_smem_offset(kBoxB ? p.bw : kBK, kBM, tid, q), 0.f, 0.f,
                     0.f, 0.f);
  fence_proxy_async();  // the constant rows above are read by wgmma (async proxy)
  // Every barrier of the cluster initialized before any block copies into or arrives on it.
  if (csize > 1)
    cluster_sync();
  else
    __syncthreads();

  if (wg == 0 && kBoxB) {
    const int warp = tid >> 5;
    if (kTmaA && warp != 0) return;
    // Each piece is run columns of 32 pixels, however many boxes bring it.
    const uint32_t tx_bytes = (kTmaA ? uint32_t(P::kATileBytes) : 0u) +
                              uint32_t(live_pieces) * uint32_t(run) * uint32_t(kBK) * 4u;
    // This lane's pixel q = lane of the box (gathered A only).
    const int q_r = lane / p.bw, q_col = lane - q_r * p.bw;
    // The cluster ranks of B's column (rx, all rz) and of A's row (all rx, rz).
    uint16_t b_mask = 0, a_mask = uint16_t(((1u << p.cx) - 1u) << (rz * p.cx));
    for (int j = 0; j < p.cz; ++j) b_mask |= uint16_t(1u << (rx + j * p.cx));
    for (int i = 0; i < nk; ++i) {
      const int s = i % kStages;
      if (i >= kStages) mbar_wait(empty(s), ((i / kStages) - 1) & 1);
      const int t = kt_begin + i;
      const int img = t / p.kt_img, tt = t - img * p.kt_img;
      const int by = tt / p.boxes_x;
      const int ox0 = (tt - by * p.boxes_x) * p.bw, oy0 = by * p.br;
      if (warp == 0 && lane == 0) {
        // One thread issues the stage's expect_tx and every copy of it, as in every TMA load
        // verified on the H200 (conv2d_wgmma_nhwc.cu, the gathered-B dy load below); each
        // box of B from the table, at innermost coordinate ox0 + 4 mw: a multiple of 4 floats;
        // coordinates (column, channel, row, plane) and (column, oc, row, image): the views put
        // the output row outermost so that a box lands as br slabs (conv2d_wgrad_box_smem.h).
        // In a multicast cluster the blocks of B's column (rz = 0 issues) get its boxes and the
        // blocks of A's row (rx = 0 issues) its dy tile, each on its own barriers.
        mbar_arrive_expect_tx(full(s), tx_bytes);
        if (rz == 0)
          for (int b = 0; b < nboxes; ++b) {
            const int4 e = table[b];
            const CUtensorMap* map = e.w < 0 ? &map_xd : &map_x;  // direct: x, (W, C, H, N)
            const int plane = e.w < 0 ? img : e.w + img;
            if (p.cz > 1)
              tma_load_4d_multicast(tile_b(s) + box_dst[b], map, ox0 + e.x, e.z, oy0 + e.y, plane,
                                    full(s), b_mask);
            else
              tma_load_4d(tile_b(s) + box_dst[b], map, ox0 + e.x, e.z, oy0 + e.y, plane, full(s));
          }
        if (kTmaA && rx == 0) {
          if (p.cx > 1)
            tma_load_4d_multicast(tile_a(s), &map_dy, ox0, oc0 + m0, oy0, img, full(s), a_mask);
          else
            tma_load_4d(tile_a(s), &map_dy, ox0, oc0 + m0, oy0, img, full(s));
        }
      }
      if constexpr (!kTmaA) {
        const int oy = oy0 + q_r, ox = ox0 + q_col;
        const bool pv = oy < p.oh && ox < p.ow;
        const int64_t dy_pix = (int64_t(img) * p.oc_all + oc0) * p.ohw + int64_t(oy) * p.ow + ox;
        const uint32_t a_stage = tile_a(s);
#pragma unroll 8
        for (int rr = 0; rr < kBM / 4; ++rr) {
          const int m = warp + 4 * rr;
          if (m0 + m >= p.oc) break;  // m ascends with rr
          const uint32_t dst = a_stage + wgrad_box_smem_offset(p.bw, kBM, m, lane);
          cp_async4_zfill(dst, p.dy + (pv ? dy_pix + int64_t(m0 + m) * p.ohw : 0), pv ? 4u : 0u);
        }
        if constexpr (kSync) {
          cp_async_wait_all();
          fence_proxy_async();
          mbar_arrive(full(s));
        } else {
          cp_async_mbarrier_arrive_noinc(full(s));
        }
      }
    }
    if constexpr (!kTmaA) cp_async_wait_all();
    return;
  }
  if (wg == 0) {
    const int warp = tid >> 5;
    const uint32_t lane_chunk = uint32_t(lane >> 2), lane_byte = uint32_t(lane & 3) * 4;
    for (int i = 0; i < nk; ++i) {
      const int s = i % kStages;
      if (i >= kStages) mbar_wait(empty(s), ((i / kStages) - 1) & 1);
      const int t = kt_begin + i;
      // This lane's pixel: image img, pixel pix of it, pv when it exists.
      int img, pix;
      bool pv;
      if (!kTmaA && p.packed) {  // the host never pairs packed k-tiles with TMA
        const int k = t * kBK + lane;
        pv = k < p.npix;
        img = k / p.ohw;
        pix = k - img * p.ohw;
      } else {
        img = t / p.kt_img;
        const int p0 = (t - img * p.kt_img) * kBK;
        pix = p0 + lane;
        pv = pix < p.ohw;
        if constexpr (kTmaA) {
          if (tid == 0) {
            mbar_arrive_expect_tx(full(s), P::kATileBytes);
            tma_load_3d(tile_a(s), &map_dy, p0, oc0 + m0, img, full(s));
          }
        }
      }
      const int oy = pix / p.ow, ox = pix - oy * p.ow;
      const int iy0 = oy * p.sh - p.ph, ix0 = ox * p.sw - p.pw;
      const int64_t win = int64_t(img) * p.chw + int64_t(iy0) * p.w + ix0;  // may be < 0
      const uint32_t b_stage = tile_b(s);
#pragma unroll 8
      for (int rr = 0; rr < kBN / 4; ++rr) {
        const int j = warp + 4 * rr;
        const int4 e = table[j];
        if (e.w == 0) continue;  // the same j for the whole warp
        const int iy = iy0 + e.y, ix = ix0 + e.z;
        const bool ok = pv && unsigned(iy) < unsigned(p.h) && unsigned(ix) < unsigned(p.w);
        const uint32_t dst =
            b_stage + uint32_t(j * 128) + ((lane_chunk ^ uint32_t(j & 7)) << 4) + lane_byte;
        cp_async4_zfill(dst, x + (ok ? win + e.x : 0), ok ? 4u : 0u);
      }
      if constexpr (!kTmaA) {
        const int64_t dy_pix = (int64_t(img) * p.oc_all + oc0) * p.ohw + pix;
        const uint32_t a_stage = tile_a(s);
#pragma unroll 8
        for (int rr = 0; rr < kBM / 4; ++rr) {
          const int m = warp + 4 * rr;
          if (m0 + m >= p.oc) break;  // m ascends with rr
          const uint32_t dst =
              a_stage + uint32_t(m * 128) + ((lane_chunk ^ uint32_t(m & 7)) << 4) + lane_byte;
          cp_async4_zfill(dst, p.dy + (pv ? dy_pix + int64_t(m0 + m) * p.ohw : 0), pv ? 4u : 0u);
        }
      }
      if constexpr (kSync) {
        cp_async_wait_all();
        fence_proxy_async();
        mbar_arrive(full(s));
      } else {
        cp_async_mbarrier_arrive_noinc(full(s));
      }
    }
    cp_async_wait_all();  // no thread leaves with copies into shared memory still in flight
    return;
  }

  // Consumer warpgroup wg: tile rows [64 (wg - 1), +64).
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  // The stage's layout (conv2d_wgrad_box_smem.h): rows of bw floats in slabs of a k-tile row,
  // swizzle span bw * 4 bytes; the gathered layout is bw = 32 (one slab of 128-byte rows). Step
  // kk's descriptors add its slab and in-row offset (in 16-byte units) to the stage's.
  const int bw = kBoxB ? p.bw : kBK;
  const uint32_t span = wgrad_span_bytes(bw);
  const uint32_t a_off = uint32_t(wg - 1) * 64 * span;  // this warpgroup's first row of a slab
  const int b_slab_rows = kBoxB ? p.b.slab_rows : 8;    // the gathered B: the group layout
  const uint32_t b_sbo = wgrad_b_sbo(bw, b_slab_rows);
  uint32_t a_step[kBK / 8], b_step[kBK / 8];
#pragma unroll
  for (int kk = 0; kk < kBK / 8; ++kk) {
    a_step[kk] = wgrad_box_step_offset(bw, kBM, kk) >> 4;
    b_step[kk] = wgrad_box_step_offset(bw, b_slab_rows, kk) >> 4;
  }
  for (int i = 0; i < nk; ++i) {
    const int s = i % kStages;
    mbar_wait(full(s), (i / kStages) & 1);
    const uint32_t q_base = kSplit ? residual_set(i % P::kSmallSets) : 0u;
    if constexpr (kSplit) {
      // The stage rounded to TF32 in place, its residuals into set q (WgPlan), by all consumer
      // threads, 16 bytes each in turn; each fences its writes for wgmma (async proxy), which
      // also covers the producer's cp.async writes it has acquired, and the consumers meet.
      for (int v = tid - 128; v < P::kStageBytes / 16; v += 128 * P::kConsumers) {
        const float4 x = ld_shared_v4(tile_a(s) + 16u * v);
        const ptx::Tf32Split x0 = ptx::split_tf32(x.x), x1 = ptx::split_tf32(x.y),
                             x2 = ptx::split_tf32(x.z), x3 = ptx::split_tf32(x.w);
        st_shared_v4(tile_a(s) + 16u * v, __uint_as_float(x0.big), __uint_as_float(x1.big),
                     __uint_as_float(x2.big), __uint_as_float(x3.big));
        st_shared_v4(q_base + 16u * v, __uint_as_float(x0.small), __uint_as_float(x1.small),
                     __uint_as_float(x2.small), __uint_as_float(x3.small));
      }
      fence_proxy_async();
      consumer_sync(128 * P::kConsumers);
    } else if constexpr (!kSync && !(kBoxB && kTmaA)) {
      fence_proxy_async();  // the producer's cp.async writes (file comment); TMA's need none
    }
    const uint64_t da = wgrad_smem_desc(tile_a(s) + a_off, span, wgrad_a_sbo(bw));
    const uint64_t db = wgrad_smem_desc(tile_b(s), span, b_sbo);
    wgmma_fence();
    fence_acc(acc);
    if constexpr (kSplit) {
      const uint64_t das = wgrad_smem_desc(q_base + a_off, span, wgrad_a_sbo(bw));
      const uint64_t dbs = wgrad_smem_desc(q_base + uint32_t(P::kATileBytes), span, b_sbo);
#pragma unroll
      for (int kk = 0; kk < kBK / 8; ++kk) {
        wgmma_m64n128k8_tf32(acc, das + a_step[kk], db + b_step[kk]);
        wgmma_m64n128k8_tf32(acc, da + a_step[kk], dbs + b_step[kk]);
        wgmma_m64n128k8_tf32(acc, da + a_step[kk], db + b_step[kk]);
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kBK / 8; ++kk)
        wgmma_m64n128k8_tf32(acc, da + a_step[kk], db + b_step[kk]);
    }
    // The previous stage released in every block of the cluster (this block's included): the
    // ones issuing its copies wait for all of them.
    const uint32_t empty_prev = empty((i + kStages - 1) % kStages);
    const bool release = i > 0 && (kSplit || lane == 0);
    commit_and_release_previous([&] { fence_acc(acc); }, release && csize == 1, empty_prev);
    if (release && csize > 1)
      for (int r = 0; r < csize; ++r) {
        if (r == own_rank)
          mbar_arrive(empty_prev);
        else
          mbar_arrive_cluster(map_rank(empty_prev, uint32_t(r)));
      }
  }
  wgmma_wait<0>();
  fence_acc(acc);

  // acc[4 j + 2 h + e] = C[16 w + g + 8 h][8 j + 2 t4 + e] of this warpgroup's 64 rows.
  const int w = (tid / 32) & 3, g = lane >> 2, t4 = lane & 3;
  float* const slab = p.scratch ? p.scratch + int64_t(split) * p.slots : nullptr;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int oc = m0 + (wg - 1) * 64 + w * 16 + g + 8 * h;
    if (oc >= p.oc) continue;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = n0 + 8 * j + 2 * t4 + e;
        const float v = acc[4 * j + 2 * h + e];
        if (col < p.live_cols) {
          int dw_col = col;
          if constexpr (kBoxB) {  // column (tap, channel piece, channel) -> c * KH*KW + tap
            const int group = col >> p.run_shift, tap = group / p.cgroups;
            const int c = ((group - tap * p.cgroups) << p.run_shift) + (col & (p.b.run - 1));
            if (c >= p.c) continue;  // past C: a zero column
            dw_col = c * p.khw + tap;
          }
          const int64_t slot = int64_t(oc0 + oc) * p.ckhw + dw_col;
          if (slab)
            slab[slot] = v;
          else
            atomicAdd(p.dw + slot, v);
        } else if (col < p.ncols) {
          if (slab)
            slab[int64_t(p.oc_all) * p.ckhw + oc0 + oc] = v;
          else
            atomicAdd(p.db + oc0 + oc, v);
        }
      }
  }
  // No block leaves while another may still arrive on its barriers (the producers have left:
  // exited threads do not hold up a cluster barrier).
  if (csize > 1) cluster_sync_divergent();
#else
  (void)map_dy;
  (void)map_x;
  (void)map_xd;
  (void)p;
#if defined(__CUDA_ARCH__)
  __trap();  // never dispatched: conv2d_wgrad_wgmma_available() is false without sm_90a
#endif
#endif
}

// Second stage of the deterministic path: target[i] += sum over splits of scratch[split][i], in
// split order. Thread mapping: one slot per thread (grid-stride); slots < weight_slots are dw.
__global__ void wgrad_wgmma_reduce(const float* __restrict__ d_scratch, int splits, int64_t slots,
                                   int64_t weight_slots, int64_t used, float* __restrict__ d_dw,
                                   float* __restrict__ d_db) {
  ptx::griddep_enter();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < used;
       i += int64_t(gridDim.x) * blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < splits; ++s) acc += d_scratch[int64_t(s) * slots + i];
    if (i < weight_slots)
      d_dw[i] += acc;
    else
      d_db[i - weight_slots] += acc;
  }
}

struct Geometry {
  int bm = 64;
  int64_t ohw = 0, kt_img = 0, ktiles = 0, tiles_m = 0, tiles_n = 0;
  bool packed = false;
  int splits = 1;
};

// A function of the shape and of whether db is asked for, not of the device.
// box: B by TMA boxes in pieces of `run` channels (wgrad_box_geometry; the caller has checked
// wgrad_box_refusal). db: the call has a bias column (the default counts it: the limits and the
// scratch take the larger of the two).
Geometry geometry_of(const Conv2dShape& s, bool box = false, int run = kWgradBoxRunAuto,
                     bool db = true) {
  Geometry g;
  g.bm = s.ocg() <= 64 ? 64 : 128;  // tiles of a group's rows
  g.ohw = int64_t{s.oh()} * s.ow();
  g.tiles_m = ceil_div<int64_t>(s.ocg(), g.bm);
  if (box) {
    const WgradBoxGeometry b = wgrad_box_geometry(s, run);
    g.kt_img = b.kt_img;
    g.packed = false;
    g.ktiles = int64_t{s.n} * g.kt_img;
    g.tiles_n = ceil_div<int64_t>(int64_t{b.bias_col} + (db ? 1 : 0), kBN);
  } else {
    g.kt_img = ceil_div<int64_t>(g.ohw, kBK);
    g.packed = g.ohw % 4 != 0 || g.ohw < kBK;
    g.ktiles = g.packed ? ceil_div<int64_t>(int64_t{s.n} * g.ohw, kBK) : int64_t{s.n} * g.kt_img;
    g.tiles_n = ceil_div<int64_t>(int64_t{s.cg()} * s.kh * s.kw + (db ? 1 : 0), kBN);
  }
  const int64_t slots = int64_t{kSms} * (g.bm == 64 ? WgPlan<64, false>::kMinBlocks : 1);
  const int64_t tiles = g.tiles_m * s.groups * g.tiles_n;
  g.splits = static_cast<int>(split_k_one_wave(tiles, g.ktiles, slots, kMinKtilesPerSplit));
  return g;
}

// The sizes the kernel's 32-bit index arithmetic and grid allow.
bool within_limits(const Conv2dShape& s) {
  const int64_t x = int64_t{s.n} * s.c * s.h * s.w;
  const int64_t y = int64_t{s.n} * s.oc * s.oh() * s.ow();
  const int64_t w = int64_t{s.oc} * s.cg() * s.kh * s.kw + s.oc;
  const Geometry g = geometry_of(s);
  return x <= INT_MAX && y <= INT_MAX && w <= INT_MAX && g.ktiles <= INT_MAX &&
         g.tiles_m * s.groups <= 65535 && g.tiles_n <= INT_MAX;
}

// The box geometry where the shape allows B by TMA boxes and the kernel's limits hold for it.
// Every run, so that the answer does not depend on the run asked for.
bool box_shape_ok(const Conv2dShape& s) {
  if (!wgrad_box_refusal(s).empty()) return false;
  for (int run : kBoxRuns) {
    const Geometry g = geometry_of(s, true, run);
    // run columns per channel piece: C*KH*KW rounded up to pieces must index in 32 bits.
    if (g.ktiles > INT_MAX || int64_t{s.oc} * g.tiles_n * kBN > INT_MAX) return false;
  }
  return true;
}

// The swizzle whose span is a box row of bw floats (conv2d_wgrad_box_smem.h): a narrower row
// would take the whole span in shared memory.
CUtensorMapSwizzle box_swizzle(int bw) {
  return bw == 8    ? CU_TENSOR_MAP_SWIZZLE_32B
         : bw == 16 ? CU_TENSOR_MAP_SWIZZLE_64B
                    : CU_TENSOR_MAP_SWIZZLE_128B;
}

// What B's boxes read, viewed (Wc, C, Hc, R N) (dimension strides out of memory order): the
// copies of x (or x itself, (W, C, H, N)); boxes (bw, run channels, br or 1 rows, 1 plane),
// landing as slabs of [run channels][bw floats] (conv2d_wgrad_box_smem.h); unit traversal strides
// (the copies hold the stride); swizzle span bw * 4 bytes; zero fill outside (output pixels past OH
// x OW, channels past C).
CUtensorMap make_x_box_map(const float* d_src, const Conv2dShape& s, const WgradBoxGeometry& b,
                           bool x_itself) {
  CUtensorMap map{};
  const int sw = x_itself ? s.w : b.copy_w, sh = x_itself ? s.h : b.copy_h;
  const int planes = x_itself ? s.n : b.copies * s.n;
  const cuuint64_t dims[4] = {cuuint64_t(sw), cuuint64_t(s.c), cuuint64_t(sh), cuuint64_t(planes)};
  const cuuint64_t strides[3] = {cuuint64_t(sh) * sw * 4, cuuint64_t(sw) * 4,
                                 cuuint64_t(s.c) * sh * sw * 4};
  const cuuint32_t box[4] = {cuuint32_t(b.bw), cuuint32_t(b.run), cuuint32_t(b.b.box_rows), 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, const_cast<float*>(d_src), dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, box_swizzle(b.bw),
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CNN_CHECK(r == CUDA_SUCCESS,
            "conv2d_backward_weight_wgmma: cuTensorMapEncodeTiled failed (error {}) for the {} "
            "(planes, C, rows, columns) = ({}, {}, {}, {}), box {} rows x {} channels x {} "
            "columns",
            int(r), x_itself ? "x" : "copies of x", planes, s.c, sh, sw, b.b.box_rows, b.run, b.bw);
  return map;
}

// dy as a 4-D tensor (OW, OC, OH, N) (strides out of memory order), boxes (bw, BM, br, 1): a
// k-tile's pixels x BM rows, landing as br slabs of [BM rows][bw floats], swizzle span bw * 4.
CUtensorMap make_dy_box_map(const float* d_dy, const Conv2dShape& s, const WgradBoxGeometry& b,
                            int bm) {
  CUtensorMap map{};
  const int oh = s.oh(), ow = s.ow();
  const cuuint64_t dims[4] = {cuuint64_t(ow), cuuint64_t(s.oc), cuuint64_t(oh), cuuint64_t(s.n)};
  const cuuint64_t strides[3] = {cuuint64_t(oh) * ow * 4, cuuint64_t(ow) * 4,
                                 cuuint64_t(s.oc) * oh * ow * 4};
  const cuuint32_t box[4] = {cuuint32_t(b.bw), cuuint32_t(bm), cuuint32_t(b.br), 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, const_cast<float*>(d_dy), dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, box_swizzle(b.bw),
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CNN_CHECK(r == CUDA_SUCCESS,
            "conv2d_backward_weight_wgmma: cuTensorMapEncodeTiled failed (error {}) for dy "
            "(N, OC, OH, OW) = ({}, {}, {}, {}), box {} rows x {} oc x {} columns",
            int(r), s.n, s.oc, oh, ow, b.br, bm, b.bw);
  return map;
}

// p's multicast cluster (p.cx, p.cz) runs where the device places its clusters in as few waves as
// the blocks alone, else 1 x 1: a GPC holds fewer blocks in clusters than alone, and VGG's
// 128-channel 16x16 layer (126 blocks) in 42 clusters of 3 took 164 us against 112 alone (H100).
template <int kBM, bool kTmaA, bool kBoxB, bool kSync, bool kSplit = false>
WgradCluster launch(const CUtensorMap& map_dy, const CUtensorMap& map_x, const CUtensorMap& map_xd,
                    WgradParams p, dim3 grid, cudaStream_t stream) {
  using P = WgPlan<kBM, kBoxB, kSplit>;
  auto kernel = wgrad_wgmma_kernel<kBM, kTmaA, kBoxB, kSync, kSplit>;
  CNN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, P::kSmemBytes));
  if (p.cx * p.cz > 1) {
    const int64_t blocks = int64_t(grid.x) * grid.y * grid.z, cluster = p.cx * p.cz;
    const int64_t placed = max_active_clusters(reinterpret_cast<const void*>(kernel), p.cx, p.cz,
                                               P::kThreads, P::kSmemBytes);
    const int64_t slots = int64_t(sm_count()) * P::kMinBlocks;
    if (placed == 0 || ceil_div(blocks / cluster, placed) > ceil_div(blocks, slots))
      p.cx = p.cz = 1;
  }
  if (p.cx * p.cz == 1) {
    kernel<<<grid, P::kThreads, P::kSmemBytes, stream>>>(map_dy, map_x, map_xd, p);
  } else {
    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = grid;
    cfg.blockDim = dim3(P::kThreads);
    cfg.dynamicSmemBytes = P::kSmemBytes;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(p.cx);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = static_cast<unsigned>(p.cz);
    CNN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, map_dy, map_x, map_xd, p));
  }
  CNN_LAUNCH_CHECK("conv2d_backward_weight_wgmma");
  return {p.cx, p.cz};
}

// Gathered B: dy by TMA or gathered, either hand-over. Boxed B: dy by TMA (no cp.async, so no
// hand-over to choose), or gathered in box order with either hand-over. split (3xTF32, FP32):
// the consumers fence every stage themselves, so the hand-over is the default one.
template <int kBM>
WgradCluster launch_bm(bool box, bool tma, bool sync, bool split, const CUtensorMap& map_dy,
                       const CUtensorMap& map_x, const CUtensorMap& map_xd, const WgradParams& p,
                       dim3 grid, cudaStream_t stream) {
  if (split && box && tma)
    return launch<kBM, true, true, false, true>(map_dy, map_x, map_xd, p, grid, stream);
  else if (split && box)
    return launch<kBM, false, true, false, true>(map_dy, map_x, map_xd, p, grid, stream);
  else if (split && tma)
    return launch<kBM, true, false, false, true>(map_dy, map_x, map_xd, p, grid, stream);
  else if (split)
    return launch<kBM, false, false, false, true>(map_dy, map_x, map_xd, p, grid, stream);
  else if (box && tma)
    return launch<kBM, true, true, false>(map_dy, map_x, map_xd, p, grid, stream);
  else if (box && sync)
    return launch<kBM, false, true, true>(map_dy, map_x, map_xd, p, grid, stream);
  else if (box)
    return launch<kBM, false, true, false>(map_dy, map_x, map_xd, p, grid, stream);
  else if (tma && sync)
    return launch<kBM, true, false, true>(map_dy, map_x, map_xd, p, grid, stream);
  else if (tma)
    return launch<kBM, true, false, false>(map_dy, map_x, map_xd, p, grid, stream);
  else if (sync)
    return launch<kBM, false, false, true>(map_dy, map_x, map_xd, p, grid, stream);
  else
    return launch<kBM, false, false, false>(map_dy, map_x, map_xd, p, grid, stream);
}

}  // namespace

CUtensorMap wgrad_dy_tf32_map(const float* d_dy, const Conv2dShape& s, int rows) {
  CUtensorMap map{};
  const cuuint64_t ohw = cuuint64_t(s.oh()) * cuuint64_t(s.ow());
  const cuuint64_t dims[3] = {ohw, cuuint64_t(s.oc), cuuint64_t(s.n)};
  const cuuint64_t strides[2] = {ohw * 4, ohw * 4 * cuuint64_t(s.oc)};
  const cuuint32_t box[3] = {kBK, cuuint32_t(rows), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, const_cast<float*>(d_dy), dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CNN_CHECK(r == CUDA_SUCCESS,
            "conv2d_backward_weight: cuTensorMapEncodeTiled failed (error {}) for dy (N, OC, "
            "OH*OW) = ({}, {}, {}) in boxes of {} rows",
            int(r), s.n, s.oc, ohw, rows);
  return map;
}

bool conv2d_wgrad_wgmma_available() {
#ifdef CNN_WGMMA_SM90A
  return gemm_wgmma_available();
#else
  return false;
#endif
}

std::string conv2d_wgrad_wgmma_refusal(const Conv2dShape& s, const Exec& ex) {
  if (ex.precision != Precision::TF32 && ex.precision != Precision::FP32)
    return fmt::format(
        "conv2d_backward_weight: algo wgmma multiplies in TF32, or in 3xTF32 at FP32; the "
        "precision is {}; expected precision tf32 or fp32 (or another algo)",
        precision_name(ex.precision));
  if (!conv2d_wgrad_wgmma_available())
    return "conv2d_backward_weight: algo wgmma needs a compute capability 9.0 GPU and a build "
           "with CUDA architecture 90 (sm_90a)";
  if (!within_limits(s))
    return fmt::format(
        "conv2d_backward_weight: algo wgmma: N={} C={} {}x{} OC={} {}x{} is over the kernel's "
        "limits (tensors of at most 2^31-1 elements, OC tiles <= 65535)",
        s.n, s.c, s.h, s.w, s.oc, s.kh, s.kw);
  return {};
}

namespace {

using BLoad = WgmmaWgradOptions::BLoad;

// Auto's choice where both loaders can run: the boxes from 8 input channels up. Measured on the
// H200 (VGG at batch 128, TF32, copies included): boxes 15-28% faster than the gather on every
// 64-256-channel 3x3 layer, 8% slower on the C = 3 stem (60.1 against 55.7 us), whose 8-channel
// boxes carry 5 zero channels and whose copies cost as much as its small GEMM.
bool auto_prefers_box(const Conv2dShape& s) {
  return s.c >= 8;
}

// Scratch of one B loader (Gather, Tma or Auto): the copies of x where boxes can run, then the
// deterministic slabs of the larger split.
std::size_t scratch_floats_for(const Conv2dShape& s, const Exec& ex, BLoad b) {
  if (!within_limits(s)) return 0;
  const bool box =
      (b == BLoad::Tma || (b == BLoad::Auto && auto_prefers_box(s))) && box_shape_ok(s);
  const int64_t copies = box ? wgrad_box_geometry(s).copy_floats : 0;
  int64_t slabs = 0;
  if (ex.deterministic) {
    // Whatever run the call takes (its options or CNN_WGMMA_WGRAD_BOX_RUN) and whether it asks
    // for db: the largest split.
    int splits = 1;
    for (bool db : {false, true}) {
      splits = std::max(splits, geometry_of(s, false, kWgradBoxRunAuto, db).splits);
      if (box)
        for (int run : kBoxRuns) splits = std::max(splits, geometry_of(s, true, run, db).splits);
    }
    slabs = int64_t{splits} * (int64_t{s.oc} * s.cg() * s.kh * s.kw + s.oc);
  }
  return static_cast<std::size_t>(copies + slabs);
}

}  // namespace

std::size_t conv2d_wgrad_wgmma_scratch_floats(const Conv2dShape& s, const Exec& ex,
                                              WgmmaWgradOptions::BLoad b) {
  if (b != BLoad::Default) return scratch_floats_for(s, ex, b);
  // Either algo may call with its own default loader.
  return std::max(scratch_floats_for(s, ex, wgmma_wgrad_b_for(Algo::Wgmma)),
                  scratch_floats_for(s, ex, wgmma_wgrad_b_for(Algo::WgmmaNhwc)));
}

int conv2d_wgrad_wgmma_splits(const Conv2dShape& s, bool box, int run, bool db) {
  return geometry_of(s, box, run, db).splits;
}

WgradCluster conv2d_wgrad_wgmma_cluster(int64_t tiles_n, int64_t tiles_m) {
  WgradCluster c;
  c.z = tiles_m % 2 == 0 ? 2 : 1;
  if (tiles_n % 2 == 0 && 2 * c.z <= 4)
    c.x = 2;
  else if (tiles_n % 3 == 0 && 3 * c.z <= 4)
    c.x = 3;
  return c;
}

namespace {

// The cluster a launch asks for before its placement check: boxed B with dy by TMA at TF32 (not
// 3xTF32), clusters allowed by ex and the multicast switch; 1 x 1 elsewhere.
WgradCluster multicast_cluster(bool box, bool tma, const Exec& ex, const WgmmaWgradOptions& opt,
                               int64_t tiles_n, int64_t tiles_m) {
  if (!box || !tma || ex.precision != Precision::TF32 || !ex.clusters ||
      !wgmma_wgrad_multicast(opt))
    return {};
  return conv2d_wgrad_wgmma_cluster(tiles_n, tiles_m);
}

}  // namespace

WgradCluster conv2d_wgrad_wgmma_planned_cluster(const Conv2dShape& s, const Exec& ex, bool db,
                                                const WgmmaWgradOptions& opt) {
  if (!conv2d_wgrad_wgmma_refusal(s, ex).empty()) return {};
  const BLoad b_load = opt.b == BLoad::Default ? wgmma_wgrad_b_for(Algo::Wgmma) : opt.b;
  // The launch's choice of loaders with x, dy and the scratch 16-byte aligned.
  const bool box =
      b_load != BLoad::Gather && (b_load != BLoad::Auto || auto_prefers_box(s)) && box_shape_ok(s);
  const bool tma = !opt.force_gather && s.ow() % 4 == 0;
  if (!box || !tma) return {};
  const Geometry g = geometry_of(s, true, wgmma_wgrad_box_run(opt), db);
  return multicast_cluster(box, tma, ex, opt, g.tiles_n, g.tiles_m * s.groups);
}

bool wgmma_wgrad_multicast(const WgmmaWgradOptions& opt) {
  if (opt.multicast != WgmmaWgradOptions::Multicast::Default)
    return opt.multicast == WgmmaWgradOptions::Multicast::On;
  return process_env_switches().wgmma_wgrad_multicast;
}

bool wgmma_wgrad_box_direct(const WgmmaWgradOptions& opt) {
  if (opt.box_direct != WgmmaWgradOptions::Direct::Default)
    return opt.box_direct == WgmmaWgradOptions::Direct::On;
  return process_env_switches().wgmma_wgrad_box_direct;
}

int wgmma_wgrad_box_run(const WgmmaWgradOptions& opt) {
  if (opt.box_run != WgmmaWgradOptions::kBoxRunDefault) return opt.box_run;
  return process_env_switches().wgmma_wgrad_box_run;
}

WgmmaWgradOptions::BLoad wgmma_wgrad_b_for(Algo algo) {
  switch (process_env_switches().wgmma_wgrad_b) {
    case WgmmaWgradBSwitch::Gather:
      return BLoad::Gather;
    case WgmmaWgradBSwitch::Tma:
      return BLoad::Auto;
    default:
      // Both algos: the boxes where the shape allows and auto_prefers_box (the measurements
      // there), else the gather. CNN_WGMMA_WGRAD_B=gather keeps the gather everywhere.
      (void)algo;
      return BLoad::Auto;
  }
}

std::string conv2d_wgrad_wgmma_box_refusal(const Conv2dShape& s, const float* d_x) {
  std::string why = wgrad_box_refusal(s);
  if (!why.empty()) return why;
  if (!box_shape_ok(s))
    return fmt::format(
        "conv2d_backward_weight: the TMA-box weight gradient: N={} C={} {}x{} OC={} {}x{} is "
        "over its limits",
        s.n, s.c, s.h, s.w, s.oc, s.kh, s.kw);
  // Where the one copy would equal x the boxes read x itself, which TMA needs 16-byte aligned.
  if (wgrad_box_geometry(s, 8).reads_x && reinterpret_cast<uintptr_t>(d_x) % 16 != 0)
    return "conv2d_backward_weight: the TMA-box weight gradient of an unpadded stride-1 1x1 "
           "convolution reads x itself and needs it 16-byte aligned";
  return {};
}

void conv2d_backward_weight_wgmma(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                  float* d_dw, float* d_db, float* d_scratch, const Exec& ex,
                                  const WgmmaWgradOptions& opt) {
  check_conv2d_shape_any(s);  // dilated taps: the gather only (the boxes refuse them)
  const std::string refusal = conv2d_wgrad_wgmma_refusal(s, ex);
  CNN_CHECK(refusal.empty(), "{}", refusal);
  CNN_CHECK(d_x && d_dy && d_dw, "conv2d_backward_weight_wgmma: x, dy and dw must not be null");
  const BLoad b_load = opt.b == BLoad::Default ? wgmma_wgrad_b_for(Algo::Wgmma) : opt.b;
  CNN_CHECK(!ex.deterministic || d_scratch,
            "conv2d_backward_weight_wgmma: deterministic mode needs {} floats of scratch "
            "(conv2d_wgrad_wgmma_scratch_floats), got null",
            conv2d_wgrad_wgmma_scratch_floats(s, ex, b_load));
  std::string box_why = b_load == BLoad::Gather ? std::string("gather asked for")
                        : b_load == BLoad::Auto && !auto_prefers_box(s)
                            ? std::string("auto: fewer than 8 input channels gather faster")
                            : conv2d_wgrad_wgmma_box_refusal(s, d_x);
  // The copies of x go at the start of the scratch, which the caller sized for this loader.
  const int run = wgmma_wgrad_box_run(opt);
  const WgradBoxGeometry bg = box_why.empty() ? wgrad_box_geometry(s, run) : WgradBoxGeometry{};
  if (box_why.empty() && !bg.reads_x &&
      (!d_scratch || reinterpret_cast<uintptr_t>(d_scratch) % 16 != 0))
    box_why = fmt::format(
        "conv2d_backward_weight: the TMA-box weight gradient needs {} floats of 16-byte aligned "
        "scratch for its copies of x (conv2d_wgrad_wgmma_scratch_floats with b = tma), got {}",
        conv2d_wgrad_wgmma_scratch_floats(s, ex, BLoad::Tma),
        d_scratch ? "a misaligned pointer" : "null");
  CNN_CHECK(b_load != BLoad::Tma || box_why.empty(), "{}", box_why);
  const bool box = b_load != BLoad::Gather && box_why.empty();
  // Scratch: the copies of x (box), then the deterministic slabs.
  const int64_t copy_floats = box ? bg.copy_floats : 0;
  float* const slabs = ex.deterministic ? d_scratch + copy_floats : nullptr;
  const Geometry g = geometry_of(s, box, run, d_db != nullptr);
  WgradParams p{};
  p.x = d_x;
  p.dy = d_dy;
  p.dw = d_dw;
  p.db = d_db;
  p.scratch = slabs;
  p.oc = s.ocg();
  p.oc_all = s.oc;
  p.group_x = int64_t{s.cg()} * s.h * s.w;
  p.h = s.h;
  p.w = s.w;
  p.kh = s.kh;
  p.kw = s.kw;
  p.khw = s.kh * s.kw;
  p.sh = s.stride_h;
  p.sw = s.stride_w;
  p.ph = s.pad_h;
  p.pw = s.pad_w;
  p.dil_h = s.dil_h;
  p.dil_w = s.dil_w;
  p.ow = s.ow();
  p.ohw = static_cast<int>(g.ohw);
  p.hw = s.h * s.w;
  p.chw = int64_t{s.c} * s.h * s.w;
  p.ckhw = s.cg() * p.khw;
  p.ncols = p.ckhw + (d_db ? 1 : 0);
  p.npix = static_cast<int>(int64_t{s.n} * g.ohw);
  p.packed = g.packed;
  p.kt_img = static_cast<int>(g.kt_img);
  p.ktiles = static_cast<int>(g.ktiles);
  p.splits = g.splits;
  p.tiles_m = static_cast<int>(g.tiles_m);
  p.slots = int64_t{s.oc} * p.ckhw + s.oc;
  p.live_cols = p.ckhw;
  p.c = s.c;
  p.oh = s.oh();
  p.bw = kBK;  // the gathered layout: one slab of 32-pixel rows (box mode sets its own)
  p.br = 1;
  p.direct_copy = -1;
  p.cx = p.cz = 1;
  CUtensorMap map_x{}, map_xd{};
  bool tma = !opt.force_gather && reinterpret_cast<uintptr_t>(d_dy) % 16 == 0;
  if (box) {
    p.live_cols = bg.bias_col;
    p.ncols = bg.bias_col + (d_db ? 1 : 0);
    p.bw = bg.bw;
    p.br = bg.br;
    p.boxes_x = bg.boxes_x;
    p.cgroups = bg.cgroups;
    p.groups = bg.groups;
    p.b = bg.b;
    p.run_shift = 0;
    while ((1 << p.run_shift) < bg.run) ++p.run_shift;
    p.n = s.n;
    p.copies_h = bg.copies_h;
    p.copies_w = bg.copies_w;
    // The direct class's boxes read x itself where TMA can (x 16-byte aligned; the shape's part
    // is the geometry's), and the pre-pass skips its copy.
    if (bg.direct_copy >= 0 && wgmma_wgrad_box_direct(opt) &&
        reinterpret_cast<uintptr_t>(d_x) % 16 == 0) {
      p.direct_copy = bg.direct_copy;
      map_xd = make_x_box_map(d_x, s, bg, true);
    }
    // The pre-pass runs on the same stream, so the kernel's boxes see the finished copies.
    wgrad_box_copies_cuda(s, bg, d_x, d_scratch, ex.stream, p.direct_copy);
    map_x = make_x_box_map(bg.reads_x ? d_x : d_scratch, s, bg, bg.reads_x);
    if (p.direct_copy < 0) map_xd = map_x;  // never read
    tma = tma && p.ow % 4 == 0;             // dy's rows 16-byte aligned for its 4-D map
  } else {
    tma = tma && !g.packed;
  }
  const bool sync =
      opt.copies == WgmmaWgradOptions::Copies::Sync ||
      (opt.copies == WgmmaWgradOptions::Copies::Default && process_env_switches().wgmma_wgrad_sync);
  CUtensorMap map_dy{};
  if (tma) map_dy = box ? make_dy_box_map(d_dy, s, bg, g.bm) : wgrad_dy_tf32_map(d_dy, s, g.bm);
  const dim3 grid(static_cast<unsigned>(ceil_div(p.ncols, kBN)), static_cast<unsigned>(g.splits),
                  static_cast<unsigned>(g.tiles_m * s.groups));  // every group's row tiles
  const bool split = ex.precision == Precision::FP32;  // 3xTF32
  const WgradCluster c = multicast_cluster(box, tma, ex, opt, grid.x, grid.z);
  p.cx = c.x;
  p.cz = c.z;
  const WgradCluster ran =
      g.bm == 64 ? launch_bm<64>(box, tma, sync, split, map_dy, map_x, map_xd, p, grid, ex.stream)
                 : launch_bm<128>(box, tma, sync, split, map_dy, map_x, map_xd, p, grid, ex.stream);
  if (opt.ran_cluster) *opt.ran_cluster = ran;

  if (ex.deterministic) {
    constexpr int kBlock = 256;
    const int64_t used = int64_t{s.oc} * p.ckhw + (d_db ? s.oc : 0);
    const int blocks = static_cast<int>(std::min<int64_t>(ceil_div<int64_t>(used, kBlock), 4096));
    wgrad_wgmma_reduce<<<blocks, kBlock, 0, ex.stream>>>(slabs, g.splits, p.slots,
                                                         int64_t{s.oc} * p.ckhw, used, d_dw, d_db);
    CNN_LAUNCH_CHECK("wgrad_wgmma_reduce");
  }
}

}  // namespace cnn
