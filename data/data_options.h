#pragma once
// What the config's `data:` section says, as plain values (the app parses YAML into this).
#include <string>
#include <vector>

namespace cnn {

enum class DataFormat { Idx, Folder, List, Synthetic };

struct AugmentOptions {
  int shift = 0;      // random translation by up to this many pixels (zero-padded crop)
  bool flip = false;  // random horizontal flip
};

struct SyntheticOptions {  // a procedurally generated dataset that needs no download
  int train = 2000, test = 500;
  int classes = 4;
  unsigned seed = 7;
};

struct DataOptions {
  DataFormat format = DataFormat::Idx;
  std::string dir;  // idx: folder with train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz],
                    //      t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]
  std::string train;  // folder: root with one subfolder per class; list: CSV "path,label"
  std::string test;   // same for the test set (empty: no test set)
  std::vector<std::string> classes;  // class names (idx/list; folder takes subfolder names)
  int channels = 1, height = 28, width = 28;  // what images are converted to
  bool resize = false;                        // resize images of another size (else refuse them)
  bool resize_crop = false;  // resize keeping the aspect ratio: the shorter side, center-cropped
  bool skip_bad_images = false;  // skip undecodable images, count and list the first few
  double validation_split = 0;   // fraction of the training set held out for validation
  unsigned split_seed = 42;      // fixes which training images are held out for validation
  std::vector<float> mean, std;  // per channel; empty = computed from the training set
  bool drop_last = false;        // drop the final partial training batch
  bool decoded_cache = true;     // a decoded copy beside gzip IDX image files (data/idx_cache.h)
  AugmentOptions augment;
  SyntheticOptions synthetic;
};

}  // namespace cnn
