#include "data/normalize.h"

#include <cmath>

#include "runtime/error.h"

namespace cnn {

Normalization compute_normalization(const Dataset& d) {
  CNN_CHECK(d.n > 0 && d.images.size() == size_t(d.n) * size_t(d.image_size()),
            "cannot compute the normalization of an empty or inconsistent dataset ({})", d.source);
  Normalization out;
  const size_t plane = size_t(d.h) * d.w;
  for (int k = 0; k < d.c; ++k) {
    // Integer histograms make the sums exact regardless of the dataset size.
    std::vector<uint64_t> hist(256, 0);
    for (int i = 0; i < d.n; ++i) {
      const uint8_t* p = d.images.data() + (size_t(i) * d.c + k) * plane;
      for (size_t j = 0; j < plane; ++j) ++hist[p[j]];
    }
    const double count = double(d.n) * double(plane);
    double sum = 0, sum_sq = 0;
    for (int v = 0; v < 256; ++v) {
      const double x = v / 255.0;
      sum += hist[v] * x;
      sum_sq += hist[v] * x * x;
    }
    const double mean = sum / count;
    const double var = std::max(0.0, sum_sq / count - mean * mean);
    const double sd = std::sqrt(var);
    out.mean.push_back(float(mean));
    out.std.push_back(sd > 1e-6 ? float(sd) : 1.f);
  }
  return out;
}

void validate_normalization(const Normalization& n, int channels) {
  CNN_CHECK(int(n.mean.size()) == channels,
            "data.mean has {} values, expected {} (one per channel)", n.mean.size(), channels);
  CNN_CHECK(int(n.std.size()) == channels, "data.std has {} values, expected {} (one per channel)",
            n.std.size(), channels);
  for (int k = 0; k < channels; ++k) {
    CNN_CHECK(std::isfinite(n.mean[k]), "data.mean[{}] is {}, expected a finite number", k,
              n.mean[k]);
    CNN_CHECK(std::isfinite(n.std[k]) && n.std[k] > 0, "data.std[{}] is {}, expected > 0", k,
              n.std[k]);
  }
}

Normalization resolve_normalization(const std::vector<float>& mean, const std::vector<float>& std,
                                    const Dataset& train) {
  CNN_CHECK(mean.empty() == std.empty(),
            "data.mean and data.std must be given together (or both left out to compute them)");
  if (mean.empty()) return compute_normalization(train);
  Normalization n{mean, std};
  validate_normalization(n, train.c);
  return n;
}

void normalize_image(const uint8_t* pixels, int c, int h, int w, const Normalization& norm,
                     float* out) {
  validate_normalization(norm, c);
  const size_t plane = size_t(h) * w;
  for (int k = 0; k < c; ++k)
    for (size_t j = 0; j < plane; ++j)
      out[k * plane + j] = (float(pixels[k * plane + j]) / 255.f - norm.mean[k]) / norm.std[k];
}

std::string normalization_str(const Normalization& n) {
  std::string m, s;
  for (size_t k = 0; k < n.mean.size(); ++k) {
    m += fmt::format("{}{:.4f}", k ? ", " : "", n.mean[k]);
    s += fmt::format("{}{:.4f}", k ? ", " : "", n.std[k]);
  }
  return fmt::format("mean ({}) std ({})", m, s);
}

}  // namespace cnn
