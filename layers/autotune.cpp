#include "layers/autotune.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "runtime/error.h"
#include "runtime/stream_timer.h"

namespace cnn {

std::string describe(const TuneChoice& c) {
  std::string s = c.layer + " " + c.pass + ": " + algo_name(c.chosen);
  std::string others;
  for (const auto& [algo, us] : c.timings) {
    if (algo == c.chosen) {
      s += fmt::format(" {:.1f} us", us);
    } else {
      others += fmt::format("{}{} {:.1f}", others.empty() ? "" : ", ", algo_name(algo), us);
    }
  }
  if (!others.empty()) s += " (" + others + ")";
  return s;
}

const std::vector<Algo>& tune_candidates() {
  static const std::vector<Algo> c = {Algo::Fast, Algo::Igemm, Algo::Tiled, Algo::Naive};
  return c;
}

TuneChoice pick_fastest(const std::string& layer, const char* pass,
                        const std::function<void(Algo)>& run, const Exec& ex) {
  TuneChoice choice{layer, pass, Algo::Auto, {}};
  double best = 0;
  std::string refusals;  // why each left-out variant was left out, for the error below
  for (Algo a : tune_candidates()) {
    double us = 0;
    try {
      // One call estimates the cost; then enough calls for ~2 ms of work (3 to 50).
      const double first = time_on_stream([&] { run(a); }, ex, 1);
      const int reps = static_cast<int>(std::clamp(2000.0 / std::max(first, 1.0), 3.0, 50.0));
      us = time_on_stream([&] { run(a); }, ex, reps);
    } catch (const Error& e) {
      // A variant that does not support the shape is left out; a kernel fault is not a refusal.
      try {
        check_device_usable(ex);
      } catch (const Error& broken) {
        CNN_FAIL("algo: auto: timing {} {} with {}: {} ({})", layer, pass, algo_name(a),
                 broken.what(), e.what());
      }
      refusals += fmt::format("; {}: {}", algo_name(a), e.what());
      continue;
    }
    choice.timings.emplace_back(a, us);
    // A later candidate must be clearly faster (2%) to win: timing noise keeps the preferred one.
    if (choice.chosen == Algo::Auto || us < 0.98 * best) {
      choice.chosen = a;
      best = us;
    }
  }
  CNN_CHECK(choice.chosen != Algo::Auto, "algo: auto: no kernel variant supports {} {}{}", layer,
            pass, refusals);
  return choice;
}

std::vector<TuneChoice> tune_passes(const std::string& layer, const std::function<void(Algo)>& fwd,
                                    const std::function<void(Algo)>& dw,
                                    const std::function<void(Algo)>* dx, PassAlgos* algos,
                                    const Exec& ex) {
  std::vector<TuneChoice> out;
  out.push_back(pick_fastest(layer, "forward", fwd, ex));
  algos->fwd = out.back().chosen;
  out.push_back(pick_fastest(layer, "weight-grad", dw, ex));
  algos->dw = out.back().chosen;
  if (dx) {
    out.push_back(pick_fastest(layer, "input-grad", *dx, ex));
    algos->dx = out.back().chosen;
  }
  return out;
}

}  // namespace cnn
