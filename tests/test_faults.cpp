// Faults and reproducibility of the real ./train binary (CNN_TRAIN_BINARY), run as a child
// process on configs/tiny.yaml on the CPU:
// - SIGKILL at random moments, then --resume until the run finishes: the final checkpoints are
//   byte-identical to an uninterrupted run's, metrics.csv is whole (no torn, repeated or
//   out-of-order rows) and no temporary file is left behind;
// - a full disk (RLIMIT_FSIZE) and unwritable folders: a non-zero exit, one error line naming the
//   file and the reason, the previous checkpoint unchanged and still resumable;
// - a diverging run (a huge learning rate): it stops naming the step and the tensor, and never
//   writes a checkpoint with non-finite weights;
// - an impossible host allocation: one error line with the size and the hint;
// - two runs of the same config and seed: byte-identical checkpoints;
// - SIGINT/SIGTERM: a checkpoint, exit 130/143 and the printed command that continues the run;
// - a second run or resume on the folder of a live run: refused, naming the live run's pid.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "layers/checkpoint/safetensors.h"
#include "runtime/atomic_file.h"
#include "runtime/error.h"
#include "runtime/memory.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;

namespace {

using cnn::test::contains;
using cnn::test::slurp;

const char* const kTrain = CNN_TRAIN_BINARY;
constexpr const char* kMetricsHeader = "time_s,epoch,step,phase,loss,accuracy,lr,images_per_s";

using Clock = std::chrono::steady_clock;

std::string tiny_config() {
  return std::string(CNN_SOURCE_DIR) + "/configs/tiny.yaml";
}

fs::path fresh_dir(const std::string& name) {
  return cnn::test::fresh_dir("faults", name);
}

struct RunOptions {
  double kill_after_s = -1;      // SIGKILL the child after this long (< 0: never)
  rlim_t fsize_limit = 0;        // RLIMIT_FSIZE in the child (0: none); SIGXFSZ is ignored
  double timeout_s = 120;        // a hung child is killed and the test fails
  std::vector<std::string> env;  // extra NAME=VALUE
  // Once when() holds while the child runs: on_wait() (e.g. a second run), then `signal`.
  std::function<bool()> when;
  std::function<void()> on_wait;
  int signal = 0;
};

struct RunResult {
  int exit_code = -1;   // when it exited
  bool killed = false;  // ended by our SIGKILL
  double seconds = 0;
  std::string out, err;
};

// Runs ./train with `args`; stdout and stderr go to files in `io_dir` and are returned.
RunResult run_train(const fs::path& io_dir, const std::vector<std::string>& args,
                    const RunOptions& o = {}) {
  std::vector<std::string> all = {kTrain};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const std::string out_path = (io_dir / "stdout.txt").string();
  const std::string err_path = (io_dir / "stderr.txt").string();
  // The environment, with o.env replacing variables of the same name; built before the fork.
  std::vector<std::string> env_strings = o.env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    bool replaced = false;
    for (const auto& x : o.env)
      replaced |= var.compare(0, x.find('=') + 1, x, 0, x.find('=') + 1) == 0;
    if (!replaced) env_strings.push_back(var);
  }
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  const auto start = Clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {  // child: only async-signal-safe calls until exec
    const int fo = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int fe = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fo < 0 || fe < 0) ::_exit(126);
    ::dup2(fo, 1);
    ::dup2(fe, 2);
    if (o.fsize_limit > 0) {
      ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit then fails with EFBIG
      const struct rlimit lim = {o.fsize_limit, o.fsize_limit};
      if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(125);
    }
    ::execve(kTrain, argv.data(), envp.data());
    ::_exit(127);
  }
  RunResult r;
  if (pid < 0) {
    ADD_FAILURE() << "fork failed";
    return r;
  }
  int status = 0;
  bool reached = false;
  for (;;) {
    const pid_t got = ::waitpid(pid, &status, WNOHANG);
    if (got == pid) break;
    if (o.when && !reached && o.when()) {
      reached = true;
      if (o.on_wait) o.on_wait();
      if (o.signal) ::kill(pid, o.signal);
    }
    const double t = std::chrono::duration<double>(Clock::now() - start).count();
    const bool kill_now = o.kill_after_s >= 0 && t >= o.kill_after_s;
    if (kill_now || t >= o.timeout_s) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      if (!kill_now) ADD_FAILURE() << "train did not finish within " << o.timeout_s << " s";
      break;
    }
    const struct timespec nap = {0, 500 * 1000};  // 0.5 ms: kills land within a step
    ::nanosleep(&nap, nullptr);
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  r.killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  return r;
}

