// End to end on the CPU with configs/tiny.yaml (synthetic data, no download): the loss falls,
// checkpoints are written and refused when they do not fit, a resumed run equals an
// uninterrupted one bitwise (weights, metrics rows, time), runs never clobber each other (a new
// folder per run, resume in the checkpoint's own folder, locked folders refused), and a resume
// says what it changes or refuses, and the gradient-overwrite switch keeps the bits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "app/config/config.h"
#include "app/train/resume_plan.h"
#include "app/train/run_folder.h"
#include "app/train/trainer.h"
#include "layers/checkpoint/checkpoint.h"
#include "layers/checkpoint/safetensors.h"
#include "runtime/error.h"
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
  EXPECT_EQ(test::checkpoint_weights(a / full.name / "last.safetensors"),
            test::checkpoint_weights(b / rest.name / "last.safetensors"));
  // metrics.csv: no duplicated steps after the resume, and time_s continues from the
  // checkpoint's elapsed time instead of starting again at 0.
  auto rows = read_csv(b / rest.name / "metrics.csv");
  std::set<std::string> seen;
  for (size_t i = 1; i < rows.size(); ++i) {
    if (rows[i][3] == "train") {
      EXPECT_TRUE(seen.insert(rows[i][2]).second) << "step " << rows[i][2];
    }
  }
  double last_time = 0;
  for (size_t i = 1; i < rows.size(); ++i) {
    EXPECT_GE(std::stod(rows[i][0]), last_time) << "time_s goes back at row " << i;
    last_time = std::stod(rows[i][0]);
  }
}

// The trainer's step writes the linear layer's weight gradient instead of adding to it (and its
// update leaves it unzeroed) unless CNN_GRAD_OVERWRITE=0: both give the same weights, bitwise.
TEST(TrainE2E, GradOverwriteSwitchKeepsTheBits) {
  fs::path a = fresh_dir("overwrite_on"), b = fresh_dir("overwrite_off");
  TrainConfig on = tiny(a, {"training.max_steps=40", "optimizer.type=adamw", "optimizer.lr=0.002"});
  ASSERT_EQ(run_training(on, TrainArgs{}), 0);
  TrainConfig off =
      tiny(b, {"training.max_steps=40", "optimizer.type=adamw", "optimizer.lr=0.002"});
  int rc = 0;
  {
    test::ScopedEnv env("CNN_GRAD_OVERWRITE", "0");
    rc = run_training(off, TrainArgs{});
  }
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(test::checkpoint_weights(a / on.name / "last.safetensors"),
            test::checkpoint_weights(b / off.name / "last.safetensors"));
  const std::string log_on = test::slurp(a / on.name / "train.log");
  const std::string log_off = test::slurp(b / off.name / "train.log");
  EXPECT_TRUE(test::contains(log_on, "gradients written by backward")) << log_on;
  EXPECT_FALSE(test::contains(log_off, "gradients written by backward")) << log_off;
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(TrainE2E, MismatchedOrCorruptCheckpointIsRefusedAndNothingOverwritten) {
  fs::path dir = fresh_dir("refuse");
  TrainConfig cfg = tiny(dir, {"training.max_steps=3"});
  ASSERT_EQ(run_training(cfg, TrainArgs{}), 0);
  fs::path ckpt = dir / cfg.name / "last.safetensors";
  const auto before = test::checkpoint_weights(ckpt);
  TrainConfig other = tiny(dir, {"model.layers[0].conv2d.out_channels=5"});
  TrainArgs args;
  args.resume = ckpt.string();
  try {
    run_training(other, args);
    FAIL() << "a checkpoint of another shape was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shape"), std::string::npos) << e.what();
  }
  EXPECT_EQ(test::checkpoint_weights(ckpt), before);

  fs::path truncated = dir / "truncated.safetensors";
  fs::copy_file(ckpt, truncated);
  fs::resize_file(truncated, fs::file_size(truncated) / 2);
  args.resume = truncated.string();
  EXPECT_THROW(run_training(cfg, args), Error);
  EXPECT_EQ(test::checkpoint_weights(ckpt), before);
}

