#include "app/quant_cli.h"

#include <algorithm>
#include <filesystem>

#include "data/load_data.h"
#include "data/normalize.h"
#include "layers/network.h"
#include "runtime/error.h"

namespace cnn {
namespace {

Dataset load_split(const TrainConfig& cfg, const std::string& data_dir, bool test) {
  DataOptions opt = cfg.data;
  if (!data_dir.empty()) opt.dir = data_dir;
  DataSplits s = load_data(opt);
  Dataset& d = test ? s.test : s.train;
  CNN_CHECK(d.n > 0, "the config's dataset has no {} set", test ? "test" : "training");
  return std::move(d);
}

}  // namespace

std::string resolve_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return path;
  for (const char* name : {"best.safetensors", "last.safetensors"}) {
    const fs::path p = fs::path(path) / name;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  CNN_FAIL(
      "{}: a folder without best.safetensors or last.safetensors; expected a run folder "
      "written by ./train or a .safetensors file",
      path);
}

TrainConfig embedded_config(const std::string& path, const CheckpointMeta& meta) {
  TrainConfig cfg = parse_config(meta.config_yaml, path + " (embedded config)");
  CNN_CHECK(meta.input_chw == cfg.model.input_chw,
            "{}: metadata input_chw {} differs from the embedded config's model.input {}", path,
            shape_str(meta.input_chw), shape_str(cfg.model.input_chw));
  return cfg;
}

Fp32Model load_fp32_model(const std::string& path) {
  Fp32Model m;
  m.path = path;
  m.meta = read_checkpoint_meta(path);
  m.cfg = embedded_config(path, m.meta);
  check_checkpoint_can_hold(path, m.meta, m.cfg.model.layers, m.meta.input_chw);
  NetworkOptions o;
  o.max_batch = 1;
  const Network trained(m.cfg.model.layers, m.meta.input_chw, o, Exec{});
  const Checkpoint ck = load_checkpoint_for(path, trained);
  m.folded = fold_batchnorm(m.cfg.model.layers, m.meta.input_chw, ck.params, ck.buffers);
  return m;
}

std::vector<float> calibration_images(const TrainConfig& cfg, const CheckpointMeta& meta, int n,
                                      const std::string& data_dir, int* count) {
  CNN_CHECK(n >= 1, "--calibrate {}: expected at least 1 image", n);
  Dataset d = load_split(cfg, data_dir, false);
  const int c = int(meta.input_chw[0]), h = int(meta.input_chw[1]), w = int(meta.input_chw[2]);
  CNN_CHECK(d.c == c && d.h == h && d.w == w,
            "the training set's images are {}x{}x{}, the checkpoint's input is {}x{}x{}", d.c, d.h,
            d.w, c, h, w);
  const Normalization norm{meta.mean, meta.std};
  validate_normalization(norm, c);
  const int take = std::min(n, d.n);
  const int64_t image = int64_t(c) * h * w;
  std::vector<float> out(size_t(take) * size_t(image));
  for (int i = 0; i < take; ++i) {
    const int64_t src = int64_t(i) * d.n / take;  // evenly spread: every class appears
    normalize_image(d.images.data() + src * image, c, h, w, norm, out.data() + i * image);
  }
  *count = take;
  return out;
}

TestAccuracy test_set_accuracy(
    const TrainConfig& cfg, const CheckpointMeta& meta, int batch, const std::string& data_dir,
    const std::function<std::vector<float>(int n, const float* h_x)>& logits) {
  Dataset d = load_split(cfg, data_dir, true);
  const int c = int(meta.input_chw[0]), h = int(meta.input_chw[1]), w = int(meta.input_chw[2]);
  CNN_CHECK(d.c == c && d.h == h && d.w == w,
            "the test set's images are {}x{}x{}, the checkpoint's input is {}x{}x{}", d.c, d.h, d.w,
            c, h, w);
  const Normalization norm{meta.mean, meta.std};
  validate_normalization(norm, c);
  const int64_t image = int64_t(c) * h * w;
  std::vector<float> x(size_t(batch) * size_t(image));
  int64_t correct = 0;
  for (int b = 0; b < d.n; b += batch) {
    const int cnt = std::min(batch, d.n - b);
    for (int i = 0; i < cnt; ++i)
      normalize_image(d.images.data() + (b + i) * image, c, h, w, norm, x.data() + i * image);
    const std::vector<float> y = logits(cnt, x.data());
    const int classes = int(y.size() / size_t(cnt));
    for (int i = 0; i < cnt; ++i) {
      const float* row = y.data() + int64_t(i) * classes;
      correct += int(std::max_element(row, row + classes) - row) == d.labels[size_t(b + i)];
    }
  }
  return {double(correct) / double(d.n), d.n};
}

}  // namespace cnn
