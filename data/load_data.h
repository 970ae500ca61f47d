#pragma once
// The configured dataset, loaded and split: train, validation (a fixed, seeded part of train held
// out) and test, all conformed to the configured (channels, height, width).
#include <cstdint>
#include <map>
#include <string>

#include "data/data_options.h"
#include "data/dataset.h"

namespace cnn {

struct DataSplits {
  Dataset train, val, test;  // val / test have n == 0 when absent
};

// Extra observation for --check-data; the trainer passes nothing.
struct DataLoadHooks {
  bool skip_and_list_all_bad = false;  // skip every unreadable image and keep all the reasons
  std::map<std::string, int64_t>* train_formats = nullptr;  // source formats seen ("28x28 gray")
  std::map<std::string, int64_t>* test_formats = nullptr;
};

// What every format refuses in the options themselves (channels other than 1 or 3, sizes, the
// validation fraction): the trainer asks before it makes a run folder. Throws cnn::Error naming
// the config key.
void check_data_options(const DataOptions& opt);

// Dispatches on opt.format (idx / folder / list / synthetic), then holds out the validation
// part (check_data_options first). Throws cnn::Error naming the file or the config key at fault.
DataSplits load_data(const DataOptions& opt, const DataLoadHooks* hooks = nullptr);

// Splits `fraction` of `all` (chosen by a permutation from `seed`) off into val; both parts keep
// the original order. Throws when either part would be empty.
void split_validation(Dataset all, double fraction, uint64_t seed, Dataset* train, Dataset* val);

// Converts a dataset to (c, h, w): 1 -> 3 channels replicate, 3 -> 1 by luma; another size is
// resized when `resize`, else refused with a message naming the config keys.
void conform_dataset(Dataset& d, int c, int h, int w, bool resize);

const char* data_format_name(DataFormat f);

}  // namespace cnn
