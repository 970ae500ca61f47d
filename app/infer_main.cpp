// ./infer: classifies image files with a trained checkpoint. The checkpoint carries the model,
// class names, input size and normalization, so no config is needed.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "app/cli_common.h"
#include "app/config/config.h"
#include "app/image_paths.h"
#include "data/image_folder.h"
#include "data/normalize.h"
#include "layers/checkpoint/checkpoint.h"
#include "layers/fold_batchnorm.h"
#include "layers/network.h"
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

void print(const Prediction& p, const std::vector<std::string>& names, const std::string& format,
           bool first) {
  if (format == "json") {
    nlohmann::json j = {{"path", p.path},
                        {"class", names[size_t(p.top[0].first)]},
                        {"probability", p.top[0].second}};
    for (const auto& [c, prob] : p.top)
      j["top"].push_back({{"class", names[size_t(c)]}, {"probability", prob}});
    // File names are bytes: ones that are not UTF-8 get U+FFFD instead of stopping the output.
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else if (format == "csv") {
    if (first) {
      std::printf("path,class,probability");
      for (size_t i = 1; i < p.top.size(); ++i)
        std::printf(",top%zu_class,top%zu_probability", i + 1, i + 1);
      std::printf("\n");
    }
    std::printf("%s,%s,%.6f", csv_field(p.path).c_str(),
                csv_field(names[size_t(p.top[0].first)]).c_str(), p.top[0].second);
    for (size_t i = 1; i < p.top.size(); ++i)
      std::printf(",%s,%.6f", csv_field(names[size_t(p.top[i].first)]).c_str(), p.top[i].second);
    std::printf("\n");
  } else {
    std::string others;
    for (size_t i = 1; i < p.top.size(); ++i)
      others += fmt::format("  {} {:.1f}%", names[size_t(p.top[i].first)], 100 * p.top[i].second);
    std::printf("%-40s %-14s %6.2f%%%s\n", printable(p.path).c_str(),
                printable(names[size_t(p.top[0].first)]).c_str(), 100 * p.top[0].second,
                printable(others).c_str());
  }
}

int infer(const std::string& ckpt_path, int topk, const std::string& format,
          const std::string& device, int batch, const std::vector<std::string>& paths) {
  const CheckpointMeta meta = read_checkpoint_meta(ckpt_path);
  const TrainConfig cfg = parse_config(meta.config_yaml, ckpt_path + " (embedded config)");
  CNN_CHECK(meta.input_chw == cfg.model.input_chw,
            "{}: metadata input_chw {} differs from the embedded config's model.input {}",
            ckpt_path, shape_str(meta.input_chw), shape_str(cfg.model.input_chw));
  const int c = int(meta.input_chw[0]), h = int(meta.input_chw[1]), w = int(meta.input_chw[2]);
  Normalization norm{meta.mean, meta.std};
  validate_normalization(norm, c);

  check_checkpoint_can_hold(ckpt_path, meta, cfg.model.layers, meta.input_chw);

  Exec ex;
  ex.device = resolve_device(device);
  NetworkOptions nopt;
  nopt.max_batch = batch;
  nopt = with_env_switches(nopt, process_env_switches());
  // The checkpoint is read against the trained layout, then every conv/linear + batchnorm pair
  // is folded into one layer (layers/fold_batchnorm.h): eval mode in fewer passes.
  NetworkOptions layout_opt;
  layout_opt.max_batch = 1;
  const Network layout(cfg.model.layers, meta.input_chw, layout_opt, Exec{});
  const Checkpoint ck = load_checkpoint_for(ckpt_path, layout);
  const FoldedNetwork folded =
      fold_batchnorm(cfg.model.layers, meta.input_chw, ck.params, ck.buffers);
  Network net(folded.specs, meta.input_chw, nopt, ex);
  CNN_CHECK(size_t(net.num_classes()) == meta.class_names.size(),
            "{}: the network has {} classes but the checkpoint names {}", ckpt_path,
            net.num_classes(), meta.class_names.size());
  net.params_from_host(folded.params);
  net.buffers_from_host(folded.buffers);

  ExpandedPaths expanded = expand_image_paths(paths);
  int failures = int(expanded.errors.size());
  for (const auto& e : expanded.errors) std::fprintf(stderr, "infer: %s\n", printable(e).c_str());

  const size_t image_floats = size_t(c) * size_t(h) * size_t(w);
  std::vector<float> h_x(size_t(batch) * image_floats);
  Buffer<float> d_x(h_x.size(), ex.device);
  std::vector<float> logits(size_t(batch) * size_t(net.num_classes()));
  std::vector<std::string> batch_paths;
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
      print(p, meta.class_names, format, first);
      first = false;
    }
    std::fflush(stdout);
    batch_paths.clear();
  };
  for (const auto& path : expanded.files) {
    try {
      // Other sizes are resized: users' own images rarely come at the training size.
      std::vector<uint8_t> pixels = load_image_file(path, c, h, w, true);
      normalize_image(pixels.data(), c, h, w, norm, h_x.data() + batch_paths.size() * image_floats);
      batch_paths.push_back(path);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "infer: %s\n", printable(e.what()).c_str());
      ++failures;
      continue;
    }
    if (int(batch_paths.size()) == batch) flush();
  }
  flush();
  if (failures) std::fprintf(stderr, "infer: %d of the inputs failed\n", failures);
  return failures ? 1 : 0;
}

}  // namespace
}  // namespace cnn

int main(int argc, char** argv) {
  return cnn::run_main("infer", [&] {
    CLI::App app{"Classify images with a checkpoint written by ./train"};
    app.set_version_flag("--version", cnn::version_string("infer"));
    std::string ckpt, format = "table", device = "auto";
    int topk = 1, batch = 256;
    std::vector<std::string> paths;
    app.add_option("--checkpoint", ckpt, "checkpoint (.safetensors) written by ./train")
        ->required();
    app.add_option("--topk", topk, "also list the K most likely classes")
        ->check(CLI::Range(1, 1000));
    app.add_option("--format", format, "table, json (one object per line) or csv")
        ->check(CLI::IsMember({"table", "json", "csv"}));
    app.add_option("--device", device, "cpu, cuda or auto")
        ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    app.add_option("--batch", batch, "images per forward pass")->check(CLI::Range(1, 4096));
    app.add_option("paths", paths, "image files, folders (recursive) or glob patterns")->required();
    CLI11_PARSE(app, argc, argv);
    return cnn::infer(ckpt, topk, format, device, batch, paths);
  });
}
