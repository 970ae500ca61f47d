#pragma once
// Random VALID model configs in the YAML config language (configs/mnist.yaml documents it), from a
// fixed seed, so that the network tests cover the class of nets users write and not only the ones
// in configs/. Shared by tests/test_random_nets.cpp (CPU) and tests/gpu_random_nets.cpp (CUDA
// against the CPU).
//
// Every layer kind and key of the language appears: conv2d (kernel 1..7, square or [h, w],
// stride 1/2, padding 0..k/2, dilation, groups: grouped and depthwise, bias on/off, odd channel
// counts), batchnorm2d/1d (momentum, eps), relu, maxpool2d/avgpool2d (padding, stride defaulting
// to the window), global_avgpool, dropout (p), flatten, linear, residual blocks (identity and
// projection shortcuts, the shapes generated to match), softmax_cross_entropy; inputs of 1, 3 or
// other channel counts, sizes 6..13, odd and even, square or not; explicit layer names; batch
// 1..5.
//
// What the generator avoids, and why:
// - Blocks inside blocks: refused by design ("not supported in this version").
// - Networks whose gradient checks would measure nothing: where a parameter's true gradient is
//   zero, or zero but for batchnorm's eps, no relative error of it means anything.
//   - A conv/linear bias or a batchnorm shift with no ReLU between it and the next batchnorm: a
//     per-channel constant that the batchnorm subtracts (the gradcheck cases leave such biases
//     out for the same reason). A batchnorm goes only where the tensor carries no such constant
//     since the last ReLU (`dirty_` below), and the conv/linear before it has no bias.
//   - A batchnorm after a conv/linear with one weight per output (a 1x1 depthwise conv, a
//     linear layer of one input): bn(w x) = sign(w) bn(x), w's gradient is ~eps.
//   - A batchnorm2d over fewer than 4 values per channel of one image (H x W < 4), batchnorm1d
//     with a batch under 3, and a batchnorm2d whose output reaches global_avgpool with nothing
//     nonlinear between at batch 1: over 2 values the output is +-gamma whatever the input, and
//     over one image the mean of the normalized values is the shift, so every gradient upstream
//     is ~0 (a batch of 1 in training is refused outright, as torch refuses it).
// - Networks larger than a small budget of multiply-adds per image: the double-precision
//   gradient check runs the network twice per checked coordinate, and CI runs the CPU test under
//   ASan/UBSan too. A draw over the budget is redrawn (from the same generator, deterministic).
// - Refused by design, with a clear error, and so left out of the tests' checks rather than the
//   generator's configs: a checkpoint of a network whose input is not 1 or 3 channels (what the
//   data loaders give; save_checkpoint refuses it, tests/test_random_nets.cpp checks that).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "layers/layer_spec.h"

namespace cnn::test {

struct RandomNet {
  uint64_t seed = 0;
  std::string yaml;  // a whole config: model, synthetic data, optimizer, training
  // The config's training.batch_size, 1..5: at least 3 with batchnorm1d, 2 where a batchnorm2d
  // reaches global_avgpool (see the header comment).
  int batch = 1;
  int classes = 2;
  Shape input_chw;
  // The fewest values one image gives a batchnorm to normalize per channel (H x W for
  // batchnorm2d, 1 for batchnorm1d); 0 without batchnorm. Times the batch: the statistics' count.
  int64_t bn_values_per_image = 0;
  std::set<std::string> features;  // what it exercises ("conv_depthwise", ...), for coverage
};

// The seeds the tests run: net i is random_net(random_net_seed(i)).
constexpr int kRandomNetCount = 60;
inline uint64_t random_net_seed(int i) {
  return 0x5eed0000ull + uint64_t(i);
}

namespace random_net_detail {

// mt19937_64's sequence is fixed by the standard; the <random> distributions are not (libstdc++
// and libc++ differ), so the draws are made here: the same seed gives the same net everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  int uniform(int lo, int hi) { return lo + int(g_() % uint64_t(hi - lo + 1)); }
  bool chance(double p) { return double(g_() >> 11) * 0x1.0p-53 < p; }
  template <class T>
  T pick(const std::vector<T>& v) {
    return v[size_t(uniform(0, int(v.size()) - 1))];
  }

 private:
  std::mt19937_64 g_;
};

class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_(seed) { net_.seed = seed; }

  RandomNet make() {
    for (;;) {
      RandomNet n = net_;
      if (attempt(n)) return n;
    }
  }

