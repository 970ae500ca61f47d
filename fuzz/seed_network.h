#pragma once
// The small network of the seed checkpoint in fuzz/corpus/safetensors/: fuzz_make_corpus writes
// the checkpoint from it, and fuzz_safetensors loads mutated checkpoints against it.
namespace cnn::fuzz {

constexpr const char* kSeedConfig = R"(name: seed
model:
  input: {channels: 1, height: 4, width: 4}
  layers:
    - conv2d: {out_channels: 2, kernel: 3, padding: 1}
    - relu
    - maxpool2d: {kernel: 2}
    - flatten
    - linear: {out_features: 2}
    - softmax_cross_entropy
data: {format: synthetic, synthetic: {train: 8, test: 4, classes: 2}, normalize: {mean: [0.5], std: [0.25]}}
optimizer: {type: sgd, lr: 0.1, momentum: 0.9}
training: {epochs: 1, batch_size: 4, device: cpu}
)";

}  // namespace cnn::fuzz
