// Hostile input (issue 19): each class of input that once crashed, hung, allocated gigabytes or
// passed silently now gets one clear error line, checked here with files made on the spot (sparse
// where they are large, so no test needs more than a few MB or a second).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/config/did_you_mean.h"
#include "app/train/resume_plan.h"
#include "data/check_data.h"
#include "data/idx.h"
#include "data/image_folder.h"
#include "data/load_data.h"
#include "layers/checkpoint/checkpoint.h"
#include "layers/checkpoint/safetensors.h"
#include "layers/network.h"
#include "runtime/error.h"
#include "runtime/file_io.h"
#include "runtime/text.h"
#include "tests/test_util.h"

using namespace cnn;
namespace fs = std::filesystem;

namespace {

// The message of the cnn::Error that f throws ("" and a test failure when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no cnn::Error thrown";
  return "";
}

#define EXPECT_HAS(msg, part) \
  EXPECT_TRUE(test::contains(msg, part)) << "message: " << (msg) << "\nexpected: " << (part)

void write(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}
void write(const fs::path& p, const std::vector<uint8_t>& bytes) {
  write(p, std::string(bytes.begin(), bytes.end()));
}

// A sparse file of `size` bytes starting with `head`: takes no disk space. False where the file
// system refuses such a size.
bool write_sparse(const fs::path& p, const std::string& head, uint64_t size) {
  write(p, head);
  return ::truncate(p.c_str(), off_t(size)) == 0;
}

std::string be32(uint32_t v) {
  return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
}

// A minimal valid w x h gray PNG (filter byte 0 per row), written by hand with zlib so that the
// test can corrupt and re-seal each part.
std::string chunk(const std::string& type, const std::string& data) {
  std::string body = type + data;
  const uint32_t crc = uint32_t(crc32(0, reinterpret_cast<const Bytef*>(body.data()), body.size()));
  return be32(uint32_t(data.size())) + body + be32(crc);
}
std::string zlib_of(const std::string& raw) {
  uLongf n = compressBound(raw.size());
  std::string out(n, '\0');
  compress(reinterpret_cast<Bytef*>(out.data()), &n, reinterpret_cast<const Bytef*>(raw.data()),
           raw.size());
  out.resize(n);
  return out;
}
std::string gray_png(int w, int h, const std::string& idat_zlib = "") {
  std::string raw;
  for (int y = 0; y < h; ++y) {
    raw += '\0';
    for (int x = 0; x < w; ++x) raw += char(x * 7 + y * 13);
  }
  std::string ihdr = be32(uint32_t(w)) + be32(uint32_t(h));
  ihdr += std::string{8, 0, 0, 0, 0};  // depth 8, gray, deflate, filter 0, no interlace
  return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", ihdr) +
         chunk("IDAT", idat_zlib.empty() ? zlib_of(raw) : idat_zlib) + chunk("IEND", "");
}
std::string gray_png_raw(int w, int h) {
  std::string raw;
  for (int y = 0; y < h; ++y) {
    raw += '\0';
    for (int x = 0; x < w; ++x) raw += char(x * 7 + y * 13);
  }
  return raw;
}

std::vector<uint8_t> bytes_of(const std::string& s) {
  return {s.begin(), s.end()};
}

constexpr const char* kTinyConfig = R"(name: hostile
model:
  input: {channels: 1, height: 4, width: 4}
  layers:
    - conv2d: {out_channels: 2, kernel: 3, padding: 1}
    - relu
    - maxpool2d: {kernel: 2}
    - flatten
    - linear: {out_features: 2}
    - softmax_cross_entropy
data: {format: synthetic, synthetic: {train: 8, test: 4, classes: 2}, normalize: {mean: [0.5], std: [0.25]}}
optimizer: {type: sgd, lr: 0.1, momentum: 0.9}
training: {epochs: 1, batch_size: 4, device: cpu}
)";

// A valid checkpoint of kTinyConfig's network at `path`.
void save_tiny_checkpoint(const std::string& path) {
  const TrainConfig cfg = parse_config(kTinyConfig, "hostile.yaml");
  NetworkOptions nopt;
  nopt.max_batch = 2;
  Network net(cfg.model.layers, cfg.model.input_chw, nopt, Exec{});
  CheckpointMeta meta;
  meta.config_yaml = cfg.resolved_yaml;
  meta.class_names = {"a", "b"};
  meta.input_chw = cfg.model.input_chw;
  meta.mean = {0.5f};
  meta.std = {0.25f};
  save_checkpoint(path, net, nullptr, meta);
}

