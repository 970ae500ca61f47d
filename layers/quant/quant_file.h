#pragma once
// Quantized models as safetensors, beside the float checkpoints:
//   <layer>.weight        I8  torch layout (OC, C/groups, KH, KW) or (OUT, IN)
//   <layer>.weight_scale  F32 (OC): one symmetric scale per output channel
//   <layer>.input_scale   F32 (1): the scale of the int8 activations the layer reads
//   <layer>.bias          F32 (OC): BatchNorm folded in
// and per residual block (its add):
//   <block>.input_scale, <block>.shortcut_scale  F32 (1): the scales of the two int8 tensors added
//   <block>.output_scale  F32 (1): the scale of the sum (after the block's ReLU)
// and per avgpool2d:
//   <pool>.input_scale, <pool>.output_scale  F32 (1): the scales of the int8 tensors it reads and
//   writes
// An activation that several layers read has one scale; each records it, and reading checks that
// they agree.
// and the float checkpoint's metadata (config, classes, input size, normalization) plus
//   quantization = "int8-per-channel-symmetric", quantization_version = "1",
//   calibration = max|percentile|mse, calibration_images = N, folded = JSON list.
// The config still lists the batchnorms; they are folded again (by name) on reading.
#include <string>

#include "layers/checkpoint/checkpoint.h"
#include "layers/quant/quant_model.h"

namespace cnn {

constexpr const char* kQuantizationName = "int8-per-channel-symmetric";
constexpr const char* kQuantizationVersion = "1";

void save_quantized(const std::string& path, const QuantizedModel& m, const CheckpointMeta& meta,
                    const std::vector<std::string>& folded);

// True when the file's metadata says it is a quantized model (any version).
bool is_quantized_file(const std::string& path);

// Reads a quantized model for the network `specs` (the embedded config's layers, batchnorms not
// yet folded; input_chw as in the metadata). Every stage's four tensors must exist with the
// expected dtype and shape, scales finite and > 0, and no other tensor may be present; any
// difference is one error naming the file and the tensor.
QuantizedModel load_quantized(const std::string& path, const std::vector<LayerSpec>& specs,
                              const Shape& input_chw);

// The metadata of a quantized file, checking its quantization keys (name, version).
CheckpointMeta read_quantized_meta(const std::string& path);

}  // namespace cnn
