#pragma once
// The training and data-check entry points behind ./train (the lead's file; see app/config.h
// for the parsed configuration).
#include <string>
#include <vector>

namespace cnn {

struct TrainConfig;

struct TrainArgs {
  std::string config_path;
  std::string resume;        // --resume CKPT
  std::string init_weights;  // --init-weights CKPT
  std::string log_dir;       // --log-dir DIR (overrides logging.dir)
};

// Trains as the config says; returns the process exit code.
int run_training(const TrainConfig& cfg, const TrainArgs& args);
// --check-data: reads every image of the configured dataset and reports; returns the exit code.
int run_check_data(const TrainConfig& cfg);

}  // namespace cnn
