// The decoded copy of a gzip IDX image file: written once, read back identically, ignored and
// rewritten when the source changes or the copy is damaged, never made for small files.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "data/idx.h"
#include "data/idx_cache.h"
#include "runtime/env_switches.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;
namespace fs = std::filesystem;

namespace {

// n random 28x28 images written gzip-compressed (random bytes barely compress: ~n * 784 bytes).
std::vector<uint8_t> write_images(const fs::path& p, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> px(size_t(n) * 28 * 28);
  for (auto& v : px) v = uint8_t(rng());
  write_idx_images(p.string(), n, 28, 28, px.data());
  return px;
}

}  // namespace

TEST(IdxCache, CopyIsWrittenOnceThenReadIdentically) {
  const fs::path dir = test::fresh_dir("idx_cache", "hit");
  const fs::path src = dir / "train-images-idx3-ubyte.gz";
  const std::vector<uint8_t> px = write_images(src, 2000, 1);  // > kMinCachedSource
  ASSERT_GE(fs::file_size(src), kMinCachedSource);
  DecodeCache how;
  IdxImages a = read_idx_images_cached(src.string(), &how);
  EXPECT_EQ(how, DecodeCache::Written);
  EXPECT_TRUE(fs::exists(decoded_cache_path(src.string())));
  IdxImages b = read_idx_images_cached(src.string(), &how);
  EXPECT_EQ(how, DecodeCache::Hit);
  for (const IdxImages* im : {&a, &b}) {
    EXPECT_EQ(im->n, 2000);
    EXPECT_EQ(im->h, 28);
    EXPECT_EQ(im->w, 28);
    EXPECT_EQ(im->pixels, px);
  }
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST(IdxCache, ChangedSourceOrDamagedCopyIsIgnoredAndRewritten) {
  const fs::path dir = test::fresh_dir("idx_cache", "stale");
  const fs::path src = dir / "train-images-idx3-ubyte.gz";
  write_images(src, 2000, 1);
  DecodeCache how;
  read_idx_images_cached(src.string(), &how);
  ASSERT_EQ(how, DecodeCache::Written);

  // New content in the source (same image count, so the same size): the copy is stale.
  const std::vector<uint8_t> px2 = write_images(src, 2000, 2);
  IdxImages im = read_idx_images_cached(src.string(), &how);
  EXPECT_EQ(how, DecodeCache::Written);
  EXPECT_EQ(im.pixels, px2);

  // Only the modification time changed: stale as well (it cannot tell an edit from a touch).
  const auto t = fs::last_write_time(src);
  fs::last_write_time(src, t + std::chrono::seconds(5));
  im = read_idx_images_cached(src.string(), &how);
  EXPECT_EQ(how, DecodeCache::Written);
  EXPECT_EQ(im.pixels, px2);

  // A damaged copy: truncated, or its header garbled.
  const std::string copy = decoded_cache_path(src.string());
  fs::resize_file(copy, fs::file_size(copy) - 100);
  im = read_idx_images_cached(src.string(), &how);
  EXPECT_EQ(how, DecodeCache::Written);
  EXPECT_EQ(im.pixels, px2);
  {
    std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(44);  // the image count in the copy's IDX header, after its own 40-byte header
    f.write("\xff\xff\xff\xff", 4);
  }
  im = read_idx_images_cached(src.string(), &how);
  EXPECT_EQ(how, DecodeCache::Written);
  EXPECT_EQ(im.pixels, px2);
  read_idx_images_cached(src.string(), &how);
  EXPECT_EQ(how, DecodeCache::Hit);
}

TEST(IdxCache, SmallRawOrSwitchedOffSourcesAreReadDirectly) {
  const fs::path dir = test::fresh_dir("idx_cache", "off");
  DecodeCache how;
  const fs::path small = dir / "small-idx3-ubyte.gz";
  const std::vector<uint8_t> px = write_images(small, 10, 3);
  EXPECT_EQ(read_idx_images_cached(small.string(), &how).pixels, px);
  EXPECT_EQ(how, DecodeCache::Off);
  EXPECT_FALSE(fs::exists(decoded_cache_path(small.string())));

  const fs::path raw = dir / "raw-idx3-ubyte";
  const std::vector<uint8_t> px_raw = write_images(raw, 2000, 4);
  EXPECT_EQ(read_idx_images_cached(raw.string(), &how).pixels, px_raw);
  EXPECT_EQ(how, DecodeCache::Off);

  const fs::path big = dir / "big-idx3-ubyte.gz";
  write_images(big, 2000, 5);
  test::ScopedEnv off("CNN_DATA_CACHE", "0");  // reaches the loader through the switches
  read_idx_images_cached(big.string(), &how, read_env_switches().data_cache);
  EXPECT_EQ(how, DecodeCache::Off);
  EXPECT_FALSE(fs::exists(decoded_cache_path(big.string())));
}

TEST(IdxCache, ABrokenSourceIsStillReportedByName) {
  const fs::path dir = test::fresh_dir("idx_cache", "broken");
  const fs::path src = dir / "train-images-idx3-ubyte.gz";
  write_images(src, 2000, 1);
  fs::resize_file(src, fs::file_size(src) / 2);
  try {
    read_idx_images_cached(src.string());
    ADD_FAILURE() << "a truncated source was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), src.string())) << e.what();
  }
  EXPECT_FALSE(fs::exists(decoded_cache_path(src.string())));
}
