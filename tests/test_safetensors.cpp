#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>

#include "layers/checkpoint/checkpoint.h"
#include "layers/checkpoint/safetensors.h"
#include "runtime/atomic_file.h"
#include "runtime/error.h"
#include "runtime/file_io.h"
#include "tests/test_util.h"

using namespace cnn;
namespace fs = std::filesystem;

namespace {

// The file as text, refused above max_bytes.
std::string read_text(const std::string& path, uint64_t max_bytes) {
  const std::vector<uint8_t> bytes = cnn::read_file(path, {max_bytes});
  return std::string(bytes.begin(), bytes.end());
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "cnn_st_XXXXXX").string();
    const char* made = ::mkdtemp(pattern.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i, v >>= 8) s[i] = static_cast<char>(v & 0xFF);
  return s;
}

std::string float_bytes(std::initializer_list<float> values) {
  std::string s;
  for (float v : values) s.append(reinterpret_cast<const char*>(&v), sizeof(v));
  return s;
}

// Test files need no fsync; plain writes keep the many corrupt cases fast.
void write_plain(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.flush()) throw std::runtime_error("cannot write test file " + path);
}

// A file laid out by hand: length prefix (the header's true size unless overridden), header, data.
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               int64_t length_override = -1) {
  const uint64_t n = length_override >= 0 ? static_cast<uint64_t>(length_override) : header.size();
  write_plain(path, le64(n) + header + data);
}

// Reading `path` must throw cnn::Error whose message names the file and contains `problem`.
void expect_read_error(const std::string& path, const std::string& problem) {
  SCOPED_TRACE(problem);
  try {
    read_safetensors(path);
    ADD_FAILURE() << "expected an error about: " << problem;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(problem), std::string::npos) << msg;
  }
}

// Values whose bit patterns must survive unchanged: signed zero, infinities, a NaN payload,
// denormals, the extremes.
std::vector<float> special_values() {
  const uint32_t nan_payload = 0x7FC01234u;
  float nan;
  std::memcpy(&nan, &nan_payload, sizeof(nan));
  return {0.f,
          -0.f,
          std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity(),
          nan,
          std::numeric_limits<float>::denorm_min(),
          std::numeric_limits<float>::max(),
          std::numeric_limits<float>::lowest(),
          1.f / 3.f};
}

uint32_t crc32(const void* data, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

std::vector<NamedTensor> random_tensors(uint64_t seed) {
  // Awkward shapes: a scalar, an empty tensor, odd sizes; names out of alphabetical order.
  std::vector<NamedTensor> ts = {{"conv1.weight", {5, 3, 3, 3}, {}},
                                 {"conv1.bias", {5}, {}},
                                 {"fc.weight", {10, 7}, {}},
                                 {"scalar", {}, {}},
                                 {"empty", {0, 4}, {}},
                                 {"adam.m/fc.weight", {10, 7}, {}}};
  uint64_t s = seed;
  for (auto& t : ts) {
    size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    t.data = test::random_vector(n, s++);
  }
  return ts;
}

}  // namespace

TEST(Safetensors, RoundTripIsBitwise) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  TempDir dir;
  const std::string path = dir.file("rt.safetensors");
  auto tensors = random_tensors(seed);
  tensors.push_back({"special", {3, 3}, special_values()});
  const std::map<std::string, std::string> meta = {
      {"epoch", "7"}, {"config", "lr: 0.1\nname: \"tiny\"\t\\"}, {"unicode", "\xC3\xA9t\xC3\xA9"}};
  write_safetensors(path, tensors, meta);

  const SafetensorsFile f = read_safetensors(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.metadata(), meta);
  EXPECT_EQ(f.metadata_value("epoch"), "7");
  EXPECT_EQ(f.find_metadata("missing"), nullptr);
  ASSERT_EQ(f.entries().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const NamedTensor& want = tensors[i];
    SCOPED_TRACE(want.name);
    // The data section keeps the written order.
    EXPECT_EQ(f.entries()[i].name, want.name);
    ASSERT_NE(f.find(want.name), nullptr);
    EXPECT_EQ(f.find(want.name)->dtype, "F32");
    const NamedTensor got = f.tensor_f32(want.name);
    EXPECT_EQ(got.name, want.name);
    EXPECT_EQ(got.shape, want.shape);
    ASSERT_EQ(got.data.size(), want.data.size());
    if (!want.data.empty()) {  // memcmp must not see the null data() of an empty vector
      EXPECT_EQ(std::memcmp(got.data.data(), want.data.data(), want.data.size() * sizeof(float)),
                0);
    }
  }
  EXPECT_EQ(f.find("nope"), nullptr);
  EXPECT_THROW(f.tensor_f32("nope"), Error);
  EXPECT_THROW(f.metadata_value("nope"), Error);
}

