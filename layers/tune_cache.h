#pragma once
// The store behind `algo: auto`'s start-up cache: which kernel variant the tuner picked for each
// op shape, pass, precision and determinism, per machine identity (GPU, compute capability,
// driver, CUDA runtime, our build's git hash), in one small JSON file that a later run reads
// instead of timing again. Only the store lives here (no timing, no CUDA), so that it is tested
// on the CPU; layers/autotune.cpp consults it and still checks that a cached variant supports
// the shape before using it, so a cache can cost a re-tune but never change a result.
//
// File layout (version 1):
//   {"format": "cnn-trainer autotune cache", "version": 1,
//    "machines": [{"identity": {"device": "NVIDIA H200", ...}, "choices":
//                  {"<op> | <pass> | <precision> | <reductions>": {"algo": "fast",
//                                                                   "us": {"fast": 13.4, ...}}}}]}
// One section per identity: a home folder shared by several GPUs keeps each one's choices. A
// section of the same device written by another build is stale and dropped when we save.
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cnn {

// What a cached choice is valid for, field by field ("device", "compute_capability", "driver",
// "runtime", "build"). Two identities match only when every field is equal.
using TuneIdentity = std::map<std::string, std::string>;

struct CachedTune {
  std::string algo;                                // algo_name() of the chosen variant
  std::vector<std::pair<std::string, double>> us;  // the timings that chose it (for the log)
};

class TuneCache {
 public:
  // An empty cache for `identity`, bound to no file (save() then does nothing).
  explicit TuneCache(TuneIdentity identity = {});

  // Reads `path` and keeps the choices recorded for `identity`. A missing file is an empty cache
  // with *note "". A file that cannot be read or parsed, or holds no section for this identity
  // (another GPU, driver or build) gives an empty cache and one line in *note saying what was
  // ignored and why; never an exception.
  static TuneCache load(const std::string& path, const TuneIdentity& identity, std::string* note);

  // "<op> | <pass> | <precision> | <reductions>": the key of one tuned call.
  static std::string key(const std::string& op, const std::string& pass,
                         const std::string& precision, bool deterministic);

  const CachedTune* find(const std::string& key) const;
  void put(const std::string& key, CachedTune choice);
  // Every key with a choice, in key order.
  std::vector<std::string> keys() const;
  size_t size() const { return choices_.size(); }
  // True when put() added or changed a choice since load: only then is save() worth its write.
  bool changed() const { return changed_; }
  const TuneIdentity& identity() const { return identity_; }

  // Writes this identity's choices into `path` atomically (temporary file + rename, so a
  // concurrent reader or writer never sees a torn file). The file is read again just before, so
  // that sections of other identities and choices another run saved meanwhile are kept (ours win
  // on the same key); sections of this device from another build are dropped. Creates the
  // folder. Throws cnn::Error naming the path when it cannot write.
  void save(const std::string& path) const;

 private:
  TuneIdentity identity_;
  std::map<std::string, CachedTune> choices_;
  bool changed_ = false;
};

// Where the cache file lives: `forced` when given (EnvSwitches::autotune_cache, from
// CNN_AUTOTUNE_CACHE; "" is off), else $XDG_CACHE_HOME/cnn-trainer/autotune.json, else
// $HOME/.cache/cnn-trainer/autotune.json. "" when off or when neither variable is set. `env` looks
// a variable up (std::getenv in the program; tests pass their own).
std::string tune_cache_path(const std::optional<std::string>& forced,
                            const std::function<const char*(const char*)>& env);

}  // namespace cnn
