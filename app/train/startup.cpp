#include "app/train/startup.h"

#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

#include "app/train/run_log.h"
#include "layers/network.h"
#include "layers/tune_cache.h"
#include "runtime/device_identity.h"
#include "runtime/error.h"
#include "runtime/memory.h"

namespace cnn {
namespace {

// Set once while the program's static objects are initialized, just before main(): the
// boundary between loading the program (exec, shared libraries) and running it.
const StartupClock::Clock::time_point kMainStamp = StartupClock::Clock::now();

// Seconds since this process started, from /proc/self/stat (field 22, in clock ticks after
// boot) and CLOCK_BOOTTIME; negative when unknown.
double process_age_seconds() {
  std::ifstream f("/proc/self/stat");
  std::string stat;
  if (!std::getline(f, stat)) return -1;
  const size_t paren = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos) return -1;
  std::istringstream fields(stat.substr(paren + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i < 22) continue;
    timespec now{};
    const long ticks_per_s = ::sysconf(_SC_CLK_TCK);
    if (ticks_per_s <= 0 || ::clock_gettime(CLOCK_BOOTTIME, &now) != 0) return -1;
    const double started = std::strtod(field.c_str(), nullptr) / double(ticks_per_s);
    return double(now.tv_sec) + 1e-9 * double(now.tv_nsec) - started;
  }
  return -1;
}

double seconds(StartupClock::Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

StartupClock::StartupClock() : process_start_(kMainStamp), last_mark_(kMainStamp) {
  const double age = process_age_seconds();
  const auto now = Clock::now();
  const auto start =
      now - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(age));
  // A tick-rounded start can land a few ms after main; main is then the better bound.
  if (age >= 0 && start < kMainStamp) process_start_ = start;
  phases_.emplace_back("exec to main", seconds(kMainStamp - process_start_));
}

void StartupClock::mark(const char* phase) {
  const auto now = Clock::now();
  phases_.emplace_back(phase, seconds(now - last_mark_));
  last_mark_ = now;
}

void StartupClock::after_step(const Exec& ex, RunLog& log) {
  if (reported_) return;
  stream_sync(ex.device, ex.stream);
  if (steps_seen_ == 0) before_first_step_s_ = seconds(last_mark_ - process_start_);
  ++steps_seen_;
  mark(steps_seen_ == 1 ? "first step" : "graph capture");
  if (steps_seen_ < (graph_on_ ? 2 : 1)) return;
  reported_ = true;
  log.info("start-up: {}", describe());
}

double StartupClock::seconds_since_start() const {
  return seconds(Clock::now() - process_start_);
}

std::string StartupClock::describe() const {
  std::string before, after;
  for (const auto& [phase, s] : phases_) {
    std::string& part = phase == "first step" || phase == "graph capture" ? after : before;
    part += fmt::format("{}{} {:.3f}", part.empty() ? "" : ", ", phase, s);
  }
  return fmt::format("{:.3f} s before the first step ({}){}", before_first_step_s_, before,
                     after.empty() ? "" : "; then " + after + " s");
}

void autotune_network(Network& net, bool use_cache, const std::optional<std::string>& forced_file,
                      const std::string& build_hash, RunLog& log) {
  const Exec& ex = net.exec();
  if (ex.device != Device::CUDA || ex.deterministic) {
    for (const std::string& line : net.autotune()) log.info("algo auto: {}", line);
    return;
  }
  const std::string path =
      use_cache ? tune_cache_path(forced_file, [](const char* name) { return std::getenv(name); })
                : "";
  TuneIdentity id = device_identity(true);
  id["build"] = build_hash;
  std::string note;
  TuneCache cache = TuneCache::load(path, id, &note);
  if (!note.empty()) log.warn("{}", note);
  const std::vector<std::string> lines = net.autotune(path.empty() ? nullptr : &cache);
  for (const std::string& line : lines) log.info("algo auto: {}", line);
  if (path.empty()) {
    if (!lines.empty())
      log.info("autotune cache: off ({})",
               use_cache ? "CNN_AUTOTUNE_CACHE=0 or no HOME" : "training.autotune_cache: false");
    return;
  }
  if (!cache.changed()) {
    if (!lines.empty()) log.info("autotune cache: every choice read from {}", path);
    return;
  }
  try {
    cache.save(path);
    log.info(
        "autotune cache: choices saved to {} (a later run on this GPU and build skips the "
        "timing)",
        path);
  } catch (const Error& e) {
    log.warn("autotune cache not saved: {}", e.what());
  }
}

}  // namespace cnn
