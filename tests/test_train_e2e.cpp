// End to end on the CPU with configs/tiny.yaml (synthetic data, no download): the loss falls,
// checkpoints are written and refused when they do not fit, a resumed run equals an
// uninterrupted one bitwise, and ./infer's code path agrees with the in-training evaluation.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "app/config/config.h"
#include "app/train/trainer.h"
#include "runtime/error.h"
#include "layers/checkpoint/checkpoint.h"
#include "layers/checkpoint/safetensors.h"
#include "tests/test_util.h"

using namespace cnn;
namespace fs = std::filesystem;

namespace {

std::string tiny_path() {
  return std::string(CNN_SOURCE_DIR) + "/configs/tiny.yaml";
}

fs::path fresh_dir(const std::string& name) {
  return test::fresh_dir("e2e", name);
}

TrainConfig tiny(const fs::path& dir, std::vector<std::string> extra = {}) {
  extra.push_back("training.device=cpu");
  extra.push_back("logging.progress=off");
  extra.push_back("logging.dir=" + dir.string());
  return load_config(tiny_path(), extra);
}

std::vector<std::vector<std::string>> read_csv(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string x;
    while (std::getline(ss, x, ',')) f.push_back(x);
    rows.push_back(f);
  }
  return rows;
}

std::vector<float> weights_of(const fs::path& ckpt) {
  SafetensorsFile f = read_safetensors(ckpt.string());
  std::vector<float> all;
  for (const auto& e : f.entries()) {
    auto t = f.tensor_f32(e.name).data;
    all.insert(all.end(), t.begin(), t.end());
  }
  return all;
}

}  // namespace

TEST(TrainE2E, TinyLossFallsAndCheckpointsAreWritten) {
  fs::path dir = fresh_dir("basic");
  TrainConfig cfg = tiny(dir);
  ASSERT_EQ(run_training(cfg, TrainArgs{}), 0);
  fs::path run = dir / cfg.name;
  ASSERT_TRUE(fs::exists(run / "last.safetensors"));
  ASSERT_TRUE(fs::exists(run / "best.safetensors"));
  ASSERT_TRUE(fs::exists(run / "config.yaml"));
  ASSERT_TRUE(fs::exists(run / "confusion.csv"));
  auto rows = read_csv(run / "metrics.csv");
  ASSERT_GE(rows.size(), 3u);
  double first_loss = -1, last_loss = -1, last_eval_acc = -1;
  for (size_t i = 1; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].size(), 8u) << "torn metrics row " << i;
    if (rows[i][3] == "train") {
      if (first_loss < 0) first_loss = std::stod(rows[i][4]);
      last_loss = std::stod(rows[i][4]);
    } else {
      last_eval_acc = std::stod(rows[i][5]);
    }
  }
  EXPECT_LT(last_loss, 0.5 * first_loss) << "the training loss did not fall clearly";
  EXPECT_GT(last_eval_acc, 0.85);
  CheckpointMeta m = read_checkpoint_meta((run / "best.safetensors").string());
  EXPECT_EQ(m.class_names.size(), 4u);
  EXPECT_NEAR(m.position.best_accuracy, last_eval_acc, 0.2);
}

TEST(TrainE2E, ResumeEqualsUninterruptedBitwise) {
  fs::path a = fresh_dir("full"), b = fresh_dir("split");
  TrainConfig full = tiny(a, {"training.max_steps=37"});
  ASSERT_EQ(run_training(full, TrainArgs{}), 0);
  TrainConfig part = tiny(b, {"training.max_steps=16"});
  ASSERT_EQ(run_training(part, TrainArgs{}), 0);
  TrainConfig rest = tiny(b, {"training.max_steps=37"});
  TrainArgs args;
  args.resume = (b / rest.name / "last.safetensors").string();
  ASSERT_EQ(run_training(rest, args), 0);
  EXPECT_EQ(weights_of(a / full.name / "last.safetensors"),
            weights_of(b / rest.name / "last.safetensors"));
  // metrics.csv: no duplicated steps after the resume.
  auto rows = read_csv(b / rest.name / "metrics.csv");
  std::set<std::string> seen;
  for (size_t i = 1; i < rows.size(); ++i) {
    if (rows[i][3] == "train") {
      EXPECT_TRUE(seen.insert(rows[i][2]).second) << "step " << rows[i][2];
    }
  }
}

TEST(TrainE2E, MismatchedOrCorruptCheckpointIsRefusedAndNothingOverwritten) {
  fs::path dir = fresh_dir("refuse");
  TrainConfig cfg = tiny(dir, {"training.max_steps=3"});
  ASSERT_EQ(run_training(cfg, TrainArgs{}), 0);
  fs::path ckpt = dir / cfg.name / "last.safetensors";
  const auto before = weights_of(ckpt);
  TrainConfig other = tiny(dir, {"model.layers[0].conv2d.out_channels=5"});
  TrainArgs args;
  args.resume = ckpt.string();
  try {
    run_training(other, args);
    FAIL() << "a checkpoint of another shape was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shape"), std::string::npos) << e.what();
  }
  EXPECT_EQ(weights_of(ckpt), before);

  fs::path truncated = dir / "truncated.safetensors";
  fs::copy_file(ckpt, truncated);
  fs::resize_file(truncated, fs::file_size(truncated) / 2);
  args.resume = truncated.string();
  EXPECT_THROW(run_training(cfg, args), Error);
  EXPECT_EQ(weights_of(ckpt), before);
}
