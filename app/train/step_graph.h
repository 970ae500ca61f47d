#pragma once
// The trainer's step as one CUDA graph: every value that changes from step to step (the batch's
// place in the epoch order, the learning rate, Adam's step number) lives in device memory and is
// advanced by the step's last launch, so the launches of a step are the same every step; they are
// captured once and replayed with one cudaGraphLaunch per step. Where a step cannot be replayed
// (CPU, a partial batch, a host sync for clipping, a failed capture, the switch off) the same
// launches run eagerly, with the same results.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/optimizer/optimizer.h"
#include "layers/optim_options.h"
#include "runtime/exec.h"
#include "runtime/graph_overlap.h"
#include "runtime/memory.h"

namespace cnn {

// A created stream for the trainer on CUDA (the legacy default stream cannot be captured); null
// on the CPU. It synchronizes with the legacy stream, so that the plain synchronous copies
// (checkpoints, logging points) still see all of the step's work.
class TrainStream {
 public:
  explicit TrainStream(Device dev);
  ~TrainStream();
  TrainStream(const TrainStream&) = delete;
  TrainStream& operator=(const TrainStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// The step counters and the epoch's learning-rate table in memory of ex.device.
class StepState {
 public:
  StepState(const Exec& ex, int64_t steps_per_epoch);

  // At an epoch's start or a resume inside it: the table (one rate per batch of the epoch, from
  // epoch_lr_table in layers/lr_schedule.h), the batch the epoch continues at, and the optimizer's
  // 1-based update number of that batch. Asynchronous on ex.stream, ordered after the steps before
  // it.
  void start_epoch(const std::vector<double>& lr_per_batch, int64_t batch, int64_t update);
  void advance();  // the step's last launch (advance_step_counters)

  const int64_t* batch() const { return &counters_.data()->batch; }
  const int64_t* update() const { return &counters_.data()->update; }
  const float* lr() const { return &counters_.data()->lr; }
  // The host's copy of this epoch's table (logging), as doubles.
  double lr_at(int64_t batch) const;

 private:
  Exec ex_;
  Buffer<StepCounters> counters_;  // (1)
  Buffer<float> table_;            // (steps_per_epoch)
  std::vector<double> host_table_;
  std::vector<float> host_table_f_;
  StepCounters host_counters_;  // the source of counters_'s upload
};

// Whether the trainer may use a graph, and why not: "" when it may, else the reason (the CPU,
// the config switch, CNN_CUDA_GRAPH=0, clipping's host sync, CNN_SYNC_CHECK).
std::string cuda_graph_off_reason(Device dev, bool config_on, bool optimizer_syncs_host);

class StepGraph {
 public:
  // enabled: cuda_graph_off_reason() said "" (ex.stream must then be a created stream).
  // overlap: when the captured kernels launch (graph_overlap.h).
  StepGraph(const Exec& ex, bool enabled, GraphOverlap overlap = GraphOverlap::AtExit);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Runs one step's launches (`body`, on ex.stream). capturable: this step's launches are those
  // of every full batch (no host sync). The first capturable step runs eagerly as a warm-up
  // (anything done once at first use happens outside the graph), the second is captured and
  // launched, later ones are replays. A failed capture turns the graph off: the step runs
  // eagerly (body runs a second time: it must only enqueue work, never change host state), and
  // take_news() says why.
  void run(const std::function<void()>& body, bool capturable);

  bool replaying() const { return exec_ != nullptr; }
  // After the capture (once): the line for the log, *warning set when it failed; else "".
  std::string take_news(bool* warning);

 private:
  bool capture(const std::function<void()>& body, std::string* why);

  Exec ex_;
  bool enabled_ = false, warmed_up_ = false, failed_ = false;
  GraphOverlap overlap_wanted_ = GraphOverlap::AtExit;
  struct CUgraph_st* graph_ = nullptr;     // cudaGraph_t
  struct CUgraphExec_st* exec_ = nullptr;  // cudaGraphExec_t
  std::string news_;
  GraphOverlapResult overlap_;
};

}  // namespace cnn
