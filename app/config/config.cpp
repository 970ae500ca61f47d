#include "app/config/config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "app/config/config_yaml.h"
#include "app/config/did_you_mean.h"
#include "data/load_data.h"  // data_format_name
#include "layers/lr_schedule.h"
#include "layers/param_optimizer.h"  // optimizer_name
#include "runtime/error.h"
#include "runtime/file_io.h"
#include "runtime/text.h"

namespace cnn {

const char* progress_mode_name(ProgressMode p) {
  switch (p) {
    case ProgressMode::Auto:
      return "auto";
    case ProgressMode::On:
      return "on";
    case ProgressMode::Off:
      return "off";
  }
  return "?";
}

int TrainConfig::known_class_count() const {
  if (!data.classes.empty()) return static_cast<int>(data.classes.size());
  if (data.format == DataFormat::Synthetic) return data.synthetic.classes;
  return 0;
}

namespace {

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
const std::vector<std::string> kAlgoNames = {"auto", "naive", "tiled",     "igemm",
                                             "fast", "wgmma", "wgmma-nhwc"};
const std::vector<std::string> kLayerKinds = {
    "conv2d",      "relu",        "maxpool2d", "flatten",        "linear",  "softmax_cross_entropy",
    "batchnorm2d", "batchnorm1d", "avgpool2d", "global_avgpool", "dropout", "residual"};

// Where one layer sits in the file, so that shape errors found later point at it.
struct LayerSite {
  std::string path;  // "model.layers[3].linear" (or "model.layers[3]" for a bare name)
  int line = 0;
  bool named = false;  // the config gave it a name
  int name_line = 0;
  std::vector<LayerSite> branch, shortcut;  // a residual block's layers
  int auto_outputs_line = 0;  // linear: out_features: auto (the number of classes), else 0
};

// What later checks need to know about where things were found.
struct Sites {
  int layers_line = 0;
  int input_line = 0;
  std::vector<LayerSite> layers;
  std::string classes_origin;  // "data.classes (line 31)": where the class count came from
};

// An absent optional section reads like an empty one.
ConfigNode optional_child(const ConfigMap& m, const std::string& key) {
  if (m.has(key)) return m.at(key);
  const ConfigNode& p = m.node();
  return p.child(YAML::Node(), key, p.line());
}

bool valid_name(const std::string& s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.')
      return false;
  return true;
}

// "kernel: 5" or "kernel: [5, 3]" -> (h, w).
void read_pair(const ConfigNode& n, int64_t lo, int* h, int* w) {
  if (n.is_list()) {
    auto items = n.as_list();
    if (items.size() != 2)
      n.fail(fmt::format("expected an integer or a list [height, width], got a list of {} items",
                         items.size()));
    *h = static_cast<int>(items[0].as_int(lo, kIntMax));
    *w = static_cast<int>(items[1].as_int(lo, kIntMax));
    return;
  }
  if (!n.is_scalar())
    n.fail(fmt::format("expected an integer or a list [height, width], got {}", n.describe()));
  *h = *w = static_cast<int>(n.as_int(lo, kIntMax));
}

void read_pair_key(const ConfigMap& m, const std::string& key, int64_t lo, int def_h, int def_w,
                   int* h, int* w) {
  *h = def_h;
  *w = def_w;
  if (m.has(key)) read_pair(m.at(key), lo, h, w);
}

LayerSpec read_layer(const ConfigNode& item, Algo default_algo, LayerSite* site,
                     bool in_block = false);

// A residual block's `layers` (required) or `shortcut` (optional, empty = identity) list.
void read_block_list(const ConfigMap& p, const std::string& key, Algo default_algo,
                     std::vector<LayerSpec>* specs, std::vector<LayerSite>* sites) {
  if (!p.has(key)) {
    if (key == "layers")
      p.require(key, "the block's layers, a list like [conv2d: {...}, relu, conv2d: {...}]");
    return;
  }
  const ConfigNode list = p.at(key);
  if (list.is_null() && key == "shortcut") return;
  const auto items = list.as_list();
  if (items.empty() && key == "layers")
    list.fail("expected at least one layer in the block (the shortcut alone would add x to x)");
  for (const auto& item : items) {
    sites->emplace_back();
    specs->push_back(read_layer(item, default_algo, &sites->back(), true));
  }
}

LayerSpec read_layer(const ConfigNode& item, Algo default_algo, LayerSite* site, bool in_block) {
  LayerSpec spec;
  spec.line = item.line();
  site->line = item.line();
  std::string kind;
  ConfigNode params = item;
  if (item.is_scalar()) {
    kind = item.as_choice(kLayerKinds);
    site->path = item.path();
    params = item.child(YAML::Node(), kind, item.line());
    if (kind == "conv2d" || kind == "maxpool2d" || kind == "linear" || kind == "avgpool2d")
      item.fail(fmt::format("a {} layer needs its parameters, e.g. '- {}'", kind,
                            kind == "conv2d"      ? "conv2d: {out_channels: 32, kernel: 3}"
                            : kind == "maxpool2d" ? "maxpool2d: {kernel: 2}"
                            : kind == "avgpool2d" ? "avgpool2d: {kernel: 2}"
                                                  : "linear: {out_features: 10}"));
    if (kind == "residual")
      item.fail(
          "a residual block needs its layers, e.g. '- residual: {layers: [conv2d: {...}, relu, "
          "conv2d: {...}], shortcut: [...]}'");
  } else if (item.is_map()) {
    std::vector<std::string> keys;
    for (const auto& kv : item.yaml())
      keys.push_back(kv.first.IsScalar() ? excerpt(kv.first.Scalar()) : "?");
    if (keys.size() != 1)
      item.fail(
          fmt::format("expected one layer per item, a one-key map like '- conv2d: {{...}}', "
                      "got keys {}",
                      join_names(keys)));
    const auto kv = *item.yaml().begin();
    const int line = kv.first.Mark().is_null() ? item.line() : kv.first.Mark().line + 1;
    params = item.child(kv.second, keys[0], line);
    site->path = params.path();
    bool known = false;
    for (const auto& k : kLayerKinds) known = known || k == keys[0];
    if (!known)
      params.fail(fmt::format("unknown layer kind{} (known kinds: {})",
                              did_you_mean(keys[0], kLayerKinds), join_names(kLayerKinds)));
    kind = keys[0];
  } else {
    item.fail(
        fmt::format("expected a layer: a name like 'relu' or a one-key map like "
                    "'- conv2d: {{out_channels: 32, kernel: 3}}', got {}",
                    item.describe()));
  }

  if (in_block && kind == "residual")
    params.fail(
        "a residual block inside a residual block is not supported in this version; put the "
        "blocks one after the other");
  if (in_block && kind == "softmax_cross_entropy")
    params.fail("softmax_cross_entropy must be the network's last layer, not inside a block");
  std::vector<std::string> known = {"name"};
  if (kind == "residual")
    known = {"layers", "shortcut", "name"};
  else if (kind == "conv2d")
    known = {"out_channels", "kernel", "stride", "padding", "dilation",
             "groups",       "bias",   "algo",   "name"};
  else if (kind == "maxpool2d" || kind == "avgpool2d")
    known = {"kernel", "stride", "padding", "name"};
  else if (kind == "batchnorm2d" || kind == "batchnorm1d")
    known = {"momentum", "eps", "name"};
  else if (kind == "dropout")
    known = {"p", "name"};
  else if (kind == "linear")
    known = {"out_features", "bias", "algo", "name"};
  ConfigMap p(params, known);
  if (p.has("name")) {
    const ConfigNode n = p.at("name");
    spec.name = n.as_nonempty_string();
    if (!valid_name(spec.name))
      n.fail(
          fmt::format("expected a name of letters, digits, '_', '-' and '.', got '{}'", spec.name));
    site->named = true;
    site->name_line = n.line();
  }
  if (kind == "conv2d" || kind == "linear") {
    spec.bias = p.get_bool("bias", true);
    spec.algo = p.has("algo") ? parse_algo(p.at("algo").as_choice(kAlgoNames)) : default_algo;
  }
  if (kind == "conv2d") {
    spec.kind = LayerKind::Conv2d;
    spec.out_channels =
        static_cast<int>(p.require("out_channels", "the number of output channels, an integer >= 1")
                             .as_int(1, kIntMax));
    read_pair(p.require("kernel", "the kernel size: an integer or [height, width]"), 1,
              &spec.kernel_h, &spec.kernel_w);
    read_pair_key(p, "stride", 1, 1, 1, &spec.stride_h, &spec.stride_w);
    read_pair_key(p, "padding", 0, 0, 0, &spec.pad_h, &spec.pad_w);
    read_pair_key(p, "dilation", 1, 1, 1, &spec.dil_h, &spec.dil_w);
    spec.groups = static_cast<int>(p.get_int("groups", 1, 1, kIntMax));
  } else if (kind == "maxpool2d" || kind == "avgpool2d") {
    spec.kind = kind == "maxpool2d" ? LayerKind::MaxPool2d : LayerKind::AvgPool2d;
    read_pair(p.require("kernel", "the window size: an integer or [height, width]"), 1,
              &spec.kernel_h, &spec.kernel_w);
    read_pair_key(p, "stride", 1, spec.kernel_h, spec.kernel_w, &spec.stride_h, &spec.stride_w);
    read_pair_key(p, "padding", 0, 0, 0, &spec.pad_h, &spec.pad_w);
  } else if (kind == "linear") {
    spec.kind = LayerKind::Linear;
    const ConfigNode out =
        p.require("out_features", "the number of outputs, an integer >= 1 or auto");
    if (out.is_scalar() && out.as_string() == "auto") {
      spec.out_features = 1;  // the number of classes, once the data section is read
      site->auto_outputs_line = out.line();
    } else {
      spec.out_features = static_cast<int>(out.as_int(1, kIntMax));
    }
  } else if (kind == "batchnorm2d" || kind == "batchnorm1d") {
    spec.kind = kind == "batchnorm2d" ? LayerKind::BatchNorm2d : LayerKind::BatchNorm1d;
    spec.momentum = p.get_number("momentum", spec.momentum, between(0, 1));
    spec.eps = p.get_number("eps", spec.eps, between(0, 1, true));
  } else if (kind == "global_avgpool") {
    spec.kind = LayerKind::GlobalAvgPool;
  } else if (kind == "dropout") {
    spec.kind = LayerKind::Dropout;
    spec.dropout_p = p.get_number("p", spec.dropout_p, between(0, 1, false, true));
  } else if (kind == "relu") {
    spec.kind = LayerKind::Relu;
  } else if (kind == "flatten") {
    spec.kind = LayerKind::Flatten;
  } else if (kind == "residual") {
    spec.kind = LayerKind::Residual;
    read_block_list(p, "layers", default_algo, &spec.branch, &site->branch);
    read_block_list(p, "shortcut", default_algo, &spec.shortcut, &site->shortcut);
  } else {
    spec.kind = LayerKind::SoftmaxCrossEntropy;
  }
  return spec;
}

void read_training(const ConfigMap& top, TrainingOptions* t) {
  ConfigMap m(top.require("training", "a training section with at least epochs and batch_size"),
              {"epochs", "batch_size", "seed", "device", "precision", "algo", "deterministic",
               "eval_every_epochs", "eval_from_epoch", "max_steps", "cuda_graph", "autotune_cache",
               "stop_at_accuracy", "label_smoothing", "eval_flip", "gpus", "nccl_library"});
  t->epochs = static_cast<int>(
      m.require("epochs", "the number of passes over the training set, an integer >= 1")
          .as_int(1, 1000000));
  t->batch_size = static_cast<int>(
      m.require("batch_size", "the number of images per step, an integer >= 1").as_int(1, 1 << 20));
  if (m.has("seed")) t->seed = m.at("seed").as_uint64();
  t->device = m.get_choice("device", t->device, {"cpu", "cuda", "auto"});
  t->precision = parse_precision(m.get_choice("precision", "fp32", {"fp32", "tf32", "bf16"}));
  t->algo = parse_algo(m.get_choice("algo", "auto", kAlgoNames));
  t->deterministic = m.get_bool("deterministic", t->deterministic);
  t->eval_every_epochs =
      static_cast<int>(m.get_int("eval_every_epochs", t->eval_every_epochs, 1, kIntMax));
  t->eval_from_epoch =
      static_cast<int>(m.get_int("eval_from_epoch", t->eval_from_epoch, 1, kIntMax));
  t->max_steps = m.get_int("max_steps", t->max_steps, 0);
  t->cuda_graph = m.get_bool("cuda_graph", t->cuda_graph);
  t->autotune_cache = m.get_bool("autotune_cache", t->autotune_cache);
  t->stop_at_accuracy = m.get_number("stop_at_accuracy", t->stop_at_accuracy, between(0, 100));
  // A fraction where a percentage belongs would stop every run after its first evaluation.
  if (t->stop_at_accuracy > 0 && t->stop_at_accuracy <= 1)
    m.at("stop_at_accuracy")
        .fail(fmt::format("is a test accuracy in percent, in (1, 100] or 0 for off; did you mean "
                          "{}?",
                          100 * t->stop_at_accuracy));
  t->label_smoothing =
      m.get_number("label_smoothing", t->label_smoothing, between(0, 1, false, true));
  t->eval_flip = m.get_bool("eval_flip", t->eval_flip);
  t->gpus = static_cast<int>(m.get_int("gpus", t->gpus, 1, 1024));
  t->nccl_library = m.get_string("nccl_library", t->nccl_library);
}

void read_model(const ConfigMap& top, TrainConfig* cfg, Sites* sites) {
  ConfigMap m(top.require("model", "a model section with input and layers"), {"input", "layers"});
  const ConfigNode input_node =
      m.require("input", "the input image size: {channels: C, height: H, width: W}");
  sites->input_line = input_node.line();
  ConfigMap in(input_node, {"channels", "height", "width"});
  const int64_t c =
      in.require("channels", "the number of image channels, an integer >= 1").as_int(1, 4096);
  const int64_t h =
      in.require("height", "the image height in pixels, an integer >= 1").as_int(1, 1 << 16);
  const int64_t w =
      in.require("width", "the image width in pixels, an integer >= 1").as_int(1, 1 << 16);
  cfg->model.input_chw = {c, h, w};

  const ConfigNode layers = m.require("layers", "a list of layers ending in softmax_cross_entropy");
  sites->layers_line = layers.line();
  const auto items = layers.as_list();
  if (items.empty())
    layers.fail("expected a non-empty list of layers ending in softmax_cross_entropy");
  for (const auto& item : items) {
    LayerSite site;
    cfg->model.layers.push_back(read_layer(item, cfg->training.algo, &site));
    sites->layers.push_back(site);
  }
}

void read_data(const ConfigMap& top, TrainConfig* cfg, Sites* sites) {
  ConfigMap m(top.require("data", "a data section with at least format"),
              {"format", "dir", "train", "test", "classes", "channels", "height", "width", "resize",
               "skip_bad_images", "validation_split", "split_seed", "normalize", "drop_last",
               "augment", "synthetic"});
  DataOptions& d = cfg->data;
  const std::string format = m.require("format", "one of idx, folder, list, synthetic")
                                 .as_choice({"idx", "folder", "list", "synthetic"});
  d.format = format == "idx"      ? DataFormat::Idx
             : format == "folder" ? DataFormat::Folder
             : format == "list"   ? DataFormat::List
                                  : DataFormat::Synthetic;
  d.dir = m.get_string("dir", "");
  d.train = m.get_string("train", "");
  d.test = m.get_string("test", "");
  if (d.format == DataFormat::Idx)
    d.dir = m.require("dir", "the folder with the IDX files (format idx)").as_nonempty_string();
  if (d.format == DataFormat::Folder)
    d.train = m.require("train", "the folder with one subfolder per class (format folder)")
                  .as_nonempty_string();
  if (d.format == DataFormat::List)
    d.train =
        m.require("train", "a CSV file of 'path,label' lines (format list)").as_nonempty_string();

  if (m.has("classes")) {
    const ConfigNode cn = m.at("classes");
    const auto items = cn.as_list();
    if (items.size() < 2)
      cn.fail(fmt::format("expected a list of at least 2 class names, got {}", items.size()));
    std::unordered_map<std::string, size_t> seen;  // name -> item: linear, not pairwise
    for (size_t i = 0; i < items.size(); ++i) {
      std::string name = items[i].as_nonempty_string();
      // Class names go into checkpoints (JSON) and result files: bytes that are not UTF-8 would
      // fail there, after the training they were meant to label.
      if (!valid_utf8(name))
        items[i].fail(fmt::format("the class name '{}' is not valid UTF-8", excerpt(name)));
      const auto [it, fresh] = seen.emplace(name, i);
      if (!fresh)
        items[i].fail(fmt::format("the class name '{}' is listed twice (also item [{}])",
                                  excerpt(name), it->second));
      d.classes.push_back(std::move(name));
    }
    sites->classes_origin =
        fmt::format("data.classes (line {}) lists {}", cn.line(), d.classes.size());
  }

  // The images are converted to what the network takes; a differing size here is a mistake.
  const Shape& chw = cfg->model.input_chw;
  const char* dims[3] = {"channels", "height", "width"};
  int* vals[3] = {&d.channels, &d.height, &d.width};
  for (int i = 0; i < 3; ++i) {
    *vals[i] = static_cast<int>(chw[i]);
    if (!m.has(dims[i])) continue;
    const ConfigNode n = m.at(dims[i]);
    const int64_t v = n.as_int(1, kIntMax);
    if (v != chw[i])
      n.fail(fmt::format("expected {} to match model.input.{} (line {}), got {}", chw[i], dims[i],
                         sites->input_line, v));
  }
  if (m.has("resize")) {
    const ConfigNode r = m.at("resize");
    const std::string v = r.is_scalar() ? r.as_string() : "";
    d.resize = v == "stretch" || v == "crop";
    d.resize_crop = v == "crop";
    if (!d.resize) {
      try {
        d.resize = r.as_bool();  // true: stretch, as before the modes had names
      } catch (const Error&) {
        r.fail(fmt::format("expected false, stretch or crop (true means stretch), got {}",
                           r.describe()));
      }
    }
  }
  d.skip_bad_images = m.get_bool("skip_bad_images", d.skip_bad_images);
  d.validation_split = m.get_number("validation_split", 0, between(0, 1, false, true));
  d.split_seed = static_cast<unsigned>(
      m.get_int("split_seed", d.split_seed, 0, std::numeric_limits<unsigned>::max()));
  d.drop_last = m.get_bool("drop_last", d.drop_last);

  if (m.has("normalize") && !m.at("normalize").is_scalar()) {
    ConfigMap n(m.at("normalize"), {"mean", "std"});
    for (const bool is_mean : {true, false}) {
      const char* key = is_mean ? "mean" : "std";
      const ConfigNode ln =
          n.require(key, fmt::format("a list of {} numbers, one per channel", d.channels));
      const auto items = ln.as_list();
      if (static_cast<int>(items.size()) != d.channels)
        ln.fail(fmt::format("expected {} value{} (one per channel, model.input.channels), got {}",
                            d.channels, d.channels == 1 ? "" : "s", items.size()));
      auto& out = is_mean ? d.mean : d.std;
      for (const auto& it : items)
        out.push_back(static_cast<float>(it.as_number(is_mean ? NumRange() : greater_than(0))));
    }
  } else if (m.has("normalize")) {
    m.at("normalize").as_choice({"auto"});  // mean/std computed from the training set
  }

  ConfigMap aug(optional_child(m, "augment"), {"shift", "flip"});
  const int64_t max_shift = std::min(d.height, d.width) - 1;
  d.augment.shift = static_cast<int>(aug.get_int("shift", d.augment.shift, 0, max_shift));
  d.augment.flip = aug.get_bool("flip", d.augment.flip);

  ConfigMap syn(optional_child(m, "synthetic"), {"train", "test", "classes", "seed"});
  SyntheticOptions& s = d.synthetic;
  s.train = static_cast<int>(syn.get_int("train", s.train, 1, kIntMax));
  s.test = static_cast<int>(syn.get_int("test", s.test, 0, kIntMax));
  s.classes = static_cast<int>(syn.get_int("classes", s.classes, 2, 1 << 20));
  s.seed =
      static_cast<unsigned>(syn.get_int("seed", s.seed, 0, std::numeric_limits<unsigned>::max()));
  if (d.format == DataFormat::Synthetic) {
    const int line = syn.has("classes") ? syn.at("classes").line() : syn.node().line();
    if (!d.classes.empty() && static_cast<int>(d.classes.size()) != s.classes)
      m.at("classes").fail(
          fmt::format("expected {} class names to match data.synthetic.classes "
                      "(line {}), got {}",
                      s.classes, line, d.classes.size()));
    if (d.classes.empty())
      sites->classes_origin =
          syn.has("classes")
              ? fmt::format("data.synthetic.classes (line {}) gives {}", line, s.classes)
              : fmt::format("data.synthetic.classes defaults to {}", s.classes);
  }
}

void read_optimizer(const ConfigMap& top, OptimizerOptions* o) {
  ConfigMap m(top.require("optimizer", "an optimizer section with at least lr"),
              {"type", "lr", "momentum", "nesterov", "weight_decay", "decay_biases", "betas", "eps",
               "clip_grad_norm"});
  const std::string type = m.get_choice("type", "sgd", {"sgd", "adam", "adamw"});
  o->type = type == "sgd"    ? OptimizerType::Sgd
            : type == "adam" ? OptimizerType::Adam
                             : OptimizerType::AdamW;
  o->lr = m.require("lr", "the learning rate, a number > 0").as_number(greater_than(0));
  o->momentum = m.get_number("momentum", o->momentum, between(0, 1, false, true));
  o->nesterov = m.get_bool("nesterov", o->nesterov);
  if (o->nesterov && (o->type != OptimizerType::Sgd || o->momentum == 0))
    m.at("nesterov").fail("nesterov needs type sgd with momentum > 0");
  o->weight_decay = m.get_number("weight_decay", o->weight_decay, at_least(0));
  o->decay_biases = m.get_bool("decay_biases", o->decay_biases);
  if (m.has("betas")) {
    const ConfigNode bn = m.at("betas");
    const auto items = bn.as_list();
    if (items.size() != 2)
      bn.fail(fmt::format("expected a list [beta1, beta2], got a list of {} items", items.size()));
    o->beta1 = items[0].as_number(between(0, 1, false, true));
    o->beta2 = items[1].as_number(between(0, 1, false, true));
  }
  o->eps = m.get_number("eps", o->eps, greater_than(0));
  o->clip_grad_norm = m.get_number("clip_grad_norm", o->clip_grad_norm, at_least(0));
}

void read_schedule(const ConfigMap& top, const TrainConfig& cfg, ScheduleOptions* s) {
  ConfigMap m(optional_child(top, "schedule"), {"type", "warmup_epochs", "warmup_start_factor",
                                                "step_epochs", "gamma", "min_lr", "pct_start"});
  s->type = schedule_type(m.get_choice("type", "constant", schedule_names()));
  s->warmup_epochs =
      m.get_number("warmup_epochs", s->warmup_epochs, between(0, cfg.training.epochs));
  s->warmup_start_factor =
      m.get_number("warmup_start_factor", s->warmup_start_factor, between(0, 1, true, false));
  s->step_epochs = m.get_number("step_epochs", s->step_epochs, greater_than(0));
  s->gamma = m.get_number("gamma", s->gamma, between(0, 1, true, false));
  s->min_lr = m.get_number("min_lr", s->min_lr, between(0, cfg.optimizer.lr));
  s->pct_start = m.get_number("pct_start", s->pct_start, between(0, 1, true, true));
}

void read_logging(const ConfigMap& top, LoggingOptions* l) {
  ConfigMap m(optional_child(top, "logging"), {"dir", "every_steps", "progress"});
  if (m.has("dir")) l->dir = m.at("dir").as_nonempty_string();
  l->every_steps = static_cast<int>(m.get_int("every_steps", l->every_steps, 1, kIntMax));
  const std::string p = m.get_choice("progress", "auto", {"auto", "on", "off"});
  l->progress = p == "on" ? ProgressMode::On : p == "off" ? ProgressMode::Off : ProgressMode::Auto;
}

void read_checkpoint(const ConfigMap& top, const TrainConfig& cfg, CheckpointOptions* c) {
  ConfigMap m(optional_child(top, "checkpoint"),
              {"dir", "every_epochs", "every_steps", "keep_best"});
  c->dir = m.has("dir") ? m.at("dir").as_nonempty_string() : cfg.run_dir();
  c->every_epochs = static_cast<int>(m.get_int("every_epochs", c->every_epochs, 0, kIntMax));
  c->every_steps = m.get_int("every_steps", c->every_steps, 0);
  c->keep_best = m.get_bool("keep_best", c->keep_best);
}

// Every layer with its site, those inside residual blocks after their block, in file order.
void flatten_sites(const std::vector<LayerSpec>& specs, const std::vector<LayerSite>& sites,
                   std::vector<std::pair<const LayerSpec*, const LayerSite*>>* out) {
  for (size_t i = 0; i < specs.size(); ++i) {
    out->emplace_back(&specs[i], &sites[i]);
    flatten_sites(specs[i].branch, sites[i].branch, out);
    flatten_sites(specs[i].shortcut, sites[i].shortcut, out);
  }
}

// The shapes through a list of layers from `cur`, each error pointing at its layer (inside a
// residual block: at the layer in the block; a block whose two paths differ: at the block).
Shape chain_checked(const YamlDoc& doc, const std::vector<LayerSpec>& specs,
                    const std::vector<LayerSite>& sites, Shape cur) {
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].kind == LayerKind::Residual) {
      chain_checked(doc, specs[i].branch, sites[i].branch, cur);
      chain_checked(doc, specs[i].shortcut, sites[i].shortcut, cur);
    }
    try {
      cur = layer_output_shape(specs[i], cur);
    } catch (const Error& e) {
      doc.fail(sites[i].path, sites[i].line, e.what());
    }
  }
  return cur;
}