// The tiny run, on the CPU, with checkpoints every few steps so that kills land in steps,
// checkpoint writes and evaluations alike.
std::vector<std::string> tiny_args(const fs::path& run_dir, std::vector<std::string> sets = {}) {
  std::vector<std::string> a = {"--config", tiny_config(), "--device",
                                "cpu",      "--log-dir",   run_dir.string()};
  sets.insert(sets.begin(),
              {"logging.progress=off", "logging.every_steps=5", "checkpoint.every_steps=3"});
  for (const auto& s : sets) {
    a.push_back("--set");
    a.push_back(s);
  }
  return a;
}

std::vector<std::string> with_resume(std::vector<std::string> a, const fs::path& ckpt) {
  a.push_back("--resume");
  a.push_back(ckpt.string());
  return a;
}

std::string describe(const RunResult& r) {
  return "exit " + std::to_string(r.exit_code) + (r.killed ? " (killed)" : "") +
         "\nstderr: " + r.err +
         "\nstdout tail: " + r.out.substr(r.out.size() > 2000 ? r.out.size() - 2000 : 0);
}

// Names of files in `dir` that look like temporary files of an atomic write.
std::vector<std::string> temp_files(const fs::path& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.find(".tmp") != std::string::npos) found.push_back(n);
  }
  return found;
}

// The error line train printed: exactly one line on stderr, "train: error: ...".
std::string error_line(const RunResult& r) {
  std::string e = r.err;
  while (!e.empty() && e.back() == '\n') e.pop_back();
  EXPECT_EQ(e.find('\n'), std::string::npos) << "more than one line on stderr:\n" << r.err;
  EXPECT_EQ(e.rfind("train: error: ", 0), 0u) << r.err;
  return e;
}

bool all_weights_finite(const fs::path& ckpt) {
  cnn::SafetensorsFile f = cnn::read_safetensors(ckpt.string());
  for (const auto& e : f.entries())
    for (float v : f.tensor_f32(e.name).data)
      if (!std::isfinite(v)) return false;
  return true;
}

// metrics.csv is whole: the header, then rows of 8 fields that parse, train rows strictly
// increasing in step, no (step, phase) twice, steps and time_s never going back. Returns the eval
// steps; *train_rows (if given) gets each train row's "epoch,step,phase,loss,accuracy,lr".
std::vector<int64_t> check_metrics(const fs::path& csv,
                                   std::vector<std::string>* train_rows = nullptr) {
  std::ifstream in(csv);
  std::string line;
  std::vector<int64_t> eval_steps;
  EXPECT_TRUE(std::getline(in, line)) << csv << " is empty";
  EXPECT_EQ(line, kMetricsHeader);
  const std::string all = slurp(csv);
  EXPECT_TRUE(!all.empty() && all.back() == '\n') << "the last row has no newline (torn)";
  std::set<std::pair<int64_t, std::string>> seen;
  int64_t last_step = 0, last_train = 0;
  double last_time = 0;
  int row = 1;
  while (std::getline(in, line)) {
    ++row;
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string x;
    while (std::getline(ss, x, ',')) f.push_back(x);
    if (f.size() != 8) {
      ADD_FAILURE() << "row " << row << " has " << f.size() << " fields: '" << line << "'";
      continue;
    }
    for (int i : {0, 4, 5, 6, 7}) {
      size_t used = 0;
      try {
        (void)std::stod(f[size_t(i)], &used);
      } catch (const std::exception&) {
      }
      EXPECT_EQ(used, f[size_t(i)].size()) << "row " << row << " field " << i << ": " << line;
    }
    const int64_t step = std::stoll(f[2]);
    const double time_s = std::stod(f[0]);
    EXPECT_GE(time_s, last_time) << "row " << row << ": time_s goes back: " << line;
    last_time = time_s;
    EXPECT_TRUE(f[3] == "train" || f[3] == "eval") << line;
    EXPECT_TRUE(seen.insert({step, f[3]}).second) << "row " << row << " repeats: " << line;
    EXPECT_GE(step, last_step) << "row " << row << " goes back: " << line;
    last_step = step;
    if (f[3] == "train") {
      EXPECT_GT(step, last_train) << "row " << row << ": " << line;
      last_train = step;
      if (train_rows)
        train_rows->push_back(f[1] + "," + f[2] + "," + f[3] + "," + f[4] + "," + f[5] + "," +
                              f[6]);
    } else {
      eval_steps.push_back(step);
    }
  }
  return eval_steps;
}

}  // namespace

