#include "layers/autotune.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "layers/tune_cache.h"
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
  if (c.cached) s += " [cached]";
  return s;
}

const std::vector<Algo>& tune_candidates() {
  static const std::vector<Algo> c = {Algo::Fast,  Algo::Wgmma, Algo::WgmmaNhwc,
                                      Algo::Igemm, Algo::Tiled, Algo::Naive};
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

TuneChoice pick_cached_or_timed(const TuneSite& site, const char* pass,
                                const std::function<void(Algo)>& run, const Exec& ex,
                                const std::function<TuneChoice()>& time_candidates) {
  if (!site.cache) return time_candidates();
  const std::string key =
      TuneCache::key(site.op, pass, precision_name(ex.precision), ex.deterministic);
  if (const CachedTune* hit = site.cache->find(key)) {
    const auto& cands = tune_candidates();
    const auto named =
        std::find_if(cands.begin(), cands.end(), [&](Algo a) { return hit->algo == algo_name(a); });
    if (named != cands.end()) {
      // The cache only names a variant: the variant's own shape check decides whether it may
      // run, exactly as when it was timed; a refusal means the entry is wrong, so time afresh.
      bool accepted = true;
      try {
        run(*named);
      } catch (const Error& e) {
        try {
          check_device_usable(ex);
        } catch (const Error& broken) {
          CNN_FAIL("algo: auto: {} {} with the cached {}: {} ({})", site.layer, pass,
                   algo_name(*named), broken.what(), e.what());
        }
        accepted = false;
      }
      if (accepted) {
        TuneChoice c{site.layer, pass, *named, {}, true};
        for (const auto& [name, us] : hit->us)
          for (Algo a : cands)
            if (name == algo_name(a)) c.timings.emplace_back(a, us);
        return c;
      }
    }
  }
  TuneChoice c = time_candidates();
  CachedTune record{algo_name(c.chosen), {}};
  for (const auto& [a, us] : c.timings) record.us.emplace_back(algo_name(a), us);
  site.cache->put(key, std::move(record));
  return c;
}

TuneChoice pick_fastest(const TuneSite& site, const char* pass,
                        const std::function<void(Algo)>& run, const Exec& ex) {
  return pick_cached_or_timed(site, pass, run, ex,
                              [&] { return pick_fastest(site.layer, pass, run, ex); });
}

std::vector<TuneChoice> tune_passes(const std::string& layer, const std::function<void(Algo)>& fwd,
                                    const std::function<void(Algo)>& dw,
                                    const std::function<void(Algo)>* dx, PassAlgos* algos,
                                    const Exec& ex) {
  return tune_passes(TuneSite{layer, "", nullptr}, fwd, dw, dx, algos, ex);
}

std::vector<TuneChoice> tune_passes(const TuneSite& site, const std::function<void(Algo)>& fwd,
                                    const std::function<void(Algo)>& dw,
                                    const std::function<void(Algo)>* dx, PassAlgos* algos,
                                    const Exec& ex, const TuneBeside* beside,
                                    const std::function<void(Algo)>* dw_beside) {
  std::vector<TuneChoice> out;
  out.push_back(pick_fastest(site, "forward", fwd, ex));
  algos->fwd = out.back().chosen;
  out.push_back(pick_fastest(site, "weight-grad", dw, ex));
  algos->dw = out.back().chosen;
  if (dx && beside && dw_beside) {
    const Algo partner = algos->dw;
    const std::function<void(Algo)> pair = [&](Algo a) {
      beside->fork();
      (*dw_beside)(partner);
      try {
        (*dx)(a);
      } catch (...) {
        beside->join();  // the refused variant enqueued nothing; the side stream's work is joined
        throw;
      }
      beside->join();
    };
    out.push_back(pick_fastest(site, "input-grad beside weight-grad", pair, ex));
    algos->dx = out.back().chosen;
  } else if (dx) {
    out.push_back(pick_fastest(site, "input-grad", *dx, ex));
    algos->dx = out.back().chosen;
  }
  return out;
}

}  // namespace cnn
