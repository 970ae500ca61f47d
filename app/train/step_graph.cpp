#include "app/train/step_graph.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "runtime/env_switches.h"
#include "runtime/error.h"
#include "runtime/graph_overlap.h"
#include "runtime/side_stream.h"

#ifdef CNN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "runtime/cuda_check.h"
#endif

namespace cnn {

TrainStream::TrainStream(Device dev) {
  if (dev != Device::CUDA) return;
#ifdef CNN_HAVE_CUDA
  // Default flags: a blocking stream, ordered with the legacy stream's synchronous copies. The
  // greatest priority: the optimizer's early updates on a side stream take only the SMs that
  // this stream's kernels leave (runtime/side_stream.h).
  CNN_CUDA_CHECK(
      cudaStreamCreateWithPriority(&stream_, cudaStreamDefault, greatest_stream_priority()));
#else
  CNN_FAIL("a CUDA stream was requested but this build has no CUDA");
#endif
}

TrainStream::~TrainStream() {
#ifdef CNN_HAVE_CUDA
  if (stream_) cudaStreamDestroy(stream_);
#endif
}

StepState::StepState(const Exec& ex, int64_t steps_per_epoch)
    : ex_(ex),
      counters_(1, ex.device),
      table_(static_cast<size_t>(std::max<int64_t>(1, steps_per_epoch)), ex.device) {}

void StepState::start_epoch(const std::vector<double>& lr_per_batch, int64_t batch,
                            int64_t update) {
  CNN_CHECK(!lr_per_batch.empty() && lr_per_batch.size() <= table_.size(),
            "step state: a table of {} learning rates for {} batches per epoch",
            lr_per_batch.size(), table_.size());
  CNN_CHECK(batch >= 0 && update >= 1, "step state: batch {} / update {}", batch, update);
  host_table_ = lr_per_batch;
  // The float the by-value optimizer path would pass (static_cast<float>(lr)).
  host_table_f_.assign(lr_per_batch.size(), 0.f);
  for (size_t k = 0; k < lr_per_batch.size(); ++k)
    host_table_f_[k] = static_cast<float>(lr_per_batch[k]);
  host_counters_.batch = batch;
  host_counters_.update = update;
  host_counters_.lr = host_table_f_[std::min(size_t(batch), host_table_f_.size() - 1)];
  table_.copy_from(host_table_f_.data(), Device::CPU, host_table_f_.size(), ex_.stream);
  counters_.copy_from(&host_counters_, Device::CPU, 1, ex_.stream);
}

void StepState::advance() {
  advance_step_counters(counters_.data(), table_.data(), int64_t(host_table_f_.size()), ex_);
}

double StepState::lr_at(int64_t batch) const {
  CNN_CHECK(!host_table_.empty(), "step state: no epoch started");
  return host_table_[size_t(std::clamp<int64_t>(batch, 0, int64_t(host_table_.size()) - 1))];
}

std::string cuda_graph_off_reason(Device dev, bool config_on, bool optimizer_syncs_host) {
  if (dev != Device::CUDA) return "the CPU runs each step directly";
  if (!config_on) return "training.cuda_graph is false";
  const EnvSwitches env = read_env_switches();  // once per run: the trainer asks at start
  if (!env.cuda_graph) return "CNN_CUDA_GRAPH=0";
  if (optimizer_syncs_host)
    return "optimizer.clip_grad_norm reads the gradient norm back to the host every step";
  if (env.sync_check) return "CNN_SYNC_CHECK synchronizes after every launch";
  return "";
}

StepGraph::StepGraph(const Exec& ex, bool enabled, GraphOverlap overlap)
    : ex_(ex), enabled_(enabled), overlap_wanted_(overlap) {
  CNN_CHECK(!enabled || (ex.device == Device::CUDA && ex.stream),
            "a CUDA graph needs the CUDA device and a created stream");
}

StepGraph::~StepGraph() {
#ifdef CNN_HAVE_CUDA
  // A replay may still run (a run left by an exception): let it finish before its graph goes.
  if (exec_ && cudaStreamSynchronize(ex_.stream) != cudaSuccess) (void)cudaGetLastError();
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
#endif
}

std::string StepGraph::take_news(bool* warning) {
  *warning = failed_;
  return std::move(news_);
}

void StepGraph::run(const std::function<void()>& body, bool capturable) {
  if (!enabled_ || failed_ || !capturable) return body();
#ifdef CNN_HAVE_CUDA
  if (exec_) {
    CNN_CUDA_CHECK(cudaGraphLaunch(exec_, ex_.stream));
    return;
  }
  if (!warmed_up_) {
    warmed_up_ = true;
    return body();
  }
  std::string why;
  if (!capture(body, &why)) {
    failed_ = true;
    news_ = "CUDA graph: capturing the training step failed (" + why +
            "); the steps run as plain launches";
    return body();
  }
  size_t nodes = 0;
  if (cudaGraphGetNodes(graph_, nullptr, &nodes) != cudaSuccess) (void)cudaGetLastError();
  news_ = fmt::format(
      "CUDA graph: captured the training step ({} nodes); every full batch is one replay", nodes);
  if (overlap_.programmatic_edges > 0)
    news_ += fmt::format("; {} kernels launch while the one before them ends",
                         overlap_.programmatic_edges);
  else if (!overlap_.note.empty())
    news_ += "; kernels launch after the one before them (" + overlap_.note + ")";
  CNN_CUDA_CHECK(cudaGraphLaunch(exec_, ex_.stream));
#else
  body();
#endif
}

bool StepGraph::capture(const std::function<void()>& body, std::string* why) {
#ifdef CNN_HAVE_CUDA
  cudaError_t err = cudaStreamBeginCapture(ex_.stream, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) {
    *why = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(err);
    (void)cudaGetLastError();
    return false;
  }
  std::string failure;
  try {
    body();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  cudaGraph_t graph = nullptr;
  err = cudaStreamEndCapture(ex_.stream, &graph);
  if (failure.empty() && err != cudaSuccess)
    failure = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(err);
  cudaGraphExec_t exec = nullptr;
  if (failure.empty()) {
    err = instantiate_graph(&exec, graph, overlap_wanted_, &overlap_);
    if (err != cudaSuccess)
      failure = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(err);
  }
  if (!failure.empty()) {
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // capture errors are not sticky; clear them for the plain launches
    *why = failure;
    return false;
  }
  graph_ = graph;
  exec_ = exec;
  return true;
#else
  (void)body;
  *why = "built without CUDA";
  return false;
#endif
}

}  // namespace cnn
