#pragma once
// The training and data-check entry points behind ./train (see app/config/config.h for the parsed
// configuration and app/train/run_folder.h for where a run writes).
#include <string>
#include <vector>

#include "app/train/distributed.h"

namespace cnn {

struct TrainConfig;

struct TrainArgs {
  std::string resume;        // --resume CKPT or RUN_DIR
  std::string init_weights;  // --init-weights CKPT
  std::string log_dir;       // --log-dir DIR (overrides <logging.dir>/<name>)
  bool overwrite = false;    // --overwrite: replace the run in <logging.dir>/<name> or --log-dir
  std::string program;       // argv[0], for the command that continues a stopped run
  RankInfo rank;             // a data-parallel run's rank (one process: rank 0 of 1)
};

// Trains as the config says; returns the process exit code: 0 when done (or nothing was left to
// do), 128 + the signal number when SIGINT/SIGTERM stopped it after a checkpoint.
int run_training(const TrainConfig& cfg, const TrainArgs& args);
// --check-data: reads every image of the configured dataset and reports; returns the exit code.
int run_check_data(const TrainConfig& cfg);

}  // namespace cnn
