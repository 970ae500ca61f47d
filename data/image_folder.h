#pragma once
// Images from files: one image file decoded to the model's input, folders of class
// subfolders (root/<class>/*.{png,bmp,jpg,jpeg}), and CSV list files ("path,label").
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace cnn {

constexpr int kMaxImageSide = 16384;  // larger images are refused before decoding
// A list file larger than this is refused before it is read (10 million rows fit).
constexpr uint64_t kMaxListFileBytes = uint64_t(1) << 30;
// A list whose integer labels imply more classes than this and than it has rows is refused.
constexpr size_t kMaxListClasses = 1024;

// How decoded images are conformed to the model's input.
struct ImageLoadOptions {
  int channels = 1, height = 28, width = 28;  // target; channels 1 or 3
  bool resize = false;                        // another size is resized (stb resize), else refused
  bool crop = false;  // resize keeping the aspect ratio: center-crop to the target's, then scale
  bool skip_bad_images = false;  // undecodable images are skipped and counted, else fatal
  size_t keep_skipped = 5;       // how many "file: reason" lines of skipped images to keep
  // When set, counts the source formats seen, e.g. "32x32 RGB" -> 1200 (for --check-data).
  std::map<std::string, int64_t>* source_formats = nullptr;
};

// Decodes one encoded image (PNG, BMP, JPEG) held in memory into (C, H, W) uint8: gray is
// replicated to RGB, RGB(A) becomes gray by ITU-R 601 luma (as PIL's convert("L")), alpha is
// dropped, a size mismatch is resized or refused. 16-bit and HDR images and sides above
// kMaxImageSide are refused before decoding. Throws cnn::Error with the reason (no file name).
// `format`, when given, receives the source format ("WxH gray|gray+alpha|RGB|RGBA"). crop (with
// resize): the largest centered region of the target's aspect ratio is scaled, so nothing is
// stretched (the shorter side is kept whole, the longer one loses equal parts at both ends).
std::vector<uint8_t> decode_image(const uint8_t* bytes, size_t size, int c, int h, int w,
                                  bool resize, std::string* format = nullptr, bool crop = false);

// The cause of an unusable image: its reason with each run of digits as '#', so that reasons
// that differ only in sizes or byte counts count as one ("image is #x# (WxH) but ...").
std::string cause_of(const std::string& reason);

// Resizes a (c, h, w) uint8 image to (c, oh, ow), plane by plane (stb resize, as for files).
std::vector<uint8_t> resize_chw(const uint8_t* src, int c, int h, int w, int oh, int ow);

// One image file as the model's input (for ./infer): (C, H, W) uint8; errors read "path: reason".
std::vector<uint8_t> load_image_file(const std::string& path, int c, int h, int w, bool resize,
                                     bool crop = false);

// root/<class>/*.{png,bmp,jpg,jpeg} (extensions case-insensitive, files sorted by name, hidden
// entries ignored). class_names empty: the sorted subfolder names; else exactly these folders,
// in this order, which must all exist (the test set passes the training set's names).
Dataset load_image_folder(const std::string& root, const ImageLoadOptions& opt,
                          const std::vector<std::string>& class_names = {});

// A CSV file of "path,label" lines: relative paths are relative to the CSV's folder; label is
// a class index or a class name; blank lines, '#' comments and a "path,label" header are
// skipped. class_names empty: integer labels give "0".."max", names give their sorted set.
Dataset load_image_list(const std::string& csv_path, const ImageLoadOptions& opt,
                        const std::vector<std::string>& class_names = {});

}  // namespace cnn
