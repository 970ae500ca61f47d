#pragma once
// `algo: auto` on CUDA: each conv/linear layer times its kernel variants once at start-up, on the
// real shapes and precision, and keeps the fastest per pass (forward, input gradient, weight
// gradient). Skipped in deterministic mode (a timed choice could differ between two runs, and
// with it the rounding) and when NetworkOptions.autotune is off (CNN_AUTOTUNE=0); the fixed rule of
// each op's dispatch applies then.
// With a TuneCache (layers/tune_cache.h) a choice recorded by an earlier run on the same GPU and
// build is reused instead of timed, after checking that the variant still accepts the shape.
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/exec.h"

namespace cnn {

class TuneCache;

struct TuneChoice {
  std::string layer;  // "conv1"
  std::string pass;   // "forward", "input-grad", "weight-grad"
  Algo chosen = Algo::Auto;
  std::vector<std::pair<Algo, double>> timings;  // microseconds per call, in candidate order
  bool cached = false;                           // taken from a TuneCache, not timed now
};

// "conv1 forward: fast 13.4 us (igemm 17.7, tiled 24.4, naive 92.3)"; a cached choice ends in
// " [cached]" (its timings are those of the run that measured them).
std::string describe(const TuneChoice& c);

// The variants tried, in order of preference when two time the same.
const std::vector<Algo>& tune_candidates();

// Times run(algo) for every candidate (a variant that throws cnn::Error, i.e. does not support
// the shape, is left out) and returns the fastest. run must only enqueue work on ex.stream.
TuneChoice pick_fastest(const std::string& layer, const char* pass,
                        const std::function<void(Algo)>& run, const Exec& ex);

// Where a tuned call sits: the layer (for the log), its op and shape (the cache key, e.g.
// "conv2d n128 c32 h14 w14 oc64 k5x5 s1x1 p2x2 bias relu": everything the variants' speed
// depends on), and the cache to consult and fill (null: time every candidate, remember nothing).
struct TuneSite {
  std::string layer;
  std::string op;
  TuneCache* cache = nullptr;
};

// pick_fastest through site.cache: a recorded choice for (op, pass, ex.precision,
// ex.deterministic) naming one of tune_candidates() is run once to check that it accepts the
// shape and is then taken without timing; otherwise (no entry, an unknown name, a refusal) the
// candidates are timed and the pick is recorded in the cache.
TuneChoice pick_fastest(const TuneSite& site, const char* pass,
                        const std::function<void(Algo)>& run, const Exec& ex);
// Its cache logic with the timing passed in (`time_candidates`, called on a miss), so that the
// tests run it on the CPU.
TuneChoice pick_cached_or_timed(const TuneSite& site, const char* pass,
                                const std::function<void(Algo)>& run, const Exec& ex,
                                const std::function<TuneChoice()>& time_candidates);

// Where the step runs a layer's weight gradient on a second stream beside its input gradient
// (NetworkOptions::weight_grads_beside), the two passes share the SMs: an input-gradient variant
// that is fastest alone can slow its partner by more than it gains (tensor-core blocks that fill
// the SMs beside a tensor-core weight gradient, where FFMA blocks left room). With a TuneBeside,
// tune_passes times each input-gradient variant as the step runs the pair: fork, the picked
// weight gradient on `side`, the variant on ex's stream, join; the time is the pair's, until
// both are done, and the pass is named "input-grad beside weight-grad" (in the log and in the
// cache's key).
struct TuneBeside {
  Exec side;                   // the side stream's
  std::function<void()> fork;  // the side stream waits for ex's
  std::function<void()> join;  // ex's stream waits for the side stream
  // The side stream's scratch, at least `floats` of it (grown with the side stream idle).
  std::function<float*(std::size_t floats)> scratch;
};

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
// The same through a TuneSite (its cache, when set); with `beside` and dx, the input gradient is
// timed beside dw_beside(the picked weight-gradient variant), which must only enqueue work on
// beside->side.stream.
std::vector<TuneChoice> tune_passes(const TuneSite& site, const std::function<void(Algo)>& fwd,
                                    const std::function<void(Algo)>& dw,
                                    const std::function<void(Algo)>* dx, PassAlgos* algos,
                                    const Exec& ex, const TuneBeside* beside = nullptr,
                                    const std::function<void(Algo)>* dw_beside = nullptr);

}  // namespace cnn
