#include "layers/fold_batchnorm.h"

#include <cmath>
#include <map>

#include "layers/network.h"
#include "runtime/error.h"

namespace cnn {
namespace {

// Parameter and buffer layouts of a network built from specs: a batch-1 CPU Network (its
// activations are a few KB; its random initial values are not used).
struct Layout {
  std::map<std::string, ParamInfo> params, buffers;
  int64_t num_params = 0, num_buffers = 0;
};

Layout layout_of(const std::vector<LayerSpec>& specs, const Shape& input_chw) {
  NetworkOptions o;
  o.max_batch = 1;
  Network net(specs, input_chw, o, Exec{});
  Layout l;
  for (const auto& p : net.param_infos()) l.params[p.name] = p;
  for (const auto& b : net.buffer_infos()) l.buffers[b.name] = b;
  l.num_params = net.num_params();
  l.num_buffers = net.num_buffers();
  return l;
}

const float* at(const std::map<std::string, ParamInfo>& infos, const std::vector<float>& values,
                const std::string& name) {
  const auto it = infos.find(name);
  CNN_CHECK(it != infos.end(), "fold_batchnorm: no tensor '{}'", name);
  return values.data() + it->second.offset;
}

bool folds(const LayerSpec& a, const LayerSpec& b) {
  return (a.kind == LayerKind::Conv2d && b.kind == LayerKind::BatchNorm2d) ||
         (a.kind == LayerKind::Linear && b.kind == LayerKind::BatchNorm1d);
}

// The specs with each folding pair made one layer, residual blocks' layers and shortcuts too
// (a block's conv + BN folds like any other); pairs, when given, gets one entry per fold.
struct FoldPair {
  std::string layer, bn;
  double eps = 0;
};
std::vector<LayerSpec> fold_list(const std::vector<LayerSpec>& specs,
                                 std::vector<FoldPair>* pairs) {
  std::vector<LayerSpec> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    out.push_back(specs[i]);
    if (specs[i].kind == LayerKind::Residual) {
      out.back().branch = fold_list(specs[i].branch, pairs);
      out.back().shortcut = fold_list(specs[i].shortcut, pairs);
    } else if (i + 1 < specs.size() && folds(specs[i], specs[i + 1])) {
      out.back().bias = true;
      if (pairs) pairs->push_back({specs[i].name, specs[i + 1].name, specs[i + 1].eps});
      ++i;
    }
  }
  return out;
}

}  // namespace

std::vector<LayerSpec> fold_batchnorm_specs(const std::vector<LayerSpec>& specs) {
  return fold_list(specs, nullptr);
}

FoldedNetwork fold_batchnorm(const std::vector<LayerSpec>& specs, const Shape& input_chw,
                             const std::vector<float>& params, const std::vector<float>& buffers) {
  const Layout src = layout_of(specs, input_chw);
  CNN_CHECK(int64_t(params.size()) == src.num_params && int64_t(buffers.size()) == src.num_buffers,
            "fold_batchnorm: {} parameters and {} buffer values for a network of {} and {}",
            params.size(), buffers.size(), src.num_params, src.num_buffers);
  FoldedNetwork out;
  std::vector<FoldPair> pairs;
  out.specs = fold_list(specs, &pairs);
  for (const FoldPair& f : pairs) out.folded.push_back(f.layer + " + " + f.bn);
  const Layout dst = layout_of(out.specs, input_chw);
  out.params.assign(size_t(dst.num_params), 0.f);
  out.buffers.assign(size_t(dst.num_buffers), 0.f);
  for (const auto& [name, b] : dst.buffers) {
    const float* v = at(src.buffers, buffers, name);
    std::copy(v, v + b.numel(), out.buffers.begin() + b.offset);
  }
  for (const auto& [name, p] : dst.params) {
    if (!src.params.count(name)) continue;  // the bias a folded layer gains: written below
    const float* v = at(src.params, params, name);
    std::copy(v, v + p.numel(), out.params.begin() + p.offset);
  }
  for (const FoldPair& f : pairs) {
    const std::string &layer = f.layer, &bn = f.bn;
    const ParamInfo& w = dst.params.at(layer + ".weight");
    const ParamInfo& b = dst.params.at(layer + ".bias");
    const int64_t oc = w.shape.at(0), per_out = w.numel() / oc;
    const float* gamma = at(src.params, params, bn + ".weight");
    const float* beta = at(src.params, params, bn + ".bias");
    const float* mean = at(src.buffers, buffers, bn + ".running_mean");
    const float* var = at(src.buffers, buffers, bn + ".running_var");
    const double eps = f.eps;
    const bool had_bias = src.params.count(layer + ".bias") > 0;
    const float* old_b = had_bias ? at(src.params, params, layer + ".bias") : nullptr;
    for (int64_t o = 0; o < oc; ++o) {
      const double scale = double(gamma[o]) / std::sqrt(double(var[o]) + eps);
      float* wo = out.params.data() + w.offset + o * per_out;
      for (int64_t k = 0; k < per_out; ++k) wo[k] = static_cast<float>(double(wo[k]) * scale);
      const double b0 = old_b ? double(old_b[o]) : 0.0;
      out.params[size_t(b.offset + o)] =
          static_cast<float>((b0 - double(mean[o])) * scale + double(beta[o]));
    }
  }
  return out;
}

}  // namespace cnn