// Rewrites a checkpoint with one metadata value or one tensor element changed.
void rewrite_checkpoint(const std::string& path, const std::string& key, const std::string& value,
                        const std::string& tensor = "", float element = 0) {
  const SafetensorsFile f = read_safetensors(path);
  std::vector<NamedTensor> tensors;
  for (const auto& e : f.entries()) {
    tensors.push_back(f.tensor_f32(e.name));
    if (e.name == tensor) tensors.back().data.at(0) = element;
  }
  std::map<std::string, std::string> md = f.metadata();
  if (!key.empty()) md[key] = value;
  write_safetensors(path, tensors, md);
}

Network tiny_network() {
  const TrainConfig cfg = parse_config(kTinyConfig, "hostile.yaml");
  NetworkOptions nopt;
  nopt.max_batch = 2;
  return Network(cfg.model.layers, cfg.model.input_chw, nopt, Exec{});
}

}  // namespace

// ---- 1. nesting: refused before parsing, no value echoed whole ----------------------------------

TEST(Hostile, SafetensorsDeepNestingIsRefusedBeforeParsing) {
  const fs::path dir = test::fresh_dir("hostile", "nesting");
  std::string header = std::string(70000, '[') + std::string(70000, ']');
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string file(8, '\0');
  for (size_t i = 0, n = header.size(); i < 8; ++i, n >>= 8) file[i] = char(n & 0xff);
  write(dir / "deep.safetensors", file + header);
  const std::string msg = error_of([&] { read_safetensors((dir / "deep.safetensors").string()); });
  EXPECT_HAS(msg, "nests 70000 levels");
  EXPECT_LT(msg.size(), 300u);

  // Within the limit but a wrong value: the message shows an excerpt, not 2,000 brackets.
  header = R"({"w": {"dtype": "F32", "shape": )" + std::string(60, '[') + std::string(60, ']') +
           R"(, "data_offsets": [0, 0]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  for (size_t i = 0, n = header.size(); i < 8; ++i, n >>= 8) file[i] = char(n & 0xff);
  write(dir / "wide.safetensors", file.substr(0, 8) + header);
  const std::string shape_msg =
      error_of([&] { read_safetensors((dir / "wide.safetensors").string()); });
  EXPECT_HAS(shape_msg, "expected non-negative integers");
  EXPECT_LT(shape_msg.size(), 300u);
}

