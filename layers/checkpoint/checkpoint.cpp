#include "layers/checkpoint/checkpoint.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>

#include "layers/checkpoint/safetensors.h"
#include "runtime/error.h"
#include "runtime/text.h"

namespace cnn {
namespace {

constexpr const char* kFormat = "cnn-trainer-checkpoint-1";
constexpr const char* kOptimizerPrefix = "optimizer.";
// Counters beyond 2^53 cannot even be told apart as doubles (the step in a learning-rate formula):
// larger is corruption, not a long run.
constexpr int64_t kMaxCounter = int64_t(1) << 53;
// The largest image side and the channel counts the data loaders produce.
constexpr int64_t kMaxInputSide = 16384;

int64_t get_int(const SafetensorsFile& f, const std::string& key) {
  const std::string& v = f.metadata_value(key);
  try {
    size_t used = 0;
    long long x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  CNN_FAIL("{}: metadata '{}' is '{}', expected an integer", f.path(), key, excerpt(v));
}

int64_t get_counter(const SafetensorsFile& f, const std::string& key) {
  const int64_t v = get_int(f, key);
  CNN_CHECK(v >= 0 && v <= kMaxCounter, "{}: metadata '{}' is {}, expected 0..2^53", f.path(), key,
            v);
  return v;
}

double get_double(const SafetensorsFile& f, const std::string& key) {
  const std::string& v = f.metadata_value(key);
  try {
    size_t used = 0;
    const double x = std::stod(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  CNN_FAIL("{}: metadata '{}' is '{}', expected a number", f.path(), key, excerpt(v));
}

uint64_t get_uint64(const SafetensorsFile& f, const std::string& key) {
  const std::string& v = f.metadata_value(key);
  try {
    size_t used = 0;
    const unsigned long long x = std::stoull(v, &used);
    if (used == v.size() && !v.empty() && v[0] != '-') return x;
  } catch (const std::exception&) {
  }
  CNN_FAIL("{}: metadata '{}' is '{}', expected an unsigned integer", f.path(), key, excerpt(v));
}

// A JSON list of strings, integers or (finite) numbers. Each item's type and range is checked
// first: nlohmann's get<> casts 9.2e19 to int64 and 1e300 to float, which is undefined (UBSan,
// found by fuzz/fuzz_safetensors).
template <class T>
std::vector<T> get_json_list(const SafetensorsFile& f, const std::string& key) {
  nlohmann::json list;
  const std::string& text = f.metadata_value(key);
  CNN_CHECK(json_nesting_depth(text) <= 1, "{}: metadata '{}' nests lists, expected a flat list",
            f.path(), key);
  try {
    list = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
  }
  bool ok = list.is_array();
  for (const auto& v : list) {
    if constexpr (std::is_same_v<T, std::string>) {
      ok = ok && v.is_string();
    } else if constexpr (std::is_integral_v<T>) {
      ok = ok &&
           (v.is_number_integer() &&
            (v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max())
                                    : v.get<int64_t>() >= int64_t(std::numeric_limits<T>::min())));
    } else {
      ok = ok && v.is_number() && std::abs(v.get<double>()) <= std::numeric_limits<T>::max();
    }
  }
  CNN_CHECK(ok, "{}: metadata '{}' is not a JSON list of the expected type", f.path(), key);
  return list.get<std::vector<T>>();
}

// An input (C, H, W) a checkpoint may describe: one the data loaders produce.
bool input_fits(const Shape& chw) {
  return chw.size() == 3 && (chw[0] == 1 || chw[0] == 3) && chw[1] >= 1 &&
         chw[1] <= kMaxInputSide && chw[2] >= 1 && chw[2] <= kMaxInputSide;
}

CheckpointMeta meta_of(const SafetensorsFile& f) {
  const std::string* format = f.find_metadata("format");
  CNN_CHECK(format && *format == kFormat,
            "{}: not a checkpoint of this trainer (metadata format "
            "'{}', expected '{}')",
            f.path(), excerpt(format ? *format : ""), kFormat);
  CheckpointMeta m;
  m.config_yaml = f.metadata_value("config");
  m.class_names = get_json_list<std::string>(f, "classes");
  m.input_chw = get_json_list<int64_t>(f, "input_chw");
  m.mean = get_json_list<float>(f, "mean");
  m.std = get_json_list<float>(f, "std");
  m.position.epoch = get_counter(f, "epoch");
  m.position.batch_in_epoch = get_counter(f, "batch_in_epoch");
  m.position.global_step = get_counter(f, "global_step");
  m.position.best_accuracy = get_double(f, "best_accuracy");
  CNN_CHECK(m.position.best_accuracy >= -1 && m.position.best_accuracy <= 1,
            "{}: metadata 'best_accuracy' is {}, expected -1 (none) or a fraction in [0, 1]",
            f.path(), m.position.best_accuracy);
  m.seed = get_uint64(f, "seed");
  if (f.find_metadata("train_window")) {  // absent in checkpoints of older builds
    const std::vector<double> w = get_json_list<double>(f, "train_window");
    CNN_CHECK(w.size() == 3 && w[0] >= 0 && w[1] >= 0 && w[2] >= 0,
              "{}: metadata train_window must hold 3 numbers >= 0", f.path());
    std::copy(w.begin(), w.end(), m.train_window.begin());
  }
  CNN_CHECK(m.input_chw.size() == 3, "{}: metadata input_chw must have 3 values", f.path());
  CNN_CHECK(input_fits(m.input_chw),
            "{}: metadata input_chw is {}, expected 1 or 3 channels and sides 1..{}", f.path(),
            shape_str(m.input_chw), kMaxInputSide);
  CNN_CHECK(!m.class_names.empty(), "{}: metadata 'classes' is empty", f.path());
  for (const auto& e : f.entries()) m.tensor_bytes += e.end - e.begin;
  return m;
}

// NaN weights would classify as "nan%" with rc 0, and a resume would blame the learning rate.
void check_finite(const std::string& path, const NamedTensor& t) {
  for (size_t i = 0; i < t.data.size(); ++i)
    CNN_CHECK(std::isfinite(t.data[i]),
              "{}: tensor '{}' holds {} at element {}; a checkpoint must hold finite values", path,
              t.name, t.data[i], i);
}

}  // namespace

void check_checkpoint_can_hold(const std::string& path, const CheckpointMeta& meta,
                               const std::vector<LayerSpec>& layers, const Shape& input_chw) {
  const NetworkSummary sum = summarize_network(layers, input_chw);
  const uint64_t need = uint64_t(sum.total_params) * sizeof(float);
  CNN_CHECK(need <= meta.tensor_bytes,
            "{}: its config's model (input {}) has {} parameters ({} bytes), but the file holds "
            "only {} bytes of tensors (a corrupt or edited checkpoint, or another model)",
            path, shape_str(input_chw), sum.total_params, need, meta.tensor_bytes);
}

void save_checkpoint(const std::string& path, const Network& net, const ParamOptimizer* opt,
                     const CheckpointMeta& meta) {
  // Refused here rather than by the next read of the file (meta_of), which would refuse it.
  CNN_CHECK(
      input_fits(meta.input_chw),
      "{}: cannot write a checkpoint of a network with input {}: checkpoints hold inputs of 1 "
      "or 3 channels and sides 1..{} (the images the data loaders give)",
      path, shape_str(meta.input_chw), kMaxInputSide);
  std::vector<float> params = net.params_to_host();
  std::vector<NamedTensor> tensors;
  for (const auto& p : net.param_infos())
    tensors.push_back(
        {p.name, p.shape,
         std::vector<float>(params.begin() + p.offset, params.begin() + p.offset + p.numel())});
  const std::vector<float> buffers = net.buffers_to_host();
  for (const auto& b : net.buffer_infos()) {
    NamedTensor t{b.name, b.shape, {}};
    const auto first = buffers.begin() + b.offset, last = first + b.numel();
    if (b.is_int64) {
      t.int64 = true;
      for (auto it = first; it != last; ++it) t.ints.push_back(static_cast<int64_t>(*it));
    } else {
      t.data.assign(first, last);
    }
    tensors.push_back(std::move(t));
  }
  if (opt)
    for (auto& [name, values] : opt->state_to_host())
      tensors.push_back({name, {static_cast<int64_t>(values.size())}, std::move(values)});
  write_safetensors(path, tensors, checkpoint_metadata(meta));
}

CheckpointMeta checkpoint_meta_of(const SafetensorsFile& f) {
  return meta_of(f);
}

std::map<std::string, std::string> checkpoint_metadata(const CheckpointMeta& meta) {
  return {
      {"format", kFormat},
      {"config", meta.config_yaml},
      {"classes", nlohmann::json(meta.class_names).dump()},
      {"input_chw", nlohmann::json(meta.input_chw).dump()},
      {"mean", nlohmann::json(meta.mean).dump()},
      {"std", nlohmann::json(meta.std).dump()},
      {"epoch", std::to_string(meta.position.epoch)},
      {"batch_in_epoch", std::to_string(meta.position.batch_in_epoch)},
      {"global_step", std::to_string(meta.position.global_step)},
      {"best_accuracy", fmt::format("{:.17g}", meta.position.best_accuracy)},
      {"seed", std::to_string(meta.seed)},
      {"train_window", nlohmann::json(meta.train_window).dump()},
  };
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  return meta_of(read_safetensors(path));
}

Checkpoint load_checkpoint_for(const std::string& path, const Network& net) {
  SafetensorsFile f = read_safetensors(path);
  CNN_CHECK(!f.find_metadata("quantization"),
            "{}: an int8 model written by ./quantize, not a float checkpoint; run it with "
            "./infer --precision int8",
            path);
  Checkpoint ck;
  ck.meta = meta_of(f);
  ck.params.assign(static_cast<size_t>(net.num_params()), 0.f);
  std::set<std::string> expected;
  for (const auto& p : net.param_infos()) {
    expected.insert(p.name);
    const SafetensorsEntry* e = f.find(p.name);
    CNN_CHECK(e,
              "{}: has no tensor '{}' that this network needs (was it trained with another "
              "model config?)",
              path, p.name);
    CNN_CHECK(e->shape == p.shape, "{}: tensor '{}' has shape {}, this network needs {}", path,
              p.name, shape_str(e->shape), shape_str(p.shape));
    NamedTensor t = f.tensor_f32(p.name);
    check_finite(path, t);
    std::copy(t.data.begin(), t.data.end(), ck.params.begin() + p.offset);
  }
  ck.buffers.assign(static_cast<size_t>(net.num_buffers()), 0.f);
  for (const auto& b : net.buffer_infos()) {
    expected.insert(b.name);
    const SafetensorsEntry* e = f.find(b.name);
    CNN_CHECK(e,
              "{}: has no tensor '{}' that this network needs (was it trained with another "
              "model config?)",
              path, b.name);
    CNN_CHECK(e->shape == b.shape, "{}: tensor '{}' has shape {}, this network needs {}", path,
              b.name, shape_str(e->shape), shape_str(b.shape));
    if (b.is_int64) {
      const NamedTensor t = f.tensor_i64(b.name);
      for (size_t i = 0; i < t.ints.size(); ++i)
        ck.buffers[size_t(b.offset) + i] = static_cast<float>(t.ints[i]);
    } else {
      const NamedTensor t = f.tensor_f32(b.name);
      std::copy(t.data.begin(), t.data.end(), ck.buffers.begin() + b.offset);
    }
  }
  for (const auto& e : f.entries()) {
    if (e.name.rfind(kOptimizerPrefix, 0) == 0) {
      NamedTensor t = f.tensor_f32(e.name);
      check_finite(path, t);
      ck.optimizer_state.emplace_back(e.name, std::move(t.data));
      continue;
    }
    CNN_CHECK(expected.count(e.name), "{}: has tensor '{}' that this network does not have", path,
              e.name);
  }
  return ck;
}

}  // namespace cnn
