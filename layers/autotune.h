#pragma once
// `algo: auto` on CUDA: each conv/linear layer times its kernel variants once at start-up, on the
// real shapes and precision, and keeps the fastest per pass (forward, input gradient, weight
// gradient). Skipped in deterministic mode (a timed choice could differ between two runs, and
// with it the rounding) and when NetworkOptions.autotune is off (CNN_AUTOTUNE=0); the fixed rule of
// each op's dispatch applies then.
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/exec.h"

namespace cnn {

struct TuneChoice {
  std::string layer;  // "conv1"
  std::string pass;   // "forward", "input-grad", "weight-grad"
  Algo chosen = Algo::Auto;
  std::vector<std::pair<Algo, double>> timings;  // microseconds per call, in candidate order
};

// "conv1 forward: fast 13.4 us (igemm 17.7, tiled 24.4, naive 92.3)"
std::string describe(const TuneChoice& c);

// The variants tried, in order of preference when two time the same.
const std::vector<Algo>& tune_candidates();

// Times run(algo) for every candidate (a variant that throws cnn::Error, i.e. does not support
// the shape, is left out) and returns the fastest. run must only enqueue work on ex.stream.
TuneChoice pick_fastest(const std::string& layer, const char* pass,
                        const std::function<void(Algo)>& run, const Exec& ex);

// The variant of each pass of a conv/linear layer: as configured, or as tune_passes() picked.
struct PassAlgos {
  Algo fwd = Algo::Auto, dw = Algo::Auto, dx = Algo::Auto;
  explicit PassAlgos(Algo all = Algo::Auto) : fwd(all), dw(all), dx(all) {}
};

// pick_fastest for a layer's forward, weight-gradient and (when dx is given: not the first
// layer) input-gradient passes, in that order, into *algos; one choice per pass tuned.
std::vector<TuneChoice> tune_passes(const std::string& layer, const std::function<void(Algo)>& fwd,
                                    const std::function<void(Algo)>& dw,
                                    const std::function<void(Algo)>* dx, PassAlgos* algos,
                                    const Exec& ex);

}  // namespace cnn
