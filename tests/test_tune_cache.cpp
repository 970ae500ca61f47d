// The autotune cache's store and lookup logic, on the CPU (the timing itself needs a GPU and is
// covered by gpu_autotune): round trip, other identities ignored, a corrupt file ignored with a
// note, concurrent writers never leaving a torn file, and a cached variant still validated.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "layers/autotune.h"
#include "layers/tune_cache.h"
#include "runtime/env_switches.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;
namespace fs = std::filesystem;

namespace {

TuneIdentity h200(const std::string& build = "abc1234") {
  return {{"device", "NVIDIA H200"},
          {"compute_capability", "9.0"},
          {"driver", "13000"},
          {"runtime", "13000"},
          {"build", build}};
}

const std::string kKey = TuneCache::key("conv2d n128 c32 h14 w14 oc64 k5x5 s1x1 p2x2 bias relu",
                                        "forward", "tf32", false);

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

}  // namespace

TEST(TuneCache, RoundTripKeepsEveryChoiceAndTiming) {
  const fs::path dir = test::fresh_dir("tune_cache", "round_trip");
  const std::string path = (dir / "sub" / "autotune.json").string();  // the folder is created
  TuneCache c(h200());
  c.put(kKey, {"fast", {{"fast", 13.4}, {"igemm", 17.7}}});
  c.put(TuneCache::key("linear n128 in3136 out1024 bias relu", "weight-grad", "fp32", false),
        {"tiled", {}});
  ASSERT_TRUE(c.changed());
  c.save(path);

  std::string note = "x";
  const TuneCache back = TuneCache::load(path, h200(), &note);
  EXPECT_EQ(note, "");
  EXPECT_FALSE(back.changed());
  ASSERT_EQ(back.size(), 2u);
  const CachedTune* hit = back.find(kKey);
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->algo, "fast");
  ASSERT_EQ(hit->us.size(), 2u);
  EXPECT_DOUBLE_EQ(hit->us[1].second, 17.7);
  // Precision and determinism are part of the key.
  EXPECT_EQ(back.find(TuneCache::key("conv2d n128 c32 h14 w14 oc64 k5x5 s1x1 p2x2 bias relu",
                                     "forward", "fp32", false)),
            nullptr);
  EXPECT_EQ(back.find(TuneCache::key("conv2d n128 c32 h14 w14 oc64 k5x5 s1x1 p2x2 bias relu",
                                     "forward", "tf32", true)),
            nullptr);
}

TEST(TuneCache, MissingFileIsAnEmptyCacheWithoutANote) {
  const fs::path dir = test::fresh_dir("tune_cache", "missing");
  std::string note = "x";
  const TuneCache c = TuneCache::load((dir / "none.json").string(), h200(), &note);
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(note, "");
}

TEST(TuneCache, AnotherBuildOrGpuIsIgnoredWithANoteAndKeptForThatGpu) {
  const fs::path dir = test::fresh_dir("tune_cache", "foreign");
  const std::string path = (dir / "autotune.json").string();
  TuneCache old_build(h200("0000000"));
  old_build.put(kKey, {"naive", {}});
  old_build.save(path);
  TuneIdentity a100 = h200();
  a100["device"] = "NVIDIA A100-SXM4-80GB";
  a100["compute_capability"] = "8.0";
  TuneCache other_gpu(a100);
  other_gpu.put(kKey, {"igemm", {}});
  other_gpu.save(path);

  std::string note;
  TuneCache ours = TuneCache::load(path, h200(), &note);
  EXPECT_EQ(ours.find(kKey), nullptr) << "a choice of another build or GPU must not be used";
  EXPECT_TRUE(test::contains(note, "ignored")) << note;
  EXPECT_TRUE(test::contains(note, path)) << note;

  // Saving ours drops the stale section of this GPU (old build) but keeps the other GPU's.
  ours.put(kKey, {"fast", {}});
  ours.save(path);
  TuneCache again = TuneCache::load(path, h200(), &note);
  ASSERT_NE(again.find(kKey), nullptr);
  EXPECT_EQ(again.find(kKey)->algo, "fast");
  EXPECT_EQ(TuneCache::load(path, a100, &note).find(kKey)->algo, "igemm");
  EXPECT_EQ(TuneCache::load(path, h200("0000000"), &note).size(), 0u);
  EXPECT_TRUE(test::contains(note, "ignored")) << note;
}

