// Which tiled-TMA box corners a Hopper GPU accepts: one 4-D fp32 load (tensor (W, H, C, N) =
// (32, 8, 16, 2), box (bw, br, 8, 1)) at the corner given on the command line, checked element
// by element against the tensor (out-of-bounds elements must read zero). Each run is its own
// process because a refused copy ends the context with "illegal instruction".
//   nvcc -O2 -arch=sm_90a -cudart static scripts/tma_coordinate_probe.cu -o tma_coordinate_probe
//   ./tma_coordinate_probe X Y [BW=32] [SWIZZLE=0|32|64|128] [CHANNELS_SECOND=0]
//   e.g. ./tma_coordinate_probe -1 0 32 128; CHANNELS_SECOND=1 views the tensor as (W, C, H, N)
//   (dimension strides out of memory order), box (BW, 8, 32 / BW, 1): rows land (r, c).
// Prints "ok" (the box landed densely, rows of BW floats, swizzled by the mode's XOR of 16-byte
// chunk bits with row bits 7+), "ok with rows padded to the swizzle span" (each box row took
// SWIZZLE bytes), "WRONG (k mismatches)" or the CUDA error; exit status 0 only for the first two.
// Why it exists: the TMA-box weight gradient (kernels/conv/conv2d_wgmma_wgrad.cu) put box corners
// at W offsets kw - pw (e.g. -1, +1 floats) and stopped with an illegal instruction; this probe
// separates the coordinate's sign from its 16-byte alignment. What it showed on the H200
// (CUDA 13.0, driver 580):
//   - the innermost coordinate must be a multiple of 16 bytes: x = 1, 2, -1, 3 stop the kernel
//     with "illegal instruction"; x = 0, 4, -4, -8, 28 load correctly (negative and partly
//     out-of-bounds boxes zero-fill); other coordinates may be anything (y = -1, -3 fine);
//   - a box row narrower than the swizzle span takes the whole span in shared memory (8 floats
//     under 64B or 128B swizzle: rows 64 or 128 bytes apart); with the span equal to the row
//     (8 floats / 32B, 16 / 64B, 32 / 128B) the box lands dense, chunk bits 4.. XOR row bits 7..;
//   - dimensions may be listed out of memory order ((W, C, H, N) view of an NCHW tensor).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int kW = 32, kH = 8, kC = 16, kN = 2, kBoxC = 8;

__global__ void probe_kernel(const __grid_constant__ CUtensorMap map, int x, int c1, int c2,
                             int bytes, int smem_floats, float* out) {
  __shared__ alignas(1024) float tile[32 * 8 * kBoxC];
  __shared__ alignas(8) uint64_t bar;
  const uint32_t t = static_cast<uint32_t>(__cvta_generic_to_shared(tile));
  const uint32_t b = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(b));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b), "r"(bytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(t),
        "l"(reinterpret_cast<uint64_t>(&map)), "r"(x), "r"(c1), "r"(c2), "r"(1), "r"(b)
        : "memory");
  }
  __syncthreads();
  asm volatile(
      "{\n .reg .pred p;\n wait: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n"
      " @!p bra wait;\n}\n" ::"r"(b)
      : "memory");
  for (int i = threadIdx.x; i < smem_floats; i += blockDim.x) out[i] = tile[i];
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s X Y [BW=32] [SWIZZLE128=0]\n", argv[0]);
    return 2;
  }
  const int x = std::atoi(argv[1]), y = std::atoi(argv[2]);
  const int bw = argc > 3 ? std::atoi(argv[3]) : 32, br = 32 / bw;
  const int swz = argc > 4 ? std::atoi(argv[4]) : 0;  // swizzle span in bytes, 0 = none
  const int swz_bits = swz == 32 ? 1 : swz == 64 ? 2 : swz == 128 ? 3 : 0;
  const bool perm = argc > 5 && std::atoi(argv[5]) != 0;
  std::vector<float> host(size_t(kW) * kH * kC * kN);
  for (size_t i = 0; i < host.size(); ++i) host[i] = float(i + 1);
  float *d_x = nullptr, *d_out = nullptr;
  const int elems = 32 * kBoxC, bytes = elems * 4;
  const int smem_floats = 32 * 8 * kBoxC;  // room for rows padded to 128 bytes
  cudaMalloc(&d_x, host.size() * 4);
  cudaMalloc(&d_out, smem_floats * 4);
  cudaMemset(d_out, 0xff, smem_floats * 4);
  cudaMemcpy(d_x, host.data(), host.size() * 4, cudaMemcpyHostToDevice);

  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
  auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  CUtensorMap map{};
  const cuuint64_t dims[4] = {kW, cuuint64_t(perm ? kC : kH), cuuint64_t(perm ? kH : kC), kN};
  const cuuint64_t strides[3] = {cuuint64_t(perm ? kW * kH * 4 : kW * 4),
                                 cuuint64_t(perm ? kW * 4 : kW * kH * 4),
                                 uint64_t(kW) * kH * kC * 4};
  const cuuint32_t box[4] = {cuuint32_t(bw), cuuint32_t(perm ? kBoxC : br),
                             cuuint32_t(perm ? br : kBoxC), 1};
  const cuuint32_t es[4] = {1, 1, 1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, d_x, dims, strides, box, es,
                            CU_TENSOR_MAP_INTERLEAVE_NONE,
                            swz == 32    ? CU_TENSOR_MAP_SWIZZLE_32B
                            : swz == 64  ? CU_TENSOR_MAP_SWIZZLE_64B
                            : swz == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                                         : CU_TENSOR_MAP_SWIZZLE_NONE,
                            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  std::printf("corner (%d, %d) box %dx%d swizzle %dB%s: ", x, y, bw, br, swz,
              perm ? " (W, C, H, N)" : "");
  if (r != CUDA_SUCCESS) {
    std::printf("encode failed (%d)\n", int(r));
    return 1;
  }
  probe_kernel<<<1, 128>>>(map, x, perm ? 0 : y, perm ? y : 0, bytes, smem_floats, d_out);
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    std::printf("%s\n", cudaGetErrorString(e));
    return 1;
  }
  std::vector<float> got(smem_floats);
  cudaMemcpy(got.data(), d_out, smem_floats * 4, cudaMemcpyDeviceToHost);
  // Mismatches if box row (c, r0) starts every `row_bytes` bytes, swizzled by address.
  auto mismatches = [&](int row_bytes) {
    int bad = 0;
    for (int c = 0; c < kBoxC; ++c)
      for (int r0 = 0; r0 < br; ++r0)
        for (int col = 0; col < bw; ++col) {
          const int gx = x + col, gy = y + r0;
          const float want = gx < 0 || gx >= kW || gy < 0 || gy >= kH
                                 ? 0.f
                                 : host[((size_t(1) * kC + c) * kH + gy) * kW + gx];
          const int row = perm ? r0 * kBoxC + c : c * br + r0;
          uint32_t off = uint32_t(row * row_bytes + col * 4);
          off ^= ((off >> 7) & ((1u << swz_bits) - 1u)) << 4;  // chunk ^= (address bits 7+)
          bad += off / 4 >= uint32_t(smem_floats) || got[off / 4] != want;
        }
    return bad;
  };
  const int dense = mismatches(bw * 4), padded = swz > bw * 4 ? mismatches(swz) : -1;
  if (dense == 0) {
    std::printf("ok\n");
    return 0;
  }
  if (padded == 0) {
    std::printf("ok with rows padded to the swizzle span\n");
    return 0;
  }
  std::printf("WRONG (%d mismatches dense, %d padded)\n", dense, padded);
  return 1;
}
