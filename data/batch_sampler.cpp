#include "data/batch_sampler.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

#include "runtime/error.h"
#include "runtime/hash_rng.h"

namespace cnn {

namespace {
constexpr uint64_t kShuffleStream = 0x5348554646ull;  // "SHUFF": keeps this stream apart
}

std::vector<int32_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  CNN_CHECK(n >= 0 && n <= std::numeric_limits<int32_t>::max(),
            "cannot shuffle {} samples (expected 0..2^31-1)", n);
  std::vector<int32_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  SplitMix64 rng(hash3(seed, static_cast<uint64_t>(epoch), kShuffleStream));
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

BatchSampler::BatchSampler(int64_t n, int batch_size, bool shuffle, bool drop_last, uint64_t seed,
                           int rank, int world)
    : n_(n),
      batch_size_(batch_size),
      shuffle_(shuffle),
      drop_last_(drop_last),
      rank_(rank),
      world_(world),
      seed_(seed) {
  CNN_CHECK(n > 0 && n <= std::numeric_limits<int32_t>::max(),
            "batch sampler: {} samples, expected 1..2^31-1", n);
  CNN_CHECK(batch_size > 0, "batch size is {}, expected > 0", batch_size);
  CNN_CHECK(world >= 1 && rank >= 0 && rank < world, "batch sampler: rank {} of {} ranks", rank,
            world);
  CNN_CHECK(!drop_last || global_batch() <= n,
            "drop_last with batch size {}{} and only {} samples leaves no batch at all",
            global_batch(),
            world > 1 ? fmt::format(" ({} per GPU x {} GPUs)", batch_size, world) : "", n);
}

int64_t BatchSampler::batches_per_epoch() const {
  const int64_t g = global_batch();
  return drop_last_ ? n_ / g : (n_ + g - 1) / g;
}

int64_t BatchSampler::samples_per_epoch() const {
  return drop_last_ ? batches_per_epoch() * global_batch() : n_;
}

void BatchSampler::start_epoch(int64_t epoch, int64_t position) {
  CNN_CHECK(epoch >= 0, "epoch {} is negative", epoch);
  CNN_CHECK(position >= 0 && position <= batches_per_epoch(),
            "resume position {} is outside [0, {}] batches of epoch {}", position,
            batches_per_epoch(), epoch);
  if (epoch != epoch_ || order_.empty()) {
    if (shuffle_) {
      order_ = epoch_permutation(n_, seed_, epoch);
    } else {
      order_.resize(static_cast<size_t>(n_));
      std::iota(order_.begin(), order_.end(), 0);
    }
  }
  epoch_ = epoch;
  position_ = position;
}

bool BatchSampler::next(const int32_t** indices, int* count) {
  CNN_CHECK(epoch_ >= 0, "batch sampler: next() before start_epoch()");
  if (position_ >= batches_per_epoch()) return false;
  const int64_t global_begin = position_ * global_batch();
  const int64_t global_end = std::min<int64_t>(global_begin + global_batch(), n_);
  const int64_t begin = std::min(slice_begin(position_), global_end);
  const int64_t end = std::min<int64_t>(begin + batch_size_, global_end);
  *indices = order_.data() + begin;
  *count = static_cast<int>(end - begin);
  last_global_count_ = global_end - global_begin;
  ++position_;
  return true;
}

}  // namespace cnn
