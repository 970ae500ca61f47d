// Training on your own folder of images, as configs/folder_example.yaml does: no data.classes
// (the sorted folder names), out_features: auto, images of other sizes center-cropped; then
// ./infer on the run folder: the table, the closing line, accuracy and confusion matrix from the
// folder names, skipped files counted. CPU, a few seconds.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "app/config/config.h"
#include "app/train/trainer.h"
#include "layers/checkpoint/checkpoint.h"
#include "runtime/error.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>

namespace {

namespace fs = std::filesystem;

// Three classes a model tells apart at once: bright top half, bright left half, dark all over.
// Sizes vary (and are not square) so that every image is cropped to the model's 16x16.
void write_class_image(const fs::path& file, int cls, int w, int h, unsigned seed) {
  std::vector<uint8_t> rgb(size_t(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const bool bright = cls == 0 ? y < h / 2 : cls == 1 ? x < w / 2 : false;
      seed = seed * 1103515245u + 12345u;
      const int v = (bright ? 200 : 40) + int(seed >> 27);
      for (int k = 0; k < 3; ++k) rgb[(size_t(y) * w + x) * 3 + k] = uint8_t(v);
    }
  fs::create_directories(file.parent_path());
  ASSERT_TRUE(stbi_write_png(file.c_str(), w, h, 3, rgb.data(), w * 3));
}

std::string read_text(const fs::path& p) {
  std::stringstream s;
  s << std::ifstream(p).rdbuf();
  return s.str();
}

struct ChildResult {
  int rc = -1;
  std::string out, err;
};

ChildResult run(const std::string& cmd, const fs::path& dir) {
  const std::string o = (dir / "stdout").string(), e = (dir / "stderr").string();
  const int st = std::system((cmd + " >" + o + " 2>" + e).c_str());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, read_text(o), read_text(e)};
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class OwnImages : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "cnn_own_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    const char* names[] = {"left", "top", "dark"};  // not in sorted order on purpose
    const int cls_of[] = {1, 0, 2};
    for (int c = 0; c < 3; ++c) {
      for (int i = 0; i < 40; ++i)
        write_class_image(dir_ / "train" / names[c] / ("img" + std::to_string(i) + ".png"),
                          cls_of[c], 16 + i % 5 * 2, 18 + i % 3 * 3, unsigned(c * 100 + i));
      for (int i = 0; i < 6; ++i)
        write_class_image(dir_ / "test" / names[c] / ("t" + std::to_string(i) + ".png"), cls_of[c],
                          20, 16 + i, unsigned(c * 1000 + i));
    }
    std::ofstream(dir_ / "test" / "top" / "notes.txt") << "not an image\n";
    std::ofstream(dir_ / "own.yaml") << "name: own\n"
                                        "model:\n"
                                        "  input: {channels: 3, height: 16, width: 16}\n"
                                        "  layers:\n"
                                        "    - conv2d: {out_channels: 4, kernel: 3, padding: 1}\n"
                                        "    - relu\n"
                                        "    - maxpool2d: {kernel: 4}\n"
                                        "    - flatten\n"
                                        "    - linear: {out_features: auto}\n"
                                        "    - softmax_cross_entropy\n"
                                        "data:\n"
                                        "  format: folder\n"
                                        "  train: "
                                     << (dir_ / "train").string()
                                     << "\n"
                                        "  test: "
                                     << (dir_ / "test").string()
                                     << "\n"
                                        "  resize: crop\n"
                                        "  normalize: auto\n"
                                        "optimizer: {type: adam, lr: 0.01}\n"
                                        "training: {epochs: 3, batch_size: 16, device: cpu}\n"
                                        "logging: {dir: "
                                     << (dir_ / "logs").string() << ", every_steps: 4}\n";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

TEST_F(OwnImages, FolderDatasetWithoutClassesTrainsAndInferReportsAccuracy) {
  const cnn::TrainConfig cfg = cnn::load_config((dir_ / "own.yaml").string());
  EXPECT_EQ(cfg.model.layers[4].out_features, 3);
  ASSERT_EQ(cfg.notes.size(), 1u);
  EXPECT_TRUE(has(cfg.notes[0], "model.layers[4].linear.out_features: auto = 3")) << cfg.notes[0];
  EXPECT_TRUE(has(cfg.resolved_yaml, "resize: crop")) << cfg.resolved_yaml;
  ASSERT_EQ(cnn::run_training(cfg, cnn::TrainArgs{}), 0);

  const fs::path run_dir = dir_ / "logs" / "own";
  const std::string log = read_text(run_dir / "train.log");
  EXPECT_TRUE(has(log, "config: model.layers[4].linear.out_features: auto = 3")) << log;
  EXPECT_TRUE(has(log, "best: epoch")) << log;
  EXPECT_TRUE(has(log, "./infer --checkpoint " + run_dir.string() + " images/")) << log;
  const cnn::CheckpointMeta meta =
      cnn::read_checkpoint_meta((run_dir / "best.safetensors").string());
  EXPECT_EQ(meta.class_names, (std::vector<std::string>{"dark", "left", "top"}));

  // The run folder stands for its best checkpoint; the test images sit in class folders.
  const std::string infer = std::string(CNN_INFER_BINARY) + " --device cpu --checkpoint " +
                            run_dir.string() + " --topk 2 " + (dir_ / "test").string();
  const ChildResult r = run(infer, dir_);
  EXPECT_EQ(r.rc, 0) << r.err;
  std::istringstream lines(r.out);
  std::string header;
  std::getline(lines, header);
  for (const char* col : {"image", "true", "class", "prob", "top2", "p2"})
    EXPECT_TRUE(has(header, col)) << header;
  EXPECT_TRUE(has(r.out, "18 images in ")) << r.out;
  EXPECT_TRUE(has(r.out, "images/s")) << r.out;
  EXPECT_TRUE(has(r.out, "skipped 1 file without an image extension")) << r.out;
  EXPECT_TRUE(has(r.out, "notes.txt")) << r.out;
  EXPECT_TRUE(has(r.out, "accuracy ")) << r.out;
  EXPECT_TRUE(has(r.out, "of 18; true classes from the folder names")) << r.out;
  EXPECT_TRUE(has(r.out, "confusion matrix")) << r.out;

  // Images outside class folders: no ground truth, unless asked for, which then fails clearly.
  const ChildResult plain =
      run(std::string(CNN_INFER_BINARY) + " --device cpu --checkpoint " + run_dir.string() + " " +
              (dir_ / "test" / "top" / "t0.png").string() + " " + (dir_ / "own.yaml").string(),
          dir_);
  EXPECT_FALSE(has(plain.out, "accuracy")) << plain.out;
  EXPECT_TRUE(has(plain.err, "own.yaml")) << plain.err;  // tried (named explicitly), failed
  const ChildResult forced =
      run(std::string(CNN_INFER_BINARY) + " --device cpu --labels-from-folders --checkpoint " +
              run_dir.string() + " " + (dir_ / "train").string() + " " +
              (dir_ / "test" / "top" / "t0.png").string() + " " + (dir_ / "own.yaml").string(),
          dir_);
  EXPECT_EQ(forced.rc, 1);
  EXPECT_TRUE(has(forced.err, "infer: error: --labels-from-folders: ")) << forced.err;
}

TEST_F(OwnImages, AutoNeedsAClassCount) {
  std::string e;
  try {
    cnn::load_config((dir_ / "own.yaml").string(), {"data.train=" + (dir_ / "nowhere").string()});
  } catch (const cnn::Error& err) {
    e = err.what();
  }
  EXPECT_TRUE(has(e, "model.layers[4].linear.out_features: auto needs the number of classes")) << e;
  try {
    cnn::load_config((dir_ / "own.yaml").string(), {"data.resize=sideways"});
  } catch (const cnn::Error& err) {
    e = err.what();
  }
  EXPECT_TRUE(has(e, "data.resize=sideways: expected false, stretch or crop (true means stretch)"))
      << e;
}

}  // namespace
