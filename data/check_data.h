#pragma once
// ./train --check-data: reads every image of the configured dataset and reports what it found.
#include <cstdint>
#include <string>

#include "data/data_options.h"

namespace cnn {

// A multi-line report: sources, counts per class for each split, image formats seen, the
// normalization, and every unreadable file with its reason (all of them are read, whatever
// data.skip_bad_images says). A fatal problem (missing folder, corrupt IDX, ...) ends the report
// with "error: ..." instead of throwing. *problems (if given) receives the number of unreadable
// files plus fatal errors: 0 means the data is clean.
std::string check_data_report(const DataOptions& opt, int64_t* problems = nullptr);

}  // namespace cnn
