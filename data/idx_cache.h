#pragma once
// Gunzipping Fashion-MNIST's 47 MB of training images is most of a run's start-up on a fast GPU
// (docs/training.md has the numbers), so a gzip IDX image file is decoded once into a plain copy
// beside it, "<file>.decoded", that later runs read instead. The copy's header names the source's
// size, modification time and its gzip trailer (the CRC-32 and length of the decoded bytes,
// gzip's own hash of what the copy holds); a copy that does not match, is unreadable or fails the
// IDX checks is ignored and written again. The copy is written atomically, so concurrent runs
// never read a torn one; its pixels are not checksummed again on every read (that would cost
// about as much as reading them), so damage inside a complete copy goes unnoticed: delete it.
// Only gzip sources of at least kMinCachedSource bytes are cached (a raw IDX file is read as fast
// as the copy would be); DataOptions::decoded_cache (CNN_DATA_CACHE=0) turns it off.
#include <cstddef>
#include <string>

#include "data/idx.h"

namespace cnn {

constexpr size_t kMinCachedSource = size_t(1) << 20;

enum class DecodeCache { Off, Hit, Written, Unwritable };

// read_idx_images(path) through the decoded copy (read_idx_images alone when !use_copy); *how
// (if given) says what happened.
IdxImages read_idx_images_cached(const std::string& path, DecodeCache* how = nullptr,
                                 bool use_copy = true);

// The decoded copy's path for a source path.
std::string decoded_cache_path(const std::string& source);

}  // namespace cnn