// Two runs of the same config and seed, in different folders and with different CPU thread
// counts: byte-identical checkpoints (the metadata holds no time, path or host; the CPU kernels
// split work into fixed slices whatever the thread count), the same confusion matrix.
TEST(Faults, RepeatedRunsAreBitwiseIdentical) {
  fs::path a = fresh_dir("repeat_a"), b = fresh_dir("repeat_b");
  RunOptions one, three;
  one.env = {"CNN_CPU_THREADS=1"};
  three.env = {"CNN_CPU_THREADS=3"};
  RunResult ra = run_train(a, tiny_args(a / "run"), one);
  ASSERT_EQ(ra.exit_code, 0) << describe(ra);
  RunResult rb = run_train(b, tiny_args(b / "run"), three);
  ASSERT_EQ(rb.exit_code, 0) << describe(rb);
  for (const char* f : {"last.safetensors", "best.safetensors", "confusion.csv"})
    EXPECT_TRUE(slurp(a / "run" / f) == slurp(b / "run" / f)) << f << " differs";
  EXPECT_FALSE(slurp(a / "run" / "last.safetensors").empty());
  fs::remove_all(a);
  fs::remove_all(b);
}

// SIGKILL after random delays, then --resume (or a fresh start while there is no checkpoint yet)
// until the run finishes; several seeds. Replay one with CNN_TEST_SEED.
TEST(Faults, KilledAndResumedRunEqualsUninterruptedBitwise) {
  fs::path ref = fresh_dir("kill_ref");
  RunResult full = run_train(ref, tiny_args(ref / "run"));
  ASSERT_EQ(full.exit_code, 0) << describe(full);
  const std::string ref_last = slurp(ref / "run" / "last.safetensors");
  const std::string ref_best = slurp(ref / "run" / "best.safetensors");
  const std::string ref_confusion = slurp(ref / "run" / "confusion.csv");
  std::vector<std::string> ref_train;
  const std::vector<int64_t> ref_evals = check_metrics(ref / "run" / "metrics.csv", &ref_train);
  ASSERT_EQ(ref_evals.size(), 3u);  // one per epoch

  uint64_t first_seed = uint64_t(Clock::now().time_since_epoch().count());
  if (const char* s = std::getenv("CNN_TEST_SEED")) first_seed = std::stoull(s);
  constexpr int kSeeds = 5, kMaxAttempts = 40;
  int kills = 0, resumes = 0, fresh_restarts = 0, temp_left = 0;
  for (int k = 0; k < kSeeds; ++k) {
    const uint64_t seed = first_seed + uint64_t(k);
    SCOPED_TRACE("seed " + std::to_string(seed) + " (CNN_TEST_SEED=" + std::to_string(first_seed) +
                 " replays all)");
    std::mt19937_64 rng(seed);
    // Kills from before the first checkpoint to past the end of a resumed run: each attempt
    // gets on by a few checkpoints, so a run is interrupted several times.
    std::uniform_real_distribution<double> delay(0.01, 0.6 * full.seconds);
    fs::path io = fresh_dir("kill_" + std::to_string(k)), run = io / "run";
    const fs::path ckpt = run / "last.safetensors";
    bool finished = false;
    for (int attempt = 0; attempt < kMaxAttempts && !finished; ++attempt) {
      const bool resume = fs::exists(ckpt);
      RunOptions o;
      if (attempt + 1 < kMaxAttempts) o.kill_after_s = delay(rng);
      // A start over after a kill before the first checkpoint replaces that attempt's files.
      std::vector<std::string> fresh = tiny_args(run);
      if (attempt > 0) fresh.push_back("--overwrite");
      RunResult r = run_train(io, resume ? with_resume(tiny_args(run), ckpt) : fresh, o);
      resumes += resume;
      fresh_restarts += !resume && attempt > 0;
      if (r.killed) {
        ++kills;
        if (fs::exists(run)) temp_left += int(temp_files(run).size());
        continue;
      }
      ASSERT_EQ(r.exit_code, 0) << describe(r);
      finished = true;
    }
    ASSERT_TRUE(finished);
    EXPECT_TRUE(slurp(ckpt) == ref_last) << "last.safetensors differs from the uninterrupted run";
    EXPECT_TRUE(slurp(run / "best.safetensors") == ref_best) << "best.safetensors differs";
    EXPECT_EQ(slurp(run / "confusion.csv"), ref_confusion);
    std::vector<std::string> train_rows;
    EXPECT_EQ(check_metrics(run / "metrics.csv", &train_rows), ref_evals) << "evaluation rows";
    // Every train row averages the same steps as the uninterrupted run's, also the first one
    // after a resume from a checkpoint taken inside a logging window.
    EXPECT_EQ(train_rows, ref_train) << "train rows";
    EXPECT_EQ(temp_files(run), std::vector<std::string>{}) << "temporary files left behind";
    if (!HasFailure()) fs::remove_all(io);
  }
  std::printf(
      "[ stats    ] %d seeds from %llu: %d kills, %d resumes, %d fresh restarts, %d temporary "
      "files seen after a kill (all removed by the next start); a whole run takes %.2f s\n",
      kSeeds, (unsigned long long)first_seed, kills, resumes, fresh_restarts, temp_left,
      full.seconds);
  EXPECT_GE(kills, kSeeds) << "the delays never interrupted a run";
  fs::remove_all(ref);
}

