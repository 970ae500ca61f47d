#pragma once
// ./train --check-data: reads every image of the configured dataset and reports what it found.
#include <cstdint>
#include <string>

#include "data/data_options.h"

namespace cnn {

// A multi-line report: sources, counts per class for each split, the source image sizes as
// ranges, the normalization, and the unusable files grouped by cause, with a count and a few
// example files each (all files are read, whatever data.skip_bad_images says). A fatal problem
// (missing folder, corrupt IDX, ...) ends the report with "error: ..." instead of throwing.
// *problems (if given) receives the number of unreadable files plus fatal errors: 0 means the data
// is clean.
std::string check_data_report(const DataOptions& opt, int64_t* problems = nullptr);

// What fetches a missing dataset into `dir`: "fetch it with: scripts/get_data.sh mnist" (the
// name guessed from the folder's name), or the script's usage when the name says nothing.
std::string dataset_download_hint(const std::string& dir);

}  // namespace cnn
