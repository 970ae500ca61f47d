// IDX reader/writer: round trips (raw and gzip, pixel exact) and every corrupt-file message.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "data/idx.h"
#include "data/load_data.h"
#include "runtime/atomic_file.h"
#include "runtime/error.h"
#include "runtime/file_io.h"
#include "tests/test_util.h"

using namespace cnn;
namespace fs = std::filesystem;

namespace {

// A fresh temporary folder per test, removed afterwards.
class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "cnn_idx_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    seed_ = test::fresh_seed();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  void write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    write_file_atomically(path(name), bytes.data(), bytes.size());
  }
  std::vector<uint8_t> random_bytes(size_t n) const {
    std::vector<uint8_t> v(n);
    auto r = test::random_labels(n, 256, seed_);
    for (size_t i = 0; i < n; ++i) v[i] = uint8_t(r[i]);
    return v;
  }
  // The error message of f(), or "" when it does not throw cnn::Error.
  template <class F>
  static std::string error_of(F&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  static std::vector<uint8_t> be32(std::initializer_list<uint32_t> words) {
    std::vector<uint8_t> out;
    for (uint32_t v : words)
      for (int s = 24; s >= 0; s -= 8) out.push_back(uint8_t(v >> s));
    return out;
  }
  std::string dir_;
  uint64_t seed_ = 0;
};

}  // namespace

TEST_F(IdxTest, RoundTripRawAndGzipPixelExact) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int n = 13, h = 5, w = 7;  // awkward sizes
  const auto pixels = random_bytes(size_t(n) * h * w);
  std::vector<uint8_t> labels(n);
  for (int i = 0; i < n; ++i) labels[i] = uint8_t((i * 7) % 10);
  for (const char* suffix : {"", ".gz"}) {
    const std::string im = path(std::string("im-idx3-ubyte") + suffix);
    const std::string lb = path(std::string("lb-idx1-ubyte") + suffix);
    write_idx_images(im, n, h, w, pixels.data());
    write_idx_labels(lb, labels);
    const auto bytes = read_file(im);
    EXPECT_EQ(is_gzip(bytes.data(), bytes.size()), std::string(suffix) == ".gz");
    IdxImages got = read_idx_images(im);
    EXPECT_EQ(got.n, n);
    EXPECT_EQ(got.h, h);
    EXPECT_EQ(got.w, w);
    EXPECT_EQ(got.pixels, pixels);
    EXPECT_EQ(read_idx_labels(lb), labels);
    Dataset d = load_idx_dataset(im, lb, {});
    EXPECT_EQ(d.n, n);
    EXPECT_EQ(d.c, 1);
    EXPECT_EQ(d.num_classes(), 10);  // "0".."9" from the largest label
    EXPECT_EQ(d.images, pixels);
    for (int i = 0; i < n; ++i) EXPECT_EQ(d.labels[i], labels[i]);
  }
}

TEST_F(IdxTest, GzipIsDetectedByMagicNotName) {
  const auto pixels = random_bytes(2 * 3 * 4);
  write_idx_images(path("a.gz"), 2, 3, 4, pixels.data());
  fs::rename(path("a.gz"), path("compressed-without-suffix"));
  EXPECT_EQ(read_idx_images(path("compressed-without-suffix")).pixels, pixels);
  write_idx_images(path("raw"), 2, 3, 4, pixels.data());
  fs::rename(path("raw"), path("raw-named.gz"));
  EXPECT_EQ(read_idx_images(path("raw-named.gz")).pixels, pixels);
}

TEST_F(IdxTest, MultiMemberGzip) {
  // `cat a.gz b.gz` is a valid gzip file holding both contents.
  auto file = be32({0x803, 2, 2, 2});
  const auto px = random_bytes(8);
  auto a = gzip_compress(file.data(), file.size());
  auto b = gzip_compress(px.data(), px.size());
  a.insert(a.end(), b.begin(), b.end());
  write("multi", a);
  EXPECT_EQ(read_idx_images(path("multi")).pixels, px);
}

// The in-memory entry points (used by fuzz/fuzz_idx) read exactly what the file readers read,
// and name the given source in their messages.
TEST_F(IdxTest, ParseFromMemoryMatchesTheFileReaders) {
  auto file = be32({0x803, 3, 2, 4});
  const auto px = random_bytes(24);
  file.insert(file.end(), px.begin(), px.end());
  const IdxImages im = parse_idx_images(gzip_compress(file.data(), file.size()), "mem");
  EXPECT_EQ(im.n, 3);
  EXPECT_EQ(im.h, 2);
  EXPECT_EQ(im.w, 4);
  EXPECT_EQ(im.pixels, px);
  auto labels = be32({0x801, 3});
  labels.insert(labels.end(), {2, 0, 1});
  EXPECT_EQ(parse_idx_labels(labels, "mem"), (std::vector<uint8_t>{2, 0, 1}));
  file.pop_back();
  const std::string e = error_of([&] { parse_idx_images(file, "in-memory.idx"); });
  EXPECT_EQ(e.rfind("in-memory.idx: short file", 0), 0u) << e;
}

