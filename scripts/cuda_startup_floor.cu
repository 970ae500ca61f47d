// The platform's share of start-up: a program that does nothing but create the CUDA context
// (cudaFree(0)) and run one empty kernel, timed from the process's start (/proc/self/stat), so
// that the trainer's `start-up:` line can be read against what any CUDA program pays first.
//   nvcc -O2 -arch=sm_90 -cudart static scripts/cuda_startup_floor.cu -o cuda_startup_floor
//   ./cuda_startup_floor      (run it a few times: the first run after boot is slower)
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <ctime>

__global__ void empty_kernel() {}

static double now_s() {  // the clock /proc/self/stat's start time counts on
  timespec t;
  clock_gettime(CLOCK_BOOTTIME, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

// Field 22 of /proc/self/stat: the process's start, in clock ticks since boot.
static double process_start_s() {
  char buf[4096] = {};
  FILE* f = std::fopen("/proc/self/stat", "r");
  if (!f) return 0.0;
  const bool ok = std::fgets(buf, sizeof buf, f) != nullptr;
  std::fclose(f);
  if (!ok) return 0.0;
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces
  unsigned long long ticks = 0;
  for (int field = 2; p && field < 22; ++field) p = std::strchr(p + 1, ' ');
  if (p) std::sscanf(p + 1, "%llu", &ticks);
  return double(ticks) / double(sysconf(_SC_CLK_TCK));
}

int main() {
  const double t0 = now_s();
  cudaError_t e = cudaFree(nullptr);
  const double t1 = now_s();
  if (e == cudaSuccess) {
    empty_kernel<<<1, 1>>>();
    e = cudaDeviceSynchronize();
  }
  const double t2 = now_s();
  if (e != cudaSuccess) {
    std::fprintf(stderr, "cuda_startup_floor: error: %s\n", cudaGetErrorString(e));
    return 1;
  }
  const double start = process_start_s();
  std::printf("exec to main %.3f s, CUDA context %.3f s, first kernel %.3f s, process start to "
              "first kernel %.3f s\n", t0 - start, t1 - t0, t2 - t1, t2 - start);
  return 0;
}
