#ifdef CNN_HAVE_CUDA
#include "app/bench/bench_timer.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/cuda_check.h"
#include "runtime/error.h"
#include "runtime/graph_overlap.h"

namespace cnn::bench {

namespace {

// Owns a chain of events: samples are the gaps between consecutive ones.
class EventChain {
 public:
  explicit EventChain(int n) : events_(static_cast<size_t>(n), nullptr) {
    for (auto& e : events_) CNN_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~EventChain() {
    for (auto e : events_)
      if (e) cudaEventDestroy(e);
  }
  EventChain(const EventChain&) = delete;
  EventChain& operator=(const EventChain&) = delete;
  cudaEvent_t operator[](size_t i) const { return events_[i]; }
  // Per-launch microseconds of each gap, after the stream has finished.
  std::vector<double> gaps_us(int launches_per_gap) const {
    std::vector<double> out;
    for (size_t i = 0; i + 1 < events_.size(); ++i) {
      float ms = 0;
      CNN_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
      out.push_back(1000.0 * ms / launches_per_gap);
    }
    return out;
  }

 private:
  std::vector<cudaEvent_t> events_;
};

struct GraphHolder {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~GraphHolder() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

// Captures K launches; returns false (with the reason, the stream out of capture mode and the
// error state cleared) when any part of it fails.
bool capture(cudaStream_t stream, const std::function<void(int)>& launch, int first, int count,
             GraphOverlap overlap, GraphHolder& g, GraphOverlapResult* overlapped,
             std::string* why) {
  cudaError_t err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) {
    *why = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(err);
    cudaGetLastError();
    return false;
  }
  std::string failure;
  try {
    for (int i = 0; i < count; ++i) launch(first + i);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  err = cudaStreamEndCapture(stream, &g.graph);
  if (failure.empty() && err != cudaSuccess)
    failure = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(err);
  if (failure.empty()) {
    err = instantiate_graph(&g.exec, g.graph, overlap, overlapped);
    if (err != cudaSuccess)
      failure = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(err);
  }
  if (!failure.empty()) {
    cudaGetLastError();  // capture errors are not sticky; clear them before plain launches
    *why = failure;
    return false;
  }
  return true;
}

// Under a budget: K, R and the warm-up rounds for a launch that takes about est_us.
TimerOptions fit_budget(const TimerOptions& opt, double est_us) {
  TimerOptions o = opt;
  const double budget_us = opt.budget_s * 1e6;
  const int min_reps = std::max(1, std::min(opt.min_repeats, opt.repeats));
  // K shrinks only when even min_reps samples of K launches would overrun the budget. A K below
  // the number of rotated input sets reuses fewer sets; such a launch takes milliseconds, far
  // longer than L2 could hide.
  const double k_fit = budget_us / (est_us * min_reps);
  o.launches = static_cast<int>(std::clamp(k_fit, 1.0, double(opt.launches)));
  const double sample_us = est_us * o.launches;
  o.repeats =
      static_cast<int>(std::clamp(budget_us / sample_us, double(min_reps), double(opt.repeats)));
  // The probe already ran two launches; further warm-up rounds only while they are cheap.
  o.warmup = static_cast<int>(std::clamp(0.1 * budget_us / sample_us, 0.0, double(opt.warmup)));
  return o;
}

}  // namespace

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const double rank = std::ceil(q * static_cast<double>(v.size()));
  const size_t idx = static_cast<size_t>(std::clamp(rank, 1.0, double(v.size()))) - 1;
  return v[idx];
}

Timing time_launches(cudaStream_t stream, const std::function<void(int)>& launch,
                     const TimerOptions& asked) {
  CNN_CHECK(asked.launches > 0 && asked.repeats > 0 && asked.warmup >= 0,
            "timer: launches ({}) and repeats ({}) must be positive, warmup ({}) >= 0",
            asked.launches, asked.repeats, asked.warmup);
  CNN_CHECK(stream != nullptr,
            "timer: a created stream is needed (the legacy stream cannot be "
            "captured)");
  int next = 0;
  TimerOptions opt = asked;
  if (asked.budget_s > 0) {
    // The first launch absorbs module loading and first-touch costs; the second is the probe.
    launch(next++);
    CNN_CUDA_CHECK(cudaStreamSynchronize(stream));
    EventChain probe(2);
    CNN_CUDA_CHECK(cudaEventRecord(probe[0], stream));
    launch(next++);
    CNN_CUDA_CHECK(cudaEventRecord(probe[1], stream));
    CNN_CUDA_CHECK(cudaStreamSynchronize(stream));
    opt = fit_budget(asked, std::max(probe.gaps_us(1).at(0), 0.5));
  }
  for (int r = 0; r < opt.warmup; ++r)
    for (int i = 0; i < opt.launches; ++i) launch(next++);
  CNN_CUDA_CHECK(cudaStreamSynchronize(stream));

  Timing t;
  t.launches = opt.launches;
  GraphHolder g;
  if (opt.use_graph) {
    std::string why;
    GraphOverlapResult overlapped;
    t.graph = capture(stream, launch, next, opt.launches, opt.overlap, g, &overlapped, &why);
    t.programmatic_edges = overlapped.programmatic_edges;
    if (t.graph && !overlapped.note.empty()) t.note = "no overlap (" + overlapped.note + ")";
    next += opt.launches;
    if (t.graph) {
      // One replay outside the timing: uploads the graph and warms what the capture did not run.
      CNN_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
      CNN_CUDA_CHECK(cudaStreamSynchronize(stream));
    } else {
      t.note = "no CUDA graph (" + why + "); plain launches";
    }
  }

  EventChain ev(opt.repeats + 1);
  CNN_CUDA_CHECK(cudaEventRecord(ev[0], stream));
  for (int r = 0; r < opt.repeats; ++r) {
    if (t.graph) {
      CNN_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
    } else {
      for (int i = 0; i < opt.launches; ++i) launch(next++);
    }
    CNN_CUDA_CHECK(cudaEventRecord(ev[static_cast<size_t>(r) + 1], stream));
  }
  CNN_CUDA_CHECK(cudaStreamSynchronize(stream));
  CNN_CUDA_CHECK(cudaGetLastError());

  const std::vector<double> us = ev.gaps_us(opt.launches);
  t.samples = static_cast<int>(us.size());
  t.median_us = percentile(us, 0.5);
  t.p95_us = percentile(us, 0.95);
  t.min_us = *std::min_element(us.begin(), us.end());
  return t;
}

}  // namespace cnn::bench
#endif  // CNN_HAVE_CUDA
