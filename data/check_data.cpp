#include "data/check_data.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <map>
#include <vector>

#include "data/image_folder.h"
#include "data/load_data.h"
#include "data/normalize.h"
#include "runtime/error.h"

namespace cnn {

namespace {

constexpr size_t kExamplesPerCause = 3;

// "where file: reason" without ": reason" (the cause's line says it once).
std::string example_file(const std::string& example, const std::string& reason) {
  const std::string tail = ": " + reason;
  if (example.size() > tail.size() &&
      example.compare(example.size() - tail.size(), tail.size(), tail) == 0)
    return example.substr(0, example.size() - tail.size());
  return example;
}

// "problems: 420 file(s) in 2 cause(s)", then per cause (most files first) its count, its reason
// and a few of its files.
void describe_bad_files(std::string& out, const Dataset& d) {
  struct Cause {
    std::string reason;
    bool varies = false;  // members' reasons differ in their numbers
    std::vector<size_t> files;
  };
  std::vector<Cause> causes;
  std::map<std::string, size_t> index;
  const size_t listed = std::min(d.skipped_examples.size(), d.skipped_reasons.size());
  for (size_t i = 0; i < listed; ++i) {
    const std::string& r = d.skipped_reasons[i];
    auto [it, added] = index.emplace(cause_of(r), causes.size());
    if (added) causes.push_back({r, false, {}});
    Cause& c = causes[it->second];
    c.varies = c.varies || r != c.reason;
    c.files.push_back(i);
  }
  std::stable_sort(causes.begin(), causes.end(),
                   [](const Cause& a, const Cause& b) { return a.files.size() > b.files.size(); });
  out += fmt::format("  unusable: {} file(s), {} cause(s)\n", d.skipped, causes.size());
  for (const Cause& c : causes) {
    out += fmt::format("    {} x {}{}\n", c.files.size(), c.reason,
                       c.varies ? " (numbers vary by file)" : "");
    for (size_t k = 0; k < c.files.size() && k < kExamplesPerCause; ++k) {
      const size_t i = c.files[k];
      out += "      " +
             (c.varies ? d.skipped_examples[i] : example_file(d.skipped_examples[i], c.reason)) +
             "\n";
    }
    if (c.files.size() > kExamplesPerCause)
      out += fmt::format("      ... and {} more\n", c.files.size() - kExamplesPerCause);
  }
  if (size_t(d.skipped) > listed)
    out += fmt::format("    ({} more not itemized)\n", size_t(d.skipped) - listed);
}

// "WxH channels" formats summarized: ranges of width and height, the commonest sizes, channels.
std::string describe_formats(const std::map<std::string, int64_t>& formats) {
  int64_t min_w = INT64_MAX, max_w = 0, min_h = INT64_MAX, max_h = 0;
  std::map<std::string, int64_t> sizes, channels;
  for (const auto& [f, count] : formats) {
    long long w = 0, h = 0;
    char word[32] = {0};
    if (std::sscanf(f.c_str(), "%lldx%lld %31s", &w, &h, word) < 2) continue;
    min_w = std::min<int64_t>(min_w, w);
    max_w = std::max<int64_t>(max_w, w);
    min_h = std::min<int64_t>(min_h, h);
    max_h = std::max<int64_t>(max_h, h);
    sizes[fmt::format("{}x{}", w, h)] += count;
    const std::string rest =
        f.substr(f.find(' ') == std::string::npos ? f.size() : f.find(' ') + 1);
    channels[rest.empty() ? "?" : rest] += count;
  }
  if (sizes.empty()) return "";
  std::vector<std::pair<int64_t, std::string>> by_count;
  for (const auto& [s, n] : sizes) by_count.push_back({-n, s});
  std::sort(by_count.begin(), by_count.end());
  std::string out;
  if (sizes.size() == 1 && channels.size() == 1)
    return fmt::format("  source images: all {} {}\n", by_count[0].second, channels.begin()->first);
  if (sizes.size() == 1) {
    out = fmt::format("  source size: all {}", by_count[0].second);
  } else {
    out = fmt::format("  source sizes: width {}..{}, height {}..{} ({} different); most common:",
                      min_w, max_w, min_h, max_h, sizes.size());
    for (size_t i = 0; i < by_count.size() && i < 3; ++i)
      out += fmt::format("{} {} x{}", i ? "," : "", by_count[i].second, -by_count[i].first);
  }
  out += "; channels:";
  for (const auto& [c, n] : channels) out += fmt::format(" {} x{};", c, n);
  out.back() = '\n';
  return out;
}

void describe(std::string& out, const char* name, const Dataset& d,
              const std::map<std::string, int64_t>* formats, bool formats_include_val = false) {
  if (d.n == 0 && d.skipped == 0) {
    out += fmt::format("{}: none\n", name);
    return;
  }
  out += fmt::format("{}: {} images of {}x{}x{} (CxHxW) from {}\n", name, d.n, d.c, d.h, d.w,
                     d.source);
  if (formats && !formats->empty()) {
    std::string f = describe_formats(*formats);
    if (formats_include_val && !f.empty()) f.insert(f.size() - 1, " (train + validation)");
    out += f;
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
  if (d.skipped) describe_bad_files(out, d);
}

}  // namespace

std::string dataset_download_hint(const std::string& dir) {
  std::string lower = dir;
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  const char* name = lower.find("fashion") != std::string::npos ? "fashion-mnist"
                     : lower.find("mnist") != std::string::npos ? "mnist"
                                                                : nullptr;
  if (!name)
    return fmt::format(
        "scripts/get_data.sh mnist|fashion-mnist {} fetches MNIST or Fashion-MNIST there", dir);
  const bool default_dir = dir == std::string("datasets/") + name;
  return fmt::format("fetch it with: scripts/get_data.sh {}{}", name, default_dir ? "" : " " + dir);
}

std::string check_data_report(const DataOptions& opt, int64_t* problems) {
  std::string out = fmt::format("data check: format {}", data_format_name(opt.format));
  if (!opt.dir.empty()) out += ", dir " + opt.dir;
  if (!opt.train.empty()) out += ", train " + opt.train;
  if (!opt.test.empty()) out += ", test " + opt.test;
  out += fmt::format("; images converted to {}x{}x{}{}\n", opt.channels, opt.height, opt.width,
                     opt.resize ? " (resizing)" : "");
  int64_t bad = 0;
  std::map<std::string, int64_t> train_formats, test_formats;  // filled as far as it got
  try {
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
          "{} unusable file(s): training would stop at the first (data.skip_bad_images is "
          "false)\n",
          bad);
    out += bad ? fmt::format("result: {} problem(s)\n", bad) : "result: ok\n";
  } catch (const std::exception& e) {
    ++bad;
    out += fmt::format("error: {}\n", e.what());
    // The sizes read before the error still tell what the images are (e.g. all of another size).
    for (const auto& [name, formats] :
         {std::pair{"train", &train_formats}, {"test", &test_formats}})
      if (!formats->empty())
        out += fmt::format("{} (as far as read):\n{}", name, describe_formats(*formats));
  }
  if (problems) *problems = bad;
  return out;
}

}  // namespace cnn
