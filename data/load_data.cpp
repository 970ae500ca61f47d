#include "data/load_data.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "data/batch_sampler.h"
#include "data/check_data.h"
#include "data/idx.h"
#include "data/image_folder.h"
#include "data/synthetic.h"
#include "runtime/error.h"
#include "runtime/hash_rng.h"

namespace cnn {

namespace {

constexpr uint64_t kValidationStream = 0x56414C4944ull;  // "VALID"

Dataset subset(const Dataset& all, const std::vector<int32_t>& idx, const std::string& source) {
  Dataset d;
  d.n = int(idx.size());
  d.c = all.c;
  d.h = all.h;
  d.w = all.w;
  d.class_names = all.class_names;
  d.source = source;
  const size_t sz = size_t(all.image_size());
  d.images.resize(idx.size() * sz);
  d.labels.resize(idx.size());
  for (size_t j = 0; j < idx.size(); ++j) {
    std::copy_n(all.images.data() + size_t(idx[j]) * sz, sz, d.images.data() + j * sz);
    d.labels[j] = all.labels[idx[j]];
  }
  return d;
}

ImageLoadOptions image_options(const DataOptions& opt, const DataLoadHooks* hooks,
                               std::map<std::string, int64_t>* formats) {
  ImageLoadOptions io;
  io.channels = opt.channels;
  io.height = opt.height;
  io.width = opt.width;
  io.resize = opt.resize;
  io.crop = opt.resize_crop;
  io.skip_bad_images = opt.skip_bad_images;
  if (hooks && hooks->skip_and_list_all_bad) {
    io.skip_bad_images = true;
    io.keep_skipped = std::numeric_limits<size_t>::max();
  }
  io.source_formats = formats;
  return io;
}

void load_idx(const DataOptions& opt, const DataLoadHooks* hooks, DataSplits& s) {
  CNN_CHECK(!opt.dir.empty(), "data.dir is empty: the idx format needs the folder of the files");
  std::string images, labels;
  try {
    images = find_idx_file(opt.dir, "train-images-idx3-ubyte");
    labels = find_idx_file(opt.dir, "train-labels-idx1-ubyte");
  } catch (const Error& e) {
    CNN_FAIL("{}; {}", e.what(), dataset_download_hint(opt.dir));
  }
  const IdxExpect expect{opt.height, opt.width, opt.resize};
  s.train = load_idx_dataset(images, labels, opt.classes, expect, opt.decoded_cache);
  const std::string ti = find_idx_file_optional(opt.dir, "t10k-images-idx3-ubyte");
  const std::string tl = find_idx_file_optional(opt.dir, "t10k-labels-idx1-ubyte");
  CNN_CHECK(ti.empty() == tl.empty(), "{}: {} exists but not its {} file", opt.dir,
            ti.empty() ? tl : ti,
            ti.empty() ? "t10k-images-idx3-ubyte[.gz]" : "t10k-labels-idx1-ubyte[.gz]");
  if (!ti.empty()) {
    s.test = load_idx_dataset(ti, tl, s.train.class_names, expect, opt.decoded_cache);
  } else {
    spdlog::warn("{}: no t10k-* files, so there is no test set", opt.dir);
  }
  auto note = [](const Dataset& d, std::map<std::string, int64_t>* f) {
    if (f && d.n) (*f)[fmt::format("{}x{} gray (IDX)", d.w, d.h)] += d.n;
  };
  if (hooks) {
    note(s.train, hooks->train_formats);
    note(s.test, hooks->test_formats);
  }
}

}  // namespace

void check_data_options(const DataOptions& opt) {
  CNN_CHECK(opt.channels == 1 || opt.channels == 3,
            "data.channels (model.input.channels) is {}, expected 1 or 3: the loaders give "
            "grayscale or RGB images",
            opt.channels);
  CNN_CHECK(
      opt.height > 0 && opt.width > 0 && opt.height <= kMaxImageSide && opt.width <= kMaxImageSide,
      "data.height/width are {}x{}, expected 1..{}", opt.height, opt.width, kMaxImageSide);
  CNN_CHECK(opt.validation_split >= 0 && opt.validation_split < 1,
            "data.validation_split is {}, expected a fraction in [0, 1)", opt.validation_split);
}

const char* data_format_name(DataFormat f) {
  switch (f) {
    case DataFormat::Idx:
      return "idx";
    case DataFormat::Folder:
      return "folder";
    case DataFormat::List:
      return "list";
    case DataFormat::Synthetic:
      return "synthetic";
  }
  return "?";
}

void conform_dataset(Dataset& d, int c, int h, int w, bool resize) {
  if (d.n == 0 || (d.c == c && d.h == h && d.w == w)) return;
  CNN_CHECK(resize || (d.h == h && d.w == w),
            "{}: images are {}x{} (WxH) but data.width/height say {}x{} (set data.resize: true "
            "to resize them)",
            d.source, d.w, d.h, w, h);
  CNN_CHECK(c == 1 || c == 3, "data.channels is {}, expected 1 or 3", c);
  const size_t in_plane = size_t(d.h) * d.w, out_plane = size_t(h) * w;
  std::vector<uint8_t> out(size_t(d.n) * c * out_plane);  // (N, C, H, W)
  std::vector<uint8_t> chan(size_t(c) * in_plane);        // one image, channels converted
  for (int i = 0; i < d.n; ++i) {
    const uint8_t* src = d.images.data() + size_t(i) * d.c * in_plane;
    if (d.c == c) {
      std::copy_n(src, chan.size(), chan.begin());
    } else if (d.c == 1) {
      for (int k = 0; k < c; ++k) std::copy_n(src, in_plane, chan.begin() + k * in_plane);
    } else {  // RGB -> gray by the luma used for files (image_folder.cpp)
      for (size_t j = 0; j < in_plane; ++j)
        chan[j] = uint8_t((src[j] * 19595u + src[in_plane + j] * 38470u +
                           src[2 * in_plane + j] * 7471u + 0x8000u) >>
                          16);
    }
    uint8_t* dst = out.data() + size_t(i) * c * out_plane;
    if (d.h == h && d.w == w) {
      std::copy(chan.begin(), chan.end(), dst);
    } else {
      const std::vector<uint8_t> r = resize_chw(chan.data(), c, d.h, d.w, h, w);
      std::copy(r.begin(), r.end(), dst);
    }
  }
  d.images = std::move(out);
  d.c = c;
  d.h = h;
  d.w = w;
}

void split_validation(Dataset all, double fraction, uint64_t seed, Dataset* train, Dataset* val) {
  CNN_CHECK(fraction > 0 && fraction < 1, "data.validation_split is {}, expected in (0, 1)",
            fraction);
  const int64_t n_val = std::llround(all.n * fraction);
  CNN_CHECK(n_val >= 1 && n_val < all.n,
            "data.validation_split {} of {} training images leaves {} for validation and {} for "
            "training; both need at least one",
            fraction, all.n, n_val, all.n - n_val);
  std::vector<int32_t> perm = epoch_permutation(all.n, mix64(seed ^ kValidationStream), 0);
  std::vector<int32_t> val_idx(perm.begin(), perm.begin() + n_val);
  std::vector<int32_t> train_idx(perm.begin() + n_val, perm.end());
  std::sort(val_idx.begin(), val_idx.end());
  std::sort(train_idx.begin(), train_idx.end());
  const std::string src = all.source;
  *val =
      subset(all, val_idx, fmt::format("{} (validation: {} held out, seed {})", src, n_val, seed));
  Dataset t = subset(all, train_idx, src);
  t.skipped = all.skipped;
  t.skipped_examples = std::move(all.skipped_examples);
  t.skipped_reasons = std::move(all.skipped_reasons);
  *train = std::move(t);
}

DataSplits load_data(const DataOptions& opt, const DataLoadHooks* hooks) {
  check_data_options(opt);
  DataSplits s;
  std::map<std::string, int64_t>* train_formats = hooks ? hooks->train_formats : nullptr;
  std::map<std::string, int64_t>* test_formats = hooks ? hooks->test_formats : nullptr;
  switch (opt.format) {
    case DataFormat::Idx:
      load_idx(opt, hooks, s);
      break;
    case DataFormat::Folder:
      CNN_CHECK(!opt.train.empty(), "data.train is empty: the folder format needs the root folder");
      s.train = load_image_folder(opt.train, image_options(opt, hooks, train_formats), opt.classes);
      if (!opt.test.empty())
        s.test = load_image_folder(opt.test, image_options(opt, hooks, test_formats),
                                   s.train.class_names);
      break;
    case DataFormat::List:
      CNN_CHECK(!opt.train.empty(), "data.train is empty: the list format needs a CSV file");
      s.train = load_image_list(opt.train, image_options(opt, hooks, train_formats), opt.classes);
      if (!opt.test.empty())
        s.test =
            load_image_list(opt.test, image_options(opt, hooks, test_formats), s.train.class_names);
      break;
    case DataFormat::Synthetic: {
      const SyntheticOptions& so = opt.synthetic;
      s.train = make_synthetic(so.train, so.classes, so.seed, SyntheticSplit::Train, opt.channels,
                               opt.height, opt.width);
      if (so.test > 0)
        s.test = make_synthetic(so.test, so.classes, so.seed, SyntheticSplit::Test, opt.channels,
                                opt.height, opt.width);
      const std::string fmt_name = fmt::format("{}x{} synthetic", opt.width, opt.height);
      if (train_formats) (*train_formats)[fmt_name] += s.train.n;
      if (test_formats && s.test.n) (*test_formats)[fmt_name] += s.test.n;
      break;
    }
  }
  conform_dataset(s.train, opt.channels, opt.height, opt.width, opt.resize);
  conform_dataset(s.test, opt.channels, opt.height, opt.width, opt.resize);
  if (opt.validation_split > 0)
    split_validation(std::move(s.train), opt.validation_split, opt.split_seed, &s.train, &s.val);

  validate_dataset(s.train, "training set " + s.train.source);
  if (s.val.n) validate_dataset(s.val, "validation set " + s.val.source);
  if (s.test.n) validate_dataset(s.test, "test set " + s.test.source);
  spdlog::info("data: {} train, {} validation, {} test images of {}x{}x{}, {} classes ({})",
               s.train.n, s.val.n, s.test.n, s.train.c, s.train.h, s.train.w, s.train.num_classes(),
               data_format_name(opt.format));
  return s;
}

}  // namespace cnn
