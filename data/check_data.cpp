#include "data/check_data.h"

#include <map>
#include <vector>

#include "data/load_data.h"
#include "data/normalize.h"
#include "runtime/error.h"

namespace cnn {

namespace {

constexpr size_t kMaxListedBadFiles = 200;

void describe(std::string& out, const char* name, const Dataset& d,
              const std::map<std::string, int64_t>* formats, bool formats_include_val = false) {
  if (d.n == 0 && d.skipped == 0) {
    out += fmt::format("{}: none\n", name);
    return;
  }
  out += fmt::format("{}: {} images of {}x{}x{} (CxHxW) from {}\n", name, d.n, d.c, d.h, d.w,
                     d.source);
  if (formats && !formats->empty()) {
    out += formats_include_val ? "  source formats (train + validation):" : "  source formats:";
    for (const auto& [f, count] : *formats) out += fmt::format(" {} x{};", f, count);
    out.back() = '\n';
  }
  std::vector<int64_t> per_class(d.class_names.size(), 0);
  for (int32_t l : d.labels)
    if (l >= 0 && size_t(l) < per_class.size()) ++per_class[l];
  out += "  per class:";
  for (size_t k = 0; k < per_class.size(); ++k)
    out += fmt::format(" {}={}", d.class_names[k], per_class[k]);
  out += "\n";
  for (size_t k = 0; k < per_class.size(); ++k)
    if (per_class[k] == 0)
      out += fmt::format("  note: class '{}' has no images here\n", d.class_names[k]);
  if (d.skipped) {
    out += fmt::format("  unreadable: {} file(s)\n", d.skipped);
    for (size_t i = 0; i < d.skipped_examples.size() && i < kMaxListedBadFiles; ++i)
      out += "    " + d.skipped_examples[i] + "\n";
    if (d.skipped_examples.size() > kMaxListedBadFiles)
      out += fmt::format("    ... and {} more\n", d.skipped_examples.size() - kMaxListedBadFiles);
  }
}

}  // namespace

std::string check_data_report(const DataOptions& opt, int64_t* problems) {
  std::string out = fmt::format("data check: format {}", data_format_name(opt.format));
  if (!opt.dir.empty()) out += ", dir " + opt.dir;
  if (!opt.train.empty()) out += ", train " + opt.train;
  if (!opt.test.empty()) out += ", test " + opt.test;
  out += fmt::format("; images converted to {}x{}x{}{}\n", opt.channels, opt.height, opt.width,
                     opt.resize ? " (resizing)" : "");
  int64_t bad = 0;
  try {
    std::map<std::string, int64_t> train_formats, test_formats;
    DataLoadHooks hooks;
    hooks.skip_and_list_all_bad = true;
    hooks.train_formats = &train_formats;
    hooks.test_formats = &test_formats;
    DataSplits s = load_data(opt, &hooks);
    describe(out, "train", s.train, &train_formats, opt.validation_split > 0);
    if (opt.validation_split > 0) describe(out, "validation", s.val, nullptr);
    describe(out, "test", s.test, &test_formats);
    bad = s.train.skipped + s.test.skipped;
    const bool configured = !opt.mean.empty();
    const Normalization norm = resolve_normalization(opt.mean, opt.std, s.train);
    out += fmt::format("normalization ({}): {}\n",
                       configured ? "from the config" : "computed over the training set",
                       normalization_str(norm));
    if (bad && !opt.skip_bad_images)
      out += fmt::format(
          "{} unreadable file(s): training would stop at the first (data.skip_bad_images is "
          "false)\n",
          bad);
    out += bad ? fmt::format("result: {} problem(s)\n", bad) : "result: ok\n";
  } catch (const std::exception& e) {
    ++bad;
    out += fmt::format("error: {}\n", e.what());
  }
  if (problems) *problems = bad;
  return out;
}

}  // namespace cnn
