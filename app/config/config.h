#pragma once
// The parsed, validated run configuration behind ./train (configs/*.yaml). Parsing is strict:
// every problem is reported before anything runs, as one line naming the file, the key path, its
// line and what was expected.
#include <cstdint>
#include <string>
#include <vector>

#include "data/data_options.h"
#include "layers/layer_spec.h"
#include "layers/optim_options.h"
#include "runtime/exec.h"
#include "runtime/tensor.h"

namespace cnn {

struct ModelConfig {
  Shape input_chw;                // (C, H, W) of one input image
  std::vector<LayerSpec> layers;  // finalized: every layer named, shapes chain, loss last
};

struct TrainingOptions {
  int epochs = 1;
  int batch_size = 64;
  uint64_t seed = 42;
  std::string device = "auto";  // cpu | cuda | auto (CUDA when available)
  Precision precision = Precision::FP32;
  Algo algo = Algo::Auto;  // default kernel variant for layers that name none
  bool deterministic = false;
  int eval_every_epochs = 1;
  // The first epoch (1-based) evaluated; earlier ones skip evaluation (a speed run's early epochs
  // cannot reach its target, and each evaluation costs a pass over the test set). The last epoch
  // is always evaluated.
  int eval_from_epoch = 1;
  int64_t max_steps = 0;   // 0 = no limit; stops early for quick runs
  bool cuda_graph = true;  // replay the step as one CUDA graph (CNN_CUDA_GRAPH=0 also turns it off)
  bool autotune_cache = true;    // reuse algo: auto's choices across runs (app/train/startup.h)
  double stop_at_accuracy = 0;   // percent; stop after the evaluation that reaches it; 0 = off
  double label_smoothing = 0.0;  // of the training loss, in [0, 1) (torch's semantics)
  bool eval_flip = false;  // evaluation predicts from an image's logits plus its mirror image's
  // Data-parallel training: ranks (one per GPU; train --gpus N sets it), each at batch_size, so
  // a step's global batch is gpus * batch_size. NCCL's library path ("" = libnccl.so.2 from the
  // loader's search path; CNN_NCCL_LIBRARY wins).
  int gpus = 1;
  std::string nccl_library;
};

enum class ProgressMode { Auto, On, Off };  // auto: a progress bar only on a terminal
const char* progress_mode_name(ProgressMode p);

struct LoggingOptions {
  std::string dir = "logs";  // the run writes to <dir>/<name>/
  int every_steps = 50;
  ProgressMode progress = ProgressMode::Auto;
};

struct CheckpointOptions {
  std::string dir;          // resolved: defaults to the run's log dir, <logging.dir>/<name>
  int every_epochs = 1;     // 0 = not per epoch
  int64_t every_steps = 0;  // 0 = not per step
  bool keep_best = true;    // also keep the checkpoint with the best evaluation accuracy
};

struct TrainConfig {
  std::string name;  // run name; defaults to the config file's stem
  ModelConfig model;
  DataOptions data;
  OptimizerOptions optimizer;
  ScheduleOptions schedule;
  TrainingOptions training;
  LoggingOptions logging;
  CheckpointOptions checkpoint;

  std::string source_path;         // the config file it came from
  std::string resolved_yaml;       // every key with defaults and overrides applied (config_to_yaml)
  std::vector<std::string> notes;  // what the config left to be found out, e.g. out_features: auto

  std::string run_dir() const { return logging.dir + "/" + name; }
  // Number of classes the data section names (data.classes or synthetic.classes), 0 if unknown
  // until the dataset is read.
  int known_class_count() const;
};

// Reads and validates a config file. `overrides` are --set arguments "key.path=value", applied in
// order before validation; each value is parsed as YAML. Throws cnn::Error with one line.
TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// Same, from text; `source_name` stands for the file in messages and gives the default run name.
// Configs (files, --config, and those embedded in checkpoints) larger than this are refused
// before parsing: real ones are a few KB.
constexpr size_t kMaxConfigBytes = size_t(4) << 20;

TrainConfig parse_config(const std::string& yaml_text, const std::string& source_name,
                         const std::vector<std::string>& overrides = {});

// The complete configuration as YAML that parse_config reads back to the same values.
std::string config_to_yaml(const TrainConfig& cfg);

}  // namespace cnn