// Names, loss position, shape chaining and class count, each error pointing at its layer.
void check_network(const YamlDoc& doc, TrainConfig* cfg, const Sites& sites) {
  auto& layers = cfg->model.layers;
  const size_t n = layers.size();
  std::vector<std::pair<const LayerSpec*, const LayerSite*>> all;
  flatten_sites(layers, sites.layers, &all);
  for (size_t i = 0; i < all.size(); ++i) {
    const LayerSite& si = *all[i].second;
    if (!si.named) continue;
    for (size_t j = 0; j < i; ++j)
      if (all[j].second->named && all[j].first->name == all[i].first->name)
        doc.fail(si.path + ".name", si.name_line,
                 fmt::format("the name '{}' is already used by {} (line {})", all[i].first->name,
                             all[j].second->path, all[j].second->line));
  }
  for (size_t i = 0; i + 1 < n; ++i)
    if (layers[i].kind == LayerKind::SoftmaxCrossEntropy)
      doc.fail(sites.layers[i].path, sites.layers[i].line,
               "softmax_cross_entropy must be the last layer");
  if (layers.back().kind != LayerKind::SoftmaxCrossEntropy)
    doc.fail(sites.layers.back().path, sites.layers.back().line,
             fmt::format("the last layer must be softmax_cross_entropy (the loss), got {}",
                         layer_kind_name(layers.back().kind)));
  try {
    finalize_layer_specs(layers);
  } catch (const Error& e) {
    doc.fail("model.layers", sites.layers_line, e.what());
  }

  Shape cur = {1};
  cur.insert(cur.end(), cfg->model.input_chw.begin(), cfg->model.input_chw.end());
  chain_checked(doc, layers, sites.layers, cur);
  const NetworkSummary sum = summarize_network(layers, cfg->model.input_chw);
  const int64_t scores = sum.rows.back().out.at(0);
  const int known = cfg->known_class_count();
  if (known > 0 && scores != known) {
    // Blame the layer that sets the number of scores: the last one with outputs of its own.
    size_t k = n - 1;
    while (k > 0 && layers[k].kind != LayerKind::Linear && layers[k].kind != LayerKind::Conv2d) --k;
    const LayerSite& si = sites.layers[k];
    const bool lin = layers[k].kind == LayerKind::Linear;
    const bool conv = layers[k].kind == LayerKind::Conv2d;
    doc.fail(lin    ? si.path + ".out_features"
             : conv ? si.path + ".out_channels"
                    : si.path,
             si.line,
             fmt::format("the network ends in {} class scores but {} classes; expected {}", scores,
                         sites.classes_origin, known));
  }
}

