#include "data/dataset.h"

#include "runtime/error.h"

namespace cnn {

void validate_dataset(const Dataset& d, const std::string& what) {
  CNN_CHECK(d.n > 0, "{}: the dataset is empty", what);
  CNN_CHECK(d.images.size() == size_t(d.n) * size_t(d.image_size()),
            "{}: {} image bytes for {} images of {}x{}x{}", what, d.images.size(), d.n, d.c, d.h,
            d.w);
  CNN_CHECK(d.labels.size() == size_t(d.n), "{}: {} labels for {} images", what, d.labels.size(),
            d.n);
  const int classes = d.num_classes();
  for (size_t i = 0; i < d.labels.size(); ++i)
    CNN_CHECK(d.labels[i] >= 0 && d.labels[i] < classes,
              "{}: label {} of image {} is outside [0, {})", what, d.labels[i], i, classes);
}

}  // namespace cnn