TEST(TuneCache, CorruptFileIsIgnoredWithOneNoteAndReplacedOnSave) {
  const fs::path dir = test::fresh_dir("tune_cache", "corrupt");
  const std::string path = (dir / "autotune.json").string();
  const std::vector<std::string> bad = {
      "{\"format\": \"cnn-trainer autotune cache\", \"version\": 1, \"machines\": [{\"ident",
      "not json at all",
      "{\"format\": \"something else\", \"version\": 1, \"machines\": []}",
      "{\"format\": \"cnn-trainer autotune cache\", \"version\": 99, \"machines\": []}",
      "{\"format\": \"cnn-trainer autotune cache\", \"version\": 1, \"machines\": "
      "[{\"identity\": {\"device\": 7}, \"choices\": {}}]}",
      "{\"format\": \"cnn-trainer autotune cache\", \"version\": 1, \"machines\": "
      "[{\"identity\": {}, \"choices\": {\"k\": {\"us\": {}}}}]}",
      ""};
  for (const std::string& text : bad) {
    SCOPED_TRACE(text);
    write_text(path, text);
    std::string note;
    TuneCache c = TuneCache::load(path, h200(), &note);
    EXPECT_EQ(c.size(), 0u);
    EXPECT_TRUE(test::contains(note, "unreadable, ignored")) << note;
    EXPECT_EQ(note.find('\n'), std::string::npos) << "one log line";
    c.put(kKey, {"fast", {}});
    ASSERT_NO_THROW(c.save(path));
    EXPECT_EQ(TuneCache::load(path, h200(), &note).find(kKey)->algo, "fast");
    EXPECT_EQ(note, "");
  }
}

TEST(TuneCache, ConcurrentWritersNeverLeaveATornFile) {
  const fs::path dir = test::fresh_dir("tune_cache", "concurrent");
  const std::string path = (dir / "autotune.json").string();
  constexpr int kWriters = 6, kSaves = 40;
  std::vector<pid_t> kids;
  for (int w = 0; w < kWriters; ++w) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 0;
      try {
        for (int s = 0; s < kSaves; ++s) {
          TuneCache c(h200());
          // Many entries, so that a torn write would be visible as broken JSON.
          for (int k = 0; k < 50; ++k)
            c.put(TuneCache::key(fmt::format("op{} writer{}", k, w), "forward", "fp32", false),
                  {"tiled", {{"tiled", double(s)}}});
          c.save(path);
        }
      } catch (...) {
        rc = 1;
      }
      ::_exit(rc);
    }
    kids.push_back(pid);
  }
  // Meanwhile, every read sees a whole file (or none yet).
  int reads = 0;
  for (bool running = true; running;) {
    running = false;
    for (pid_t pid : kids)
      if (::waitpid(pid, nullptr, WNOHANG) == 0) running = true;
    std::string note;
    TuneCache::load(path, h200(), &note);
    EXPECT_EQ(note, "") << "read " << reads;
    ++reads;
  }
  for (pid_t pid : kids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
  std::string note;
  const TuneCache last = TuneCache::load(path, h200(), &note);
  EXPECT_EQ(note, "");
  // Each save merges with what is there, so the last writer's file holds at least its own 50.
  EXPECT_GE(last.size(), 50u);
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos)
        << "left behind: " << e.path();
}

