#pragma once
// Times work enqueued on a stream with device events: what the start-up tuner (algo: auto) uses
// to compare kernel variants on the real shapes. Not for benchmarks (./bench has its own method).
#include <functional>

#include "runtime/exec.h"

namespace cnn {

// Runs fn once to warm up (first-launch costs, caches), then `reps` times between two events on
// ex.stream, and returns the mean microseconds per call. CUDA only; throws on the CPU.
double time_on_stream(const std::function<void()>& fn, const Exec& ex, int reps);

// After a variant refused a shape: throws if the device context is no longer usable (a kernel
// faulted: every later launch would fail too, so the tuner must stop and say so, not try the
// next variant). Clears a non-sticky launch error first. CUDA only.
void check_device_usable(const Exec& ex);

}  // namespace cnn
