#pragma once
// Timing of device work: warm up, capture K launches in a CUDA graph, replay the graph R times
// back to back between CUDA events, and report per-launch statistics. A graph removes the launch
// gaps that would otherwise dominate kernels of a few microseconds.
#include <functional>
#include <string>
#include <vector>

#include "runtime/graph_overlap.h"
#include "runtime/stream.h"

namespace cnn::bench {

struct TimerOptions {
  int launches = 20;  // K: launches per graph, i.e. per timing sample
  int repeats = 50;   // R: timing samples
  int warmup = 3;     // plain rounds of K launches before capture (module load, autotuning)
  bool use_graph = true;
  // With the graph: its kernel -> kernel edges programmatic, as the trainer's step graph makes
  // them (runtime/graph_overlap.h). Off for single ops, whose times are compared with cuDNN's.
  GraphOverlap overlap = GraphOverlap::Off;
  // > 0: the timed samples together should take about this many seconds. One probed launch
  // estimates the launch time; K, the warm-up rounds and R then shrink so that slow kernels
  // (the naive ones on large shapes take milliseconds each) cost a fraction of a second instead
  // of R*K launches, while fast ones keep every sample. R never drops below min_repeats, so a
  // P95 always rests on a few samples.
  double budget_s = 0;
  int min_repeats = 5;
};

struct Timing {
  double median_us = 0, p95_us = 0, min_us = 0;  // per launch
  int samples = 0;
  int launches = 0;    // K actually used (smaller than asked for under a budget)
  bool graph = false;  // false: plain launches (the graph was not asked for or could not be made)
  std::string note;    // why there is no graph when one was asked for
  int programmatic_edges = 0;  // of the graph, with TimerOptions::overlap
};

// launch(i) enqueues launch number i on `stream` (i counts up from 0 through warm-up, capture and
// any fallback, so callers rotate among input sets with i % sets). It must not synchronize the
// stream or allocate device memory, or the capture fails and the timing falls back to plain
// launches (said in Timing::note). Exceptions from launch() outside a capture propagate.
Timing time_launches(cudaStream_t stream, const std::function<void(int)>& launch,
                     const TimerOptions& opt);

// Nearest-rank percentile, q in [0, 1]; NaN for an empty sample.
double percentile(std::vector<double> v, double q);

}  // namespace cnn::bench