TEST_F(IdxTest, WrongMagic) {
  write_idx_labels(path("labels"), {1, 2, 3});
  std::string e = error_of([&] { read_idx_images(path("labels")); });
  EXPECT_NE(e.find("wrong magic 0x00000801"), std::string::npos) << e;
  EXPECT_NE(e.find(path("labels")), std::string::npos) << e;
  EXPECT_NE(e.find("labels (idx1)"), std::string::npos) << e;  // the hint
  write("png", {0x89, 'P', 'N', 'G', 13, 10, 26, 10, 0, 0, 0, 0, 0, 0, 0, 0});
  e = error_of([&] { read_idx_labels(path("png")); });
  EXPECT_NE(e.find("wrong magic"), std::string::npos) << e;
  EXPECT_NE(e.find("not an IDX file"), std::string::npos) << e;
  // Float IDX (type 0x0D) is named, not misread.
  write("float", be32({0x00000D03, 1, 1, 1, 0}));
  e = error_of([&] { read_idx_images(path("float")); });
  EXPECT_NE(e.find("type 0x0d"), std::string::npos) << e;
}

TEST_F(IdxTest, ShortFiles) {
  write("tiny", {0, 0, 8, 3, 0});
  std::string e = error_of([&] { read_idx_images(path("tiny")); });
  EXPECT_NE(e.find("short file"), std::string::npos) << e;
  write("empty", {});
  e = error_of([&] { read_idx_images(path("empty")); });
  EXPECT_NE(e.find("short file"), std::string::npos) << e;

  const auto pixels = random_bytes(4 * 6 * 6);
  write_idx_images(path("full"), 4, 6, 6, pixels.data());
  auto bytes = read_file(path("full"));
  bytes.resize(bytes.size() - 10);
  write("truncated", bytes);
  e = error_of([&] { read_idx_images(path("truncated")); });
  EXPECT_NE(e.find("short file"), std::string::npos) << e;
  EXPECT_NE(e.find("4x6x6"), std::string::npos) << e;
  // A complete gzip stream of a truncated file: short file (after gunzip).
  write("truncated.gz", gzip_compress(bytes.data(), bytes.size()));
  e = error_of([&] { read_idx_images(path("truncated.gz")); });
  EXPECT_NE(e.find("short file"), std::string::npos) << e;
  EXPECT_NE(e.find("after gunzip"), std::string::npos) << e;
}

TEST_F(IdxTest, ExtraBytesAreRefused) {
  auto bytes = be32({0x801, 3});
  bytes.insert(bytes.end(), {1, 2, 3, 4});
  write("extra", bytes);
  std::string e = error_of([&] { read_idx_labels(path("extra")); });
  EXPECT_NE(e.find("1 bytes follow"), std::string::npos) << e;
  write("extra.gz", gzip_compress(bytes.data(), bytes.size()));
  e = error_of([&] { read_idx_labels(path("extra.gz")); });
  EXPECT_NE(e.find("follow"), std::string::npos) << e;
}