// The class folders of a folder dataset's root, as load_image_folder finds them (sorted,
// hidden ones left out); empty when the root is not a readable folder.
std::vector<std::string> class_folders(const std::string& root) {
  std::vector<std::string> names;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (it->is_directory(ec) && !name.empty() && name[0] != '.') names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// out_features: auto becomes the number of classes: data.classes, data.synthetic.classes, or
// the class folders of a folder dataset. Only the layer that gives the class scores may say it.
void resolve_auto_outputs(const YamlDoc& doc, TrainConfig* cfg, Sites* sites) {
  auto& layers = cfg->model.layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSite& si = sites->layers[i];
    if (!si.auto_outputs_line) continue;
    for (size_t k = i + 1; k < layers.size(); ++k)
      if (layers[k].kind == LayerKind::Linear || layers[k].kind == LayerKind::Conv2d)
        doc.fail(si.path + ".out_features", si.auto_outputs_line,
                 fmt::format("auto (the number of classes) is only for the layer that gives the "
                             "class scores, but model.layers[{}] comes after it",
                             k));
    int classes = cfg->known_class_count();
    std::string origin = sites->classes_origin;
    if (classes == 0 && cfg->data.format == DataFormat::Folder) {
      classes = int(class_folders(cfg->data.train).size());
      origin = fmt::format("the class folders of data.train ({})", cfg->data.train);
      if (classes < 2)
        doc.fail(si.path + ".out_features", si.auto_outputs_line,
                 fmt::format("auto needs the number of classes, but data.train '{}' {}; "
                             "expected root/<class>/*.png with at least 2 classes, or list the "
                             "names in data.classes",
                             cfg->data.train,
                             std::filesystem::is_directory(cfg->data.train)
                                 ? fmt::format("has {} class folder(s)", classes)
                                 : std::string("is not a folder")));
      sites->classes_origin = fmt::format("{} gives {}", origin, classes);
    }
    if (classes == 0)
      doc.fail(si.path + ".out_features", si.auto_outputs_line,
               fmt::format("auto needs the number of classes: list them in data.classes (format "
                           "{} does not name them before the data is read)",
                           data_format_name(cfg->data.format)));
    layers[i].out_features = classes;
    cfg->notes.push_back(fmt::format("{}.out_features: auto = {} ({})", si.path, classes, origin));
  }
}

