// ./infer: classifies image files with a trained checkpoint. The checkpoint carries the model,
// class names, input size and normalization, so no config is needed.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "app/cli_common.h"
#include "app/config/config.h"
#include "app/image_paths.h"
#include "app/quant_cli.h"
#include "app/train/evaluate.h"
#include "data/image_folder.h"
#include "data/normalize.h"
#include "layers/checkpoint/checkpoint.h"
#include "layers/fold_batchnorm.h"
#include "layers/network.h"
#include "layers/quant/int8_network.h"
#include "layers/quant/quant_file.h"
#include "runtime/env_switches.h"
#include "runtime/error.h"
#include "runtime/text.h"

namespace cnn {
namespace {

struct Prediction {
  std::string path;
  std::vector<std::pair<int, double>> top;  // (class, probability), best first
};

std::vector<std::pair<int, double>> top_k(const float* logits, int classes, int k) {
  double mx = logits[0];
  for (int c = 1; c < classes; ++c) mx = std::max(mx, double(logits[c]));
  std::vector<std::pair<int, double>> p(static_cast<size_t>(classes));
  double sum = 0;
  for (int c = 0; c < classes; ++c) sum += std::exp(double(logits[c]) - mx);
  for (int c = 0; c < classes; ++c) p[size_t(c)] = {c, std::exp(double(logits[c]) - mx) / sum};
  std::stable_sort(p.begin(), p.end(), [](auto& a, auto& b) { return a.second > b.second; });
  p.resize(size_t(std::min(k, classes)));
  return p;
}

// Control characters and bytes that are not UTF-8 are written as \xHH (printable()).
std::string csv_field(const std::string& raw) {
  const std::string s = printable(raw);
  if (s.find_first_of(",\"") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

// Column widths of the table: the longest path (up to 60, longer ones overflow) and class name.
struct TableLayout {
  size_t path = 5, name = 5;
  bool truth = false;  // a "true" column (labels from the folders)
};

std::string table_header(const TableLayout& t, int topk) {
  std::string h = fmt::format("{:<{}}", "image", t.path);
  if (t.truth) h += fmt::format("  {:<{}}", "true", t.name);
  for (int i = 1; i <= topk; ++i)
    h += fmt::format("  {:<{}} {:>7}", i == 1 ? std::string("class") : fmt::format("top{}", i),
                     t.name, i == 1 ? std::string("prob") : fmt::format("p{}", i));
  return h;
}

void print(const Prediction& p, const std::vector<std::string>& names, const std::string& format,
           bool first, const TableLayout& t, int truth) {
  if (format == "json") {
    nlohmann::json j = {{"path", p.path},
                        {"class", names[size_t(p.top[0].first)]},
                        {"probability", p.top[0].second}};
    if (truth >= 0) j["true_class"] = names[size_t(truth)];
    for (const auto& [c, prob] : p.top)
      j["top"].push_back({{"class", names[size_t(c)]}, {"probability", prob}});
    // File names are bytes: ones that are not UTF-8 get U+FFFD instead of stopping the output.
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else if (format == "csv") {
    if (first) {
      std::printf("path,class,probability");
      for (size_t i = 1; i < p.top.size(); ++i)
        std::printf(",top%zu_class,top%zu_probability", i + 1, i + 1);
      if (truth >= 0) std::printf(",true_class");
      std::printf("\n");
    }
    std::printf("%s,%s,%.6f", csv_field(p.path).c_str(),
                csv_field(names[size_t(p.top[0].first)]).c_str(), p.top[0].second);
    for (size_t i = 1; i < p.top.size(); ++i)
      std::printf(",%s,%.6f", csv_field(names[size_t(p.top[i].first)]).c_str(), p.top[i].second);
    if (truth >= 0) std::printf(",%s", csv_field(names[size_t(truth)]).c_str());
    std::printf("\n");
  } else {
    if (first) std::printf("%s\n", table_header(t, int(p.top.size())).c_str());
    std::string row = fmt::format("{:<{}}", printable(p.path), t.path);
    if (t.truth) row += fmt::format("  {:<{}}", printable(names[size_t(truth)]), t.name);
    for (const auto& [c, prob] : p.top)
      row += fmt::format("  {:<{}} {:>6.2f}%", printable(names[size_t(c)]), t.name, 100 * prob);
    if (t.truth && truth != p.top[0].first) row += "  (wrong)";
    std::printf("%s\n", row.c_str());
  }
}

// The class index of each image from its parent folder's name, or -1 for all when some parent
// is not a class name (then there is no ground truth, unless `required`, which fails instead).
std::vector<int> labels_from_folders(const std::vector<std::string>& files,
                                     const std::vector<std::string>& names, bool required) {
  std::vector<int> labels;
  for (const auto& f : files) {
    const std::string parent = std::filesystem::path(f).parent_path().filename().string();
    const auto it = std::find(names.begin(), names.end(), parent);
    if (it == names.end()) {
      CNN_CHECK(!required,
                "--labels-from-folders: {} sits in folder '{}', which is not one of the model's "
                "{} classes",
                f, parent, names.size());
      return std::vector<int>(files.size(), -1);
    }
    labels.push_back(int(it - names.begin()));
  }
  return labels;
}

struct InferOptions {
  std::string checkpoint, format = "table", device = "auto", precision = "fp32";
  std::string method = calibration_method_name(kDefaultCalibration), data_dir;
  int topk = 1, batch = 256, calibrate = 0;
  bool labels_required = false, evaluate = false;
  std::vector<std::string> paths;
};

// The model ./infer runs: the float network (FP32 or TF32) or the int8 one, behind one forward.
struct LoadedModel {
  CheckpointMeta meta;
  TrainConfig cfg;
  std::unique_ptr<Network> net;
  std::unique_ptr<Int8Network> qnet;
  std::string description;  // "fp32", "int8 (percentile calibration)", ...
  const float* forward(int n, const float* d_x) {
    return net ? net->forward(n, d_x) : qnet->forward(n, d_x);
  }
  int num_classes() const { return net ? net->num_classes() : qnet->num_classes(); }
};

LoadedModel load_model(const InferOptions& o, const Exec& ex) {
  const std::string ckpt_path = resolve_checkpoint(o.checkpoint);
  LoadedModel m;
  const bool int8 = o.precision == "int8";
  if (is_quantized_file(ckpt_path)) {
    CNN_CHECK(int8,
              "{}: an int8 model written by ./quantize; run it with --precision int8 (got "
              "--precision {})",
              ckpt_path, o.precision);
    CNN_CHECK(o.calibrate == 0, "--calibrate: {} is quantized already; drop --calibrate",
              ckpt_path);
    m.meta = read_quantized_meta(ckpt_path);
    m.cfg = embedded_config(ckpt_path, m.meta);
    const QuantizedModel qm = load_quantized(ckpt_path, m.cfg.model.layers, m.meta.input_chw);
    m.qnet = std::make_unique<Int8Network>(qm, o.batch, ex, !process_env_switches().int8_direct,
                                           process_env_switches().int8_fuse_classifier);
    m.description = fmt::format("int8 ({} calibration)", qm.method);
  } else if (int8) {
    CNN_CHECK(o.calibrate > 0,
              "--precision int8: {} is a float checkpoint; quantize it with ./quantize, or add "
              "--calibrate N to quantize it here on N training images",
              ckpt_path);
    const Fp32Model fp = load_fp32_model(ckpt_path);
    m.meta = fp.meta;
    m.cfg = fp.cfg;
    int count = 0;
    const std::vector<float> calib =
        calibration_images(fp.cfg, fp.meta, o.calibrate, o.data_dir, &count);
    const QuantizedModel qm = quantize_network(fp.folded, fp.meta.input_chw, calib.data(), count,
                                               parse_calibration_method(o.method), ex);
    m.qnet = std::make_unique<Int8Network>(qm, o.batch, ex, !process_env_switches().int8_direct,
                                           process_env_switches().int8_fuse_classifier);
    m.description = fmt::format("int8 ({} calibration on {} images)", qm.method, count);
  } else {
    const Fp32Model fp = load_fp32_model(ckpt_path);
    m.meta = fp.meta;
    m.cfg = fp.cfg;
    NetworkOptions nopt;
    nopt.max_batch = o.batch;
    nopt = with_env_switches(nopt, process_env_switches());
    m.net = std::make_unique<Network>(fp.folded.specs, fp.meta.input_chw, nopt, ex);
    m.net->params_from_host(fp.folded.params);
    m.net->buffers_from_host(fp.folded.buffers);
    m.description = o.precision;
  }
  CNN_CHECK(size_t(m.num_classes()) == m.meta.class_names.size(),
            "{}: the network has {} classes but the checkpoint names {}", ckpt_path,
            m.num_classes(), m.meta.class_names.size());
  return m;
}

// --evaluate: the accuracy on the config's test set.
int evaluate_test_set(LoadedModel& m, const InferOptions& o, const Exec& ex) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t image = shape_numel(m.meta.input_chw);
  Buffer<float> d_x(size_t(o.batch) * size_t(image), ex.device);
  const TestAccuracy a =
      test_set_accuracy(m.cfg, m.meta, o.batch, o.data_dir, [&](int n, const float* h_x) {
        d_x.copy_from(h_x, Device::CPU, size_t(n) * size_t(image));
        const float* d_y = m.forward(n, d_x.data());
        std::vector<float> y(size_t(n) * size_t(m.num_classes()));
        raw_copy(y.data(), Device::CPU, d_y, ex.device, y.size() * sizeof(float));
        return y;
      });
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("test accuracy %.2f%% on %lld images, %s, %s (%.2f s)\n", 100 * a.accuracy,
              (long long)a.count, m.description.c_str(), device_name(ex.device), secs);
  return 0;
}

int infer(const InferOptions& o) {
  const int topk = o.topk, batch = o.batch;
  const std::string& format = o.format;
  // Checked before the model loads: a forgotten path is the command line's error, not the model's.
  CNN_CHECK(o.evaluate || !o.paths.empty(),
            "paths is required: name image files, folders or globs, or pass --evaluate for the "
            "config's test set");
  Exec ex;
  ex.device = resolve_device(o.device);
  if (o.precision == "tf32") ex.precision = Precision::TF32;
  LoadedModel model = load_model(o, ex);
  if (o.evaluate) return evaluate_test_set(model, o, ex);
  const CheckpointMeta& meta = model.meta;
  const TrainConfig& cfg = model.cfg;
  const int c = int(meta.input_chw[0]), h = int(meta.input_chw[1]), w = int(meta.input_chw[2]);
  Normalization norm{meta.mean, meta.std};
  validate_normalization(norm, c);
  const bool labels_required = o.labels_required;
  const std::vector<std::string>& paths = o.paths;
  struct {
    LoadedModel& m;
    const float* forward(int n, const float* x) { return m.forward(n, x); }
    int num_classes() const { return m.num_classes(); }
  } net{model};

  // Timed from here: images/s is about reading and classifying, not loading the model.
  const auto start = std::chrono::steady_clock::now();
  ExpandedPaths expanded = expand_image_paths(paths);
  int failures = int(expanded.errors.size());
  for (const auto& e : expanded.errors) std::fprintf(stderr, "infer: %s\n", printable(e).c_str());
  const std::vector<int> truth =
      labels_from_folders(expanded.files, meta.class_names, labels_required);
  const bool have_truth = !truth.empty() && truth[0] >= 0;
  TableLayout layout;
  layout.truth = have_truth;
  for (const auto& f : expanded.files)
    layout.path = std::max(layout.path, std::min<size_t>(f.size(), 60));
  for (const auto& n : meta.class_names) layout.name = std::max(layout.name, n.size());
  EvalResult confusion;  // row = folder's class, column = prediction
  confusion.classes = net.num_classes();
  confusion.confusion.assign(size_t(confusion.classes) * size_t(confusion.classes), 0);
  int64_t classified = 0, correct = 0;

  const size_t image_floats = size_t(c) * size_t(h) * size_t(w);
  std::vector<float> h_x(size_t(batch) * image_floats);
  Buffer<float> d_x(h_x.size(), ex.device);
  std::vector<float> logits(size_t(batch) * size_t(net.num_classes()));
  std::vector<std::string> batch_paths;
  std::vector<int> batch_truth;
  bool first = true;
  auto flush = [&] {
    if (batch_paths.empty()) return;
    const int n = int(batch_paths.size());
    d_x.copy_from(h_x.data(), Device::CPU, size_t(n) * image_floats);
    const float* d_logits = net.forward(n, d_x.data());
    raw_copy(logits.data(), Device::CPU, d_logits, ex.device,
             size_t(n) * size_t(net.num_classes()) * sizeof(float));
    for (int i = 0; i < n; ++i) {
      Prediction p{
          batch_paths[size_t(i)],
          top_k(logits.data() + size_t(i) * size_t(net.num_classes()), net.num_classes(), topk)};
      const int t = batch_truth[size_t(i)];
      print(p, meta.class_names, format, first, layout, t);
      first = false;
      ++classified;
      if (t >= 0) {
        ++confusion.confusion[size_t(t) * size_t(confusion.classes) + size_t(p.top[0].first)];
        ++confusion.count;
        correct += t == p.top[0].first;
      }
    }
    std::fflush(stdout);
    batch_paths.clear();
    batch_truth.clear();
  };
  for (size_t k = 0; k < expanded.files.size(); ++k) {
    const std::string& path = expanded.files[k];
    try {
      // Other sizes are resized: users' own images rarely come at the training size.
      // As in training when it cropped (data.resize: crop), else stretched.
      std::vector<uint8_t> pixels = load_image_file(path, c, h, w, true, cfg.data.resize_crop);
      normalize_image(pixels.data(), c, h, w, norm, h_x.data() + batch_paths.size() * image_floats);
      batch_paths.push_back(path);
      batch_truth.push_back(have_truth ? truth[k] : -1);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "infer: %s\n", printable(e.what()).c_str());
      ++failures;
      continue;
    }
    if (int(batch_paths.size()) == batch) flush();
  }
  flush();

  // The closing lines: on stdout under a table, on stderr under JSON/CSV (which stay parseable).
  std::FILE* out = format == "table" ? stdout : stderr;
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string closing = fmt::format(
      "{} image{} in {:.2f} s ({:.1f} images/s, {})", classified, classified == 1 ? "" : "s", secs,
      double(classified) / std::max(secs, 1e-9), device_name(ex.device));
  if (expanded.skipped)
    closing += fmt::format(
        "; skipped {} file{} without an image extension (.png .bmp .jpg .jpeg), e.g. {}",
        expanded.skipped, expanded.skipped == 1 ? "" : "s", expanded.skipped_example);
  if (failures)
    closing += fmt::format("; {} input{} failed (see above)", failures, failures == 1 ? "" : "s");
  std::fprintf(out, "%s\n", closing.c_str());
  if (confusion.count > 0) {
    std::fprintf(out, "accuracy %.2f%% (%lld of %lld; true classes from the folder names)\n",
                 100 * double(correct) / double(confusion.count), (long long)correct,
                 (long long)confusion.count);
    std::fprintf(out, "confusion matrix (rows: true class, columns: predicted):\n%s",
                 format_confusion(confusion, meta.class_names).c_str());
  }
  return failures ? 1 : 0;
}

}  // namespace
}  // namespace cnn

int main(int argc, char** argv) {
  return cnn::run_main("infer", [&] {
    CLI::App app{"Classify images with a checkpoint written by ./train"};
    app.set_version_flag("--version", cnn::version_string("infer"));
    cnn::InferOptions o;
    app.add_option("--checkpoint", o.checkpoint,
                   "checkpoint (.safetensors) written by ./train or ./quantize, or a run folder "
                   "(takes best.safetensors, else last.safetensors)")
        ->required();
    app.add_flag("--labels-from-folders", o.labels_required,
                 "the folder each image sits in names its true class: report accuracy and a "
                 "confusion matrix (automatic when every folder is a class name)");
    app.add_option("--topk", o.topk, "also list the K most likely classes")
        ->check(CLI::Range(1, 1000));
    app.add_option("--format", o.format, "table, json (one object per line) or csv")
        ->check(CLI::IsMember({"table", "json", "csv"}));
    app.add_option("--device", o.device, "cpu, cuda or auto")
        ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    app.add_option("--batch", o.batch, "images per forward pass")->check(CLI::Range(1, 4096));
    app.add_option("--precision", o.precision,
                   "fp32, tf32 or int8 (a model from ./quantize, or a float checkpoint with "
                   "--calibrate)")
        ->check(CLI::IsMember({"fp32", "tf32", "int8"}));
    app.add_option("--calibrate", o.calibrate,
                   "with --precision int8 and a float checkpoint: quantize it here, calibrating "
                   "on N training images")
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--method", o.method, "calibration for --calibrate: max, percentile or mse")
        ->check(CLI::IsMember({"max", "percentile", "mse"}));
    app.add_flag("--evaluate", o.evaluate,
                 "print the accuracy on the config's test set instead of classifying files");
    app.add_option("--data", o.data_dir,
                   "dataset folder instead of the config's data.dir (--evaluate, --calibrate)");
    app.add_option("paths", o.paths, "image files, folders (recursive) or glob patterns");
    if (!cnn::parse_command_line(app, argc, argv, "infer")) return 0;
    return cnn::infer(o);
  });
}
