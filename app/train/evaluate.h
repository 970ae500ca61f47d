#pragma once
// Evaluation of a network over a whole split: mean loss, accuracy and the confusion matrix.
#include <cstdint>
#include <string>
#include <vector>

#include "app/train/batch_source.h"
#include "layers/network.h"

namespace cnn {

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t count = 0;
  int classes = 0;
  std::vector<int64_t> confusion;  // (classes, classes): row = true label, column = prediction
};

// mirror: test-time flipping, each image's prediction from the sum of its logits and those of
// its left-right mirror image (accuracy and confusion); the loss stays that of the plain images.
EvalResult evaluate(Network& net, BatchSource& source, bool mirror = false);

// A printable table and a CSV of the confusion matrix with class names.
std::string format_confusion(const EvalResult& r, const std::vector<std::string>& class_names);
std::string confusion_csv(const EvalResult& r, const std::vector<std::string>& class_names);

}  // namespace cnn
