#include "layers/tune_cache.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "runtime/atomic_file.h"
#include "runtime/error.h"
#include "runtime/file_io.h"

namespace cnn {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "cnn-trainer autotune cache";
constexpr int kVersion = 1;
// A cache of a few dozen choices is a few KiB; anything this large is not ours.
constexpr size_t kMaxFileBytes = size_t(4) << 20;
// Sections of other identities kept on save (other GPUs sharing a home folder); the oldest go.
constexpr size_t kMaxSections = 16;

TuneIdentity identity_of(const json& section) {
  TuneIdentity id;
  for (const auto& [k, v] : section.at("identity").items()) id[k] = v.get<std::string>();
  return id;
}

// "build 34a4eca (this build: 5d1f00e)" for the first field where the two differ.
std::string first_difference(const TuneIdentity& theirs, const TuneIdentity& ours) {
  for (const auto& [k, v] : ours) {
    const auto it = theirs.find(k);
    const std::string t = it == theirs.end() ? "(none)" : it->second;
    if (t != v) return fmt::format("{} {} (this run: {})", k, t, v);
  }
  for (const auto& [k, v] : theirs)
    if (!ours.count(k)) return fmt::format("{} {} (this run: none)", k, v);
  return "identical";
}

bool same_device(const TuneIdentity& a, const TuneIdentity& b) {
  for (const char* k : {"device", "compute_capability", "driver", "runtime"}) {
    const auto ia = a.find(k), ib = b.find(k);
    if ((ia == a.end()) != (ib == b.end())) return false;
    if (ia != a.end() && ia->second != ib->second) return false;
  }
  return true;
}

CachedTune choice_from_json(const json& j) {
  CachedTune c;
  c.algo = j.at("algo").get<std::string>();
  if (j.contains("us"))
    for (const auto& [algo, us] : j.at("us").items()) c.us.emplace_back(algo, us.get<double>());
  return c;
}

json choice_to_json(const CachedTune& c) {
  json us = json::object();
  for (const auto& [algo, t] : c.us) us[algo] = t;
  return {{"algo", c.algo}, {"us", us}};
}

// The file's sections, checked for shape; throws cnn::Error (or json's exceptions) saying what is
// wrong with it.
json read_sections(const std::string& path) {
  const json doc = json::parse(read_file(path, {kMaxFileBytes, "autotune cache", true}));
  CNN_CHECK(doc.is_object() && doc.value("format", "") == kFormat,
            "not an autotune cache (no \"format\": \"{}\")", kFormat);
  CNN_CHECK(doc.value("version", 0) == kVersion, "version {}, this build reads version {}",
            doc.value("version", 0), kVersion);
  const json& sections = doc.at("machines");
  CNN_CHECK(sections.is_array(), "\"machines\" is not a list");
  for (const json& s : sections) {
    identity_of(s);  // throws when malformed
    for (const auto& [key, c] : s.at("choices").items()) choice_from_json(c);
  }
  return sections;
}

}  // namespace

TuneCache::TuneCache(TuneIdentity identity) : identity_(std::move(identity)) {}

std::string TuneCache::key(const std::string& op, const std::string& pass,
                           const std::string& precision, bool deterministic) {
  return op + " | " + pass + " | " + precision + " | " +
         (deterministic ? "deterministic" : "atomic");
}

TuneCache TuneCache::load(const std::string& path, const TuneIdentity& identity,
                          std::string* note) {
  note->clear();
  TuneCache cache(identity);
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(path, ec)) return cache;
  json sections;
  try {
    sections = read_sections(path);
  } catch (const std::exception& e) {
    *note =
        fmt::format("autotune cache {}: unreadable, ignored ({}); tuning afresh", path, e.what());
    return cache;
  }
  std::string foreign;
  for (const json& s : sections) {
    const TuneIdentity theirs = identity_of(s);
    if (theirs != identity) {
      if (foreign.empty()) foreign = first_difference(theirs, identity);
      continue;
    }
    for (const auto& [key, c] : s.at("choices").items()) cache.choices_[key] = choice_from_json(c);
    return cache;
  }
  if (!foreign.empty())
    *note = fmt::format(
        "autotune cache {}: no choices for this GPU and build ({} section(s) for others, e.g. "
        "{}), ignored; tuning afresh",
        path, sections.size(), foreign);
  return cache;
}

const CachedTune* TuneCache::find(const std::string& key) const {
  const auto it = choices_.find(key);
  return it == choices_.end() ? nullptr : &it->second;
}

std::vector<std::string> TuneCache::keys() const {
  std::vector<std::string> k;
  for (const auto& [key, choice] : choices_) k.push_back(key);
  return k;
}

void TuneCache::put(const std::string& key, CachedTune choice) {
  choices_[key] = std::move(choice);
  changed_ = true;
}

void TuneCache::save(const std::string& path) const {
  if (path.empty()) return;
  // What is there now: another run may have saved since we loaded. An unreadable file is replaced.
  json kept = json::array();
  json ours = json::object();
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    try {
      for (const json& s : read_sections(path)) {
        const TuneIdentity theirs = identity_of(s);
        if (theirs == identity_) {
          ours = s.at("choices");
        } else if (!same_device(theirs, identity_) && kept.size() + 1 < kMaxSections) {
          kept.push_back(s);
        }
      }
    } catch (const std::exception&) {
      kept = json::array();
      ours = json::object();
    }
  }
  for (const auto& [key, c] : choices_) ours[key] = choice_to_json(c);
  json id = json::object();
  for (const auto& [k, v] : identity_) id[k] = v;
  json sections = json::array();
  sections.push_back({{"identity", id}, {"choices", ours}});
  for (const json& s : kept) sections.push_back(s);
  const json doc = {{"format", kFormat}, {"version", kVersion}, {"machines", sections}};
  const std::string text = doc.dump(1) + "\n";

  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) {
    std::filesystem::create_directories(dir, ec);
    CNN_CHECK(!ec, "cannot create the autotune cache folder '{}': {}", dir.string(), ec.message());
  }
  write_file_atomically(path, text.data(), text.size());
}

std::string tune_cache_path(const std::optional<std::string>& forced,
                            const std::function<const char*(const char*)>& env) {
  const auto var = [&](const char* name) {
    const char* v = env(name);
    return std::string(v ? v : "");
  };
  if (forced) return *forced;
  if (const std::string xdg = var("XDG_CACHE_HOME"); !xdg.empty() && xdg[0] == '/')
    return xdg + "/cnn-trainer/autotune.json";
  if (const std::string home = var("HOME"); !home.empty())
    return home + "/.cache/cnn-trainer/autotune.json";
  return "";
}

}  // namespace cnn
