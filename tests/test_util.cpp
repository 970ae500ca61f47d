#include "tests/test_util.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include "layers/checkpoint/safetensors.h"
#include "layers/param_optimizer.h"
#include "runtime/memory.h"

namespace cnn::test {

std::string source_dir() {
  const char* env = std::getenv("CNN_SOURCE_DIR");
  return env && *env ? env : CNN_SOURCE_DIR;
}

std::filesystem::path fresh_dir(const std::string& prefix, const std::string& name) {
  const std::filesystem::path d = std::filesystem::temp_directory_path() /
                                  ("cnn_" + prefix + "_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int network_batch() {
  if (const char* s = std::getenv("CNN_TEST_NETWORK_BATCH")) {
    const int n = std::atoi(s);
    if (n > 0) return n;
  }
  return 128;
}

Dataset random_dataset(int n, int c, int h, int w, int classes, uint64_t seed) {
  Dataset d;
  d.n = n;
  d.c = c;
  d.h = h;
  d.w = w;
  auto px = random_labels(size_t(n) * c * h * w, 256, seed);
  d.images.assign(px.begin(), px.end());
  d.labels = random_labels(n, classes, seed + 1);
  for (int k = 0; k < classes; ++k) d.class_names.push_back(std::to_string(k));
  d.source = "random";
  return d;
}

bool light_sweeps() {
  return std::getenv("CNN_TEST_NETWORK_BATCH") != nullptr;
}

uint64_t fresh_seed() {
  if (const char* s = std::getenv("CNN_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  static uint64_t counter = 0;
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) +
         0x9E3779B97F4A7C15ull * ++counter;
}

std::vector<float> make_values(size_t n, Fill fill, uint64_t seed) {
  if (fill == Fill::Random) return random_vector(n, seed);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(-2, 2);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(d(rng));
  return v;
}

std::vector<float> random_vector(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<int32_t> random_labels(size_t n, int classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, classes - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Tensor to_device(const std::vector<float>& v) {
  return Tensor::from_host({static_cast<int64_t>(v.size())}, v, Device::CUDA);
}

std::vector<float> to_host(const float* d_ptr, size_t n) {
  std::vector<float> v(n);
  raw_copy(v.data(), Device::CPU, d_ptr, Device::CUDA, n * sizeof(float));
  return v;
}

void poison_device(float* d_ptr, size_t n) {
  std::vector<float> nan(n, std::numeric_limits<float>::quiet_NaN());
  raw_copy(d_ptr, Device::CUDA, nan.data(), Device::CPU, n * sizeof(float));
  // A copy from pageable memory returns before its DMA lands, unordered with a non-blocking
  // stream's later launches: wait, so that the poison cannot land on a kernel's output.
  stream_sync(Device::CUDA, nullptr);
}

double max_rel_error(const std::vector<float>& got, const std::vector<float>& ref, double floor) {
  if (got.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = got[i], r = ref[i];
    if (std::isnan(g) != std::isnan(r)) return std::numeric_limits<double>::infinity();
    if (std::isnan(g)) continue;
    worst = std::max(worst, std::fabs(g - r) / (floor + std::fabs(r)));
  }
  return worst;
}

bool any_nan(const std::vector<float>& v) {
  for (float x : v)
    if (std::isnan(x)) return true;
  return false;
}

bool gpu_present() {
  if (cuda_available()) return true;
  const char* req = std::getenv("CNN_REQUIRE_GPU");
  if (req && std::string(req) == "1") {
    ADD_FAILURE() << "CNN_REQUIRE_GPU=1 but no CUDA device is usable";
  }
  return false;
}

Conv2dShape square_conv(int n, int c, int h, int w, int oc, int k, int stride, int pad) {
  Conv2dShape s;
  s.n = n;
  s.c = c;
  s.h = h;
  s.w = w;
  s.oc = oc;
  s.kh = s.kw = k;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  return s;
}

Conv2dShape one_channel_conv(int n, int oc, int h, int w, int k, int pad) {
  return square_conv(n, 1, h, w, oc, k, 1, pad);
}

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  if (const char* old = std::getenv(name)) {
    had_ = true;
    old_ = old;
  }
  if (value)
    setenv(name, value, 1);
  else
    unsetenv(name);
}

ScopedEnv::~ScopedEnv() {
  if (had_)
    setenv(name_.c_str(), old_.c_str(), 1);
  else
    unsetenv(name_.c_str());
}

NetworkRun run_network(const std::vector<LayerSpec>& specs, const Shape& chw, const Exec& ex,
                       const NetworkOptions& o, int n, int steps,
                       const std::function<void(const Network&)>& inspect) {
  Network net(specs, chw, o, ex);
  NetworkRun r;
  r.fused = net.fused_conv_relu_pool();
  r.notes = net.fusion_notes();
  const auto x = random_vector(size_t(n) * size_t(shape_numel(chw)), o.seed + 1);
  const auto labels = random_labels(size_t(n), net.num_classes(), o.seed + 2);
  Buffer<float> d_x(x.size(), ex.device);
  d_x.copy_from(x.data(), Device::CPU, x.size());
  Buffer<int32_t> d_labels(labels.size(), ex.device);
  d_labels.copy_from(labels.data(), Device::CPU, labels.size());
  for (int s = 0; s < steps; ++s)
    net.forward_backward(n, d_x.data(), d_labels.data(), 1.0f / float(n));
  stream_sync(ex.device, ex.stream);
  const auto host = [&](const float* d, size_t count) {
    std::vector<float> h(count);
    raw_copy(h.data(), Device::CPU, d, ex.device, count * sizeof(float));
    return h;
  };
  r.logits = host(net.logits(), size_t(n) * size_t(net.num_classes()));
  r.loss = host(net.loss_rows(), size_t(n));
  r.grads = net.grads_to_host();
  r.buffers = net.buffers_to_host();
  const float* e = net.forward(n, d_x.data());
  stream_sync(ex.device, ex.stream);
  r.eval_logits = host(e, size_t(n) * size_t(net.num_classes()));
  if (inspect) inspect(net);
  return r;
}

NetworkRun run_network_once(const std::vector<LayerSpec>& specs, const Shape& chw, const Exec& ex,
                            PoolFusion fusion, int n, uint64_t seed) {
  NetworkOptions o;
  o.max_batch = n + 2;  // a partial batch
  o.seed = seed;
  o.fuse_pool = fusion;
  return run_network(specs, chw, ex, o, n, 1);
}

StepBatch step_batch(const Shape& chw, int classes, const NetworkOptions& o, int s, Device dev) {
  StepBatch b;
  b.n = s % 3 == 2 ? std::max(1, o.max_batch - 3) : o.max_batch;
  const auto x = random_vector(size_t(b.n) * size_t(shape_numel(chw)), o.seed + 10 + s);
  const auto labels = random_labels(size_t(b.n), classes, o.seed + 20 + s);
  b.x = Buffer<float>(x.size(), dev);
  b.x.copy_from(x.data(), Device::CPU, x.size());
  b.labels = Buffer<int32_t>(labels.size(), dev);
  b.labels.copy_from(labels.data(), Device::CPU, labels.size());
  return b;
}

TrainRun train_steps(const std::vector<LayerSpec>& specs, const Shape& chw, const Exec& ex,
                     const NetworkOptions& o, const OptimizerOptions& opt, int steps) {
  Network net(specs, chw, o, ex);
  ParamOptimizer optimizer(opt, net);
  TrainRun r;
  r.overwritten = net.overwritten_grad_ranges();
  r.overwritten_names = net.overwritten_grad_names();
  for (int s = 0; s < steps; ++s) {
    const StepBatch b = step_batch(chw, net.num_classes(), o, s, ex.device);
    net.forward_backward(b.n, b.x.data(), b.labels.data(), 1.0f / float(b.n));
    if (s + 1 == steps) r.grads_before_update = net.grads_to_host();
    optimizer.step(opt.lr);
    r.params.push_back(net.params_to_host());
  }
  r.grads_after_update = net.grads_to_host();
  return r;
}

bool pending_layer_error(const std::string& msg) {
  if (contains(msg, "unknown layer kind")) return true;
  if (!contains(msg, "unknown key")) return false;
  for (const char* key : {".groups:", ".dilation:", "training.label_smoothing:"})
    if (contains(msg, key)) return true;
  return false;
}

std::vector<float> checkpoint_weights(const std::filesystem::path& ckpt) {
  const SafetensorsFile f = read_safetensors(ckpt.string());
  std::vector<float> all;
  for (const auto& e : f.entries()) {
    const std::vector<float> t = f.tensor_f32(e.name).data;
    all.insert(all.end(), t.begin(), t.end());
  }
  return all;
}

namespace {

LayerSpec smooth_layer(const LayerSpec& l) {
  LayerSpec s = l;
  if (s.kind == LayerKind::MaxPool2d) s.kind = LayerKind::AvgPool2d;
  s.branch = smooth_specs(l.branch);
  s.shortcut = smooth_specs(l.shortcut);
  return s;
}

}  // namespace

std::vector<LayerSpec> smooth_specs(const std::vector<LayerSpec>& specs) {
  std::vector<LayerSpec> out;
  for (const LayerSpec& l : specs)
    if (l.kind != LayerKind::Relu) out.push_back(smooth_layer(l));
  return out;
}

std::vector<LayerSpec> conv_in_small_net(const LayerSpec& conv, int prefix_channels,
                                         int prefix_kernel) {
  return {
      conv2d_spec("prefix", prefix_channels, prefix_kernel, prefix_kernel, 1, prefix_kernel / 2),
      conv,
      layer_spec(LayerKind::Relu, "relu"),
      layer_spec(LayerKind::Flatten, "flatten"),
      linear_spec("fc", 5),
      layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
}

std::vector<LayerSpec> norm_net() {
  LayerSpec conv2 = conv2d_spec("conv2", 5, 3, 3, 1, 1);
  conv2.bias = false;
  return {conv2d_spec("conv1", 4, 3, 3, 1, 1),
          batchnorm_spec(LayerKind::BatchNorm2d, "bn1"),
          layer_spec(LayerKind::Relu, "relu1"),
          avgpool2d_spec("pool1", 3, 2, 1),
          conv2,
          batchnorm_spec(LayerKind::BatchNorm2d, "bn2"),
          layer_spec(LayerKind::Relu, "relu2"),
          layer_spec(LayerKind::GlobalAvgPool, "gap"),
          layer_spec(LayerKind::Flatten, "flatten"),
          linear_spec("fc1", 6),
          batchnorm_spec(LayerKind::BatchNorm1d, "bn3"),
          layer_spec(LayerKind::Relu, "relu3"),
          dropout_spec("drop", 0.25),
          linear_spec("fc2", 3),
          layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
}

}  // namespace cnn::test
