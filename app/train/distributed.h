#pragma once
// Data-parallel training: one process (rank) per GPU. Which rank this process is (from the
// launcher's CNN_RANK / CNN_WORLD_SIZE / CNN_LOCAL_RANK, or mpirun's OMPI_COMM_WORLD_* / PMI_*),
// the NCCL communicator of the ranks (rank 0 creates the unique id and hands it over through a
// 0600 file written atomically), the gradient all-reduce in buckets that start while the backward
// pass still runs, and the watchdog that stops a rank whose collective never finishes.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/exec.h"
#include "runtime/nccl_lib.h"

namespace cnn {

class Network;

struct RankInfo {
  int rank = 0, world = 1, local_rank = 0;
  // The file rank 0 writes the NCCL unique id to and the others read it from; token: a value the
  // file must carry (an MPI job id), so that a stale file of an earlier job is never read.
  std::string id_file, id_token;
  std::string source;  // "train --gpus", "mpirun (OMPI_COMM_WORLD_RANK)", ...; "" for one process
  bool distributed() const { return !source.empty(); }
};

// This process's rank from the environment (getenv_fn stands for std::getenv, for tests). One
// process (source "") when none of the variables is set. Throws on values that do not fit.
RankInfo rank_info_from_env(const char* (*getenv_fn)(const char*));

// NCCL from CNN_NCCL_LIBRARY, else training.nccl_library (config_value), else libnccl.so.2;
// throws one line naming the library and where its name came from when it cannot be loaded.
std::unique_ptr<NcclLib> open_nccl(const std::string& config_value);
// Whether this build can train on several GPUs (CUDA and CNN_ENABLE_NCCL); "" when it can, else
// why not.
std::string multi_gpu_unsupported_reason();

// The unique id through a file: write (atomically, mode 0600) and wait for it (polling until
// timeout_s; throws naming the file when it never comes or does not carry the token).
void write_nccl_id_file(const std::string& path, const NcclUniqueId& id, const std::string& token);
NcclUniqueId wait_nccl_id_file(const std::string& path, const std::string& token, double timeout_s);

// Parameter gradient buckets: contiguous ranges of the flat gradient buffer, in the order the
// backward pass finishes them (from the end of the buffer down to 0), each at least
// bucket_floats long (the last one may be shorter) and cut only at the offsets the backward pass
// reports (Network::grads_ready_offsets()), so that a bucket is launched as soon as its last
// layer's backward has run.
struct GradBucket {
  int64_t begin = 0, end = 0;
};
std::vector<GradBucket> plan_grad_buckets(const std::vector<int64_t>& ready_offsets, int64_t total,
                                          int64_t bucket_floats);

// Timing of one step's communication, from CUDA events (milliseconds; < 0 when unknown).
struct CommTimes {
  double allreduce_ms = -1;  // first bucket's start to the last bucket's end
  double exposed_ms = -1;    // the end of backward to the end of the last all-reduce: the wait
};

// One rank's communicator and its gradient all-reduce (CUDA and NCCL only).
class DataParallel {
 public:
  // Loads NCCL, exchanges the unique id and creates the communicator (this blocks until all
  // ranks have joined). deterministic: NCCL_ALGO=Ring and NCCL_PROTO=Simple are set first (a
  // fixed reduction order for a fixed number of ranks). Logs nothing; describe() says what it
  // did.
  DataParallel(const RankInfo& info, const std::string& nccl_library_config, bool deterministic,
               double timeout_s);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  std::string describe() const;
  const RankInfo& info() const { return info_; }

  // Hooks the network's backward pass: buckets of ~bucket_bytes are summed across ranks on a
  // stream of their own as soon as the backward pass has finished them. ex: the trainer's.
  void attach(Network& net, const Exec& ex, int64_t bucket_bytes);
  // After forward_backward (also when this rank had no samples and ran none): launches what is
  // left, and makes ex.stream wait for every all-reduce.
  void finish_step();
  // Sums `count` floats in place across ranks, on ex.stream (evaluation counters and such).
  void all_reduce_sum(float* d_data, size_t count);
  // After a step's launches: waits (polling NCCL's asynchronous error and the timeout) for the
  // step before it, so that the host never runs more than one step ahead of a collective that
  // may never finish. Throws one line naming the rank and what happened.
  void watch_step();
  // Waits the same way for everything enqueued so far: before the host synchronizes with the
  // stream (logging, checkpoints), which would otherwise wait forever for a collective that
  // another rank never joins.
  void drain();
  // The last finished step's communication times (call after a synchronization).
  CommTimes last_times() const;
  int num_buckets() const { return int(buckets_.size()); }

 private:
  void launch_bucket(size_t b);
  void wait_event(void* event, const char* what);
  void abort_comm();

  RankInfo info_;
  double timeout_s_ = 600;
  bool deterministic_ = false;
  std::unique_ptr<NcclLib> lib_;
  NcclComm comm_ = nullptr;
  [[maybe_unused]] bool failed_ =
      false;  // aborted: the destructor must not wait for a collective (CUDA + NCCL builds)
  Exec ex_;
  float* d_grads_ = nullptr;
  std::vector<GradBucket> buckets_;
  std::vector<bool> launched_;
  cudaStream_t comm_stream_ = nullptr;
  std::vector<void*> ready_events_;  // cudaEvent_t per bucket
  void* ev_first_ = nullptr;         // comm stream: the first all-reduce starts
  void* ev_backward_end_ = nullptr;  // compute stream: backward done
  void* ev_comm_end_ = nullptr;      // comm stream: every all-reduce done
  void* step_events_[2] = {nullptr, nullptr};
  int64_t steps_ = 0;
};

}  // namespace cnn