 private:
  static constexpr int64_t kMacBudget = 600000;  // multiply-adds per image
  static constexpr int kMaxChannels = 20;

  // The tensor between layers: (c, h, w), or (c) when flat.
  int c_ = 1, h_ = 1, w_ = 1;
  bool flat_ = false;
  // A per-channel constant from a parameter (bias, batchnorm shift) reached the tensor since the
  // last ReLU (see the header comment): no batchnorm may follow.
  bool dirty_ = false;
  // A batchnorm2d's output reached the tensor with nothing nonlinear (ReLU, max-pool) since.
  bool bn_to_mean_ = false;
  int64_t macs_ = 0, bn_per_image_ = 0;
  int names_ = 0;
  bool has_bn1d_ = false;
  Rng rng_;
  RandomNet net_;
  std::set<std::string>* features_ = nullptr;

  void feature(const std::string& f) { features_->insert(f); }

  static std::string pair(int h, int w) {
    return h == w ? std::to_string(h) : fmt::format("[{}, {}]", h, w);
  }
  // A square value written as [v, v] now and then, as the grammar allows.
  std::string pair_key(const char* key, int h, int w) {
    if (h == w && rng_.chance(0.15)) return fmt::format(", {}: [{}, {}]", key, h, w);
    return fmt::format(", {}: {}", key, pair(h, w));
  }
  // ", name: ..." now and then; never a default name (conv1, relu2, ...), so never a clash.
  std::string maybe_name(const char* kind) {
    if (!rng_.chance(0.1)) return "";
    feature("named_layer");
    return fmt::format(", name: u{}_{}", ++names_, kind);
  }
  std::string bare(const char* kind) {
    const std::string n = maybe_name(kind);
    return n.empty() ? std::string(kind) : fmt::format("{}: {{{}}}", kind, n.substr(2));
  }

  // Groups for a conv from cin to cout: 1 mostly, else a common divisor (cin itself: depthwise).
  int pick_groups(int cin, int cout) {
    std::vector<int> divisors;
    for (int d = 2; d <= std::gcd(cin, cout); ++d)
      if (cin % d == 0 && cout % d == 0) divisors.push_back(d);
    if (divisors.empty() || rng_.chance(0.55)) return 1;
    return rng_.pick(divisors);
  }

  struct Conv {
    int cout = 1, kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
    bool bias = true;
  };

  // Writes the conv2d item and moves the tensor through it.
  std::string emit_conv(const Conv& v) {
    const int span_h = v.dh * (v.kh - 1) + 1, span_w = v.dw * (v.kw - 1) + 1;
    const int oh = (h_ + 2 * v.ph - span_h) / v.sh + 1, ow = (w_ + 2 * v.pw - span_w) / v.sw + 1;
    macs_ += int64_t(v.cout) * oh * ow * (c_ / v.groups) * v.kh * v.kw;
    feature("conv2d");
    if (v.kh != v.kw) feature("conv_nonsquare_kernel");
    if (std::max(v.kh, v.kw) == 7) feature("conv_kernel_7");
    if (std::max(v.kh, v.kw) % 2 == 0) feature("conv_even_kernel");
    if (v.sh == 2 || v.sw == 2) feature("conv_stride_2");
    if (v.ph || v.pw) feature("conv_padding");
    if (v.dh > 1 || v.dw > 1) feature("conv_dilation");
    if (v.groups > 1) feature(v.groups == c_ ? "conv_depthwise" : "conv_grouped");
    if (!v.bias) feature("conv_no_bias");
    if (v.cout % 2 == 1 && v.cout > 1) feature("odd_channels");
    std::string s = fmt::format("conv2d: {{out_channels: {}", v.cout);
    s += pair_key("kernel", v.kh, v.kw);
    if (v.sh != 1 || v.sw != 1 || rng_.chance(0.2)) s += pair_key("stride", v.sh, v.sw);
    if (v.ph || v.pw || rng_.chance(0.2)) s += pair_key("padding", v.ph, v.pw);
    if (v.dh != 1 || v.dw != 1) s += pair_key("dilation", v.dh, v.dw);
    if (v.groups != 1 || rng_.chance(0.1)) s += fmt::format(", groups: {}", v.groups);
    if (!v.bias || rng_.chance(0.2)) s += fmt::format(", bias: {}", v.bias ? "true" : "false");
    s += maybe_name("conv") + "}";
    c_ = v.cout;
    h_ = oh;
    w_ = ow;
    dirty_ = dirty_ || v.bias;
    return s;
  }

