#include "layers/quant/int8_network.h"

#include <algorithm>
#include <cmath>

#include "kernels/quant/qconv_few_channels.h"
#include "kernels/quant/qconv_fused_classifier.h"
#include "kernels/quant/quantize.h"
#include "runtime/error.h"

namespace cnn {

namespace {

std::string scale_tensor(const QuantStage& q, bool shortcut) {
  return q.name + (shortcut ? ".shortcut_scale" : ".input_scale");
}

void check_scale(float v, const std::string& source, const std::string& tensor) {
  CNN_CHECK(std::isfinite(v) && v > 0.f, "{}: tensor '{}' is {}, expected a finite scale > 0",
            source, tensor, v);
}

}  // namespace

QAvgPoolShape avgpool_shape(const QConvShape& s) {
  QAvgPoolShape p;
  p.n = s.n, p.h = s.h, p.w = s.w, p.c = s.c, p.cp = s.cp;
  p.kh = s.pool_kh, p.kw = s.pool_kw, p.stride_h = s.pool_sh, p.stride_w = s.pool_sw;
  p.pad_h = s.pool_ph, p.pad_w = s.pool_pw;
  return p;
}

void validate_quantized_model(const QuantizedModel& m, const std::string& source) {
  CNN_CHECK(!m.stages.empty(), "{}: no int8 layers", source);
  const int count = int(m.stages.size());
  for (int i = 0; i < count; ++i) {
    const QuantStage& q = m.stages[size_t(i)];
    CNN_CHECK(q.input >= -1 && q.input < i && (!q.add || (q.shortcut >= -1 && q.shortcut < i)),
              "int8: stage '{}' reads a stage that does not come before it", q.name);
    check_scale(q.input_scale, source, q.name + ".input_scale");
    if (q.avgpool) {
      CNN_CHECK(i + 1 < count, "{}: the network ends with the avgpool2d '{}', not a linear layer",
                source, q.name);
      check_scale(q.output_scale, source, q.name + ".output_scale");
      continue;
    }
    if (q.add) {
      CNN_CHECK(i + 1 < count, "{}: the network ends with the add '{}', not a linear layer", source,
                q.name);
      check_scale(q.shortcut_scale, source, q.name + ".shortcut_scale");
      check_scale(q.output_scale, source, q.name + ".output_scale");
      continue;
    }
    CNN_CHECK(int64_t(q.weight.size()) == q.weight_numel(),
              "{}: tensor '{}.weight' has {} values, expected {} (shape {})", source, q.name,
              q.weight.size(), q.weight_numel(), shape_str(q.weight_shape()));
    CNN_CHECK(int64_t(q.weight_scale.size()) == q.oc,
              "{}: tensor '{}.weight_scale' has {} values, expected {} (one per output channel)",
              source, q.name, q.weight_scale.size(), q.oc);
    CNN_CHECK(int64_t(q.bias.size()) == q.oc, "{}: tensor '{}.bias' has {} values, expected {}",
              source, q.name, q.bias.size(), q.oc);
    for (size_t o = 0; o < q.weight_scale.size(); ++o)
      CNN_CHECK(std::isfinite(q.weight_scale[o]) && q.weight_scale[o] > 0.f,
                "{}: tensor '{}.weight_scale' holds {} at element {}, expected a finite scale > 0",
                source, q.name, q.weight_scale[o], o);
    for (size_t o = 0; o < q.bias.size(); ++o)
      CNN_CHECK(std::isfinite(q.bias[o]), "{}: tensor '{}.bias' holds {} at element {}", source,
                q.name, q.bias[o], o);
    for (size_t k = 0; k < q.weight.size(); ++k)
      CNN_CHECK(q.weight[k] != -128,
                "{}: tensor '{}.weight' holds -128 at element {}; symmetric int8 weights lie in "
                "[-127, 127]",
                source, q.name, k);
  }
  // One int8 tensor has one scale: every layer that reads it (and the add that writes it) must
  // record the same one.
  for (int j = -1; j + 1 < count; ++j) {
    std::string first;
    float s = 0.f;
    const auto agree = [&](const std::string& tensor, float v) {
      if (first.empty()) {
        first = tensor, s = v;
        return;
      }
      CNN_CHECK(
          v == s,
          "{}: tensor '{}' is {} but '{}' is {}; both are the scale of the activations {} "
          "writes, expected equal",
          source, tensor, v, first, s,
          j < 0 ? std::string("the input quantization") : "'" + m.stages[size_t(j)].name + "'");
    };
    if (j >= 0 && (m.stages[size_t(j)].add || m.stages[size_t(j)].avgpool))
      agree(m.stages[size_t(j)].name + ".output_scale", m.stages[size_t(j)].output_scale);
    for (const QuantStage& q : m.stages) {
      if (q.input == j) agree(scale_tensor(q, false), q.input_scale);
      if (q.add && q.shortcut == j) agree(scale_tensor(q, true), q.shortcut_scale);
    }
    const bool read = std::any_of(m.stages.begin(), m.stages.end(), [&](const QuantStage& q) {
      return q.input == j || (q.add && q.shortcut == j);
    });
    CNN_CHECK(read, "int8: no layer reads the output of '{}'",
              j < 0 ? std::string("the input") : m.stages[size_t(j)].name);
  }
}

Int8Network::Int8Network(const QuantizedModel& m, int max_batch, const Exec& ex, bool tensor_cores,
                         bool fuse_classifier)
    : ex_(ex), max_batch_(max_batch), input_chw_(m.input_chw) {
  CNN_CHECK(max_batch >= 1, "int8: batch must be >= 1, got {}", max_batch);
  validate_quantized_model(m, "int8 model");
  classes_ = m.num_classes();
  const QuantStage& first = m.stages[0];
  const Shape first_chw{first.c, first.h, first.w};
  CNN_CHECK(first.input == -1 && first_chw == m.input_chw,
            "int8: the first layer '{}' does not read the network input {}", first.name,
            shape_str(m.input_chw));
  input_inv_scale_ = 1.f / output_scale_of(m, -1);
  x_q_ = Buffer<int8_t>(size_t(max_batch) * first.h * first.w * round_up4(first.c), ex.device);
  for (size_t i = 0; i < m.stages.size(); ++i) {
    const QuantStage& q = m.stages[i];
    const bool last = i + 1 == m.stages.size();
    Stage st;
    st.input = q.input, st.shortcut = q.shortcut, st.is_add = q.add, st.is_avgpool = q.avgpool;
    QConvShape& s = st.shape;
    s.n = max_batch, s.h = q.h, s.w = q.w, s.c = q.c, s.cp = round_up4(q.c);
    s.oc = q.oc, s.ocp = round_up4(q.oc);
    // What the stage reads: the (C, H, W) its input's writer writes.
    const auto check_reads = [&](int j, const char* what) {
      const int c = j < 0 ? int(m.input_chw[0]) : m.stages[size_t(j)].out_c();
      const int h = j < 0 ? int(m.input_chw[1]) : stages_[size_t(j)].shape.ph();
      const int w = j < 0 ? int(m.input_chw[2]) : stages_[size_t(j)].shape.pw();
      CNN_CHECK(c == s.c && h == s.h && w == s.w,
                "int8: layer '{}' reads ({}, {}, {}) as its {} but '{}' writes ({}, {}, {})",
                q.name, s.c, s.h, s.w, what,
                j < 0 ? std::string("input") : m.stages[size_t(j)].name, c, h, w);
    };
    check_reads(q.input, "input");
    if (q.avgpool) {
      // Shaped as a 1x1 conv followed by a pool of the stage's window, so ph/pw/ocp describe its
      // output as for a conv.
      CNN_CHECK(q.oc == q.c, "int8: avgpool2d '{}' of {} channels writes {}", q.name, q.c, q.oc);
      s.pool_kh = q.pool_kh, s.pool_kw = q.pool_kw, s.pool_sh = q.pool_sh;
      s.pool_sw = q.pool_sw, s.pool_ph = q.pool_ph, s.pool_pw = q.pool_pw;
      s.cgp = qconv_weight_inner(s.c, s.groups);
      check_qconv_shape(s);
      st.avg_mult = float(double(q.input_scale) /
                          (double(q.output_scale) * double(q.pool_kh) * double(q.pool_kw)));
      st.relu = q.relu;
      st.y = Buffer<int8_t>(size_t(max_batch) * s.ph() * s.pw() * s.ocp, ex.device);
      stages_.push_back(std::move(st));
      continue;
    }
    if (q.add) {
      // Shaped as a 1x1 conv whose output is its tensor, so ph/pw/ocp describe it as for a conv.
      CNN_CHECK(q.oc == q.c, "int8: add '{}' of {} channels writes {}", q.name, q.c, q.oc);
      s.cgp = qconv_weight_inner(s.c, s.groups);
      check_qconv_shape(s);
      check_reads(q.shortcut, "shortcut");
      const double out = double(q.output_scale);
      st.scales.mult_a = float(double(q.input_scale) / out);
      st.scales.mult_b = float(double(q.shortcut_scale) / out);
      st.scales.relu = q.relu;
      st.y = Buffer<int8_t>(size_t(max_batch) * s.h * s.w * s.ocp, ex.device);
      stages_.push_back(std::move(st));
      continue;
    }
    if (q.linear) {
      s.kh = q.h, s.kw = q.w;  // the whole image: one output
    } else {
      s.kh = q.kh, s.kw = q.kw, s.stride_h = q.stride_h, s.stride_w = q.stride_w;
      s.pad_h = q.pad_h, s.pad_w = q.pad_w, s.dil_h = q.dil_h, s.dil_w = q.dil_w;
      s.groups = q.groups;
      if (q.pool) {
        s.pool_kh = q.pool_kh, s.pool_kw = q.pool_kw, s.pool_sh = q.pool_sh;
        s.pool_sw = q.pool_sw, s.pool_ph = q.pool_ph, s.pool_pw = q.pool_pw;
      }
    }
    s.cgp = qconv_weight_inner(s.c, s.groups);
    check_qconv_shape(s);
    CNN_CHECK(!last || (s.ph() == 1 && s.pw() == 1), "int8: the last layer '{}' must be linear",
              q.name);
    st.relu = q.relu;
    // Weights: torch layout -> (OC, KH, KW, CGP), zero padded.
    std::vector<int8_t> w(size_t(s.oc) * s.kh * s.kw * s.cgp, 0);
    const int cg = s.cg();
    // A global average pool before a linear layer: w[o, ci] at every position.
    for (int o = 0; o < s.oc; ++o)
      for (int ci = 0; ci < cg; ++ci)
        for (int r = 0; r < s.kh; ++r)
          for (int t = 0; t < s.kw; ++t)
            w[((size_t(o) * s.kh + r) * s.kw + t) * s.cgp + ci] =
                q.global_avg ? q.weight[size_t(o) * cg + ci]
                             : q.weight[((size_t(o) * cg + ci) * s.kh + r) * s.kw + t];
    // The requantization into the scale of this stage's output; the last stage dequantizes.
    const double out_scale = last ? 1.0 : double(output_scale_of(m, int(i)));
    const double positions = q.global_avg ? double(q.h) * q.w : 1.0;  // the pool's 1/(h*w)
    std::vector<float> mult(size_t(s.oc)), add(size_t(s.oc));
    for (int o = 0; o < s.oc; ++o) {
      mult[size_t(o)] =
          float(double(q.input_scale) * double(q.weight_scale[size_t(o)]) / out_scale / positions);
      add[size_t(o)] = float(double(q.bias[size_t(o)]) / out_scale);
    }
    st.w = Buffer<int8_t>(w.size(), ex.device);
    st.w.copy_from(w.data(), Device::CPU, w.size());
    st.specialized = tensor_cores && ex.device == Device::CUDA;
    // The repacked weights wherever the rule might pick the tensor cores at some batch up to
    // max_batch: a shape they take at batch 1 (they stop taking larger batches, never smaller
    // ones), unless a few-channel kernel takes it at max_batch (then at every batch). A cheap
    // superset: a classifier the linear dp4a kernel always runs carries them too.
    QConvShape one = s;
    one.n = 1;
    if (st.specialized && qconv_igemm_supported(one) &&
        !qconv_is_few_channel_kernel(qconv_pick_kernel(s, true))) {
      std::vector<int8_t> packed(size_t(qconv_igemm_weight_size(one)));
      qconv_pack_igemm_weights(one, w.data(), packed.data());  // the same bytes at every batch
      st.w_igemm = Buffer<int8_t>(packed.size(), ex.device);
      st.w_igemm.copy_from(packed.data(), Device::CPU, packed.size());
    }
    st.mult = Buffer<float>(mult.size(), ex.device);
    st.mult.copy_from(mult.data(), Device::CPU, mult.size());
    st.add = Buffer<float>(add.size(), ex.device);
    st.add.copy_from(add.data(), Device::CPU, add.size());
    if (!last) st.y = Buffer<int8_t>(size_t(max_batch) * s.ph() * s.pw() * s.ocp, ex.device);
    stages_.push_back(std::move(st));
  }
  logits_ = Buffer<float>(size_t(max_batch) * size_t(classes_), ex.device);
  // The first stage quantizes the input itself when it runs a few-channel kernel (at max_batch,
  // so at every batch) and only it reads the input (else x_q_ is still needed); its output is
  // int8 unless it is also the last.
  const Stage& st0 = stages_[0];
  fuse_input_quantization_ =
      !st0.is_add && !st0.is_avgpool && stages_.size() > 1 &&
      qconv_is_few_channel_kernel(qconv_resolve_kernel(st0.shape, path_of(st0, st0.shape))) &&
      std::none_of(m.stages.begin() + 1, m.stages.end(), [](const QuantStage& q) {
        return q.input == -1 || (q.add && q.shortcut == -1);
      });
  if (fuse_input_quantization_) x_q_ = Buffer<int8_t>();  // never written
  // The classifier fusion's scratch where the shapes allow it; whether a batch fuses depends on
  // the kernel the stage before runs at that batch (fuses_classifier).
  const size_t count = stages_.size();
  if (fuse_classifier && count >= 2 && m.stages[count - 1].input == int(count) - 2) {
    const Stage& a = stages_[count - 2];
    const Stage& b = stages_[count - 1];
    // (Not a first stage that quantizes the input itself: a few-channel kernel, never the tile.)
    const bool reads_float = count == 2 && fuse_input_quantization_;
    if (!a.is_add && !a.is_avgpool && a.specialized && !a.w_igemm.empty() && !reads_float &&
        qconv_classifier_fusable(a.shape, b.shape)) {
      classifier_acc_ =
          Buffer<int32_t>(size_t(qconv_classifier_acc_size(max_batch, classes_)), ex.device);
      classifier_arrivals_ =
          Buffer<uint32_t>(size_t(qconv_classifier_arrivals_size(max_batch)), ex.device);
      classifier_acc_.zero(ex.stream);
      classifier_arrivals_.zero(ex.stream);
    }
  }
}

bool Int8Network::fuses_classifier(int n) const {
  if (classifier_acc_.empty()) return false;
  CNN_CHECK(n >= 1 && n <= max_batch_, "int8: batch {} outside 1..{}", n, max_batch_);
  // The fused kernel is the linear tensor-core tile's (the rule's tile for a linear layer is
  // always a linear one).
  return stage_kernel(stages_.size() - 2, n) == QConvKernel::TensorCores;
}

QConvPath Int8Network::path_of(const Stage& st, const QConvShape& s) {
  if (!st.specialized) return QConvPath{};
  // The repacked weights only for a batch the tensor-core kernel takes (qconv_resolve_kernel
  // refuses them otherwise, and the rule then picks another kernel).
  const bool packed = !st.w_igemm.empty() && qconv_igemm_supported(s);
  return QConvPath(packed ? st.w_igemm.data() : nullptr, QConvKernel::Auto);
}

const float* Int8Network::forward(int n, const float* x) {
  CNN_CHECK(n >= 1 && n <= max_batch_, "int8 forward: batch {} outside 1..{}", n, max_batch_);
  QuantizeShape qs;
  qs.n = n, qs.c = int(input_chw_[0]), qs.h = int(input_chw_[1]), qs.w = int(input_chw_[2]);
  qs.cp = round_up4(qs.c);
  if (!fuse_input_quantization_) quantize_nchw_to_nhwc(qs, x, input_inv_scale_, x_q_.data(), ex_);
  const auto output = [&](int j) -> const int8_t* {
    return j < 0 ? x_q_.data() : stages_[size_t(j)].y.data();
  };
  const bool fuse_classifier = fuses_classifier(n);
  for (size_t i = 0; i < stages_.size(); ++i) {
    Stage& st = stages_[i];
    QConvShape s = st.shape;
    s.n = n;
    const int8_t* in = output(st.input);
    if (st.is_add) {
      const QAddShape as{n, s.h, s.w, s.c, s.cp};
      qadd_forward(as, in, output(st.shortcut), st.scales, st.y.data(), ex_);
      continue;
    }
    if (st.is_avgpool) {
      qavgpool_forward(avgpool_shape(s), in, st.avg_mult, st.relu, st.y.data(), ex_);
      continue;
    }
    const QEpilogue ep{st.mult.data(), st.add.data(), st.relu};
    QConvPath path = path_of(st, s);
    // The classifier's launch overlaps the end of the stage before (its weights are the
    // network's, never written by that stage).
    path.overlap_launch = i + 1 == stages_.size() && i > 0;
    if (fuse_classifier && i + 2 == stages_.size()) {
      const Stage& last = stages_.back();
      QClassifierFusion cls;
      cls.shape = last.shape;
      cls.shape.n = n;
      cls.w = last.w.data();
      cls.ep = QEpilogue{last.mult.data(), last.add.data(), last.relu};
      cls.acc = classifier_acc_.data();
      cls.arrivals = classifier_arrivals_.data();
      cls.y = logits_.data();
      qconv_linear_classifier_forward(s, in, st.w.data(), path.w_igemm, ep, st.y.data(), cls, ex_);
      break;  // the last stage ran inside this one
    }
    if (i == 0 && fuse_input_quantization_)
      qconv_few_channels_forward_quantize(s, x, input_inv_scale_, st.w.data(), ep, st.y.data(),
                                          ex_);
    else if (i + 1 == stages_.size())
      qconv_forward_float(s, in, st.w.data(), ep, logits_.data(), ex_, path);
    else
      qconv_forward(s, in, st.w.data(), ep, st.y.data(), ex_, path);
  }
  return logits_.data();
}

QConvKernel Int8Network::stage_kernel(size_t i, int n) const {
  const Stage& st = stages_.at(i);
  CNN_CHECK(!st.is_add && !st.is_avgpool, "int8: stage {} is not a conv/linear layer", i);
  CNN_CHECK(n >= 1 && n <= max_batch_, "int8: batch {} outside 1..{}", n, max_batch_);
  QConvShape s = st.shape;
  s.n = n;
  return qconv_resolve_kernel(s, path_of(st, s));
}

std::vector<int8_t> Int8Network::stage_output_to_host(size_t i, int n) const {
  const QConvShape& s = stages_.at(i).shape;
  CNN_CHECK(!stages_[i].y.empty(), "int8: stage {} writes float logits, not int8", i);
  std::vector<int8_t> out(size_t(n) * s.ph() * s.pw() * s.ocp);
  raw_copy(out.data(), Device::CPU, stages_[i].y.data(), ex_.device, out.size());
  return out;
}

}  // namespace cnn