namespace {

TrainArgs resume_args(const fs::path& ckpt_or_dir) {
  TrainArgs a;
  a.resume = ckpt_or_dir.string();
  return a;
}

}  // namespace

// A second run of the same config goes to <name>-2 and leaves the first run's files as they were;
// <name>-latest follows the newest; --overwrite takes <name> itself.
TEST(TrainE2E, SecondRunGetsItsOwnFolder) {
  fs::path dir = fresh_dir("second");
  TrainConfig first = tiny(dir, {"training.max_steps=8"});
  ASSERT_EQ(run_training(first, TrainArgs{}), 0);
  const fs::path run1 = dir / "tiny";
  const std::string ckpt = test::slurp(run1 / "last.safetensors");
  const std::string best = test::slurp(run1 / "best.safetensors");
  const std::string metrics = test::slurp(run1 / "metrics.csv");
  const std::string log = test::slurp(run1 / "train.log");
  ASSERT_FALSE(ckpt.empty());

  TrainConfig second = tiny(dir, {"training.max_steps=12", "training.seed=2"});
  ASSERT_EQ(run_training(second, TrainArgs{}), 0);
  EXPECT_TRUE(test::slurp(run1 / "last.safetensors") == ckpt) << "the first checkpoint changed";
  EXPECT_TRUE(test::slurp(run1 / "best.safetensors") == best);
  EXPECT_EQ(test::slurp(run1 / "metrics.csv"), metrics);
  EXPECT_EQ(test::slurp(run1 / "train.log"), log);
  ASSERT_TRUE(fs::exists(dir / "tiny-2" / "last.safetensors"));
  EXPECT_EQ(
      read_checkpoint_meta((dir / "tiny-2" / "last.safetensors").string()).position.global_step,
      12);
  EXPECT_TRUE(fs::is_symlink(dir / "tiny-latest"));
  EXPECT_EQ(fs::read_symlink(dir / "tiny-latest"), fs::path("tiny-2"));
  EXPECT_TRUE(test::contains(test::slurp(dir / "tiny-2" / "train.log"), "holds an earlier run"));

  // A third run while tiny-3 is locked by someone else (a run that has just claimed it): tiny-4.
  {
    const auto held = FolderLock::lock((dir / "tiny-3").string());
    ASSERT_EQ(run_training(tiny(dir, {"training.max_steps=4"}), TrainArgs{}), 0);
  }
  EXPECT_TRUE(fs::exists(dir / "tiny-4" / "last.safetensors"));
  EXPECT_EQ(fs::read_symlink(dir / "tiny-latest"), fs::path("tiny-4"));

  TrainArgs over;
  over.overwrite = true;
  ASSERT_EQ(run_training(tiny(dir, {"training.max_steps=4", "checkpoint.keep_best=false"}), over),
            0);
  EXPECT_FALSE(fs::exists(run1 / "best.safetensors")) << "--overwrite kept the old run's file";
  EXPECT_EQ(read_checkpoint_meta((run1 / "last.safetensors").string()).position.global_step, 4);
  EXPECT_EQ(fs::read_symlink(dir / "tiny-latest"), fs::path("tiny"));

  // --log-dir on a folder holding a run is refused, naming it and the ways out.
  TrainArgs explicit_dir;
  explicit_dir.log_dir = (dir / "tiny-2").string();
  try {
    run_training(tiny(dir, {"training.max_steps=4"}), explicit_dir);
    FAIL() << "--log-dir on a finished run was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "already holds a run")) << e.what();
    EXPECT_TRUE(test::contains(e.what(), "--overwrite")) << e.what();
  }
  fs::remove_all(dir);
}