TEST(Safetensors, GoldenLayout) {
  TempDir dir;
  const std::string path = dir.file("golden.safetensors");
  write_safetensors(path, {{"w", {2}, {1.f, -2.f}}, {"b", {1, 1}, {0.5f}}}, {{"k", "v"}});

  const std::string json = R"({"__metadata__":{"k":"v"},)"
                           R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[1,1],"data_offsets":[8,12]}})";
  ASSERT_EQ(json.size(), 135u);  // padded with 1 space to 136 = 0x88
  const std::string header = json + " ";
  const std::string want = std::string("\x88\0\0\0\0\0\0\0", 8) + header +
                           std::string(
                               "\x00\x00\x80\x3F"   // 1.0f
                               "\x00\x00\x00\xC0"   // -2.0f
                               "\x00\x00\x00\x3F",  // 0.5f
                               12);
  const std::string got = read_text(path, 1 << 20);
  EXPECT_EQ(got.size(), 8u + 136u + 12u);
  EXPECT_EQ(got, want);

  // No metadata: no "__metadata__" key at all; the header still ends on a multiple of 8.
  write_safetensors(path, {{"x", {}, {3.f}}});
  const std::string bare = read_text(path, 1 << 20);
  const std::string bare_json = R"({"x":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})";
  ASSERT_EQ(bare.size(), 8u + 56u + 4u);
  EXPECT_EQ(bare.substr(0, 8), le64(56));
  EXPECT_EQ(bare.substr(8, 56), bare_json + std::string(56 - bare_json.size(), ' '));
}

TEST(Safetensors, ReadsFileWrittenByReference) {
  // The exact bytes that safetensors 0.8's numpy save_file wrote for
  // {"w": arange(6, float32).reshape(2, 3), "i": [1, -2] int64}, metadata {"k": "v"}:
  // it sorts by dtype size then name and pads the header with spaces to a multiple of 8.
  TempDir dir;
  const std::string path = dir.file("reference.safetensors");
  const std::string header =
      R"({"__metadata__":{"k":"v"},"i":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
      R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[16,40]}}       )";
  ASSERT_EQ(header.size(), 144u);
  write_plain(path, le64(144) + header + le64(1) + le64(static_cast<uint64_t>(-2)) +
                        float_bytes({0, 1, 2, 3, 4, 5}));
  const SafetensorsFile f = read_safetensors(path);
  ASSERT_EQ(f.entries().size(), 2u);
  EXPECT_EQ(f.entries()[0].name, "i");  // entries come in data order
  EXPECT_EQ(f.metadata_value("k"), "v");
  const NamedTensor w = f.tensor_f32("w");
  EXPECT_EQ(w.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w.data, (std::vector<float>{0, 1, 2, 3, 4, 5}));
  int64_t i[2];
  std::memcpy(i, f.bytes(*f.find("i")), sizeof(i));
  EXPECT_EQ(i[0], 1);
  EXPECT_EQ(i[1], -2);
}

TEST(Safetensors, WriterRejectsBadInput) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  EXPECT_THROW(write_safetensors(path, {{"a", {2}, {1, 2}}, {"a", {1}, {3}}}), Error);
  EXPECT_THROW(write_safetensors(path, {{"", {1}, {1}}}), Error);
  EXPECT_THROW(write_safetensors(path, {{"__metadata__", {1}, {1}}}), Error);
  EXPECT_THROW(write_safetensors(path, {{"a", {2, 2}, {1, 2, 3}}}), Error);
  EXPECT_THROW(write_safetensors(path, {{"a", {-1, -2}, {1, 2}}}), Error);
  EXPECT_THROW(write_safetensors(path, {{"bad\xFFutf8", {1}, {1}}}), Error);
  EXPECT_FALSE(fs::exists(path));  // nothing half-written
}

