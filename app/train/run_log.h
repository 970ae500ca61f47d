#pragma once
// What a run writes while it trains: log lines (console + logs/<run>/train.log through spdlog),
// metrics.csv rows (appended durably; on resume, rows past the checkpoint are dropped first so
// none is duplicated), and the progress display on a terminal.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "app/train/progress.h"

namespace cnn {

struct MetricsRow {
  double time_s = 0;
  int64_t epoch = 0, step = 0;
  std::string phase;  // "train" | "eval" | "test"
  double loss = 0, accuracy = 0, lr = 0, images_per_s = 0;
};

class RunLog {
 public:
  // progress: draw a bar (only when stdout is a terminal and the config allows it).
  RunLog(const std::string& run_dir, bool progress);
  // A rank other than 0 of a data-parallel run: writes no file; warnings go to stderr with the
  // rank's name, everything else is dropped (rank 0 logs the run).
  explicit RunLog(int rank);
  ~RunLog();

  template <class... Args>
  void info(fmt::format_string<Args...> f, Args&&... args) {
    clear_bar();
    logger_->info(f, std::forward<Args>(args)...);
    redraw_bar();
  }
  template <class... Args>
  void warn(fmt::format_string<Args...> f, Args&&... args) {
    clear_bar();
    logger_->warn(f, std::forward<Args>(args)...);
    redraw_bar();
  }
  // A training window's loss line: while the progress display shows these values live, it goes
  // to train.log only; without a display, to the console too.
  template <class... Args>
  void step_info(fmt::format_string<Args...> f, Args&&... args) {
    if (display_)
      file_logger_->info(f, std::forward<Args>(args)...);
    else
      logger_->info(f, std::forward<Args>(args)...);
  }

  // Keeps rows with step <= last_step (resume; 0: a fresh run keeps the header only), rewriting
  // the file atomically. eval_done: false drops the eval rows at last_step too, for a checkpoint
  // taken on an epoch's last batch before that epoch's evaluation, which the resume runs again.
  // train_row_done: false drops a train row at last_step, for a checkpoint taken with an open
  // window of training metrics, whose row the resume writes again.
  void truncate_metrics_after(int64_t last_step, bool eval_done = true, bool train_row_done = true);
  void metrics(const MetricsRow& row);

  // Redraws the progress display (progress.h) at most a few times a second. Called every step:
  // returns before formatting anything unless it redraws.
  void progress(int64_t epoch, int64_t epochs, int64_t batch, int64_t batches, double lr,
                double eta_s);
  void clear_bar();   // takes the live line away (a finished epoch's line stays)
  void redraw_bar();  // after a log line

  const std::string& metrics_path() const { return metrics_path_; }

 private:
  std::shared_ptr<spdlog::logger> logger_, file_logger_;
  std::string metrics_path_;
  std::unique_ptr<ProgressDisplay> display_;  // only when stdout is a terminal
};

}  // namespace cnn
