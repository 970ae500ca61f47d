#pragma once
// A small fixed pool of worker threads for the fast CPU kernels (gemm_cpu, conv2d_cpu_fast,
// linear_cpu_fast). No OpenMP: it would load libgomp at run time, and we link nothing dynamic
// beyond libc/libstdc++.
#include <cstdint>
#include <functional>

namespace cnn {

// Threads the CPU kernels use (the calling thread included): CNN_CPU_THREADS when set (1..256),
// otherwise std::thread::hardware_concurrency() capped at kMaxDefaultCpuThreads.
constexpr int kMaxDefaultCpuThreads = 16;
int cpu_thread_count();

// Splits [begin, end) into at most cpu_thread_count() contiguous chunks of near-equal size and runs
// fn(lo, hi) once per chunk, the calling thread taking part; returns when all chunks are done.
// The first exception thrown by fn is rethrown here after every chunk has finished.
// Called from inside a running parallel_for/parallel_tasks (nested), it runs serially.
void parallel_for(int64_t begin, int64_t end, const std::function<void(int64_t, int64_t)>& fn);

// Runs fn(t) for every task t in [0, tasks) on the pool. Which thread runs which task is not
// fixed, so results are repeatable only when each task writes its own outputs (the callers here
// give every task a fixed slice of the work and reduce the slices in a fixed order).
void parallel_tasks(int64_t tasks, const std::function<void(int64_t)>& fn);

}  // namespace cnn