TEST(Safetensors, ReadsOtherDtypes) {
  TempDir dir;
  const std::string path = dir.file("ints.safetensors");
  std::string data = le64(42) + le64(static_cast<uint64_t>(-7));
  data += "\x01\x02\x03";
  write_raw(path,
            R"({"step":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
            R"("mask":{"dtype":"U8","shape":[3],"data_offsets":[16,19]}})",
            data);
  const SafetensorsFile f = read_safetensors(path);
  const SafetensorsEntry* step = f.find("step");
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->dtype, "I64");
  EXPECT_EQ(step->numel(), 2u);
  int64_t v[2];
  std::memcpy(v, f.bytes(*step), sizeof(v));
  EXPECT_EQ(v[0], 42);
  EXPECT_EQ(v[1], -7);
  EXPECT_EQ(f.bytes(*f.find("mask"))[2], 3);
  EXPECT_THROW(f.tensor_f32("step"), Error);  // not silently reinterpreted
}

TEST(Safetensors, CorruptFilesGiveClearErrors) {
  TempDir dir;
  const std::string p = dir.file("corrupt.safetensors");
  const std::string a8 = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

  write_plain(p, std::string("\x10\0\0", 3));
  expect_read_error(p, "shorter than the 8-byte header length prefix");
  write_plain(p, "");
  expect_read_error(p, "shorter than the 8-byte header length prefix");

  write_raw(p, "{" + a8 + "}", float_bytes({1, 2}), int64_t{1} << 62);
  expect_read_error(p, "exceeds the limit");
  write_raw(p, "{" + a8 + "}", float_bytes({1, 2}), (100 << 20) + 1);
  expect_read_error(p, "exceeds the limit");
  write_raw(p, "{" + a8 + "}", float_bytes({1, 2}), 1000);
  expect_read_error(p, "header length 1000 is larger than the");
  write_raw(p, "", "");
  expect_read_error(p, "header length is 0");

  write_raw(p, R"({"a":{"dtype":"F32",)", float_bytes({1, 2}));
  expect_read_error(p, "not valid JSON");
  write_raw(p, std::string("{}\0\0\0\0\0\0", 8), "");
  expect_read_error(p, "NUL byte at offset 2");
  write_raw(p, "[1,2]", "");
  expect_read_error(p, "expected a JSON object");
  write_raw(p, R"({"a":5})", "");
  expect_read_error(p, "expected an object");

  write_raw(p, "{" + a8 + "}", float_bytes({1}));
  expect_read_error(p, "outside the 4-byte data section");
  write_raw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", float_bytes({1}));
  expect_read_error(p, "outside the 4-byte data section");

  write_raw(p, "{" + a8 + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            float_bytes({1, 2, 3}));
  expect_read_error(p, "overlap");
  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
            float_bytes({1, 2, 3}));
  expect_read_error(p, "data bytes [4, 8) before tensor 'b' belong to no tensor");
  write_raw(p, "{" + a8 + "}", float_bytes({1, 2, 3}));
  expect_read_error(p, "data bytes [8, 12) at the end belong to no tensor");

  write_raw(p, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", float_bytes({1, 2}));
  expect_read_error(p, "needs 12 bytes, but its data_offsets [0, 8] span 8");
  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],)"
            R"("data_offsets":[0,8]}})",
            float_bytes({1, 2}));
  expect_read_error(p, "overflows");
  write_raw(p, R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", float_bytes({1, 2}));
  expect_read_error(p, "expected non-negative integers");
  write_raw(p, R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", float_bytes({1, 2}));
  expect_read_error(p, "expected non-negative integers");
  write_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", float_bytes({1, 2}));
  expect_read_error(p, "0 <= begin <= end");
  write_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})", float_bytes({1, 2}));
  expect_read_error(p, "expected [begin, end]");

  write_raw(p, R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", float_bytes({1, 2}));
  expect_read_error(p, "unknown dtype 'F33'");
  write_raw(p, R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", float_bytes({1, 2}));
  expect_read_error(p, "expected a string");
  write_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})",
            float_bytes({1, 2}));
  expect_read_error(p, "unknown field 'x'");
  write_raw(p, R"({"a":{"dtype":"F32","shape":[2]}})", float_bytes({1, 2}));
  expect_read_error(p, "lacks one of");

  write_raw(p, "{" + a8 + "," + a8 + "}", float_bytes({1, 2}));
  expect_read_error(p, "the key 'a' twice");
  write_raw(p, R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
            float_bytes({1, 2}));
  expect_read_error(p, "the key 'dtype' twice");
  write_raw(p, R"({"__metadata__":{"k":"1","k":"2"},)" + a8 + "}", float_bytes({1, 2}));
  expect_read_error(p, "the key 'k' twice");
  write_raw(p, R"({"__metadata__":{"epoch":3},)" + a8 + "}", float_bytes({1, 2}));
  expect_read_error(p, "metadata 'epoch' is 3, expected a string");

  expect_read_error(dir.file("missing.safetensors"), "No such file");
  fs::create_directory(dir.file("adir"));
  expect_read_error(dir.file("adir"), "not a regular file");
}

