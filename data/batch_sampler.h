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

class BatchSampler {
 public:
  // shuffle = false: the identity order every epoch (evaluation). drop_last: a final batch
  // smaller than batch_size is not produced.
  BatchSampler(int64_t n, int batch_size, bool shuffle, bool drop_last, uint64_t seed);

  int64_t size() const { return n_; }
  int batch_size() const { return batch_size_; }
  int64_t batches_per_epoch() const;
  // Samples one epoch visits (n, or fewer with drop_last).
  int64_t samples_per_epoch() const;

  // Starts `epoch` at batch `position` (0 for a fresh epoch; the saved position on resume).
  void start_epoch(int64_t epoch, int64_t position = 0);
  // The next batch's indices (a view into the epoch order, valid until the next start_epoch);
  // returns false at the end of the epoch.
  bool next(const int32_t** indices, int* count);

  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }  // batches already taken this epoch
  const std::vector<int32_t>& order() const { return order_; }

 private:
  int64_t n_;
  int batch_size_;
  bool shuffle_, drop_last_;
  uint64_t seed_;
  int64_t epoch_ = -1, position_ = 0;
  std::vector<int32_t> order_;  // (n)
};

}  // namespace cnn
