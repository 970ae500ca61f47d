#pragma once
// What ./quantize and ./infer --precision int8 share: the float model of a checkpoint with its
// batchnorms folded, calibration images from the config's training set, and the accuracy of a
// forward function over the config's test set.
#include <functional>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "layers/checkpoint/checkpoint.h"
#include "layers/fold_batchnorm.h"

namespace cnn {

// The run's best checkpoint when given a run folder (the last when there is no best).
std::string resolve_checkpoint(const std::string& path);

struct Fp32Model {
  std::string path;
  CheckpointMeta meta;
  TrainConfig cfg;
  FoldedNetwork folded;
};
// Reads a float checkpoint (a quantized one is refused naming the file) and folds its batchnorms.
Fp32Model load_fp32_model(const std::string& path);

// The embedded config of a checkpoint's metadata, checked against its input size.
TrainConfig embedded_config(const std::string& path, const CheckpointMeta& meta);

// n images of the config's training set (evenly spread over it, all when it holds fewer),
// normalized as the checkpoint says: (count, C, H, W). data_dir, when not empty, replaces the
// config's data.dir (IDX datasets).
std::vector<float> calibration_images(const TrainConfig& cfg, const CheckpointMeta& meta, int n,
                                      const std::string& data_dir, int* count);

// Runs `logits` (n images (n, C, H, W) on the host -> (n, classes) host logits) over the config's
// test set in batches; returns the fraction whose arg-max is the label, and the count.
struct TestAccuracy {
  double accuracy = 0;
  int64_t count = 0;
};
TestAccuracy test_set_accuracy(
    const TrainConfig& cfg, const CheckpointMeta& meta, int batch, const std::string& data_dir,
    const std::function<std::vector<float>(int n, const float* h_x)>& logits);

}  // namespace cnn
