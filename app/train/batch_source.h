#pragma once
// Feeds one split of a dataset to the compute device as normalized float batches. On the GPU the
// uint8 images live on the device and one gather kernel builds each batch (indices of the whole
// epoch uploaded once per epoch, so a step copies nothing from the host; with a batch counter the
// kernel also finds its batch there, so that a CUDA graph replays it); on the CPU the same gather
// runs as its CPU twin. With world > 1 it feeds one rank's slice of each global batch.
#include <cstdint>

#include "data/batch_sampler.h"
#include "data/gather.h"
#include "runtime/exec.h"
#include "runtime/memory.h"

namespace cnn {

class BatchSource {
 public:
  // augment may be null (evaluation). shuffle=false keeps the dataset order. keep_host_labels:
  // also keep each batch's labels on the host (evaluation's confusion matrix); training leaves it
  // off so a step does no per-sample host work.
  BatchSource(const Dataset& d, const Normalization& norm, const AugmentOptions* augment,
              uint64_t seed, int batch, bool shuffle, bool drop_last, const Exec& ex,
              bool keep_host_labels = false, int rank = 0, int world = 1);

  int64_t size() const { return sampler_.size(); }
  int64_t batches_per_epoch() const { return sampler_.batches_per_epoch(); }
  void start_epoch(int64_t epoch, int64_t position = 0);
  // Gathers the next batch into x()/labels(); false at the end of the epoch.
  bool next(int* n);
  // next() in two halves: take() moves the sampler to the next batch (host only; false at the end
  // of the epoch), gather(n) builds that batch into x()/labels().
  bool take(int* n);
  void gather(int n);
  // gather(n) with every image mirrored left-right: the second half of test-time flipping.
  void gather_mirrored(int n);
  int64_t position() const { return sampler_.position(); }
  // The global batch the last take() chose (all ranks together; see BatchSampler).
  int64_t last_global_count() const { return sampler_.last_global_count(); }

  // Training under a CUDA graph: from now on the gather reads the batch's position in the epoch
  // from *batch_counter (memory of the device, e.g. StepCounters::batch, advanced by the step
  // itself) and the epoch from memory of its own, so that one captured launch gathers every
  // step's batch. The counter must hold position() (before take()) when the gather runs.
  void use_batch_counter(const int64_t* batch_counter);

  const float* x() const { return x_.data(); }         // (batch, C, H, W)
  const int32_t* labels() const { return y_.data(); }  // (batch)
  const int32_t* host_labels_of_last_batch() const { return last_labels_; }

 private:
  Exec ex_;
  const Dataset& host_;
  GatherParams params_;
  BatchSampler sampler_;
  DeviceDataset device_data_;         // CUDA only
  Buffer<int32_t> d_order_;           // (N) the epoch's order on the device
  Buffer<float> x_;                   // (batch, C, H, W)
  Buffer<int32_t> y_;                 // (batch)
  Buffer<int64_t> epoch_;             // (1) the epoch, for the gather, with a batch counter
  int64_t host_epoch_ = 0;            // the source of epoch_'s upload
  int64_t first_ = 0;                 // order entry of the taken batch's first sample
  const int32_t* indices_ = nullptr;  // host: the taken batch's indices
  bool keep_host_labels_ = false;
  const int32_t* last_labels_ = nullptr;
  std::vector<int32_t> last_labels_host_;
};

}  // namespace cnn