std::string fmt_double(double v) {
  return fmt::format("{}", v);
}

std::string fmt_floats(const std::vector<float>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + fmt::format("{}", v[i]);
  return out + "]";
}

std::string fmt_layer(const LayerSpec& s) {
  std::string p = "name: " + yaml_quote(s.name);
  switch (s.kind) {
    case LayerKind::Conv2d:
      p += fmt::format(", out_channels: {}", s.out_channels);
      if (s.dil_h != 1 || s.dil_w != 1) p += fmt::format(", dilation: [{}, {}]", s.dil_h, s.dil_w);
      if (s.groups != 1) p += fmt::format(", groups: {}", s.groups);
      [[fallthrough]];
    case LayerKind::MaxPool2d:
    case LayerKind::AvgPool2d:
      p += fmt::format(", kernel: [{}, {}], stride: [{}, {}], padding: [{}, {}]", s.kernel_h,
                       s.kernel_w, s.stride_h, s.stride_w, s.pad_h, s.pad_w);
      break;
    case LayerKind::Linear:
      p += fmt::format(", out_features: {}", s.out_features);
      break;
    case LayerKind::BatchNorm2d:
    case LayerKind::BatchNorm1d:
      p += fmt::format(", momentum: {}, eps: {}", fmt_double(s.momentum), fmt_double(s.eps));
      break;
    case LayerKind::Dropout:
      p += fmt::format(", p: {}", fmt_double(s.dropout_p));
      break;
    default:
      break;
  }
  if (s.kind == LayerKind::Conv2d || s.kind == LayerKind::Linear)
    p += fmt::format(", bias: {}, algo: {}", s.bias, algo_name(s.algo));
  return fmt::format("    - {}: {{{}}}\n", layer_kind_name(s.kind), p);
}