TEST(Hostile, JsonDepthScanIgnoresBracketsInStrings) {
  EXPECT_EQ(json_nesting_depth(R"({"a": "[[[[", "b": [1, [2]]})"), 3u);
  EXPECT_EQ(json_nesting_depth(R"(["\"[[["])"), 1u);
  EXPECT_EQ(json_nesting_depth(""), 0u);
  EXPECT_EQ(json_nesting_depth("]]]]"), 0u);
}

TEST(Hostile, CheckpointNestedMetadataListIsRefused) {
  const fs::path dir = test::fresh_dir("hostile", "nested_meta");
  const std::string path = (dir / "ck.safetensors").string();
  save_tiny_checkpoint(path);
  rewrite_checkpoint(path, "classes", std::string(5000, '[') + std::string(5000, ']'));
  EXPECT_HAS(error_of([&] { read_checkpoint_meta(path); }), "'classes' nests lists");
}

// ---- 2. names that are not UTF-8 ----------------------------------------------------------------

TEST(Hostile, TextHelpers) {
  EXPECT_TRUE(valid_utf8("plain ascii"));
  EXPECT_TRUE(valid_utf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));
  EXPECT_FALSE(valid_utf8("\xFF\xFE"));
  EXPECT_FALSE(valid_utf8("\xC0\xAF"));          // overlong '/'
  EXPECT_FALSE(valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(valid_utf8("\xF4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(valid_utf8("\xE2\x82"));          // truncated
  EXPECT_EQ(utf8_replace_invalid("a\xFF\xFE"
                                 "b"),
            "a\xEF\xBF\xBD\xEF\xBF\xBD"
            "b");
  EXPECT_TRUE(valid_utf8(utf8_replace_invalid("\xE2\x82\xC0")));
  EXPECT_EQ(printable("a\xFF\nb\xC3\xA9"), "a\\xFF\\x0Ab\xC3\xA9");
  EXPECT_EQ(excerpt("short"), "short");
  const std::string cut = excerpt(std::string(1000, 'k'), 10);
  EXPECT_EQ(cut, "kkkkkkkkkk... (1000 bytes)");
}

TEST(Hostile, ClassFolderNotUtf8IsRefusedAtLoad) {
  const fs::path dir = test::fresh_dir("hostile", "utf8_folder");
  write(dir / "good" / "a.png", gray_png(4, 4));
  write(dir / "bad\xFF\xFE" / "a.png", gray_png(4, 4));
  ImageLoadOptions opt;
  opt.height = opt.width = 4;
  const std::string msg = error_of([&] { load_image_folder(dir.string(), opt); });
  EXPECT_HAS(msg, "bad\\xFF\\xFE");
  EXPECT_HAS(msg, "not named in UTF-8");
  EXPECT_TRUE(valid_utf8(msg));
}

TEST(Hostile, ListClassNameNotUtf8IsRefused) {
  const fs::path dir = test::fresh_dir("hostile", "utf8_list");
  write(dir / "a.png", gray_png(4, 4));
  write(dir / "list.csv", std::string("a.png,cat\na.png,d\xFFg\n"));
  ImageLoadOptions opt;
  opt.height = opt.width = 4;
  const std::string msg = error_of([&] { load_image_list((dir / "list.csv").string(), opt); });
  EXPECT_HAS(msg, "list.csv:2:");
  EXPECT_HAS(msg, "d\\xFFg");
}

TEST(Hostile, ConfigClassNameNotUtf8IsRefused) {
  const std::string msg =
      error_of([&] { parse_config(kTinyConfig, "c.yaml", {"data.classes=[\"ok\", \"b\xFF\"]"}); });
  EXPECT_HAS(msg, "not valid UTF-8");
}

// ---- 3. not a regular file, or far too large: refused before reading ----------------------------

TEST(Hostile, ConfigThatIsNotARegularFileIsRefused) {
  EXPECT_HAS(error_of([] { load_config("/dev/zero"); }), "is a device");
  const fs::path dir = test::fresh_dir("hostile", "config_dir");
  EXPECT_HAS(error_of([&] { load_config(dir.string()); }), "is a directory");
  const fs::path fifo = dir / "fifo.yaml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_HAS(error_of([&] { load_config(fifo.string()); }), "FIFO");  // and does not hang
}

TEST(Hostile, ConfigLargerThanTheLimitIsRefusedBySize) {
  const fs::path dir = test::fresh_dir("hostile", "config_big");
  ASSERT_TRUE(write_sparse(dir / "big.yaml", "name: x\n", uint64_t(8) << 30));
  EXPECT_HAS(error_of([&] { load_config((dir / "big.yaml").string()); }), "larger than the limit");
}

TEST(Hostile, SparseIdxWithWrongMagicIsRefusedFromItsHeader) {
  const fs::path dir = test::fresh_dir("hostile", "idx_sparse");
  const fs::path im = dir / "train-images-idx3-ubyte", lb = dir / "train-labels-idx1-ubyte";
  if (!write_sparse(im, be32(0x12345678), uint64_t(8) << 30)) GTEST_SKIP() << "no sparse files";
  write(lb, bytes_of(be32(0x801) + be32(1) + std::string(1, '\0')));
  EXPECT_HAS(error_of([&] { load_idx_dataset(im.string(), lb.string(), {}); }), "wrong magic");
  // A right header but 8 GB where 784 bytes are announced.
  ASSERT_TRUE(write_sparse(im, be32(0x803) + be32(1) + be32(28) + be32(28), uint64_t(8) << 30));
  EXPECT_HAS(error_of([&] { load_idx_dataset(im.string(), lb.string(), {}); }),
             "follow the 784 bytes of data");
}

TEST(Hostile, IdxFromADeviceIsRefused) {
  const fs::path dir = test::fresh_dir("hostile", "idx_dev");
  fs::create_symlink("/dev/zero", dir / "train-images-idx3-ubyte");
  write(dir / "train-labels-idx1-ubyte", bytes_of(be32(0x801) + be32(1) + std::string(1, '\0')));
  EXPECT_HAS(error_of([&] {
               load_idx_dataset((dir / "train-images-idx3-ubyte").string(),
                                (dir / "train-labels-idx1-ubyte").string(), {});
             }),
             "is a device");
}

TEST(Hostile, HugeSparseFileNamedPngIsRefusedFromItsHeader) {
  const fs::path dir = test::fresh_dir("hostile", "png_sparse");
  if (!write_sparse(dir / "zeros.png", "", uint64_t(8) << 30)) GTEST_SKIP() << "no sparse files";
  // A real 4x4 PNG header, then 8 GB of nothing.
  const std::string png = gray_png(4, 4);
  ASSERT_TRUE(write_sparse(dir / "padded.png", png, uint64_t(8) << 30));
  EXPECT_HAS(error_of([&] { load_image_file((dir / "zeros.png").string(), 1, 4, 4, false); }),
             "not a readable");
  EXPECT_HAS(error_of([&] { load_image_file((dir / "padded.png").string(), 1, 4, 4, false); }),
             "never needs more than");
}

TEST(Hostile, FifoAndDeviceInAClassFolderAreRefusedOrSkipped) {
  const fs::path dir = test::fresh_dir("hostile", "folder_special");
  write(dir / "a" / "ok.png", gray_png(4, 4));
  write(dir / "b" / "ok.png", gray_png(4, 4));
  ASSERT_EQ(::mkfifo((dir / "a" / "fifo.png").c_str(), 0600), 0);
  fs::create_symlink("/dev/zero", dir / "b" / "zero.png");
  ImageLoadOptions opt;
  opt.height = opt.width = 4;
  const std::string msg = error_of([&] { load_image_folder(dir.string(), opt); });
  EXPECT_HAS(msg, "fifo.png: is a FIFO");
  opt.skip_bad_images = true;
  const Dataset d = load_image_folder(dir.string(), opt);
  EXPECT_EQ(d.n, 2);
  EXPECT_EQ(d.skipped, 2);
  ASSERT_EQ(d.skipped_examples.size(), 2u);
  EXPECT_HAS(d.skipped_examples[1], "zero.png: is a device");
}

// ---- 4. decompression bombs: headers compared before the body is inflated -----------------------

TEST(Hostile, GzipIdxHeadersAreCheckedBeforeInflating) {
  const fs::path dir = test::fresh_dir("hostile", "gzip_bomb");
  const std::string im = (dir / "im.gz").string(), lb = (dir / "lb").string();
  // 1 x 65535 x 65535 (4.3 GB inflated): refused by the header's image side alone.
  const std::string side = be32(0x803) + be32(1) + be32(65535) + be32(65535) + std::string(64, 0);
  write(im, gzip_compress(reinterpret_cast<const uint8_t*>(side.data()), side.size()));
  write(lb, bytes_of(be32(0x801) + be32(1) + std::string(1, '\0')));
  EXPECT_HAS(error_of([&] { load_idx_dataset(im, lb, {}); }), "65535x65535 pixels are absurd");

  // 1 x 4096 x 4096 zeros (16 MB inflated, 16 KB of gzip): the label count is compared, and the
  // image size with the model's, from the headers alone.
  std::string body = be32(0x803) + be32(1) + be32(4096) + be32(4096);
  body.resize(body.size() + 4096 * 4096);
  write(im, gzip_compress(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
  write(lb, bytes_of(be32(0x801) + be32(2) + std::string(2, '\0')));
  EXPECT_HAS(error_of([&] { load_idx_dataset(im, lb, {}); }), "2 labels, but");
  write(lb, bytes_of(be32(0x801) + be32(1) + std::string(1, '\0')));
  EXPECT_HAS(error_of([&] {
               load_idx_dataset(im, lb, {}, IdxExpect{28, 28, false});
             }),
             "images are 4096x4096 (WxH) but data.width/height say 28x28");

  // A 40-byte gzip cannot hold what its header announces.
  const std::string head = be32(0x803) + be32(1000) + be32(1000) + be32(1000);
  write(im, gzip_compress(reinterpret_cast<const uint8_t*>(head.data()), head.size()));
  write(lb, bytes_of(be32(0x801) + be32(1000) + std::string(1000, '\0')));
  EXPECT_HAS(error_of([&] { load_idx_dataset(im, lb, {}); }), "can hold");
}

TEST(Hostile, IdxLargerThanMemoryIsRefusedFromItsHeader) {
  const fs::path dir = test::fresh_dir("hostile", "idx_memory");
  const fs::path im = dir / "im", lb = dir / "lb";
  // 2^24 images of 256x256: exactly 2^40 bytes, as the sparse file holds.
  const uint64_t n = uint64_t(1) << 24;
  if (!write_sparse(im, be32(0x803) + be32(uint32_t(n)) + be32(256) + be32(256), 16 + (n << 16)))
    GTEST_SKIP() << "no 1 TiB sparse files here";
  ASSERT_TRUE(write_sparse(lb, be32(0x801) + be32(uint32_t(n)), 8 + n));
  EXPECT_HAS(error_of([&] { load_idx_dataset(im.string(), lb.string(), {}); }),
             "more than this machine's");
}

// ---- 5. sizes from small inputs -----------------------------------------------------------------

TEST(Hostile, ListLabelBeyondTheRowsIsRefused) {
  const fs::path dir = test::fresh_dir("hostile", "list_label");
  write(dir / "a.png", gray_png(4, 4));
  write(dir / "list.csv", std::string("a.png,99999999\n"));
  ImageLoadOptions opt;
  opt.height = opt.width = 4;
  EXPECT_HAS(error_of([&] { load_image_list((dir / "list.csv").string(), opt); }),
             "label 99999999 would make 100000000 classes, but the file has 1 rows");
  // Sparse labels within the bound still work: 3 classes from 2 rows.
  write(dir / "list.csv", std::string("a.png,0\na.png,2\n"));
  EXPECT_EQ(load_image_list((dir / "list.csv").string(), opt).num_classes(), 3);
}

TEST(Hostile, CheckpointModelLargerThanItsTensorsIsRefusedBeforeBuilding) {
  const fs::path dir = test::fresh_dir("hostile", "ck_input");
  const std::string path = (dir / "ck.safetensors").string();
  save_tiny_checkpoint(path);
  const CheckpointMeta meta = read_checkpoint_meta(path);
  const TrainConfig cfg = parse_config(kTinyConfig, "hostile.yaml");
  EXPECT_NO_THROW(check_checkpoint_can_hold(path, meta, cfg.model.layers, cfg.model.input_chw));
  EXPECT_HAS(error_of([&] {
               check_checkpoint_can_hold(path, meta, cfg.model.layers, {1, 4096, 4096});
             }),
             "(input (1, 4096, 4096)) has 16777238 parameters");
  // ./infer and a --resume without --config build the network from the stored config: refused
  // from the file's size before that.
  std::string big = meta.config_yaml;
  for (const std::string side : {"height: ", "width: "}) {
    for (size_t at = big.find(side + "4"); at != std::string::npos;
         at = big.find(side + "4", at + side.size() + 4))
      big.replace(at, side.size() + 1, side + "4096");
  }
  rewrite_checkpoint(path, "config", big);
  rewrite_checkpoint(path, "input_chw", "[1, 4096, 4096]");
  EXPECT_HAS(error_of([&] { config_from_checkpoint(path, {}); }),
             "(input (1, 4096, 4096)) has 16777238 parameters");
  rewrite_checkpoint(path, "input_chw", "[1, 4096, 99999]");
  EXPECT_HAS(error_of([&] { read_checkpoint_meta(path); }), "input_chw is (1, 4096, 99999)");
}

// ---- 6. quadratic work --------------------------------------------------------------------------

TEST(Hostile, ManyClassNamesAreCheckedInLinearTime) {
  std::string list = "[";
  for (int i = 0; i < 60000; ++i) list += (i ? ",c" : "c") + std::to_string(i);
  const std::string msg =
      error_of([&] { parse_config(kTinyConfig, "c.yaml", {"data.classes=" + list + ",c7]"}); });
  EXPECT_HAS(msg, "the class name 'c7' is listed twice (also item [7])");
}

TEST(Hostile, HugeUnknownKeyIsRefusedQuicklyAndShortly) {
  // An explicit key ("? key"): YAML allows plain implicit keys of 1024 characters only.
  const std::string key(3 << 20, 'k');
  const std::string msg = error_of(
      [&] { parse_config(std::string(kTinyConfig) + "? " + key + "\n: 1\n", "big_key.yaml"); });
  EXPECT_HAS(msg, "unknown key");
  EXPECT_HAS(msg, "(3145728 bytes)");
  EXPECT_LT(msg.size(), 600u);
  EXPECT_EQ(closest_match(key, {"kkk"}), "");
  EXPECT_HAS(error_of([] { parse_config(std::string(5 << 20, '#'), "huge.yaml"); }),
             "larger than the limit");
}

// ---- 7. checksums that stb_image does not verify ------------------------------------------------

TEST(Hostile, PngWithBadCrcOrAdlerIsABadImage) {
  const std::string good = gray_png(4, 4);
  EXPECT_NO_THROW(
      decode_image(reinterpret_cast<const uint8_t*>(good.data()), good.size(), 1, 4, 4, false));
  std::string bad_crc = good;
  bad_crc[8 + 8 + 13] ^= 1;  // the IHDR CRC's first byte
  EXPECT_HAS(error_of([&] {
               decode_image(reinterpret_cast<const uint8_t*>(bad_crc.data()), bad_crc.size(), 1, 4,
                            4, false);
             }),
             "chunk 'IHDR' at byte 8 fails its CRC check");

  std::string z = zlib_of(gray_png_raw(4, 4));
  z.back() ^= 0x55;  // the Adler-32, chunk CRC re-sealed
  const std::string bad_adler = gray_png(4, 4, z);
  EXPECT_HAS(error_of([&] {
               decode_image(reinterpret_cast<const uint8_t*>(bad_adler.data()), bad_adler.size(), 1,
                            4, 4, false);
             }),
             "Adler-32");

  // In a folder: skippable, and --check-data counts it.
  const fs::path dir = test::fresh_dir("hostile", "png_crc");
  write(dir / "a" / "ok.png", good);
  write(dir / "a" / "bad.png", bad_adler);
  write(dir / "b" / "ok.png", good);
  DataOptions d;
  d.format = DataFormat::Folder;
  d.train = dir.string();
  d.channels = 1;
  d.height = d.width = 4;
  int64_t problems = 0;
  const std::string report = check_data_report(d, &problems);
  EXPECT_EQ(problems, 1) << report;
  // --check-data groups problems by cause, each with example files.
  EXPECT_HAS(report, "corrupt PNG");
  EXPECT_HAS(report, "bad.png");
}

// ---- 8. non-finite and absurd checkpoints -------------------------------------------------------

TEST(Hostile, CheckpointWithNonFiniteTensorIsRefusedNamingIt) {
  const fs::path dir = test::fresh_dir("hostile", "ck_nan");
  const std::string path = (dir / "ck.safetensors").string();
  save_tiny_checkpoint(path);
  Network net = tiny_network();
  EXPECT_NO_THROW(load_checkpoint_for(path, net));
  rewrite_checkpoint(path, "", "", net.param_infos().back().name,
                     std::numeric_limits<float>::quiet_NaN());
  const std::string msg = error_of([&] { load_checkpoint_for(path, net); });
  EXPECT_HAS(msg, "tensor '" + net.param_infos().back().name + "' holds nan at element 0");
  rewrite_checkpoint(path, "", "", net.param_infos().front().name,
                     std::numeric_limits<float>::infinity());
  EXPECT_HAS(error_of([&] { load_checkpoint_for(path, net); }), "holds inf");
}

TEST(Hostile, CheckpointCountersOutOfRangeAreRefusedNamingTheKey) {
  const fs::path dir = test::fresh_dir("hostile", "ck_counter");
  const std::string path = (dir / "ck.safetensors").string();
  const std::pair<const char*, const char*> cases[] = {{"global_step", "9223372036854775807"},
                                                       {"global_step", "9007199254740993"},
                                                       {"epoch", "-1"},
                                                       {"batch_in_epoch", "-5"}};
  for (const auto& [key, value] : cases) {
    save_tiny_checkpoint(path);
    rewrite_checkpoint(path, key, value);
    const std::string msg = error_of([&] { read_checkpoint_meta(path); });
    EXPECT_HAS(msg, path);
    EXPECT_HAS(msg, fmt::format("metadata '{}' is {}", key, value));
  }
  save_tiny_checkpoint(path);
  rewrite_checkpoint(path, "best_accuracy", "7");
  EXPECT_HAS(error_of([&] { read_checkpoint_meta(path); }), "'best_accuracy' is 7");
}