  // Any conv that fits the tensor: kernel 1..7 (square mostly), stride 1 or 2, padding 0..k/2,
  // dilation 2 now and then, groups plain, grouped or depthwise.
  Conv any_conv(bool bias) {
    Conv v;
    v.bias = bias;
    const int mode = c_ > 1 ? rng_.uniform(0, 9) : 0;
    if (mode >= 8) {  // depthwise: one group per input channel
      v.groups = c_;
      v.cout = c_ * (c_ * 2 <= kMaxChannels && rng_.chance(0.3) ? 2 : 1);
    } else if (mode >= 6) {  // grouped: a divisor of the input channels
      std::vector<int> divisors;
      for (int d = 2; d < c_; ++d)
        if (c_ % d == 0) divisors.push_back(d);
      v.groups = divisors.empty() ? c_ : rng_.pick(divisors);
      v.cout = v.groups * rng_.uniform(1, std::max(1, kMaxChannels / v.groups));
    } else {
      v.cout = rng_.uniform(1, kMaxChannels);
    }
    for (int tries = 0;; ++tries) {
      v.kh = rng_.uniform(1, 7);
      v.kw = rng_.chance(0.25) ? rng_.uniform(1, 7) : v.kh;
      v.dh = v.dw = rng_.chance(0.12) ? 2 : 1;
      if (v.dh > 1 && rng_.chance(0.3)) v.dw = 1;
      v.ph = rng_.uniform(0, v.kh / 2);
      v.pw = rng_.uniform(0, v.kw / 2);
      if (h_ + 2 * v.ph >= v.dh * (v.kh - 1) + 1 && w_ + 2 * v.pw >= v.dw * (v.kw - 1) + 1) break;
      if (tries > 20) {
        v.kh = v.kw = v.dh = v.dw = 1;
        v.ph = v.pw = 0;
        break;
      }
    }
    v.sh = rng_.chance(0.3) ? 2 : 1;
    v.sw = rng_.chance(0.15) ? 3 - v.sh : v.sh;
    return v;
  }

  // A conv whose output (H, W) is ceil(H / stride), ceil(W / stride) whatever the input size:
  // odd kernel k, padding dilation * (k / 2). A block's branch and its projection shortcut both
  // built this way end at the same size.
  Conv sized_conv(int cout, int sh, int sw, bool bias, int max_k = 5) {
    Conv v;
    v.cout = cout;
    v.bias = bias;
    v.groups = pick_groups(c_, cout);
    v.kh = 2 * rng_.uniform(0, max_k / 2) + 1;
    v.kw = rng_.chance(0.2) ? 2 * rng_.uniform(0, max_k / 2) + 1 : v.kh;
    v.dh = v.dw = rng_.chance(0.1) ? 2 : 1;
    v.ph = v.dh * (v.kh / 2);
    v.pw = v.dw * (v.kw / 2);
    v.sh = sh;
    v.sw = sw;
    return v;
  }

  // batchnorm2d / batchnorm1d where the tensor allows one (see the header comment).
  bool bn_allowed() const { return !dirty_ && (flat_ || h_ * w_ >= 4); }
  std::string emit_bn() {
    const bool one_d = flat_;
    feature(one_d ? "batchnorm1d" : "batchnorm2d");
    const int64_t per_image = one_d ? 1 : int64_t(h_) * w_;
    bn_per_image_ = bn_per_image_ == 0 ? per_image : std::min(bn_per_image_, per_image);
    has_bn1d_ = has_bn1d_ || one_d;
    dirty_ = true;  // its shift
    bn_to_mean_ = bn_to_mean_ || !one_d;
    const char* kind = one_d ? "batchnorm1d" : "batchnorm2d";
    std::string keys;
    if (rng_.chance(0.25)) keys += fmt::format(", momentum: {}", rng_.pick<double>({0.01, 0.3, 1}));
    if (rng_.chance(0.25)) keys += fmt::format(", eps: {}", rng_.pick<double>({1e-3, 0.01}));
    keys += maybe_name(one_d ? "bn1d" : "bn2d");
    if (keys.empty()) return kind;
    return fmt::format("{}: {{{}}}", kind, keys.substr(2));
  }
  std::string emit_relu() {
    feature("relu");
    dirty_ = false;
    bn_to_mean_ = false;
    return bare("relu");
  }
  std::string emit_dropout() {
    feature("dropout");
    const double p = rng_.pick<double>({0.0, 0.1, 0.25, 0.5});
    if (rng_.chance(0.2)) return bare("dropout");  // p defaults to 0.5
    return fmt::format("dropout: {{p: {}{}}}", p, maybe_name("drop"));
  }

