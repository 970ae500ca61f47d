#pragma once
// Counter-based hashing and a small seeded generator, identical on the host and the device and on
// every platform (std:: distributions are implementation-defined, so they are not used for
// anything that must be reproducible: shuffles, splits, augmentation, synthetic data).
#include <cstdint>

#if defined(__CUDACC__)
#define CNN_DATA_HD __host__ __device__
#else
#define CNN_DATA_HD
#endif

namespace cnn {

// The splitmix64 finalizer: a bijective 64-bit mix with full avalanche.
CNN_DATA_HD inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A hash of three counters; different argument orders give unrelated values.
CNN_DATA_HD inline uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = mix64(a + 0x9E3779B97F4A7C15ull);
  h = mix64(h ^ (b + 0x632BE59BD9B4E019ull));
  return mix64(h ^ (c + 0x85157AF5ED4D5C2Bull));
}

// Maps 32 random bits to [0, n) by multiply-shift (bias below 2^-32 * n, irrelevant here, and
// exactly reproducible everywhere).
CNN_DATA_HD inline uint32_t bounded32(uint32_t bits, uint32_t n) {
  return static_cast<uint32_t>((static_cast<uint64_t>(bits) * n) >> 32);
}

// Sequential generator (splitmix64 stream) for host-side shuffles and synthetic images.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    return mix64(state_);
  }
  // Uniform in [0, n), n > 0, for n up to 2^64-1 (rejection keeps it unbiased).
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do r = next();
    while (r >= limit);
    return r % n;
  }
  // Uniform in [lo, hi] (inclusive).
  int range(int lo, int hi) { return lo + static_cast<int>(below(uint64_t(hi - lo) + 1)); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  uint64_t state_;
};

}  // namespace cnn