// A residual block in block style, its layers as fmt_layer writes them, indented under it.
std::string fmt_residual(const LayerSpec& s) {
  std::string out = fmt::format("    - residual:\n        name: {}\n", yaml_quote(s.name));
  const auto list = [&out](const char* key, const std::vector<LayerSpec>& specs) {
    out += fmt::format("        {}:{}\n", key, specs.empty() ? " []" : "");
    for (const LayerSpec& c : specs) out += "      " + fmt_layer(c);
  };
  list("layers", s.branch);
  list("shortcut", s.shortcut);
  return out;
}

}  // namespace

TrainConfig parse_config(const std::string& yaml_text, const std::string& source_name,
                         const std::vector<std::string>& overrides) {
  // yaml-cpp's time and memory grow with the text (a 48 MB key took 33 s and 2.9 GB to refuse).
  CNN_CHECK(yaml_text.size() <= kMaxConfigBytes,
            "{}: a config of {} bytes is larger than the limit of {} bytes", source_name,
            yaml_text.size(), kMaxConfigBytes);
  YamlDoc doc(source_name);
  YAML::Node tree;
  try {
    tree = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) CNN_FAIL("{}: malformed YAML: {}", source_name, e.msg);
    CNN_FAIL("{}:{}:{}: malformed YAML: {}", source_name, e.mark.line + 1, e.mark.column + 1,
             e.msg);
  }
  for (const auto& o : overrides) doc.apply_override(tree, o);

  TrainConfig cfg;
  cfg.source_path = source_name;
  const ConfigNode root(doc, tree, "", 1);
  ConfigMap top(root, {"name", "model", "data", "optimizer", "schedule", "training", "logging",
                       "checkpoint"});
  if (top.has("name")) {
    const ConfigNode n = top.at("name");
    cfg.name = n.as_nonempty_string();
    if (!valid_name(cfg.name))
      n.fail(fmt::format("expected a run name of letters, digits, '_', '-' and '.', got '{}'",
                         cfg.name));
  } else {
    cfg.name = std::filesystem::path(source_name).stem().string();
    if (!valid_name(cfg.name))
      doc.fail("name", 1,
               fmt::format("the file name gives the run name '{}', which is not a valid folder "
                           "name; set name: to letters, digits, '_', '-' and '.'",
                           cfg.name));
  }

  Sites sites;
  read_training(top, &cfg.training);
  read_model(top, &cfg, &sites);
  read_data(top, &cfg, &sites);
  read_optimizer(top, &cfg.optimizer);
  read_schedule(top, cfg, &cfg.schedule);
  read_logging(top, &cfg.logging);
  read_checkpoint(top, cfg, &cfg.checkpoint);
  resolve_auto_outputs(doc, &cfg, &sites);
  check_network(doc, &cfg, sites);

  cfg.resolved_yaml = config_to_yaml(cfg);
  return cfg;
}

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  const std::vector<uint8_t> bytes = read_file(path, {kMaxConfigBytes, "config file"});
  return parse_config(std::string(bytes.begin(), bytes.end()), path, overrides);
}