// --resume from a run folder continues there, whatever the config's logging.dir says; --resume
// RUN_DIR takes its last.safetensors; a symlink (<name>-latest) is followed to the real folder.
TEST(TrainE2E, ResumeWritesOnlyInTheCheckpointsFolder) {
  fs::path a = fresh_dir("resume_here"), b = fresh_dir("resume_not_here");
  fs::remove_all(b);
  ASSERT_EQ(run_training(tiny(a, {"training.max_steps=16"}), TrainArgs{}), 0);
  TrainConfig other = tiny(b, {"training.max_steps=24"});
  ASSERT_EQ(run_training(other, resume_args(a / "tiny-latest")), 0);
  EXPECT_FALSE(fs::exists(b)) << "the resume wrote into the config's folder";
  EXPECT_EQ(read_checkpoint_meta((a / "tiny" / "last.safetensors").string()).position.global_step,
            24);
  EXPECT_TRUE(test::contains(test::slurp(a / "tiny" / "train.log"),
                             "resuming from " + (a / "tiny").string()));
  EXPECT_FALSE(fs::exists(a / "tiny-2"));
  fs::remove_all(a);
}

// A run folder locked by a live run refuses a second run and a resume, naming the holder's pid.
TEST(TrainE2E, LockedRunFolderIsRefused) {
  fs::path dir = fresh_dir("locked");
  ASSERT_EQ(run_training(tiny(dir, {"training.max_steps=4"}), TrainArgs{}), 0);
  const auto held = FolderLock::lock((dir / "tiny").string());
  const std::string pid = "pid " + std::to_string(::getpid());
  for (int resume = 0; resume < 2; ++resume) {
    TrainArgs args;
    if (resume) {
      args.resume = (dir / "tiny").string();
    } else {
      args.log_dir = (dir / "tiny").string();
      args.overwrite = true;
    }
    try {
      run_training(tiny(dir, {"training.max_steps=8"}), args);
      FAIL() << "a run on a locked folder was accepted";
    } catch (const Error& e) {
      EXPECT_TRUE(test::contains(e.what(), "in use by another ./train (" + pid + ")")) << e.what();
    }
  }
  EXPECT_EQ(read_checkpoint_meta((dir / "tiny" / "last.safetensors").string()).position.global_step,
            4);
  fs::remove_all(dir);
}

// Resuming a finished run writes nothing and says how to train longer.
TEST(TrainE2E, ResumingAFinishedRunHasNothingToDo) {
  fs::path dir = fresh_dir("finished");
  ASSERT_EQ(run_training(tiny(dir, {"training.epochs=1"}), TrainArgs{}), 0);
  const fs::path run = dir / "tiny";
  const std::string log = test::slurp(run / "train.log"),
                    metrics = test::slurp(run / "metrics.csv");
  const std::string ckpt = test::slurp(run / "last.safetensors");
  testing::internal::CaptureStdout();
  const int rc = run_training(tiny(dir, {"training.epochs=1"}), resume_args(run));
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0);
  EXPECT_TRUE(test::contains(out, "is finished: 1 of 1 epochs trained (step 32)")) << out;
  EXPECT_TRUE(test::contains(out, "nothing to do")) << out;
  EXPECT_TRUE(test::contains(out, "--resume " + run.string() + " --set training.epochs=2")) << out;
  EXPECT_EQ(test::slurp(run / "train.log"), log);
  EXPECT_EQ(test::slurp(run / "metrics.csv"), metrics);
  EXPECT_TRUE(test::slurp(run / "last.safetensors") == ckpt);

  testing::internal::CaptureStdout();
  run_training(tiny(dir, {"training.epochs=3", "training.max_steps=32"}), resume_args(run));
  const std::string steps = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(test::contains(steps, "training.max_steps=32")) << steps;
  EXPECT_TRUE(test::contains(steps, "nothing to do")) << steps;
  fs::remove_all(dir);
}