// A temporary file of a writer that died is removed at the next start; one of a live process
// is not touched.
TEST(Faults, StaleTemporaryFilesAreRemovedAtStart) {
  fs::path dir = fresh_dir("stale");
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const fs::path stale = dir / ("last.safetensors.tmp." + std::to_string(dead));
  const fs::path live = dir / ("last.safetensors.tmp." + std::to_string(::getppid()));
  const fs::path other = dir / "notes.tmp.txt";
  for (const auto& p : {stale, live, other}) std::ofstream(p) << "x";
  const auto removed = cnn::remove_stale_temp_files(dir.string());
  EXPECT_EQ(removed, std::vector<std::string>{stale.string()});
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other));
  fs::remove_all(dir);
}

// A metrics row that does not fit on the disk is not left half-written: the file is cut back to
// its last whole row. In a child process, so that RLIMIT_FSIZE does not outlive the test.
TEST(Faults, FailedAppendLeavesNoTornRow) {
  fs::path dir = fresh_dir("append");
  const std::string path = (dir / "metrics.csv").string();
  cnn::append_line_durably(path, kMetricsHeader);
  const auto before = fs::file_size(path);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const struct rlimit lim = {before + 10, before + 10};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    try {
      cnn::append_line_durably(path, std::string(100, '7'));
      ::_exit(2);  // it fit: the limit did not work
    } catch (const cnn::Error& e) {
      ::_exit(std::string(e.what()).find(std::strerror(EFBIG)) != std::string::npos ? 0 : 3);
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: the append fit; 3: the error does not say EFBIG";
  EXPECT_EQ(fs::file_size(path), before) << "a torn row was left";
  fs::remove_all(dir);
}

// The disk fills up while a checkpoint is written (RLIMIT_FSIZE below the checkpoint's size, so
// every other file still fits): train stops with one line naming the file and the reason, the
// previous checkpoint is untouched, no temporary file is left, and a resume afterwards works.
TEST(Faults, DiskFullKeepsThePreviousCheckpoint) {
  fs::path io = fresh_dir("diskfull"), run = io / "run";
  const fs::path ckpt = run / "last.safetensors";
  RunResult first = run_train(io, tiny_args(run, {"training.epochs=1"}));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  const std::string before = slurp(ckpt);
  ASSERT_GT(before.size(), 4096u);
  // Every file the run writes besides the checkpoints stays far below this (train.log is the
  // largest, a few KiB).
  RunOptions o;
  o.fsize_limit = before.size() - 1;
  RunResult full = run_train(io, with_resume(tiny_args(run, {"training.epochs=2"}), ckpt), o);
  EXPECT_FALSE(full.killed);
  EXPECT_NE(full.exit_code, 0) << describe(full);
  const std::string line = error_line(full);
  EXPECT_TRUE(contains(line, ckpt.string())) << line;
  EXPECT_TRUE(contains(line, std::strerror(EFBIG))) << line;
  EXPECT_TRUE(contains(line, "previous one is unchanged")) << line;
  EXPECT_TRUE(slurp(ckpt) == before) << "the previous checkpoint changed";
  EXPECT_EQ(temp_files(run), std::vector<std::string>{});
  check_metrics(run / "metrics.csv");

  RunResult again = run_train(io, with_resume(tiny_args(run, {"training.epochs=2"}), ckpt));
  EXPECT_EQ(again.exit_code, 0) << describe(again);
  EXPECT_EQ(cnn::read_safetensors(ckpt.string()).metadata_value("epoch"), "2");
  if (!HasFailure()) fs::remove_all(io);
}

// The log folder cannot be created (its parent is a regular file) or written (mode 0555, when
// not root, which ignores permissions); the checkpoints live elsewhere and stay unchanged.
TEST(Faults, UnwritableLogFolderIsOneClearError) {
  fs::path io = fresh_dir("unwritable"), run = io / "run";
  const fs::path ckpt = run / "last.safetensors";
  RunResult first = run_train(io, tiny_args(run, {"training.max_steps=4"}));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  const std::string before = slurp(ckpt);

  std::ofstream(io / "a_file") << "not a folder";
  const fs::path bad = io / "a_file" / "logs";
  RunResult r =
      run_train(io, with_resume(tiny_args(bad, {"checkpoint.dir=" + run.string()}), ckpt));
  EXPECT_NE(r.exit_code, 0) << describe(r);
  std::string line = error_line(r);
  EXPECT_TRUE(contains(line, bad.string())) << line;
  EXPECT_TRUE(contains(line, std::strerror(ENOTDIR))) << line;
  EXPECT_TRUE(slurp(ckpt) == before);

  if (::geteuid() != 0) {
    const fs::path locked = io / "locked";
    fs::create_directories(locked);
    ::chmod(locked.c_str(), 0555);
    r = run_train(
        io, with_resume(tiny_args(locked / "logs", {"checkpoint.dir=" + run.string()}), ckpt));
    EXPECT_NE(r.exit_code, 0) << describe(r);
    line = error_line(r);
    EXPECT_TRUE(contains(line, (locked / "logs").string())) << line;
    EXPECT_TRUE(contains(line, std::strerror(EACCES))) << line;
    EXPECT_TRUE(slurp(ckpt) == before);
    // A run folder that exists but has become read-only: the checkpoint cannot be replaced.
    ::chmod(run.c_str(), 0555);
    r = run_train(io, with_resume(tiny_args(run), ckpt));
    ::chmod(run.c_str(), 0755);
    ::chmod(locked.c_str(), 0755);
    EXPECT_NE(r.exit_code, 0) << describe(r);
    line = error_line(r);
    EXPECT_TRUE(contains(line, run.string())) << line;
    EXPECT_TRUE(contains(line, std::strerror(EACCES))) << line;
    EXPECT_TRUE(slurp(ckpt) == before);
    EXPECT_EQ(temp_files(run), std::vector<std::string>{});
  }
  RunResult again = run_train(io, with_resume(tiny_args(run, {"training.max_steps=8"}), ckpt));
  EXPECT_EQ(again.exit_code, 0) << describe(again);
  if (!HasFailure()) fs::remove_all(io);
}

// A huge learning rate makes the weights non-finite within two steps; resumed at step 32, the
// next checkpoint is due at step 36 and the loss is next looked at on step 40, so the checkpoint
// sees the NaN weights first (before the fix it wrote them over last.safetensors). The run must
// stop there naming the step and the tensor, and leave the last good checkpoints as they were.
TEST(Faults, DivergingRunStopsAndKeepsTheLastGoodCheckpoint) {
  fs::path io = fresh_dir("nan"), run = io / "run";
  const fs::path ckpt = run / "last.safetensors", best = run / "best.safetensors";
  const std::vector<std::string> every = {"checkpoint.every_steps=4", "logging.every_steps=10"};
  auto sets = [&](std::vector<std::string> more) {
    more.insert(more.begin(), every.begin(), every.end());
    return more;
  };
  RunResult first = run_train(io, tiny_args(run, sets({"training.epochs=1"})));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  const std::string before = slurp(ckpt), best_before = slurp(best);

  RunResult r = run_train(
      io, with_resume(tiny_args(run, sets({"training.epochs=2", "optimizer.lr=1e30"})), ckpt));
  EXPECT_NE(r.exit_code, 0) << describe(r);
  const std::string line = error_line(r);
  EXPECT_TRUE(contains(line, "step 36: ")) << line;
  EXPECT_TRUE(contains(line, "non-finite")) << line;
  EXPECT_TRUE(contains(line, "without writing " + ckpt.string())) << line;
  EXPECT_TRUE(contains(line, ".weight") || contains(line, ".bias")) << line;
  EXPECT_TRUE(slurp(ckpt) == before) << "the last good checkpoint changed";
  EXPECT_TRUE(slurp(best) == best_before) << "best.safetensors changed";
  for (const auto& e : fs::directory_iterator(run)) {
    if (e.path().extension() == ".safetensors") {
      EXPECT_TRUE(all_weights_finite(e.path())) << e.path();
    }
  }
  EXPECT_EQ(temp_files(run), std::vector<std::string>{});
  if (!HasFailure()) fs::remove_all(io);
}

// The training rows in metrics.csv: once a run has logged one, its signal handlers are in place.
size_t train_rows(const fs::path& csv) {
  const std::string all = slurp(csv);
  size_t n = 0;
  for (size_t at = all.find(",train,"); at != std::string::npos; at = all.find(",train,", at + 1))
    ++n;
  return n;
}

// The line "... Continue with: <command>" of a stopped run, split into its words (the test paths
// need no quoting).
std::vector<std::string> continue_command(const std::string& out) {
  const std::string key = "Continue with: ";
  const size_t at = out.rfind(key);
  if (at == std::string::npos) return {};
  std::stringstream ss(out.substr(at + key.size(), out.find('\n', at) - at - key.size()));
  std::vector<std::string> words;
  for (std::string w; ss >> w;) words.push_back(w);
  return words;
}

// SIGINT, then SIGTERM, each once the run has written a checkpoint: each time a checkpoint at the
// step reached, exit 130 / 143 (a script can tell it from a finished run), and the printed
// command (--resume and the run folder, nothing else) continues it; the third run finishes with
// exit 0 and the checkpoint an uninterrupted run writes.
TEST(Faults, SignalStopsWithCheckpointExitCodeAndContinueCommand) {
  fs::path ref = fresh_dir("signal_ref"), io = fresh_dir("signal"), run = io / "run";
  const std::vector<std::string> sets = {"training.epochs=12", "checkpoint.every_steps=0"};
  RunResult full = run_train(ref, tiny_args(ref / "run", sets));
  ASSERT_EQ(full.exit_code, 0) << describe(full);

  std::vector<std::string> args = tiny_args(run, sets);
  for (const int sig : {SIGINT, SIGTERM}) {
    const std::string before = slurp(run / "last.safetensors");
    RunOptions o;
    const size_t rows_before = train_rows(run / "metrics.csv");
    o.when = [&] { return train_rows(run / "metrics.csv") > rows_before; };
    o.signal = sig;
    RunResult r = run_train(io, args, o);
    ASSERT_EQ(r.exit_code, 128 + sig) << describe(r);
    EXPECT_TRUE(contains(r.out, sig == SIGINT ? "stopped by SIGINT" : "stopped by SIGTERM"))
        << r.out;
    ASSERT_TRUE(fs::exists(run / "last.safetensors")) << r.out;
    EXPECT_FALSE(slurp(run / "last.safetensors") == before) << "no checkpoint at the stop";
    args = continue_command(r.out);
    ASSERT_EQ(args, (std::vector<std::string>{kTrain, "--resume", run.string()})) << r.out;
    args.erase(args.begin());  // run_train adds the program
  }
  RunResult last = run_train(io, args);
  ASSERT_EQ(last.exit_code, 0) << describe(last);
  EXPECT_TRUE(slurp(run / "last.safetensors") == slurp(ref / "run" / "last.safetensors"));
  check_metrics(run / "metrics.csv");
  if (!HasFailure()) {
    fs::remove_all(io);
    fs::remove_all(ref);
  }
}

// While a run trains, a second ./train on its folder (a fresh run with --log-dir, --overwrite, or
// a resume) is refused with one line naming the running one's pid, and changes nothing; the first
// run then finishes normally. Without --log-dir the second run would get a folder of its own.
TEST(Faults, SecondRunOnALiveRunsFolderIsRefused) {
  fs::path io = fresh_dir("concurrent"), other = fresh_dir("concurrent_2"), run = io / "run";
  const std::vector<std::string> sets = {"training.epochs=40", "checkpoint.every_steps=0"};
  std::vector<RunResult> second;
  RunOptions o;
  // Once it has a checkpoint, so that the resume's refusal can only be the lock.
  o.when = [&] { return fs::exists(run / "last.safetensors"); };
  o.on_wait = [&] {
    second.push_back(run_train(other, tiny_args(run, {"training.epochs=1"})));
    std::vector<std::string> over = tiny_args(run, {"training.epochs=1"});
    over.push_back("--overwrite");
    second.push_back(run_train(other, over));
    second.push_back(run_train(other, {"--resume", run.string()}));
  };
  o.signal = SIGTERM;
  RunResult first = run_train(io, tiny_args(run, sets), o);
  EXPECT_EQ(first.exit_code, 143) << describe(first);
  ASSERT_EQ(second.size(), 3u);
  for (const RunResult& r : second) {
    EXPECT_EQ(r.exit_code, 1) << describe(r);
    const std::string line = error_line(r);
    EXPECT_TRUE(contains(line, "'" + run.string() + "' is in use by another ./train (pid "))
        << line;
  }
  const std::string pid_line = slurp(run / ".lock");
  EXPECT_TRUE(contains(second[0].err, "(pid " + pid_line.substr(0, pid_line.find('\n')) + ")"))
      << second[0].err << " vs .lock " << pid_line;
  // Nothing of the refused runs reached the folder: one run's log, its metrics whole.
  const std::string log = slurp(run / "train.log");
  EXPECT_EQ(log.find("run 'tiny'"), log.rfind("run 'tiny'")) << log;
  check_metrics(run / "metrics.csv");
  // The lock died with the process: the folder can be resumed now.
  RunResult resumed = run_train(other, {"--resume", run.string(), "--set", "training.max_steps=1"});
  EXPECT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_TRUE(contains(resumed.out, "nothing to do")) << resumed.out;
  if (!HasFailure()) {
    fs::remove_all(io);
    fs::remove_all(other);
  }
}

// An allocation that cannot succeed is one error line with the size and the hint, not a crash.
TEST(Faults, ImpossibleHostAllocationIsAClearError) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reports huge allocations instead of returning null";
#endif
  try {
    cnn::Buffer<float> b(size_t(1) << 48, cnn::Device::CPU);  // 1 PiB
    FAIL() << "a 1 PiB allocation succeeded";
  } catch (const cnn::Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(contains(m, "out of host memory")) << m;
    EXPECT_TRUE(contains(m, "1073741824.0 MiB")) << m;
    EXPECT_TRUE(contains(m, "training.batch_size")) << m;
  }
}
