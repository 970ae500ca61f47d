#include "layers/quant/quant_model.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "kernels/conv/conv2d_grouped.h"
#include "kernels/gemm/linear.h"
#include "kernels/pool/avgpool.h"
#include "kernels/pool/maxpool.h"
#include "kernels/quant/qconv.h"
#include "layers/network.h"
#include "layers/quant/calibration.h"
#include "runtime/error.h"

namespace cnn {
namespace {

std::string where(const LayerSpec& s) {
  return s.line > 0 ? fmt::format("layer '{}' (line {})", s.name, s.line)
                    : fmt::format("layer '{}'", s.name);
}

}  // namespace

int8_t requantize_weight(float v) {
  return requantize_value(v);
}

const char* calibration_method_name(CalibrationMethod m) {
  switch (m) {
    case CalibrationMethod::Max:
      return "max";
    case CalibrationMethod::Percentile:
      return "percentile";
    case CalibrationMethod::Mse:
      return "mse";
  }
  return "?";
}

CalibrationMethod parse_calibration_method(const std::string& s) {
  if (s == "max") return CalibrationMethod::Max;
  if (s == "percentile") return CalibrationMethod::Percentile;
  if (s == "mse") return CalibrationMethod::Mse;
  CNN_FAIL("calibration method '{}': expected max, percentile or mse", s);
}

Shape QuantStage::weight_shape() const {
  if (linear) return {oc, global_avg ? int64_t(c) : int64_t(c) * h * w};
  return {oc, c / groups, kh, kw};
}

int64_t QuantStage::weight_numel() const {
  return shape_numel(weight_shape());
}

int QuantStage::out_h() const {
  if (linear) return 1;
  if (avgpool) return (h + 2 * pool_ph - pool_kh) / pool_sh + 1;
  const int oh = (h + 2 * pad_h - dil_h * (kh - 1) - 1) / stride_h + 1;
  return pool ? (oh + 2 * pool_ph - pool_kh) / pool_sh + 1 : oh;
}

int QuantStage::out_w() const {
  if (linear) return 1;
  if (avgpool) return (w + 2 * pool_pw - pool_kw) / pool_sw + 1;
  const int ow = (w + 2 * pad_w - dil_w * (kw - 1) - 1) / stride_w + 1;
  return pool ? (ow + 2 * pool_pw - pool_kw) / pool_sw + 1 : ow;
}

std::vector<QuantStage> plan_int8(const std::vector<LayerSpec>& specs, const Shape& input_chw) {
  CNN_CHECK(input_chw.size() == 3, "int8: input shape {} is not (C, H, W)", shape_str(input_chw));
  std::vector<QuantStage> plan;
  int c = int(input_chw[0]), h = int(input_chw[1]), w = int(input_chw[2]);
  int cur = -1;  // the stage that writes the current activations (-1: the network input)
  bool flat = false;
  // Whether only layers the last stage absorbs came after it (a relu / pool may still fuse); it
  // is false at the start of a block's layers and shortcut, whose input other layers read too.
  bool open = false;
  // A global_avgpool waiting for the linear layer that absorbs it (its name, else empty).
  std::string avg_pending;
  const auto no_pending_avg = [&](const LayerSpec& s) {
    CNN_CHECK(avg_pending.empty(),
              "int8: {} ({}) follows global_avgpool '{}'; int8 runs a global_avgpool only "
              "inside the linear layer after it (flatten and dropout may stand between)",
              where(s), layer_kind_name(s.kind), avg_pending);
  };
  const auto push = [&](QuantStage q) {
    q.input = cur;
    plan.push_back(std::move(q));
    cur = int(plan.size()) - 1;
    open = true;
  };
  std::function<void(const std::vector<LayerSpec>&, bool)> run = [&](const auto& list,
                                                                     bool in_block) {
    for (const LayerSpec& s : list) {
      switch (s.kind) {
        case LayerKind::Conv2d: {
          no_pending_avg(s);
          CNN_CHECK(!flat, "int8: {} is a conv2d after flatten", where(s));
          QuantStage q;
          q.name = s.name;
          q.c = c, q.h = h, q.w = w, q.oc = s.out_channels;
          q.kh = s.kernel_h, q.kw = s.kernel_w, q.stride_h = s.stride_h, q.stride_w = s.stride_w;
          q.pad_h = s.pad_h, q.pad_w = s.pad_w, q.dil_h = s.dil_h, q.dil_w = s.dil_w;
          q.groups = s.groups;
          c = q.oc, h = q.out_h(), w = q.out_w();
          push(q);
          break;
        }
        case LayerKind::Linear: {
          CNN_CHECK(!in_block, "int8: {} is a linear layer inside a residual block", where(s));
          QuantStage q;
          q.name = s.name;
          q.linear = true;
          q.c = c, q.h = h, q.w = w, q.oc = s.out_features;
          if (!avg_pending.empty()) {
            q.global_avg = true;
            q.fused.push_back(avg_pending);
            avg_pending.clear();
          }
          c = q.oc, h = 1, w = 1;
          push(q);
          break;
        }
        case LayerKind::Relu:
          no_pending_avg(s);
          CNN_CHECK(open && !plan.back().relu,
                    "int8: {} (relu) does not follow a conv2d, linear layer or residual block; "
                    "int8 fuses a ReLU into the layer before it",
                    where(s));
          plan.back().relu = true;
          plan.back().fused.push_back(s.name);
          break;
        case LayerKind::MaxPool2d: {
          no_pending_avg(s);
          CNN_CHECK(open && !plan.back().linear && !plan.back().add && !plan.back().avgpool &&
                        !plan.back().pool && !flat,
                    "int8: {} (maxpool2d) does not follow a conv2d (and its relu); int8 fuses a "
                    "max-pool into the conv before it",
                    where(s));
          QuantStage& q = plan.back();
          q.pool = true;
          q.pool_kh = s.kernel_h, q.pool_kw = s.kernel_w, q.pool_sh = s.stride_h;
          q.pool_sw = s.stride_w, q.pool_ph = s.pad_h, q.pool_pw = s.pad_w;
          q.fused.push_back(s.name);
          h = q.out_h(), w = q.out_w();
          break;
        }
        case LayerKind::AvgPool2d: {
          no_pending_avg(s);
          CNN_CHECK(!flat, "int8: {} (avgpool2d) follows flatten; int8 pools images (C, H, W)",
                    where(s));
          QuantStage q;
          q.name = s.name;
          q.avgpool = true;
          q.c = q.oc = c, q.h = h, q.w = w;
          q.pool_kh = s.kernel_h, q.pool_kw = s.kernel_w, q.pool_sh = s.stride_h;
          q.pool_sw = s.stride_w, q.pool_ph = s.pad_h, q.pool_pw = s.pad_w;
          CNN_CHECK(q.out_h() >= 1 && q.out_w() >= 1,
                    "int8: {} (avgpool2d): the window does not "
                    "fit the input ({}, {}, {})",
                    where(s), c, h, w);
          h = q.out_h(), w = q.out_w();
          push(q);
          break;
        }
        case LayerKind::Flatten:
          CNN_CHECK(!in_block, "int8: {} is a flatten inside a residual block", where(s));
          flat = true;
          break;
        case LayerKind::GlobalAvgPool:
          CNN_CHECK(!in_block && !flat && avg_pending.empty() && !plan.empty(),
                    "int8: {} (global_avgpool) must follow a conv2d or residual block and come "
                    "before the linear layer that absorbs it",
                    where(s));
          avg_pending = s.name;
          open = false;
          break;
        case LayerKind::Dropout:
          break;  // the identity at inference
        case LayerKind::SoftmaxCrossEntropy:
          break;
        case LayerKind::Residual: {
          no_pending_avg(s);
          CNN_CHECK(!in_block && !flat, "int8: {} (residual) must not follow flatten", where(s));
          const int in = cur, in_c = c, in_h = h, in_w = w;
          open = false;
          run(s.branch, true);
          CNN_CHECK(cur != in, "int8: residual block {} has no conv2d in its layers", where(s));
          const int branch = cur, bc = c, bh = h, bw = w;
          cur = in, c = in_c, h = in_h, w = in_w, open = false;
          run(s.shortcut, true);
          CNN_CHECK(bc == c && bh == h && bw == w,
                    "int8: residual block {}: its layers give ({}, {}, {}) but its shortcut "
                    "gives ({}, {}, {})",
                    where(s), bc, bh, bw, c, h, w);
          QuantStage q;
          q.name = s.name;
          q.add = true;
          q.c = q.oc = c, q.h = h, q.w = w;
          q.shortcut = cur;
          cur = branch;
          push(q);
          break;
        }
        default:
          CNN_FAIL(
              "int8: {} ({}) has no int8 kernel; int8 runs conv2d (grouped too), linear, relu, "
              "maxpool2d after a conv, avgpool2d, residual blocks of these, global_avgpool "
              "before the linear layer, flatten, dropout, and batchnorm folded into the "
              "conv/linear just before it",
              where(s), layer_kind_name(s.kind));
      }
    }
  };
  run(specs, false);
  CNN_CHECK(!plan.empty() && plan.back().linear,
            "int8: the network must end with a linear layer (the logits)");
  return plan;
}

float output_scale_of(const QuantizedModel& m, int j) {
  if (j >= 0 && (m.stages.at(size_t(j)).add || m.stages[size_t(j)].avgpool))
    return m.stages[size_t(j)].output_scale;
  for (const QuantStage& q : m.stages) {
    if (q.input == j) return q.input_scale;
    if (q.add && q.shortcut == j) return q.shortcut_scale;
  }
  CNN_FAIL("int8: no layer reads the output of stage {}", j);
}

std::vector<FloatStage> float_stages(const std::vector<QuantStage>& plan,
                                     const FoldedNetwork& folded, const Shape& input_chw) {
  NetworkOptions o;
  o.max_batch = 1;
  const Network net(folded.specs, input_chw, o, Exec{});
  std::map<std::string, ParamInfo> infos;
  for (const auto& p : net.param_infos()) infos[p.name] = p;
  CNN_CHECK(int64_t(folded.params.size()) == net.num_params(),
            "int8: {} parameters for a network of {}", folded.params.size(), net.num_params());
  std::vector<FloatStage> out;
  for (const QuantStage& q : plan) {
    FloatStage f;
    if (!q.has_weights()) {
      out.push_back(std::move(f));
      continue;
    }
    const auto w = infos.find(q.name + ".weight");
    CNN_CHECK(w != infos.end() && w->second.numel() == q.weight_numel(),
              "int8: no weight of {} elements for layer '{}'", q.weight_numel(), q.name);
    f.weight.assign(folded.params.begin() + w->second.offset,
                    folded.params.begin() + w->second.offset + w->second.numel());
    const auto b = infos.find(q.name + ".bias");
    if (b != infos.end())
      f.bias.assign(folded.params.begin() + b->second.offset,
                    folded.params.begin() + b->second.offset + b->second.numel());
    else
      f.bias.assign(size_t(q.oc), 0.f);
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<float> float_forward(const std::vector<QuantStage>& plan,
                                 const std::vector<FloatStage>& weights, const float* x, int n,
                                 std::vector<std::vector<float>>* stage_outputs) {
  const Exec cpu;
  const std::vector<float> input(x, x + int64_t(n) * plan[0].c * plan[0].h * plan[0].w);
  // Every stage's output, kept while a later stage may read it.
  std::vector<std::vector<float>> outs(plan.size());
  const auto of = [&](int j) -> const std::vector<float>& { return j < 0 ? input : outs[j]; };
  for (size_t i = 0; i < plan.size(); ++i) {
    const QuantStage& q = plan[i];
    const FloatStage& f = weights[i];
    std::vector<float> cur = of(q.input);
    std::vector<float> y;
    if (q.add) {  // the block's add, then its ReLU
      const std::vector<float>& b = of(q.shortcut);
      y.resize(cur.size());
      for (size_t k = 0; k < y.size(); ++k) {
        y[k] = cur[k] + b[k];
        if (q.relu) y[k] = std::max(y[k], 0.f);
      }
    } else if (q.avgpool) {  // the float pool, then its ReLU
      AvgPoolShape p;
      p.n = n, p.c = q.c, p.h = q.h, p.w = q.w, p.kh = q.pool_kh, p.kw = q.pool_kw;
      p.stride_h = q.pool_sh, p.stride_w = q.pool_sw, p.pad_h = q.pool_ph, p.pad_w = q.pool_pw;
      y.resize(size_t(n) * size_t(q.c) * size_t(p.oh()) * size_t(p.ow()));
      avgpool_forward(p, cur.data(), y.data(), cpu);
      if (q.relu)
        for (float& v : y) v = std::max(v, 0.f);
    } else if (q.linear) {
      if (q.global_avg) {  // the float pool, as the float network runs it before the layer
        const int64_t hw = int64_t(q.h) * q.w;
        std::vector<float> pooled(size_t(n) * size_t(q.c));
        for (size_t i = 0; i < pooled.size(); ++i) {
          double sum = 0;
          for (int64_t p = 0; p < hw; ++p) sum += cur[i * size_t(hw) + size_t(p)];
          pooled[i] = float(sum / double(hw));
        }
        cur = std::move(pooled);
      }
      const LinearShape s{n, q.global_avg ? q.c : q.c * q.h * q.w, q.oc};
      y.resize(size_t(n) * size_t(q.oc));
      linear_forward(s, cur.data(), f.weight.data(), f.bias.data(), y.data(), q.relu, Algo::Auto,
                     cpu);
    } else {
      Conv2dGroupedShape s;
      s.n = n, s.c = q.c, s.h = q.h, s.w = q.w, s.oc = q.oc, s.kh = q.kh, s.kw = q.kw;
      s.stride_h = q.stride_h, s.stride_w = q.stride_w, s.pad_h = q.pad_h, s.pad_w = q.pad_w;
      s.dil_h = q.dil_h, s.dil_w = q.dil_w, s.groups = q.groups;
      y.resize(size_t(n) * size_t(q.oc) * size_t(s.oh()) * size_t(s.ow()));
      conv2d_grouped_forward(s, cur.data(), f.weight.data(), f.bias.data(), y.data(), q.relu,
                             nullptr, Algo::Auto, cpu);
      if (q.pool) {
        MaxPoolShape p;
        p.n = n, p.c = q.oc, p.h = s.oh(), p.w = s.ow(), p.kh = q.pool_kh, p.kw = q.pool_kw;
        p.stride_h = q.pool_sh, p.stride_w = q.pool_sw, p.pad_h = q.pool_ph, p.pad_w = q.pool_pw;
        std::vector<float> pooled(size_t(n) * size_t(q.oc) * size_t(p.oh()) * size_t(p.ow()));
        std::vector<int32_t> argmax(pooled.size());
        maxpool_forward(p, y.data(), pooled.data(), argmax.data(), cpu);
        y = std::move(pooled);
      }
    }
    outs[i] = std::move(y);
  }
  std::vector<float> logits = outs.back();
  if (stage_outputs) *stage_outputs = std::move(outs);
  return logits;
}

float calibrate_scale(const std::vector<float>& samples, float max_abs, CalibrationMethod method) {
  if (!(max_abs > 0.f)) return 1.f;
  double clip = max_abs;
  if (method == CalibrationMethod::Percentile && !samples.empty()) {
    std::vector<float> a(samples.size());
    for (size_t i = 0; i < a.size(); ++i) a[i] = std::fabs(samples[i]);
    const size_t k = std::min(
        a.size() - 1, size_t(std::ceil(kCalibrationPercentile / 100.0 * double(a.size()))) - 1);
    std::nth_element(a.begin(), a.begin() + long(k), a.end());
    if (a[k] > 0.f) clip = a[k];
  } else if (method == CalibrationMethod::Mse && !samples.empty()) {
    // The clip among 200 candidates up to the max that minimizes the quantize-dequantize error.
    double best = -1;
    for (int k = 1; k <= 200; ++k) {
      const double t = max_abs * k / 200.0, s = t / 127.0;
      double err = 0;
      for (float v : samples) {
        const double q = std::min(127.0, std::max(-127.0, std::nearbyint(v / s)));
        err += (q * s - v) * (q * s - v);
      }
      if (best < 0 || err < best) best = err, clip = t;
    }
  }
  return float(clip / 127.0);
}

QuantizedModel quantize_network(const FoldedNetwork& folded, const Shape& input_chw, const float* x,
                                int n, CalibrationMethod method, const Exec& ex) {
  CNN_CHECK(n >= 1, "int8: calibration needs at least one image, got {}", n);
  QuantizedModel m;
  m.stages = plan_int8(folded.specs, input_chw);
  m.input_chw = input_chw;
  m.method = calibration_method_name(method);
  m.calibration_images = n;
  const std::vector<FloatStage> fw = float_stages(m.stages, folded, input_chw);
  for (size_t i = 0; i < m.stages.size(); ++i) {
    QuantStage& q = m.stages[i];
    if (!q.has_weights()) continue;
    const int64_t per_out = q.weight_numel() / q.oc;
    q.weight.resize(size_t(q.weight_numel()));
    q.weight_scale.resize(size_t(q.oc));
    q.bias = fw[i].bias;
    for (int o = 0; o < q.oc; ++o) {
      const float* wo = fw[i].weight.data() + o * per_out;
      float mx = 0.f;
      for (int64_t k = 0; k < per_out; ++k) mx = std::max(mx, std::fabs(wo[k]));
      const float s = mx > 0.f ? mx / 127.f : 1.f;
      q.weight_scale[size_t(o)] = s;
      for (int64_t k = 0; k < per_out; ++k)
        q.weight[size_t(o * per_out + k)] = requantize_weight(wo[k] / s);
    }
  }
  // One scale per int8 tensor (tensor t + 1 is stage t's output); every layer that reads a
  // tensor gets its one scale.
  const std::vector<float> scale = calibrate_activation_scales(
      m.stages, folded, input_chw, x, n, method, ex,
      ex.device == Device::CUDA ? CalibrationForward::Network : CalibrationForward::Stages);
  const auto scale_of = [&](int j) { return scale[size_t(j + 1)]; };
  for (size_t i = 0; i < m.stages.size(); ++i) {
    QuantStage& q = m.stages[i];
    q.input_scale = scale_of(q.input);
    if (q.add) q.shortcut_scale = scale_of(q.shortcut);
    if (q.add || q.avgpool) q.output_scale = scale_of(int(i));
  }
  return m;
}

}  // namespace cnn
