#pragma once
// Time to accuracy starts at the process's start, not at the first step: this is where the time
// before the first step goes (one log line and run.json), and the start-up work that a second
// run can skip (the autotune cache).
#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/exec.h"

namespace cnn {

class Network;
class RunLog;

class StartupClock {
 public:
  using Clock = std::chrono::steady_clock;
  // Reads when the process started (Linux: /proc/self/stat, in clock ticks of 10 ms; elsewhere
  // the moment this program's static objects were initialized, just before main).
  StartupClock();

  // The time since the previous mark (the first: since main) was spent on `phase`.
  void mark(const char* phase);
  // Whether the step is captured as a CUDA graph: the report then waits for the second step.
  void expect_graph(bool on) { graph_on_ = on; }
  // Called after each training step until the report is out: waits for the step (so the first
  // steps are timed, not only their launches), books it as "first step" then, with the CUDA
  // graph on, the second as "graph capture", and logs the breakdown in one line.
  void after_step(const Exec& ex, RunLog& log);
  bool reported() const { return reported_; }

  double seconds_since_start() const;  // since the process started
  // {"exec to main", s}, {"config", s}, ...: every phase so far, in order.
  const std::vector<std::pair<std::string, double>>& phases() const { return phases_; }
  double before_first_step_s() const { return before_first_step_s_; }
  // "0.82 s before the first step: exec to main 0.031, ..." (seconds).
  std::string describe() const;

 private:
  Clock::time_point process_start_, last_mark_;
  std::vector<std::pair<std::string, double>> phases_;
  double before_first_step_s_ = 0;
  int steps_seen_ = 0;
  bool graph_on_ = false, reported_ = false;
};

// `algo: auto`'s tuning through the user's cache file (layers/tune_cache.h): on when `use_cache`
// (training.autotune_cache) and `forced_file` (EnvSwitches::autotune_cache) or the environment
// (XDG_CACHE_HOME, HOME) name a file. Logs each choice, a note when the cache was ignored, and
// saves new choices (a failed save is a warning: the run does not need the cache). Where nothing is
// tuned (CPU, deterministic, a fixed algo, CNN_AUTOTUNE=0) the cache is not touched.
void autotune_network(Network& net, bool use_cache, const std::optional<std::string>& forced_file,
                      const std::string& build_hash, RunLog& log);

}  // namespace cnn
