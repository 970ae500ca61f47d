#include "layers/quant/calibration.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "layers/network.h"
#include "runtime/error.h"
#include "runtime/memory.h"

namespace cnn {
namespace {

// Samples kept per tensor for the percentile and MSE searches (every k-th value).
constexpr int64_t kMaxSamples = int64_t(1) << 18;
// The forwards run in chunks of this many images (bounded memory).
constexpr int kCalibrationChunk = 256;

// The max |v| and every k-th value of each tensor over all n images, fed chunk by chunk in image
// order: which values are kept depends only on their position among the n images' values.
class ActivationStats {
 public:
  ActivationStats(size_t tensors, int n)
      : n_(n), samples_(tensors), max_abs_(tensors, 0.f), seen_(tensors, 0) {}

  // v: the tensor's values of `images` consecutive images.
  void add(size_t t, const float* v, int64_t count, int images) {
    const int64_t total = count / images * n_;  // values of all n images
    const int64_t step = std::max<int64_t>(1, total / kMaxSamples);
    for (int64_t i = 0; i < count; ++i) {
      max_abs_[t] = std::max(max_abs_[t], std::fabs(v[i]));
      if (seen_[t]++ % step == 0) samples_[t].push_back(v[i]);
    }
  }

  std::vector<float> scales(CalibrationMethod method) const {
    std::vector<float> s(samples_.size());
    for (size_t t = 0; t < s.size(); ++t) s[t] = calibrate_scale(samples_[t], max_abs_[t], method);
    return s;
  }

 private:
  int n_;
  std::vector<std::vector<float>> samples_;
  std::vector<float> max_abs_;
  std::vector<int64_t> seen_;
};

void stages_forward(const std::vector<QuantStage>& plan, const FoldedNetwork& folded,
                    const Shape& input_chw, const float* x, int n, ActivationStats& stats) {
  const std::vector<FloatStage> fw = float_stages(plan, folded, input_chw);
  const int64_t image = shape_numel(input_chw);
  for (int b = 0; b < n; b += kCalibrationChunk) {
    const int cnt = std::min(kCalibrationChunk, n - b);
    const float* xb = x + int64_t(b) * image;
    std::vector<std::vector<float>> outs;
    float_forward(plan, fw, xb, cnt, &outs);
    stats.add(0, xb, int64_t(cnt) * image, cnt);
    for (size_t i = 0; i + 1 < outs.size(); ++i)
      stats.add(i + 1, outs[i].data(), int64_t(outs[i].size()), cnt);
  }
}

void network_forward(const std::vector<QuantStage>& plan, const FoldedNetwork& folded,
                     const Shape& input_chw, const float* x, int n, const Exec& ex_in,
                     ActivationStats& stats) {
  Exec ex = ex_in;
  ex.precision = Precision::FP32;  // the float model the int8 one approximates
  ex.training = false;
  NetworkOptions o;
  o.max_batch = std::min(kCalibrationChunk, n);
  Network net(folded.specs, input_chw, o, ex);
  net.params_from_host(folded.params);
  net.buffers_from_host(folded.buffers);
  // Those uploads ran on the default stream; ex.stream may not wait for it (non-blocking).
  stream_sync(ex.device, nullptr);
  const std::vector<size_t> nodes = stage_output_nodes(plan, folded.specs);
  const int64_t image = shape_numel(input_chw);
  Buffer<float> d_x(size_t(o.max_batch) * size_t(image), ex.device);
  std::vector<float> h_y;
  for (int b = 0; b < n; b += kCalibrationChunk) {
    const int cnt = std::min(kCalibrationChunk, n - b);
    const float* xb = x + int64_t(b) * image;
    d_x.copy_from(xb, Device::CPU, size_t(cnt) * size_t(image), ex.stream);
    net.forward(cnt, d_x.data());
    stream_sync(ex.device, ex.stream);
    stats.add(0, xb, int64_t(cnt) * image, cnt);
    for (size_t i = 0; i + 1 < plan.size(); ++i) {
      const QuantStage& q = plan[i];
      const int64_t count = int64_t(cnt) * q.out_c() * q.out_h() * q.out_w();
      h_y.resize(size_t(count));
      raw_copy(h_y.data(), Device::CPU, net.activation(nodes[i]), ex.device,
               size_t(count) * sizeof(float), ex.stream);
      stream_sync(ex.device, ex.stream);
      stats.add(i + 1, h_y.data(), count, cnt);
    }
  }
}

}  // namespace

std::vector<size_t> stage_output_nodes(const std::vector<QuantStage>& plan,
                                       const std::vector<LayerSpec>& folded_specs) {
  std::map<std::string, size_t> index;
  const std::vector<GraphNode> graph = layer_graph(folded_specs);
  for (size_t k = 0; k < graph.size(); ++k) index[graph[k].spec.name] = k;
  std::vector<size_t> nodes;
  for (const QuantStage& q : plan) {
    size_t last = 0;
    bool found = false;
    for (const std::string& name : q.fused) {
      const auto it = index.find(name);
      CNN_CHECK(it != index.end(), "int8: layer '{}' of stage '{}' is not in the network", name,
                q.name);
      last = std::max(last, it->second), found = true;
    }
    const auto it = index.find(q.name);
    CNN_CHECK(it != index.end(), "int8: stage '{}' is not in the network", q.name);
    nodes.push_back(found ? std::max(last, it->second) : it->second);
  }
  return nodes;
}

std::vector<float> calibrate_activation_scales(const std::vector<QuantStage>& plan,
                                               const FoldedNetwork& folded, const Shape& input_chw,
                                               const float* x, int n, CalibrationMethod method,
                                               const Exec& ex, CalibrationForward forward) {
  CNN_CHECK(n >= 1, "int8: calibration needs at least one image, got {}", n);
  ActivationStats stats(plan.size(), n);
  if (forward == CalibrationForward::Stages)
    stages_forward(plan, folded, input_chw, x, n, stats);
  else
    network_forward(plan, folded, input_chw, x, n, ex, stats);
  return stats.scales(method);
}

}  // namespace cnn
