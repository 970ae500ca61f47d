#include "app/train/run_log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/atomic_file.h"
#include "runtime/error.h"

namespace cnn {

namespace fs = std::filesystem;

namespace {
constexpr const char* kMetricsHeader = "time_s,epoch,step,phase,loss,accuracy,lr,images_per_s";
}

RunLog::RunLog(const std::string& run_dir, bool progress) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  CNN_CHECK(!ec, "cannot create the log directory '{}': {}", run_dir, ec.message());
  const std::string log_path = run_dir + "/train.log";
  std::shared_ptr<spdlog::sinks::basic_file_sink_mt> file_sink;
  try {
    file_sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(log_path, false);
  } catch (const spdlog::spdlog_ex& e) {
    CNN_FAIL("cannot write the log file '{}': {}", log_path, e.what());
  }
  auto console = std::make_shared<spdlog::sinks::stdout_sink_mt>();
  logger_ = std::make_shared<spdlog::logger>("train", spdlog::sinks_init_list{console, file_sink});
  file_logger_ = std::make_shared<spdlog::logger>("train.log", file_sink);
  for (const auto& l : {logger_, file_logger_}) {
    l->set_pattern("[%Y-%m-%d %H:%M:%S] %v");
    l->flush_on(spdlog::level::info);
  }
  metrics_path_ = run_dir + "/metrics.csv";
  if (!fs::exists(metrics_path_)) append_line_durably(metrics_path_, kMetricsHeader);
  if (progress && isatty(fileno(stdout))) display_ = std::make_unique<ProgressDisplay>(stdout);
}

RunLog::RunLog(int rank) {
  auto err = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  logger_ = std::make_shared<spdlog::logger>(fmt::format("rank{}", rank), err);
  logger_->set_pattern(fmt::format("[%Y-%m-%d %H:%M:%S] rank {}: %v", rank));
  logger_->set_level(spdlog::level::warn);
  file_logger_ = logger_;
}

RunLog::~RunLog() = default;  // the display leaves a finished epoch's line, clears a live one

void RunLog::truncate_metrics_after(int64_t last_step, bool eval_done, bool train_row_done) {
  if (metrics_path_.empty()) return;  // a rank's log without files
  std::ifstream in(metrics_path_);
  std::string line, kept = std::string(kMetricsHeader) + "\n";
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    // A torn last line (a kill mid-write) has too few fields or no newline: dropped.
    std::stringstream ss(line);
    std::string field;
    int fields = 0;
    int64_t step = -1;
    bool eval = false;
    while (std::getline(ss, field, ',')) {
      if (fields == 2) step = std::atoll(field.c_str());
      if (fields == 3) eval = field == "eval";
      ++fields;
    }
    const bool redone =
        step > last_step || (step == last_step && (eval ? !eval_done : !train_row_done));
    if (fields == 8 && !redone && !in.eof()) kept += line + "\n";
  }
  write_file_atomically(metrics_path_, kept.data(), kept.size());
}

void RunLog::metrics(const MetricsRow& r) {
  if (metrics_path_.empty()) return;
  append_line_durably(metrics_path_,
                      fmt::format("{:.3f},{},{},{},{:.6f},{:.6f},{:.6g},{:.1f}", r.time_s, r.epoch,
                                  r.step, r.phase, r.loss, r.accuracy, r.lr, r.images_per_s));
  if (display_ && r.phase == "train") display_->add_window(r.loss, r.accuracy, r.images_per_s);
}

void RunLog::progress(int64_t epoch, int64_t epochs, int64_t batch, int64_t batches, double lr,
                      double eta_s) {
  if (display_) display_->update(epoch, epochs, batch, batches, lr, eta_s);
}

void RunLog::clear_bar() {
  if (display_) display_->before_log();
}

void RunLog::redraw_bar() {
  if (display_) display_->after_log();
}

}  // namespace cnn