  // maxpool2d / avgpool2d: window 1..3 (or [h, w]), stride 1..window or the default (the
  // window), padding at most half the window.
  std::string emit_pool(bool keep_size = false) {
    const bool max = rng_.chance(0.5);
    feature(max ? "maxpool2d" : "avgpool2d");
    if (max) bn_to_mean_ = false;
    int kh, kw, sh, sw, ph, pw;
    bool default_stride = false;
    if (keep_size) {  // 3x3 stride 1 padding 1 (or 1x1): the size stays
      kh = kw = rng_.chance(0.8) ? 3 : 1;
      sh = sw = 1;
      ph = pw = kh / 2;
    } else {
      for (;;) {
        kh = rng_.uniform(1, 3);
        kw = rng_.chance(0.25) ? rng_.uniform(1, 3) : kh;
        ph = rng_.uniform(0, kh / 2);
        pw = rng_.uniform(0, kw / 2);
        if (h_ + 2 * ph >= kh && w_ + 2 * pw >= kw) break;
      }
      default_stride = rng_.chance(0.4);
      sh = default_stride ? kh : rng_.uniform(1, kh);
      sw = default_stride ? kw : rng_.uniform(1, kw);
    }
    if (default_stride) feature("pool_default_stride");
    if (ph || pw) feature("pool_padding");
    std::string s = fmt::format("{}: {{kernel: {}", max ? "maxpool2d" : "avgpool2d", pair(kh, kw));
    if (!default_stride) s += pair_key("stride", sh, sw);
    if (ph || pw || rng_.chance(0.2)) s += pair_key("padding", ph, pw);
    s += maybe_name(max ? "maxpool" : "avgpool") + "}";
    h_ = (h_ + 2 * ph - kh) / sh + 1;
    w_ = (w_ + 2 * pw - kw) / sw + 1;
    macs_ += int64_t(c_) * h_ * w_ * kh * kw;
    return s;
  }

  // conv [batchnorm], where a batchnorm fits: the bias is then left out, and the conv has more
  // than one weight per output channel (with one, batchnorm's output does not depend on it:
  // bn(w x) = sign(w) bn(x) up to eps, and its gradient is ~0).
  void conv_bn(std::vector<std::string>& out, Conv v, bool want_bn) {
    want_bn = want_bn && bn_allowed() && (c_ / v.groups) * v.kh * v.kw > 1;
    if (want_bn) v.bias = false;
    out.push_back(emit_conv(v));
    if (want_bn && bn_allowed()) out.push_back(emit_bn());  // the output may be under 2x2
  }
  // conv [batchnorm] [relu].
  void conv_unit(std::vector<std::string>& out) {
    conv_bn(out, any_conv(rng_.chance(0.75)), rng_.chance(0.4));
    if (rng_.chance(0.7)) out.push_back(emit_relu());
  }

