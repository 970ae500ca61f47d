#pragma once
// The lines ./train prints when a run ends (run_summary.h is the speed-run target and run.json):
// the best epoch and its accuracy (from metrics.csv, so a resumed run counts the epochs before the
// resume), the checkpoint files, and the commands that come next (classify images, plot the curves,
// train longer).
#include <cstdint>
#include <string>

namespace cnn {

struct EndSummaryInput {
  std::string metrics_csv;  // the run's metrics.csv
  std::string run_dir, ckpt_dir;
  std::string resume_command;  // continues the run ("./train --resume DIR")
  std::string target;  // training.stop_at_accuracy's "; reached ..." (AccuracyTarget), or ""
  std::string eval_name = "test";  // "test" or "validation"
  int64_t epochs = 0, steps = 0;
  double seconds = 0;
};

// Several lines, each ending in '\n'.
std::string format_end_summary(const EndSummaryInput& in);

}  // namespace cnn
