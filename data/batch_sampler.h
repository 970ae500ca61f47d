#pragma once
// The order of an epoch: a permutation drawn from (seed, epoch) alone, so that any epoch's order
// can be recomputed, and a run resumed mid-epoch at (epoch, batch position) sees exactly the
// batches it would have seen.
#include <cstdint>
#include <vector>

namespace cnn {

// A uniformly random permutation of [0, n) for this (seed, epoch) (Fisher-Yates with our own
// generator: the same on every platform).
std::vector<int32_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

// Data-parallel training (rank, world > 1) is a distributed sampler: every rank draws the same
// permutation, a step's global batch is the next world * batch_size entries of it, exactly the
// batch one process at batch world * batch_size takes, and rank r takes the contiguous slice
// [r * batch_size, (r + 1) * batch_size) of it. Contiguous rather than strided: a rank's batch is
// one range of the order, which the GPU gather already reads from a counter (a captured graph),
// and the summed gradient is that of the one-process global batch either way. A final partial
// global batch is filled rank by rank, so the last ranks may get fewer samples or none.
class BatchSampler {
 public:
  // shuffle = false: the identity order every epoch (evaluation). drop_last: a final batch
  // smaller than batch_size (world * batch_size with world > 1) is not produced.
  BatchSampler(int64_t n, int batch_size, bool shuffle, bool drop_last, uint64_t seed, int rank = 0,
               int world = 1);

  int64_t size() const { return n_; }
  int batch_size() const { return batch_size_; }  // per rank
  int64_t global_batch() const { return int64_t(batch_size_) * world_; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  // Global batches (steps) per epoch.
  int64_t batches_per_epoch() const;
  // Samples one epoch visits (n, or fewer with drop_last).
  int64_t samples_per_epoch() const;

  // Starts `epoch` at batch `position` (0 for a fresh epoch; the saved position on resume).
  void start_epoch(int64_t epoch, int64_t position = 0);
  // The next batch's indices (a view into the epoch order, valid until the next start_epoch),
  // this rank's slice of the global batch (count may be 0 on the last ranks in a final partial
  // batch); returns false at the end of the epoch.
  bool next(const int32_t** indices, int* count);
  // The size of the global batch next() last returned (all ranks together): a rank scales its
  // gradient by 1 / this so that the ranks' sum is the global batch's mean.
  int64_t last_global_count() const { return last_global_count_; }
  // Order entry of this rank's first sample in global batch `position`.
  int64_t slice_begin(int64_t position) const {
    return position * global_batch() + int64_t(rank_) * batch_size_;
  }

  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }  // batches already taken this epoch
  const std::vector<int32_t>& order() const { return order_; }

 private:
  int64_t n_;
  int batch_size_;
  bool shuffle_, drop_last_;
  int rank_ = 0, world_ = 1;
  int64_t last_global_count_ = 0;
  uint64_t seed_;
  int64_t epoch_ = -1, position_ = 0;
  std::vector<int32_t> order_;  // (n)
};

}  // namespace cnn