  // A residual block: its branch, its shortcut (empty: identity), the tensor after the add.
  std::string residual_unit() {
    const int c0 = c_, h0 = h_, w0 = w_;
    const bool dirty0 = dirty_, to_mean0 = bn_to_mean_;
    const bool projection = rng_.chance(0.5);
    int cout = c0, sh = 1, sw = 1;
    if (projection) {
      cout = rng_.uniform(1, kMaxChannels);
      sh = rng_.chance(0.6) ? 2 : 1;
      sw = rng_.chance(0.8) ? sh : 3 - sh;
    }
    feature(projection ? "residual_projection" : "residual_identity");
    std::vector<std::string> branch, shortcut;
    if (!projection && c0 <= 4 && rng_.chance(0.3)) {  // 1x1 expand, depthwise, 1x1 project
      feature("residual_depthwise_separable");
      const int mid = c0 * 2;
      conv_unit_in_block(branch, sized_conv(mid, 1, 1, true, 1), true);
      Conv dw = sized_conv(mid, 1, 1, true, 3);
      dw.groups = mid;
      conv_unit_in_block(branch, dw, true);
      conv_unit_in_block(branch, sized_conv(cout, 1, 1, true, 1), false);
    } else if (rng_.chance(0.25)) {  // one conv
      conv_unit_in_block(branch, sized_conv(cout, sh, sw, true), false);
    } else {  // conv, relu, [pool / dropout], conv: ResNet's basic block
      const int mid = rng_.uniform(1, kMaxChannels);
      conv_unit_in_block(branch, sized_conv(mid, sh, sw, true), true);
      if (rng_.chance(0.25)) branch.push_back(emit_pool(true));
      if (rng_.chance(0.15)) branch.push_back(emit_dropout());
      conv_unit_in_block(branch, sized_conv(cout, 1, 1, true), false);
    }
    const int c1 = c_, h1 = h_, w1 = w_;
    const bool dirty1 = dirty_, to_mean1 = bn_to_mean_;
    if (projection) {
      c_ = c0, h_ = h0, w_ = w0, dirty_ = dirty0, bn_to_mean_ = to_mean0;
      Conv p = sized_conv(cout, sh, sw, rng_.chance(0.5), 3);
      p.dh = p.dw = 1;
      p.ph = p.kh / 2;
      p.pw = p.kw / 2;
      conv_bn(shortcut, p, !p.bias && rng_.chance(0.5));
    }
    // The generator's own check that the two paths meet (the config would refuse them).
    if (projection && (c_ != c1 || h_ != h1 || w_ != w1))
      throw std::logic_error("random_net_config.h: a projection shortcut that does not match");
    c_ = c1, h_ = h1, w_ = w1;
    dirty_ = dirty1 || (projection ? dirty_ : dirty0);
    bn_to_mean_ = to_mean1 || (projection ? bn_to_mean_ : to_mean0);
    macs_ += int64_t(c_) * h_ * w_;  // the add
    const auto list = [](const std::vector<std::string>& items) {
      std::string s;
      for (const std::string& i : items) s += "\n          - " + i;
      return s;
    };
    std::string s = "residual:";
    if (rng_.chance(0.15)) s += fmt::format("\n        name: u{}_res", ++names_);
    s += "\n        layers:" + list(branch);
    if (projection)
      s += "\n        shortcut:" + list(shortcut);
    else if (rng_.chance(0.2))
      s += "\n        shortcut: []";
    return s;
  }
  void conv_unit_in_block(std::vector<std::string>& out, Conv v, bool relu) {
    if (rng_.chance(0.3)) v.bias = false;
    conv_bn(out, v, rng_.chance(0.5));
    if (relu) out.push_back(emit_relu());
  }

  std::string linear(int out_features, bool bias) {
    feature("linear");
    if (!bias) feature("linear_no_bias");
    macs_ += int64_t(c_) * out_features;
    std::string s = fmt::format("linear: {{out_features: {}", out_features);
    if (!bias || rng_.chance(0.2)) s += fmt::format(", bias: {}", bias ? "true" : "false");
    s += maybe_name("fc") + "}";
    c_ = out_features;
    dirty_ = dirty_ || bias;
    return s;
  }