std::string config_to_yaml(const TrainConfig& cfg) {
  const DataOptions& d = cfg.data;
  const OptimizerOptions& o = cfg.optimizer;
  const ScheduleOptions& s = cfg.schedule;
  const TrainingOptions& t = cfg.training;
  std::string y =
      "# Resolved configuration: every key, with defaults and --set overrides applied.\n"
      "# ./train --config <this file> reads it back unchanged.\n";
  y += fmt::format("name: {}\n", yaml_quote(cfg.name));
  y += "model:\n";
  y += fmt::format("  input: {{channels: {}, height: {}, width: {}}}\n", cfg.model.input_chw.at(0),
                   cfg.model.input_chw.at(1), cfg.model.input_chw.at(2));
  y += "  layers:\n";
  for (const auto& l : cfg.model.layers)
    y += l.kind == LayerKind::Residual ? fmt_residual(l) : fmt_layer(l);

  y += "data:\n";
  y += fmt::format("  format: {}\n", data_format_name(d.format));
  y += fmt::format("  dir: {}\n  train: {}\n  test: {}\n", yaml_quote(d.dir), yaml_quote(d.train),
                   yaml_quote(d.test));
  if (!d.classes.empty()) {
    y += "  classes: [";
    for (size_t i = 0; i < d.classes.size(); ++i) y += (i ? ", " : "") + yaml_quote(d.classes[i]);
    y += "]\n";
  }
  y += fmt::format("  channels: {}\n  height: {}\n  width: {}\n", d.channels, d.height, d.width);
  y +=
      fmt::format("  resize: {}\n  skip_bad_images: {}\n  validation_split: {}\n  split_seed: {}\n",
                  !d.resize       ? "false"
                  : d.resize_crop ? "crop"
                                  : "stretch",
                  d.skip_bad_images, fmt_double(d.validation_split), d.split_seed);
  if (d.mean.empty())
    y += "  normalize: auto\n";
  else
    y += fmt::format("  normalize: {{mean: {}, std: {}}}\n", fmt_floats(d.mean), fmt_floats(d.std));
  y += fmt::format("  drop_last: {}\n", d.drop_last);
  y += fmt::format("  augment: {{shift: {}, flip: {}}}\n", d.augment.shift, d.augment.flip);
  y += fmt::format("  synthetic: {{train: {}, test: {}, classes: {}, seed: {}}}\n",
                   d.synthetic.train, d.synthetic.test, d.synthetic.classes, d.synthetic.seed);

  y += "optimizer:\n";
  y += fmt::format("  type: {}\n  lr: {}\n  momentum: {}\n  nesterov: {}\n", optimizer_name(o.type),
                   fmt_double(o.lr), fmt_double(o.momentum), o.nesterov);
  y += fmt::format("  weight_decay: {}\n  decay_biases: {}\n  betas: [{}, {}]\n  eps: {}\n",
                   fmt_double(o.weight_decay), o.decay_biases, fmt_double(o.beta1),
                   fmt_double(o.beta2), fmt_double(o.eps));
  y += fmt::format("  clip_grad_norm: {}\n", fmt_double(o.clip_grad_norm));

  y += "schedule:\n";
  y += fmt::format("  type: {}\n  warmup_epochs: {}\n  warmup_start_factor: {}\n",
                   schedule_name(s.type), fmt_double(s.warmup_epochs),
                   fmt_double(s.warmup_start_factor));
  y += fmt::format("  step_epochs: {}\n  gamma: {}\n  min_lr: {}\n  pct_start: {}\n",
                   fmt_double(s.step_epochs), fmt_double(s.gamma), fmt_double(s.min_lr),
                   fmt_double(s.pct_start));

  y += "training:\n";
  y += fmt::format("  epochs: {}\n  batch_size: {}\n  seed: {}\n  device: {}\n", t.epochs,
                   t.batch_size, t.seed, t.device);
  y += fmt::format("  precision: {}\n  algo: {}\n  deterministic: {}\n",
                   precision_name(t.precision), algo_name(t.algo), t.deterministic);
  y += fmt::format("  eval_every_epochs: {}\n  eval_from_epoch: {}\n  max_steps: {}\n",
                   t.eval_every_epochs, t.eval_from_epoch, t.max_steps);
  y += fmt::format("  cuda_graph: {}\n", t.cuda_graph);
  y += fmt::format("  autotune_cache: {}\n  stop_at_accuracy: {}\n", t.autotune_cache,
                   fmt_double(t.stop_at_accuracy));
  y += fmt::format("  label_smoothing: {}\n  eval_flip: {}\n", fmt_double(t.label_smoothing),
                   t.eval_flip);
  y += fmt::format("  gpus: {}\n", t.gpus);
  if (!t.nccl_library.empty()) y += fmt::format("  nccl_library: {}\n", yaml_quote(t.nccl_library));

  y += "logging:\n";
  y += fmt::format("  dir: {}\n  every_steps: {}\n  progress: {}\n", yaml_quote(cfg.logging.dir),
                   cfg.logging.every_steps, progress_mode_name(cfg.logging.progress));

  y += "checkpoint:\n";
  y += fmt::format("  dir: {}\n  every_epochs: {}\n  every_steps: {}\n  keep_best: {}\n",
                   yaml_quote(cfg.checkpoint.dir), cfg.checkpoint.every_epochs,
                   cfg.checkpoint.every_steps, cfg.checkpoint.keep_best);
  return y;
}

}  // namespace cnn