// What a resume changes is said in train.log; where the result would be wrong it is refused and
// nothing is written.
TEST(TrainE2E, ResumeSaysWhatChangesAndRefusesWhatWouldBeWrong) {
  fs::path dir = fresh_dir("changes");
  ASSERT_EQ(run_training(tiny(dir, {"training.max_steps=16", "schedule.type=cosine"}), TrainArgs{}),
            0);
  const fs::path run = dir / "tiny";
  const std::string ckpt = test::slurp(run / "last.safetensors");
  const std::string metrics = test::slurp(run / "metrics.csv");
  auto refused = [&](std::vector<std::string> sets, const std::vector<std::string>& parts) {
    sets.push_back("schedule.type=cosine");
    try {
      run_training(tiny(dir, sets), resume_args(run));
      ADD_FAILURE() << "accepted: " << sets[0];
    } catch (const Error& e) {
      for (const auto& p : parts) EXPECT_TRUE(test::contains(e.what(), p)) << e.what();
    }
    EXPECT_TRUE(test::slurp(run / "last.safetensors") == ckpt);
    EXPECT_EQ(test::slurp(run / "metrics.csv"), metrics);
  };
  // SGD momentum is no Adam moment.
  refused({"optimizer.type=adam"}, {"optimizer.type sgd -> adam", "--init-weights"});
  // Step 16 is inside the first epoch (32 batches of 32): its other images are not in batches
  // of 64.
  refused({"training.batch_size=64"}, {"training.batch_size 32 -> 64 inside epoch 1", "batch 16"});

  // Finish the epoch, then a longer cosine and a larger batch: allowed, and said.
  ASSERT_EQ(
      run_training(tiny(dir, {"training.max_steps=32", "schedule.type=cosine"}), resume_args(run)),
      0);
  ASSERT_EQ(run_training(
                tiny(dir, {"training.epochs=6", "training.batch_size=64", "schedule.type=cosine"}),
                resume_args(run)),
            0);
  const std::string log = test::slurp(run / "train.log");
  EXPECT_TRUE(test::contains(log, "resume: training.epochs: 3 -> 6")) << log;
  EXPECT_TRUE(test::contains(log, "resume: training.batch_size: 32 -> 64")) << log;
  EXPECT_TRUE(test::contains(log, "16 steps per epoch from epoch 2 on")) << log;
  EXPECT_TRUE(test::contains(log, "learning rate at the resume point (epoch 1.00)")) << log;
  const CheckpointMeta m = read_checkpoint_meta((run / "last.safetensors").string());
  EXPECT_EQ(m.position.epoch, 6);
  EXPECT_EQ(m.position.global_step, 32 + 5 * 16);
  fs::remove_all(dir);
}

// Without --config, main() resumes with the checkpoint's own config (--set still applies).
TEST(TrainE2E, ConfigFromCheckpoint) {
  fs::path dir = fresh_dir("own_config");
  TrainConfig cfg = tiny(dir, {"training.max_steps=4", "optimizer.lr=0.02"});
  ASSERT_EQ(run_training(cfg, TrainArgs{}), 0);
  const std::string ckpt = resolve_resume_path((dir / "tiny").string());
  EXPECT_EQ(ckpt, (dir / "tiny" / "last.safetensors").string());
  TrainConfig back = config_from_checkpoint(ckpt, {"training.max_steps=8"});
  EXPECT_EQ(back.optimizer.lr, 0.02);
  EXPECT_EQ(back.training.max_steps, 8);
  EXPECT_EQ(back.training.device, "cpu");
  EXPECT_THROW(resolve_resume_path((dir / "nothing").string()), Error);
  fs::remove_all(dir);
}

// A network input the data loaders cannot give (5 channels) is refused with the key before a run
// folder is made, not after it by the loader.
TEST(TrainE2E, InputChannelsTheLoadersCannotGiveLeaveNoRunFolder) {
  fs::path dir = fresh_dir("channels5");
  TrainConfig cfg = tiny(dir, {"model.input.channels=5"});
  try {
    run_training(cfg, TrainArgs{});
    ADD_FAILURE() << "a 5-channel input was trained";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "model.input.channels")) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / cfg.name));
  fs::remove_all(dir);
}
