#include "layers/quant/quant_file.h"

#include <nlohmann/json.hpp>
#include <set>

#include "layers/checkpoint/safetensors.h"
#include "layers/fold_batchnorm.h"
#include "layers/quant/int8_network.h"
#include "runtime/error.h"
#include "runtime/text.h"

namespace cnn {
namespace {

void check_quantization_keys(const SafetensorsFile& f) {
  const std::string* q = f.find_metadata("quantization");
  CNN_CHECK(q, "{}: not a quantized model (no metadata 'quantization'); write one with ./quantize",
            f.path());
  CNN_CHECK(*q == kQuantizationName, "{}: metadata quantization is '{}', expected '{}'", f.path(),
            excerpt(*q), kQuantizationName);
  const std::string* v = f.find_metadata("quantization_version");
  CNN_CHECK(v && *v == kQuantizationVersion,
            "{}: metadata quantization_version is '{}', this build reads version {}", f.path(),
            excerpt(v ? *v : std::string()), kQuantizationVersion);
}

const SafetensorsEntry& entry(const SafetensorsFile& f, const std::string& name,
                              const std::string& dtype, const Shape& shape) {
  const SafetensorsEntry* e = f.find(name);
  CNN_CHECK(e, "{}: has no tensor '{}' that the int8 model needs ({} {})", f.path(), name, dtype,
            shape_str(shape));
  CNN_CHECK(e->dtype == dtype, "{}: tensor '{}' has dtype {}, expected {}{}", f.path(), name,
            e->dtype, dtype,
            dtype == "I8" ? " (quantized weights; a float tensor here is not int8)" : "");
  CNN_CHECK(e->shape == shape, "{}: tensor '{}' has shape {}, expected {}", f.path(), name,
            shape_str(e->shape), shape_str(shape));
  return *e;
}

}  // namespace

void save_quantized(const std::string& path, const QuantizedModel& m, const CheckpointMeta& meta,
                    const std::vector<std::string>& folded) {
  validate_quantized_model(m, path);
  std::vector<NamedTensor> tensors;
  for (const QuantStage& q : m.stages) {
    if (q.add) {
      tensors.push_back({q.name + ".input_scale", {1}, {q.input_scale}});
      tensors.push_back({q.name + ".shortcut_scale", {1}, {q.shortcut_scale}});
      tensors.push_back({q.name + ".output_scale", {1}, {q.output_scale}});
      continue;
    }
    if (q.avgpool) {
      tensors.push_back({q.name + ".input_scale", {1}, {q.input_scale}});
      tensors.push_back({q.name + ".output_scale", {1}, {q.output_scale}});
      continue;
    }
    tensors.push_back(NamedTensor::i8(q.name + ".weight", q.weight_shape(), q.weight));
    tensors.push_back({q.name + ".weight_scale", {q.oc}, q.weight_scale});
    tensors.push_back({q.name + ".input_scale", {1}, {q.input_scale}});
    tensors.push_back({q.name + ".bias", {q.oc}, q.bias});
  }
  std::map<std::string, std::string> md = checkpoint_metadata(meta);
  md["quantization"] = kQuantizationName;
  md["quantization_version"] = kQuantizationVersion;
  md["calibration"] = m.method;
  md["calibration_images"] = std::to_string(m.calibration_images);
  md["folded"] = nlohmann::json(folded).dump();
  write_safetensors(path, tensors, md);
}

bool is_quantized_file(const std::string& path) {
  return read_safetensors(path).find_metadata("quantization") != nullptr;
}

CheckpointMeta read_quantized_meta(const std::string& path) {
  const SafetensorsFile f = read_safetensors(path);
  check_quantization_keys(f);
  return checkpoint_meta_of(f);
}

QuantizedModel load_quantized(const std::string& path, const std::vector<LayerSpec>& specs,
                              const Shape& input_chw) {
  const SafetensorsFile f = read_safetensors(path);
  check_quantization_keys(f);
  QuantizedModel m;
  m.input_chw = input_chw;
  try {
    m.stages = plan_int8(fold_batchnorm_specs(specs), input_chw);
  } catch (const Error& e) {
    CNN_FAIL("{}: {}", path, e.what());
  }
  if (const std::string* c = f.find_metadata("calibration")) m.method = *c;
  std::set<std::string> expected;
  const auto read_scale = [&](const std::string& t, float* v) {
    entry(f, t, "F32", {1});
    *v = f.tensor_f32(t).data[0];
    expected.insert(t);
  };
  for (QuantStage& q : m.stages) {
    if (q.add) {
      read_scale(q.name + ".input_scale", &q.input_scale);
      read_scale(q.name + ".shortcut_scale", &q.shortcut_scale);
      read_scale(q.name + ".output_scale", &q.output_scale);
      continue;
    }
    if (q.avgpool) {
      read_scale(q.name + ".input_scale", &q.input_scale);
      read_scale(q.name + ".output_scale", &q.output_scale);
      continue;
    }
    const std::string w = q.name + ".weight", ws = q.name + ".weight_scale",
                      is = q.name + ".input_scale", b = q.name + ".bias";
    entry(f, w, "I8", q.weight_shape());
    entry(f, ws, "F32", {q.oc});
    entry(f, is, "F32", {1});
    entry(f, b, "F32", {q.oc});
    q.weight = f.tensor_i8(w).bytes;
    q.weight_scale = f.tensor_f32(ws).data;
    q.input_scale = f.tensor_f32(is).data[0];
    q.bias = f.tensor_f32(b).data;
    expected.insert({w, ws, is, b});
  }
  for (const auto& e : f.entries())
    CNN_CHECK(expected.count(e.name),
              "{}: tensor '{}' belongs to no int8 layer of the embedded config (an unsupported "
              "layer, or another model)",
              path, e.name);
  validate_quantized_model(m, path);
  return m;
}

}  // namespace cnn
