#pragma once
// `algo: auto` on CUDA: each conv/linear layer times its kernel variants once at start-up, on the
// real shapes and precision, and keeps the fastest per pass (forward, input gradient, weight
// gradient). Skipped in deterministic mode (a timed choice could differ between two runs, and
// with it the rounding) and when NetworkOptions.autotune is off (CNN_AUTOTUNE=0); the fixed rule of
// each op's dispatch applies then.
// With a TuneCache (layers/tune_cache.h) a choice recorded by an earlier run on the same GPU and
// build is reused instead of timed, after checking that the variant still accepts the shape.
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

// The variant of each pass of a conv/linear layer: as configured, or as tune_passes() picked.
struct PassAlgos {
  Algo fwd = Algo::Auto, dw = Algo::Auto, dx = Algo::Auto;
  // Whether the weight gradient may take its kernel's cluster form (Exec::clusters): on, unless
  // the check in the whole backward pass measured the pass faster beside the others without.
  bool dw_clusters = true;
  explicit PassAlgos(Algo all = Algo::Auto) : fwd(all), dw(all), dx(all) {}
};

// pick_fastest for a layer's forward, weight-gradient and (when dx is given: not the first
// layer) input-gradient passes, in that order, into *algos; one choice per pass tuned.
std::vector<TuneChoice> tune_passes(const std::string& layer, const std::function<void(Algo)>& fwd,
                                    const std::function<void(Algo)>& dw,
                                    const std::function<void(Algo)>* dx, PassAlgos* algos,
                                    const Exec& ex);
// The same through a TuneSite (its cache, when set).
std::vector<TuneChoice> tune_passes(const TuneSite& site, const std::function<void(Algo)>& fwd,
                                    const std::function<void(Algo)>& dw,
                                    const std::function<void(Algo)>* dx, PassAlgos* algos,
                                    const Exec& ex);

// The check in the whole pass: a pass timed alone can cost the passes beside it more than it
// gains. The training step runs each layer's weight gradient on a second stream beside its input
// gradient and the layers before, where they share the SMs (docs/performance.md, "Backward picks
// checked in the whole backward pass"). So each variant close behind a pick alone is tried where
// the pick runs, and kept where it shortens the whole pass.
struct PassInWhole {
  TuneChoice* choice;             // the pass's choice alone: its pick and its timings
  std::function<void(Algo)> set;  // from now on the pass runs this variant
};

// Greedy, in order: for each pass, every variant timed alone within `within` x the pick's time
// is set and the whole pass timed (time(), us); the variant is kept where the whole is at least
// `gain` (a fraction) below the best so far, else the pick is set back. Changes each kept pick in
// its choice. Returns a log line for each pass where a variant was tried, and a last one for the
// whole (none where nothing was tried).
std::vector<std::string> check_in_whole_pass(std::vector<PassInWhole>& passes,
                                             const std::function<double()>& time,
                                             const std::string& whole, double within = 2.0,
                                             double gain = 0.01);

// A switch of one pass that timing the pass alone cannot weigh: a kernel's cluster form, whose
// blocks wait for a whole cluster's room on the GPU, which the passes beside it may hold.
struct SwitchInWhole {
  std::string layer, pass, what;  // "conv5", "weight-grad", "clusters"
  std::function<void(bool)> set;  // on (each switch's state when the check starts) or off
};

// Greedy, in order: the whole is timed with every switch on, then each switch is set off and the
// whole timed again; it stays off where the whole is at least `gain` (a fraction) below the best
// so far, else it is set back on. Returns a line for each switch and a last one for the whole
// (none where there are no switches).
std::vector<std::string> check_switches_in_whole_pass(std::vector<SwitchInWhole>& switches,
                                                      const std::function<double()>& time,
                                                      const std::string& whole, double gain = 0.01);

}  // namespace cnn