TEST_F(IdxTest, BadGzip) {
  write("garbage.gz", {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3});
  std::string e = error_of([&] { read_idx_images(path("garbage.gz")); });
  EXPECT_NE(e.find("bad gzip"), std::string::npos) << e;
  EXPECT_NE(e.find("garbage.gz"), std::string::npos) << e;

  const auto pixels = random_bytes(50 * 9 * 9);
  write_idx_images(path("ok.gz"), 50, 9, 9, pixels.data());
  auto gz = read_file(path("ok.gz"));
  auto cut = gz;
  cut.resize(gz.size() / 2);
  write("cut.gz", cut);
  e = error_of([&] { read_idx_images(path("cut.gz")); });
  EXPECT_NE(e.find("bad gzip"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;

  auto bad_crc = gz;
  bad_crc[bad_crc.size() - 6] ^= 0x5a;  // inside the CRC-32 of the trailer
  write("crc.gz", bad_crc);
  e = error_of([&] { read_idx_images(path("crc.gz")); });
  EXPECT_NE(e.find("bad gzip"), std::string::npos) << e;

  auto trailing = gz;
  trailing.insert(trailing.end(), {'j', 'u', 'n', 'k'});
  write("trailing.gz", trailing);
  e = error_of([&] { read_idx_images(path("trailing.gz")); });
  EXPECT_NE(e.find("garbage after"), std::string::npos) << e;
}

TEST_F(IdxTest, AbsurdAndZeroDims) {
  auto bytes = be32({0x803, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu});
  bytes.resize(bytes.size() + 64, 7);
  write("overflow", bytes);
  std::string e = error_of([&] { read_idx_images(path("overflow")); });
  EXPECT_NE(e.find("absurd"), std::string::npos) << e;
  // Same header gzip-compressed: refused from the header alone.
  write("overflow.gz", gzip_compress(bytes.data(), bytes.size()));
  e = error_of([&] { read_idx_images(path("overflow.gz")); });
  EXPECT_NE(e.find("absurd"), std::string::npos) << e;
  // Large but representable claim on a tiny file: short, and nothing of that size allocated.
  auto big = be32({0x803, 100000000u, 100u, 100u});
  big.resize(big.size() + 100, 1);
  write("big", big);
  e = error_of([&] { read_idx_images(path("big")); });
  EXPECT_NE(e.find("short file"), std::string::npos) << e;
  write("big.gz", gzip_compress(big.data(), big.size()));
  e = error_of([&] { read_idx_images(path("big.gz")); });
  EXPECT_NE(e.find("short file"), std::string::npos) << e;

  write("zero", be32({0x803, 5, 0, 28}));
  e = error_of([&] { read_idx_images(path("zero")); });
  EXPECT_NE(e.find("dimension 1 is 0"), std::string::npos) << e;
}

TEST_F(IdxTest, CountMismatchAndLabelRange) {
  const auto pixels = random_bytes(5 * 4 * 4);
  write_idx_images(path("im"), 5, 4, 4, pixels.data());
  write_idx_labels(path("lb4"), {0, 1, 2, 3});
  std::string e = error_of([&] { load_idx_dataset(path("im"), path("lb4"), {}); });
  EXPECT_NE(e.find("count mismatch"), std::string::npos) << e;
  EXPECT_NE(e.find("4 labels"), std::string::npos) << e;
  write_idx_labels(path("lb5"), {0, 1, 2, 3, 4});
  e = error_of([&] { load_idx_dataset(path("im"), path("lb5"), {"a", "b", "c"}); });
  EXPECT_NE(e.find("label 3"), std::string::npos) << e;
  EXPECT_NE(e.find("outside [0, 3)"), std::string::npos) << e;
}

TEST_F(IdxTest, MissingFilesAreNamed) {
  std::string e = error_of([&] { read_idx_images(path("nope")); });
  EXPECT_NE(e.find("cannot open"), std::string::npos) << e;
  EXPECT_NE(e.find("nope"), std::string::npos) << e;
  e = error_of([&] { find_idx_file(dir_, "train-images-idx3-ubyte"); });
  EXPECT_NE(e.find("train-images-idx3-ubyte.gz"), std::string::npos) << e;
}

TEST_F(IdxTest, LoadDataFromIdxFolderWithValidationSplit) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int n = 40, h = 6, w = 5;
  const auto pixels = random_bytes(size_t(n) * h * w);
  std::vector<uint8_t> labels(n);
  for (int i = 0; i < n; ++i) labels[i] = uint8_t(i % 3);
  write_idx_images(path("train-images-idx3-ubyte.gz"), n, h, w, pixels.data());
  write_idx_labels(path("train-labels-idx1-ubyte"), labels);
  write_idx_images(path("t10k-images-idx3-ubyte"), 4, h, w, pixels.data());
  write_idx_labels(path("t10k-labels-idx1-ubyte.gz"), {0, 1, 2, 2});
  DataOptions opt;
  opt.format = DataFormat::Idx;
  opt.dir = dir_;
  opt.height = h;
  opt.width = w;
  opt.validation_split = 0.25;
  DataSplits s = load_data(opt);
  EXPECT_EQ(s.train.n, 30);
  EXPECT_EQ(s.val.n, 10);
  EXPECT_EQ(s.test.n, 4);
  EXPECT_EQ(s.train.num_classes(), 3);
  EXPECT_EQ(s.test.class_names, s.train.class_names);
  // The two parts partition the training set: every image appears exactly once.
  std::multiset<std::vector<uint8_t>> all, parts;
  for (int i = 0; i < n; ++i)
    all.insert(std::vector<uint8_t>(pixels.begin() + i * h * w, pixels.begin() + (i + 1) * h * w));
  for (const Dataset* d : {&s.train, &s.val})
    for (int i = 0; i < d->n; ++i)
      parts.insert(
          std::vector<uint8_t>(d->images.begin() + i * h * w, d->images.begin() + (i + 1) * h * w));
  EXPECT_EQ(all, parts);
  // The split is fixed by split_seed: loading again gives the same validation set.
  EXPECT_EQ(load_data(opt).val.images, s.val.images);
  opt.split_seed += 1;
  EXPECT_NE(load_data(opt).val.images, s.val.images);

  // Sizes other than the configured ones: refused, or resized / converted when asked.
  opt.validation_split = 0;
  opt.height = 12;
  std::string e = error_of([&] { load_data(opt); });
  EXPECT_NE(e.find("data.resize"), std::string::npos) << e;
  opt.resize = true;
  opt.channels = 3;
  DataSplits r = load_data(opt);
  EXPECT_EQ(r.train.c, 3);
  EXPECT_EQ(r.train.h, 12);
  EXPECT_EQ(r.train.images.size(), size_t(n) * 3 * 12 * w);
}