TEST(TuneCache, PathFollowsTheEnvironment) {
  const auto env = [](std::map<std::string, std::string> vars) {
    return [vars](const char* name) -> const char* {
      const auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  };
  EXPECT_EQ(tune_cache_path(std::nullopt, env({{"HOME", "/home/u"}})),
            "/home/u/.cache/cnn-trainer/autotune.json");
  EXPECT_EQ(tune_cache_path(std::nullopt, env({{"HOME", "/home/u"}, {"XDG_CACHE_HOME", "/c"}})),
            "/c/cnn-trainer/autotune.json");
  // A relative XDG_CACHE_HOME is invalid by the spec and ignored.
  EXPECT_EQ(tune_cache_path(std::nullopt, env({{"HOME", "/home/u"}, {"XDG_CACHE_HOME", "rel"}})),
            "/home/u/.cache/cnn-trainer/autotune.json");
  // CNN_AUTOTUNE_CACHE reaches the path through the switches read at the program's start.
  const auto forced_by = [](const char* value) {
    test::ScopedEnv set("CNN_AUTOTUNE_CACHE", value);
    return read_env_switches().autotune_cache;
  };
  EXPECT_EQ(tune_cache_path(forced_by("/x/t.json"), env({{"HOME", "/home/u"}})), "/x/t.json");
  EXPECT_EQ(tune_cache_path(forced_by("0"), env({{"HOME", "/home/u"}})), "");
  EXPECT_EQ(tune_cache_path(forced_by("off"), env({{"HOME", "/home/u"}})), "");
  EXPECT_EQ(tune_cache_path(std::nullopt, env({})), "");
}

// The lookup around the timing: a hit is run once (its own shape check) and not timed.
TEST(TuneCacheLookup, HitIsValidatedOnceAndNotTimed) {
  TuneCache cache(h200());
  const std::string op = "conv2d n4 c1 h8 w8 oc2 k3x3 s1x1 p1x1 bias";
  cache.put(TuneCache::key(op, "forward", "fp32", false), {"tiled", {{"tiled", 5.0}}});
  std::vector<Algo> ran;
  int timed = 0;
  const TuneChoice c = pick_cached_or_timed(
      TuneSite{"conv1", op, &cache}, "forward", [&](Algo a) { ran.push_back(a); }, Exec{},
      [&] {
        ++timed;
        return TuneChoice{"conv1", "forward", Algo::Naive, {}};
      });
  EXPECT_EQ(timed, 0);
  EXPECT_EQ(c.chosen, Algo::Tiled);
  EXPECT_TRUE(c.cached);
  EXPECT_EQ(ran, std::vector<Algo>{Algo::Tiled});
  EXPECT_TRUE(test::contains(describe(c), "[cached]")) << describe(c);
  EXPECT_EQ(cache.find(TuneCache::key(op, "forward", "fp32", false))->us.size(), 1u);
}

TEST(TuneCacheLookup, RefusedUnknownOrMissingChoicesAreTimedAndRecorded) {
  const std::string op = "linear n4 in8 out2";
  const auto pick = [&](TuneCache* cache, const std::function<void(Algo)>& run, int* timed) {
    return pick_cached_or_timed(TuneSite{"fc1", op, cache}, "forward", run, Exec{}, [&] {
      ++*timed;
      return TuneChoice{"fc1", "forward", Algo::Igemm, {{Algo::Igemm, 3.0}}};
    });
  };
  const std::string key = TuneCache::key(op, "forward", "fp32", false);
  for (const std::string& recorded :
       {std::string("fast"), std::string("warp-magic"), std::string()}) {
    SCOPED_TRACE(recorded);
    TuneCache cache(h200());
    if (!recorded.empty()) cache.put(key, {recorded, {}});
    int timed = 0;
    // "fast" refuses the shape (as a kernel's check would): the cache cannot force it.
    const TuneChoice c = pick(
        &cache,
        [](Algo a) {
          if (a == Algo::Fast) CNN_FAIL("fast: shape not supported");
        },
        &timed);
    EXPECT_EQ(timed, 1);
    EXPECT_EQ(c.chosen, Algo::Igemm);
    EXPECT_FALSE(c.cached);
    ASSERT_NE(cache.find(key), nullptr);
    EXPECT_EQ(cache.find(key)->algo, "igemm");
  }
  int timed = 0;
  pick(
      nullptr, [](Algo) {}, &timed);  // no cache: always timed
  EXPECT_EQ(timed, 1);
}