  bool attempt(RandomNet& n) {
    features_ = &n.features;
    macs_ = 0;
    bn_per_image_ = 0;
    has_bn1d_ = false;
    flat_ = false;
    dirty_ = false;
    bn_to_mean_ = false;
    int min_batch = 1;
    const int cin = rng_.pick<int>({1, 1, 1, 3, 3, 3, 5, 5, 2, 4, 7});
    const int units = rng_.chance(0.08) ? 0 : rng_.uniform(1, 5);  // of the image part
    // LeNet's start on one channel: conv, relu, max-pool 2x2, the pattern CUDA runs as one fused
    // pass (kernels/conv/conv_relu_pool.h) where the conv's output is even: on even inputs.
    const bool lenet = cin == 1 && units > 0 && rng_.chance(0.5);
    int hin = rng_.uniform(7, 13), win = rng_.uniform(7, 13);
    if (lenet && rng_.chance(0.7)) {
      hin -= hin % 2;
      win -= win % 2;
    }
    c_ = cin, h_ = hin, w_ = win;
    n.input_chw = {cin, hin, win};
    n.classes = rng_.uniform(2, 6);
    feature(cin == 1 || cin == 3 ? fmt::format("input_channels_{}", cin) : "input_channels_other");
    if (hin != win) feature("input_non_square");
    if (units == 0) feature("no_conv");
    std::vector<std::string> layers;
    if (lenet) {
      feature("conv_relu_maxpool_start");
      Conv v;
      v.cout = rng_.uniform(1, kMaxChannels);
      v.kh = v.kw = rng_.pick<int>({1, 3, 5, 5, 7});
      v.ph = v.pw = rng_.uniform(0, v.kh / 2);
      if (std::min(h_, w_) + 2 * v.ph - v.kh + 1 < 2) v.ph = v.pw = v.kh / 2;  // the pool fits
      v.bias = rng_.chance(0.8);
      layers.push_back(emit_conv(v));
      layers.push_back(emit_relu());
      layers.push_back(fmt::format("maxpool2d: {{kernel: {}}}", rng_.chance(0.5) ? "2" : "[2, 2]"));
      feature("maxpool2d");
      feature("pool_default_stride");
      h_ /= 2;
      w_ /= 2;
      macs_ += int64_t(c_) * h_ * w_ * 4;
    }
    for (int u = 0; u < units; ++u) {
      const int r = rng_.uniform(0, 99);
      if (r < 40) {
        conv_unit(layers);
      } else if (r < 55) {
        layers.push_back(emit_pool());
      } else if (r < 82) {
        layers.push_back(residual_unit());
        if (rng_.chance(0.7)) layers.push_back(emit_relu());
      } else if (r < 88) {
        layers.push_back(emit_dropout());
      } else if (r < 94 && bn_allowed()) {
        layers.push_back(emit_bn());
      } else {
        layers.push_back(emit_relu());
      }
    }

    // The head: global average pooling or not, flatten, 0..2 hidden linear layers, the class
    // scores; or global average pooling, a 1x1 conv to the classes, flatten.
    const int head = rng_.uniform(0, 9);
    if (head < 4 || head == 9) {
      feature("global_avgpool");
      layers.push_back(bare("global_avgpool"));
      // Over one image, the mean of a batchnorm2d's output is its shift whatever the input: with
      // nothing nonlinear between them, a batch of 1 would leave every gradient upstream ~0.
      min_batch = bn_to_mean_ ? 2 : 1;
      h_ = w_ = 1;
    }
    if (head == 9) {
      feature("conv_head");
      Conv v;
      v.cout = n.classes;
      v.groups = pick_groups(c_, n.classes);
      v.bias = rng_.chance(0.7);
      layers.push_back(emit_conv(v));
      layers.push_back(bare("flatten"));
    } else {
      layers.push_back(bare("flatten"));
      c_ = c_ * h_ * w_;
      h_ = w_ = 1;
      flat_ = true;
      if (rng_.chance(0.1) && bn_allowed()) layers.push_back(emit_bn());
      const int hidden = rng_.uniform(0, 2);
      for (int k = 0; k < hidden; ++k) {
        feature("linear_hidden");
        const bool clean_before = !dirty_;
        const bool bn = clean_before && c_ > 1 && rng_.chance(0.4);  // c_ > 1: as conv_bn
        layers.push_back(linear(rng_.uniform(1, 12), !bn && rng_.chance(0.8)));
        if (bn) layers.push_back(emit_bn());
        if (rng_.chance(0.75)) layers.push_back(emit_relu());
        if (rng_.chance(0.25)) layers.push_back(emit_dropout());
      }
      layers.push_back(linear(n.classes, rng_.chance(0.8)));
    }
    layers.push_back("softmax_cross_entropy");
    if (macs_ > kMacBudget) return false;

    n.batch = std::max(rng_.uniform(1, 5), has_bn1d_ ? 3 : min_batch);
    if (n.batch == 1) feature("batch_1");
    n.bn_values_per_image = bn_per_image_;
    std::string y = fmt::format(
        "name: random_net_{}\n"
        "model:\n"
        "  input: {{channels: {}, height: {}, width: {}}}\n"
        "  layers:\n",
        n.seed, cin, hin, win);
    for (const std::string& l : layers) y += "    - " + l + "\n";
    y += fmt::format(
        "data: {{format: synthetic, synthetic: {{classes: {}, train: 16, test: 8}}}}\n"
        "optimizer: {{type: sgd, lr: 0.05, momentum: 0.9}}\n"
        "training: {{epochs: 1, batch_size: {}, seed: {}}}\n",
        n.classes, n.batch, n.seed);
    n.yaml = y;
    return true;
  }
};

}  // namespace random_net_detail

// The random config for one seed (the same text for the same seed, on every platform).
inline RandomNet random_net(uint64_t seed) {
  return random_net_detail::Generator(seed).make();
}

}  // namespace cnn::test
