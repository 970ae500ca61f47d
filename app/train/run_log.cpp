#include "app/train/run_log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/error.h"
#include "runtime/atomic_file.h"

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
  logger_->set_pattern("[%Y-%m-%d %H:%M:%S] %v");
  logger_->flush_on(spdlog::level::info);
  metrics_path_ = run_dir + "/metrics.csv";
  if (!fs::exists(metrics_path_)) append_line_durably(metrics_path_, kMetricsHeader);
  bar_enabled_ = progress && isatty(fileno(stdout));
}

RunLog::~RunLog() {
  clear_bar();
}

void RunLog::truncate_metrics_after(int64_t last_step, bool eval_done, bool train_row_done) {
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
    const bool redone = step > last_step ||
                        (step == last_step && (eval ? !eval_done : !train_row_done));
    if (fields == 8 && !redone && !in.eof()) kept += line + "\n";
  }
  write_file_atomically(metrics_path_, kept.data(), kept.size());
}

void RunLog::metrics(const MetricsRow& r) {
  append_line_durably(metrics_path_,
                      fmt::format("{:.3f},{},{},{},{:.6f},{:.6f},{:.6g},{:.1f}", r.time_s, r.epoch,
                                  r.step, r.phase, r.loss, r.accuracy, r.lr, r.images_per_s));
}

void RunLog::progress(int64_t epoch, int64_t epochs, int64_t batch, int64_t batches,
                      double lr, double eta_s) {
  if (!bar_enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (batch < batches && now - last_draw_ < std::chrono::milliseconds(200)) return;
  last_draw_ = now;
  constexpr int kWidth = 28;
  const int filled = batches ? int(kWidth * batch / batches) : kWidth;
  std::string bar(size_t(filled), '=');
  if (filled < kWidth) bar += '>' + std::string(size_t(kWidth - filled - 1), ' ');
  std::printf("\r\033[Kepoch %lld/%lld [%s] %lld/%lld lr %.3g ETA %.0fs", (long long)epoch + 1,
              (long long)epochs, bar.c_str(), (long long)batch, (long long)batches, lr, eta_s);
  std::fflush(stdout);
  bar_visible_ = true;
}

void RunLog::clear_bar() {
  if (!bar_visible_) return;
  std::printf("\r\033[K");
  std::fflush(stdout);
  bar_visible_ = false;
}

}  // namespace cnn
