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
                                    const Exec& ex) {
  std::vector<TuneChoice> out;
  out.push_back(pick_fastest(site, "forward", fwd, ex));
  algos->fwd = out.back().chosen;
  out.push_back(pick_fastest(site, "weight-grad", dw, ex));
  algos->dw = out.back().chosen;
  if (dx) {
    out.push_back(pick_fastest(site, "input-grad", *dx, ex));
    algos->dx = out.back().chosen;
  }
  return out;
}

std::vector<std::string> check_in_whole_pass(std::vector<PassInWhole>& passes,
                                             const std::function<double()>& time,
                                             const std::string& whole, double within, double gain) {
  std::vector<std::string> lines;
  double best = -1;  // the whole's time with the picks so far; measured at the first try
  double first = -1;
  int changed = 0;
  for (PassInWhole& p : passes) {
    TuneChoice& c = *p.choice;
    double alone = -1;
    for (const auto& [a, us] : c.timings)
      if (a == c.chosen) alone = us;
    if (alone <= 0) continue;  // a cached choice without timings: nothing to weigh
    std::vector<Algo> close;
    for (const auto& [a, us] : c.timings)
      if (a != c.chosen && us <= within * alone) close.push_back(a);
    if (close.empty()) continue;
    if (best < 0) first = best = time();
    const Algo pick = c.chosen;
    const double before = best;
    Algo keep = pick;
    std::string tried;
    for (Algo a : close) {
      p.set(a);
      const double us = time();
      tried += fmt::format(", {} {:.1f}", algo_name(a), us);
      if (us < (1.0 - gain) * best) {
        best = us;
        keep = a;
      }
    }
    p.set(keep);
    if (keep != pick) {
      c.chosen = keep;
      ++changed;
    }
    lines.push_back(fmt::format("{} {} in the {}: {} ({} {:.1f} us{})", c.layer, c.pass, whole,
                                algo_name(keep), algo_name(pick), before, tried));
  }
  if (best >= 0)
    lines.push_back(fmt::format("{}: {:.1f} us with the picks alone, {:.1f} us with {} changed",
                                whole, first, best, changed));
  return lines;
}

std::vector<std::string> check_switches_in_whole_pass(std::vector<SwitchInWhole>& switches,
                                                      const std::function<double()>& time,
                                                      const std::string& whole, double gain) {
  std::vector<std::string> lines;
  if (switches.empty()) return lines;
  const double first = time();
  double best = first;
  int off = 0;
  for (SwitchInWhole& s : switches) {
    s.set(false);
    const double us = time();
    const bool keep_off = us < (1.0 - gain) * best;
    lines.push_back(fmt::format("{} {} in the {}: {} {} ({:.1f} us on, {:.1f} off)", s.layer,
                                s.pass, whole, s.what, keep_off ? "off" : "on", best, us));
    if (keep_off) {
      best = us;
      ++off;
    } else {
      s.set(true);
    }
  }
  lines.push_back(fmt::format("{}: {:.1f} us with every switch on, {:.1f} us with {} off", whole,
                              first, best, off));
  return lines;
}

}  // namespace cnn
