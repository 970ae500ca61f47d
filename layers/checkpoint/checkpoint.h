#pragma once
// Checkpoints as safetensors: the network's tensors under torch.nn names and layouts
// ("conv1.weight" (OC, IC, KH, KW), "fc1.weight" (OUT, IN), ...), the optimizer's state as more
// tensors ("optimizer.momentum", ...), and in the metadata everything needed to resume exactly or
// to run inference alone: the resolved config, class names, input size, normalization, and the
// training position. Written atomically (temp file, fsync, rename).
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "layers/layer_spec.h"
#include "layers/network.h"
#include "layers/param_optimizer.h"

namespace cnn {

struct TrainPosition {
  int64_t epoch = 0;           // epoch in progress (0-based)
  int64_t batch_in_epoch = 0;  // next batch to run within that epoch
  int64_t global_step = 0;     // optimizer steps taken so far
  double best_accuracy = -1;   // best evaluation accuracy so far (-1: none yet)
};

struct CheckpointMeta {
  std::string config_yaml;  // the resolved config this network was trained with
  std::vector<std::string> class_names;
  Shape input_chw;
  std::vector<float> mean, std;  // normalization applied to pixels in [0, 1]
  TrainPosition position;
  uint64_t seed = 0;
  // Training loss sum, correct count and image count since the last metrics row: a resumed run
  // averages its first row over the same steps as an uninterrupted run would.
  std::array<double, 3> train_window = {0, 0, 0};
  uint64_t tensor_bytes = 0;  // the size of the file's data section (all tensors together)
};

struct Checkpoint {
  CheckpointMeta meta;
  std::vector<std::pair<std::string, std::vector<float>>> optimizer_state;
  std::vector<float> params;   // flat, in the network's layout (filled by load_checkpoint_for)
  std::vector<float> buffers;  // flat, the network's buffer layout (batchnorm running statistics)
};

// Refuses, before writing anything, an input (meta.input_chw) that reading the file would refuse:
// checkpoints hold networks of 1 or 3 input channels, as the data loaders give them.
void save_checkpoint(const std::string& path, const Network& net, const ParamOptimizer* opt,
                     const CheckpointMeta& meta);

class SafetensorsFile;
// The metadata of a checkpoint file already read (the keys save_checkpoint writes), validated;
// throws naming the file. Quantized models (layers/quant/quant_file.h) carry the same keys.
CheckpointMeta checkpoint_meta_of(const SafetensorsFile& f);
// The metadata save_checkpoint writes for `meta`.
std::map<std::string, std::string> checkpoint_metadata(const CheckpointMeta& meta);

// Reads only the metadata (to rebuild the network for inference or check a resume).
CheckpointMeta read_checkpoint_meta(const std::string& path);

// Refuses (naming the file) a model whose parameters cannot be in this checkpoint: one claiming a
// 4096x4096 input would otherwise allocate gigabytes of activations before the tensors are
// compared. Call before building the network from the embedded config.
void check_checkpoint_can_hold(const std::string& path, const CheckpointMeta& meta,
                               const std::vector<LayerSpec>& layers, const Shape& input_chw);

// Reads a checkpoint for this network: every parameter and buffer tensor must exist with the same
// shape (buffers marked is_int64 as I64, the others F32), and no extra tensor may be present; a
// difference is an error naming the tensor, and so is a NaN or infinite value in any float
// tensor (parameters, buffers and optimizer state). Apply with net.params_from_host(ck.params)
// and net.buffers_from_host(ck.buffers).
Checkpoint load_checkpoint_for(const std::string& path, const Network& net);

}  // namespace cnn