TEST(Safetensors, TruncatedValidFileGivesClearError) {
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  write_safetensors(good, {{"a", {3, 5}, test::random_vector(15, test::fresh_seed())}});
  const std::string bytes = read_text(good, 1 << 20);
  const std::string cut = dir.file("cut.safetensors");
  write_file_atomically(cut, bytes.data(), bytes.size() - 3);
  expect_read_error(cut, "outside the 57-byte data section");
  write_file_atomically(cut, bytes.data(), 40);  // inside the header
  expect_read_error(cut, "is larger than the 32 bytes that follow");
}

TEST(Safetensors, RandomCorruptionNeverCrashes) {
  // Every mangled file either reads (a flip in a float, a harmless space) or throws cnn::Error.
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  write_safetensors(good, random_tensors(seed), {{"epoch", "3"}});
  const std::string bytes = read_text(good, 1 << 20);
  const std::string bad = dir.file("bad.safetensors");
  std::mt19937_64 rng(seed);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | static_cast<uint8_t>(bytes[i]);
  const size_t data_start = 8 + header_bytes;
  int errors = 0, reads = 0;
  for (int i = 0; i < 400; ++i) {
    std::string mangled = bytes;
    const int kind = static_cast<int>(rng() % 4);
    if (kind == 0) {  // flip bytes in the prefix and header, where the structure is
      for (int k = 0; k < 3; ++k) mangled[rng() % data_start] ^= static_cast<char>(1 + rng() % 255);
    } else if (kind == 1) {  // truncate anywhere
      mangled.resize(rng() % mangled.size());
    } else if (kind == 2) {  // junk appended
      mangled += std::string(1 + rng() % 16, static_cast<char>(rng()));
    } else {  // a flipped value in the data section is still a well-formed file
      mangled[data_start + rng() % (mangled.size() - data_start)] ^= 0x40;
    }
    write_plain(bad, mangled);
    try {
      read_safetensors(bad);
      ++reads;
    } catch (const Error& e) {
      ++errors;
      EXPECT_NE(kind, 3) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(errors, 0);
  EXPECT_GT(reads, 0);
  std::printf("random corruption: %d rejected, %d still valid\n", errors, reads);
}

TEST(Safetensors, ReferenceImplementationReadsOurFile) {
  if (std::system("python3 -c 'import numpy, safetensors.numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with numpy and safetensors is not available";
  }
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  TempDir dir;
  const std::string path = dir.file("ref.safetensors");
  const auto tensors = random_tensors(seed);
  const std::map<std::string, std::string> meta = {{"epoch", "12"}, {"format", "cnn-trainer"}};
  write_safetensors(path, tensors, meta);

  // CTest sets CNN_SOURCE_DIR; the compiled-in path serves a binary run by hand.
  const char* env_source = std::getenv("CNN_SOURCE_DIR");
  const std::string source = env_source != nullptr ? env_source : CNN_SOURCE_DIR;
  const std::string cmd =
      "python3 '" + source + "/scripts/check_safetensors.py' --json '" + path + "'";
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr) << cmd;
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, n);
  ASSERT_EQ(::pclose(pipe), 0) << cmd << "\n" << out;

  const auto summary = nlohmann::json::parse(out);
  const auto got_meta = summary["metadata"].get<std::map<std::string, std::string>>();
  EXPECT_EQ(got_meta, meta);
  ASSERT_EQ(summary["tensors"].size(), tensors.size()) << out;
  for (const NamedTensor& t : tensors) {
    SCOPED_TRACE(t.name);
    ASSERT_TRUE(summary["tensors"].contains(t.name)) << out;
    const auto& s = summary["tensors"][t.name];
    EXPECT_EQ(s["dtype"], "float32");
    EXPECT_EQ(s["shape"].get<std::vector<int64_t>>(), t.shape);
    EXPECT_EQ(s["nbytes"].get<size_t>(), t.data.size() * sizeof(float));
    EXPECT_EQ(s["crc32"].get<uint32_t>(), crc32(t.data.data(), t.data.size() * sizeof(float)));
    double sum = 0, abs_sum = 0;
    for (float v : t.data) sum += v, abs_sum += std::fabs(v);
    EXPECT_NEAR(s["sum"].get<double>(), sum, 1e-12 * abs_sum + 1e-300);
  }
}

// Checkpoint metadata that is not a number was reported as a bare "stod" (std::invalid_argument),
// a negative seed wrapped around, and out-of-range list items were cast with undefined behaviour;
// all now name the file and the key (found by fuzz/fuzz_safetensors).
TEST(Safetensors, CheckpointMetadataErrorsNameTheKey) {
  TempDir dir;
  const std::map<std::string, std::string> good = {{"format", "cnn-trainer-checkpoint-1"},
                                                   {"config", "name: x"},
                                                   {"classes", "[\"a\", \"b\"]"},
                                                   {"input_chw", "[1, 4, 4]"},
                                                   {"mean", "[0.5]"},
                                                   {"std", "[0.25]"},
                                                   {"epoch", "1"},
                                                   {"batch_in_epoch", "2"},
                                                   {"global_step", "3"},
                                                   {"best_accuracy", "0.75"},
                                                   {"seed", "7"}};
  const std::string path = dir.file("ck.safetensors");
  write_safetensors(path, {}, good);
  const CheckpointMeta m = read_checkpoint_meta(path);
  EXPECT_EQ(m.position.best_accuracy, 0.75);
  EXPECT_EQ(m.seed, 7u);

  const std::pair<const char*, const char*> bad[] = {
      {"best_accuracy", "x"}, {"best_accuracy", "0.5x"}, {"best_accuracy", ""},
      {"seed", "-5"},         {"seed", "1e3"},           {"seed", "99999999999999999999999"},
      {"epoch", "one"}};
  for (const auto& [key, value] : bad) {
    SCOPED_TRACE(std::string(key) + "=" + value);
    auto meta = good;
    meta[key] = value;
    write_safetensors(path, {}, meta);
    try {
      read_checkpoint_meta(path);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::string("metadata '") + key + "' is '" + value + "'"),
                std::string::npos)
          << msg;
    }
  }
  // Lists whose items do not fit the type: nlohmann's casts of these were undefined behaviour.
  const std::pair<const char*, const char*> bad_lists[] = {
      {"input_chw", "[1, 4, 9.3e19]"},
      {"input_chw", "[1, 4, 18446744073709551615]"},
      {"input_chw", "[1, 4, 4.5]"},
      {"mean", "[1e300]"},
      {"std", "[\"0.25\"]"},
      {"classes", "[\"a\", 1]"},
      {"mean", "0.5"},
      {"classes", "[\"a\""}};
  for (const auto& [key, value] : bad_lists) {
    SCOPED_TRACE(std::string(key) + "=" + value);
    auto meta = good;
    meta[key] = value;
    write_safetensors(path, {}, meta);
    try {
      read_checkpoint_meta(path);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path + ": metadata '" + key + "' is not a JSON list of the expected type"),
                std::string::npos)
          << msg;
    }
  }
}
