#include "app/train/evaluate.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "kernels/loss/softmax_xent.h"
#include "kernels/pointwise/add.h"

namespace cnn {

namespace {

// Test-time flipping: the batch's logits plus those of its mirror image; the predictions
// (argmax of the sum) go into *pred. The loss rows stay those of the plain images.
class MirroredPredictions {
 public:
  MirroredPredictions(int batch, int classes, const Exec& ex)
      : classes_(classes),
        ex_(ex),
        sum_(size_t(batch) * size_t(classes), ex.device),
        loss_(size_t(batch), ex.device),
        pred_(size_t(batch), ex.device) {}

  const int32_t* run(Network& net, BatchSource& source, int n) {
    const size_t count = size_t(n) * size_t(classes_);
    raw_copy(sum_.data(), ex_.device, net.logits(), ex_.device, count * sizeof(float), ex_.stream);
    source.gather_mirrored(n);
    add_forward(int64_t(count), sum_.data(), net.forward(n, source.x()), sum_.data(), ex_);
    softmax_xent({n, classes_}, sum_.data(), source.labels(), loss_.data(), pred_.data(), nullptr,
                 1.0f, ex_);
    return pred_.data();
  }

 private:
  int classes_;
  Exec ex_;
  Buffer<float> sum_, loss_;
  Buffer<int32_t> pred_;
};

}  // namespace

EvalResult evaluate(Network& net, BatchSource& source, bool mirror) {
  const Exec& ex = net.exec();
  EvalResult r;
  r.classes = net.num_classes();
  r.confusion.assign(size_t(r.classes) * size_t(r.classes), 0);
  Buffer<double> totals(3, ex.device);  // loss sum, correct, count
  totals.zero(ex.stream);
  std::vector<int32_t> pred(size_t(net.max_batch()));
  std::optional<MirroredPredictions> mirrored;
  if (mirror) mirrored.emplace(net.max_batch(), r.classes, ex);
  source.start_epoch(0);
  int n = 0;
  while (source.next(&n)) {
    net.forward_loss(n, source.x(), source.labels());
    const int32_t* d_pred = mirrored ? mirrored->run(net, source, n) : net.predictions();
    accumulate_metrics(n, net.loss_rows(), d_pred, source.labels(), totals.data(), ex);
    // The predictions come back per batch for the confusion matrix; evaluation is not the hot
    // path, and this keeps the device free of a classes^2 histogram kernel.
    raw_copy(pred.data(), Device::CPU, d_pred, ex.device, size_t(n) * sizeof(int32_t));
    const int32_t* labels = source.host_labels_of_last_batch();
    for (int i = 0; i < n; ++i)
      ++r.confusion[size_t(labels[i]) * size_t(r.classes) + size_t(pred[size_t(i)])];
  }
  double t[3] = {0, 0, 0};
  raw_copy(t, Device::CPU, totals.data(), ex.device, sizeof(t));
  r.count = int64_t(t[2]);
  r.loss = t[2] > 0 ? t[0] / t[2] : 0;
  r.accuracy = t[2] > 0 ? t[1] / t[2] : 0;
  return r;
}

std::string format_confusion(const EvalResult& r, const std::vector<std::string>& names) {
  size_t w = 6;
  for (const auto& n : names) w = std::max(w, std::min<size_t>(n.size(), 12) + 1);
  std::string out = fmt::format("{:>{}}", "true\\pred", w + 4);
  for (int c = 0; c < r.classes; ++c)
    out += fmt::format("{:>{}}", names[size_t(c)].substr(0, 12), w);
  out += "\n";
  for (int t = 0; t < r.classes; ++t) {
    out += fmt::format("{:>{}}", names[size_t(t)].substr(0, 12), w + 4);
    for (int p = 0; p < r.classes; ++p)
      out += fmt::format("{:>{}}", r.confusion[size_t(t) * size_t(r.classes) + size_t(p)], w);
    out += "\n";
  }
  return out;
}

std::string confusion_csv(const EvalResult& r, const std::vector<std::string>& names) {
  std::string out = "true\\predicted";
  for (int c = 0; c < r.classes; ++c) out += "," + names[size_t(c)];
  out += "\n";
  for (int t = 0; t < r.classes; ++t) {
    out += names[size_t(t)];
    for (int p = 0; p < r.classes; ++p)
      out += "," + std::to_string(r.confusion[size_t(t) * size_t(r.classes) + size_t(p)]);
    out += "\n";
  }
  return out;
}

}  // namespace cnn
