#include "layers/layer_spec.h"

#include <fmt/format.h>

#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>

#include "runtime/error.h"

namespace cnn {

LayerSpec layer_spec(LayerKind kind, const std::string& name) {
  LayerSpec s;
  s.kind = kind;
  s.name = name;
  return s;
}

LayerSpec conv2d_spec(const std::string& name, int out_channels, int kh, int kw, int stride,
                      int pad) {
  LayerSpec s = layer_spec(LayerKind::Conv2d, name);
  s.out_channels = out_channels;
  s.kernel_h = kh;
  s.kernel_w = kw;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  return s;
}

LayerSpec maxpool2d_spec(const std::string& name, int kernel, int stride, int pad) {
  LayerSpec s = layer_spec(LayerKind::MaxPool2d, name);
  s.kernel_h = s.kernel_w = kernel;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  return s;
}

LayerSpec linear_spec(const std::string& name, int out_features) {
  LayerSpec s = layer_spec(LayerKind::Linear, name);
  s.out_features = out_features;
  return s;
}

LayerSpec batchnorm_spec(LayerKind kind, const std::string& name) {
  return layer_spec(kind, name);
}

LayerSpec avgpool2d_spec(const std::string& name, int kernel, int stride, int pad) {
  LayerSpec s = maxpool2d_spec(name, kernel, stride, pad);
  s.kind = LayerKind::AvgPool2d;
  return s;
}

LayerSpec dropout_spec(const std::string& name, double p) {
  LayerSpec s = layer_spec(LayerKind::Dropout, name);
  s.dropout_p = p;
  return s;
}

LayerSpec residual_spec(const std::string& name, std::vector<LayerSpec> branch,
                        std::vector<LayerSpec> shortcut) {
  LayerSpec s = layer_spec(LayerKind::Residual, name);
  s.branch = std::move(branch);
  s.shortcut = std::move(shortcut);
  return s;
}

std::vector<LayerSpec> conv_net_specs(const ConvNetSizes& z) {
  return {conv2d_spec("conv1", z.conv1, z.kernel1, z.kernel1, 1, z.pad1),
          layer_spec(LayerKind::Relu, "relu1"),
          maxpool2d_spec("pool1", 2, 2),
          conv2d_spec("conv2", z.conv2, z.kernel2, z.kernel2, 1, z.pad2),
          layer_spec(LayerKind::Relu, "relu2"),
          maxpool2d_spec("pool2", 2, 2),
          layer_spec(LayerKind::Flatten, "flatten1"),
          linear_spec("fc1", z.fc1),
          layer_spec(LayerKind::Relu, "relu3"),
          linear_spec("fc2", z.classes),
          layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
}

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::Conv2d:
      return "conv2d";
    case LayerKind::Relu:
      return "relu";
    case LayerKind::MaxPool2d:
      return "maxpool2d";
    case LayerKind::Flatten:
      return "flatten";
    case LayerKind::Linear:
      return "linear";
    case LayerKind::SoftmaxCrossEntropy:
      return "softmax_cross_entropy";
    case LayerKind::BatchNorm2d:
      return "batchnorm2d";
    case LayerKind::BatchNorm1d:
      return "batchnorm1d";
    case LayerKind::AvgPool2d:
      return "avgpool2d";
    case LayerKind::GlobalAvgPool:
      return "global_avgpool";
    case LayerKind::Dropout:
      return "dropout";
    case LayerKind::Residual:
      return "residual";
  }
  return "?";
}

namespace {

std::string where(const LayerSpec& s) {
  std::string w = fmt::format("layer '{}' ({})", s.name, layer_kind_name(s.kind));
  if (s.line > 0) w += fmt::format(" at config line {}", s.line);
  return w;
}

int64_t pooled(int64_t in, int k, int stride, int pad) {
  return (in + 2 * int64_t(pad) - k) / stride + 1;
}

// One image's input and output of every layer, every layer's weights and every pooling window
// stay below 2^31 values: far beyond what this trainer runs, and small enough that every size,
// per-image index (kernels index with int) and FLOP count derived from them fits its type.
// Configs (and the configs inside checkpoints) that describe more are refused before anything
// is allocated, instead of overflowing.
constexpr int64_t kMaxValues = std::numeric_limits<int32_t>::max();

// The product of positive factors, or kMaxValues + 1 as soon as it passes kMaxValues.
int64_t capped_product(std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors) {
    if (f > 0 && p > kMaxValues / f) return kMaxValues + 1;
    p *= f;
  }
  return p;
}

void check_size(const LayerSpec& s, const char* what, int64_t values) {
  CNN_CHECK(values <= kMaxValues,
            "{}: {} has more than 2^31-1 values, more than this trainer supports", where(s), what);
}

// What a residual block may hold: at least one layer, no loss, no block (nesting would need the
// graph to track blocks within blocks; refused in this version).
void check_block(const LayerSpec& s) {
  CNN_CHECK(!s.branch.empty(), "{}: a residual block needs at least one layer under 'layers'",
            where(s));
  for (const auto* list : {&s.branch, &s.shortcut})
    for (const LayerSpec& c : *list) {
      CNN_CHECK(c.kind != LayerKind::Residual,
                "{}: holds the residual block '{}'; blocks inside blocks are not supported in "
                "this version, put them one after the other",
                where(s), c.name);
      CNN_CHECK(c.kind != LayerKind::SoftmaxCrossEntropy,
                "{}: holds softmax_cross_entropy, which must be the network's last layer",
                where(s));
    }
}

Shape chain_shapes(const std::vector<LayerSpec>& specs, Shape cur) {
  for (const LayerSpec& c : specs) cur = layer_output_shape(c, cur);
  return cur;
}

Shape per_image(const Shape& s) {
  return Shape(s.begin() + 1, s.end());
}

Shape residual_output_shape(const LayerSpec& s, const Shape& in) {
  check_block(s);
  const Shape a = chain_shapes(s.branch, in);
  const Shape b = chain_shapes(s.shortcut, in);
  CNN_CHECK(a == b,
            "{}: its layers give {} per image but its shortcut ({}) gives {}; the two are added, "
            "so they must match (a shortcut such as [conv2d: {{out_channels: C, kernel: 1, "
            "stride: S}}] maps one to the other)",
            where(s), shape_str(per_image(a)),
            s.shortcut.empty() ? std::string("the identity")
                               : fmt::format("ending in '{}'", s.shortcut.back().name),
            shape_str(per_image(b)));
  return a;
}

}  // namespace

Shape layer_output_shape(const LayerSpec& s, const Shape& in) {
  const int64_t n = in.at(0);
  switch (s.kind) {
    case LayerKind::Conv2d:
    case LayerKind::AvgPool2d:
    case LayerKind::MaxPool2d: {
      CNN_CHECK(in.size() == 4, "{}: expects an image input (N, C, H, W), got {}", where(s),
                shape_str(in));
      CNN_CHECK(s.kernel_h > 0 && s.kernel_w > 0, "{}: kernel size must be positive", where(s));
      CNN_CHECK(s.stride_h > 0 && s.stride_w > 0, "{}: stride must be positive", where(s));
      CNN_CHECK(s.pad_h >= 0 && s.pad_w >= 0, "{}: padding must be >= 0", where(s));
      check_size(s, "the input of one image", capped_product({in[1], in[2], in[3]}));
      check_size(s, "the window", capped_product({s.kernel_h, s.kernel_w}));
      const bool conv = s.kind == LayerKind::Conv2d;
      if (conv) {
        CNN_CHECK(s.dil_h > 0 && s.dil_w > 0, "{}: dilation must be positive", where(s));
        CNN_CHECK(s.groups > 0, "{}: groups must be positive", where(s));
        CNN_CHECK(in[1] % s.groups == 0,
                  "{}: groups = {} does not divide the {} input channels; expected a divisor",
                  where(s), s.groups, in[1]);
        CNN_CHECK(s.out_channels % s.groups == 0,
                  "{}: groups = {} does not divide out_channels = {}; expected a divisor", where(s),
                  s.groups, s.out_channels);
      }
      // The window a (dilated) kernel spans; pooling windows are not dilated.
      const int64_t span_h = conv ? int64_t(s.dil_h) * (s.kernel_h - 1) + 1 : s.kernel_h;
      const int64_t span_w = conv ? int64_t(s.dil_w) * (s.kernel_w - 1) + 1 : s.kernel_w;
      const int64_t padded_h = in[2] + 2 * int64_t(s.pad_h),
                    padded_w = in[3] + 2 * int64_t(s.pad_w);
      CNN_CHECK(padded_h >= span_h && padded_w >= span_w,
                "{}: kernel {}x{} is larger than its padded input {}x{}", where(s), span_h, span_w,
                padded_h, padded_w);
      if (s.kind != LayerKind::Conv2d)
        CNN_CHECK(2 * int64_t(s.pad_h) <= s.kernel_h && 2 * int64_t(s.pad_w) <= s.kernel_w,
                  "{}: padding must be at most half the window", where(s));
      int64_t c = s.kind == LayerKind::Conv2d ? s.out_channels : in[1];
      CNN_CHECK(c > 0, "{}: out_channels must be positive", where(s));
      if (s.kind == LayerKind::Conv2d)
        check_size(s, "the weight tensor",
                   capped_product({c, in[1] / s.groups, s.kernel_h, s.kernel_w}));
      const int64_t oh = pooled(in[2], static_cast<int>(span_h), s.stride_h, s.pad_h);
      const int64_t ow = pooled(in[3], static_cast<int>(span_w), s.stride_w, s.pad_w);
      check_size(s, "the output of one image", capped_product({c, oh, ow}));
      return {n, c, oh, ow};
    }
    case LayerKind::Relu:
      return in;
    case LayerKind::BatchNorm2d:
      CNN_CHECK(in.size() == 4,
                "{}: expects an image input (N, C, H, W), got {}; after a flatten or linear layer "
                "use batchnorm1d",
                where(s), shape_str(in));
      check_size(s, "the input of one image", capped_product({in[1], in[2], in[3]}));
      CNN_CHECK(s.momentum >= 0 && s.momentum <= 1, "{}: momentum must be in [0, 1], got {}",
                where(s), s.momentum);
      CNN_CHECK(s.eps > 0, "{}: eps must be positive, got {}", where(s), s.eps);
      return in;
    case LayerKind::BatchNorm1d:
      CNN_CHECK(in.size() == 2,
                "{}: expects a flat input (N, features), got {}; after a conv or pooling layer "
                "use batchnorm2d",
                where(s), shape_str(in));
      check_size(s, "the input of one image", in[1]);
      CNN_CHECK(s.momentum >= 0 && s.momentum <= 1, "{}: momentum must be in [0, 1], got {}",
                where(s), s.momentum);
      CNN_CHECK(s.eps > 0, "{}: eps must be positive, got {}", where(s), s.eps);
      return in;
    case LayerKind::GlobalAvgPool:
      CNN_CHECK(in.size() == 4, "{}: expects an image input (N, C, H, W), got {}", where(s),
                shape_str(in));
      check_size(s, "the input of one image", capped_product({in[1], in[2], in[3]}));
      return {n, in[1], 1, 1};
    case LayerKind::Dropout:
      CNN_CHECK(s.dropout_p >= 0 && s.dropout_p < 1, "{}: p must be in [0, 1), got {}", where(s),
                s.dropout_p);
      return in;
    case LayerKind::Flatten: {
      int64_t values = 1;
      for (size_t d = 1; d < in.size(); ++d) values = capped_product({values, in[d]});
      check_size(s, "the input of one image", values);
      return {n, values};
    }
    case LayerKind::Linear:
      CNN_CHECK(in.size() == 2,
                "{}: expects a flat input (N, features), got {}; add a flatten layer", where(s),
                shape_str(in));
      CNN_CHECK(s.out_features > 0, "{}: out_features must be positive", where(s));
      check_size(s, "the input of one image", in[1]);
      check_size(s, "the weight tensor", capped_product({s.out_features, in[1]}));
      return {n, s.out_features};
    case LayerKind::SoftmaxCrossEntropy:
      CNN_CHECK(in.size() == 2 && in[1] >= 2, "{}: expects class scores (N, classes >= 2), got {}",
                where(s), shape_str(in));
      return in;
    case LayerKind::Residual:
      return residual_output_shape(s, in);
  }
  return in;
}

int64_t layer_param_count(const LayerSpec& s, const Shape& in) {
  if (s.kind == LayerKind::Residual) {
    int64_t total = 0;
    for (const auto* list : {&s.branch, &s.shortcut}) {
      Shape cur = in;
      for (const LayerSpec& c : *list) {
        total += layer_param_count(c, cur);
        cur = layer_output_shape(c, cur);
      }
    }
    return total;
  }
  if (s.kind == LayerKind::Conv2d)
    return int64_t(s.out_channels) * (in.at(1) / s.groups) * s.kernel_h * s.kernel_w +
           (s.bias ? s.out_channels : 0);
  if (s.kind == LayerKind::Linear)
    return int64_t(s.out_features) * in.at(1) + (s.bias ? s.out_features : 0);
  if (s.kind == LayerKind::BatchNorm2d || s.kind == LayerKind::BatchNorm1d)
    return 2 * in.at(1);  // weight and bias; the running statistics are buffers
  return 0;
}

int64_t layer_forward_flops(const LayerSpec& s, const Shape& in) {
  Shape out = layer_output_shape(s, in);
  int64_t out_per_image = shape_numel(out) / out.at(0);
  switch (s.kind) {
    case LayerKind::Conv2d:
      return 2 * out_per_image * (in.at(1) / s.groups) * s.kernel_h * s.kernel_w;
    case LayerKind::Linear:
      return 2 * out_per_image * in.at(1);
    case LayerKind::MaxPool2d:
    case LayerKind::AvgPool2d:
      return out_per_image * s.kernel_h * s.kernel_w;
    case LayerKind::GlobalAvgPool:
      return shape_numel(in) / in.at(0);
    case LayerKind::BatchNorm2d:
    case LayerKind::BatchNorm1d:
      return 2 * out_per_image;  // one multiply-add per element with the folded scale and shift
    case LayerKind::Relu:
    case LayerKind::Dropout:
      return out_per_image;
    case LayerKind::SoftmaxCrossEntropy:
      return 5 * out_per_image;
    case LayerKind::Flatten:
      return 0;
    case LayerKind::Residual: {
      int64_t total = out_per_image;  // the add
      for (const auto* list : {&s.branch, &s.shortcut}) {
        Shape cur = in;
        for (const LayerSpec& c : *list) {
          total += layer_forward_flops(c, cur);
          cur = layer_output_shape(c, cur);
        }
      }
      return total;
    }
  }
  return 0;
}

std::vector<GraphNode> layer_graph(const std::vector<LayerSpec>& specs) {
  std::vector<GraphNode> g;
  int prev = -1;
  const auto chain = [&g](const std::vector<LayerSpec>& list, int from, bool shortcut) {
    for (const LayerSpec& c : list) {
      GraphNode node;
      node.spec = c;
      node.input = from;
      node.depth = 1;
      node.in_shortcut = shortcut;
      g.push_back(std::move(node));
      from = static_cast<int>(g.size()) - 1;
    }
    return from;
  };
  for (const LayerSpec& s : specs) {
    GraphNode node;
    node.spec = s;
    node.input = prev;
    if (s.kind == LayerKind::Residual) {
      check_block(s);
      node.input = chain(s.branch, prev, false);
      node.shortcut_input = chain(s.shortcut, prev, true);
      node.spec.branch.clear();
      node.spec.shortcut.clear();
    }
    g.push_back(std::move(node));
    prev = static_cast<int>(g.size()) - 1;
  }
  return g;
}

void finalize_layer_specs(std::vector<LayerSpec>& specs) {
  CNN_CHECK(!specs.empty(), "model.layers is empty: expected a list of layers");
  std::map<std::string, int> counters;
  const std::map<LayerKind, std::string> prefix = {
      {LayerKind::Conv2d, "conv"},       {LayerKind::Relu, "relu"},
      {LayerKind::MaxPool2d, "pool"},    {LayerKind::Flatten, "flatten"},
      {LayerKind::Linear, "fc"},         {LayerKind::SoftmaxCrossEntropy, "loss"},
      {LayerKind::BatchNorm2d, "bn"},    {LayerKind::BatchNorm1d, "bn"},
      {LayerKind::AvgPool2d, "avgpool"}, {LayerKind::GlobalAvgPool, "global_avgpool"},
      {LayerKind::Dropout, "dropout"},   {LayerKind::Residual, "res"}};
  std::set<std::string> seen;
  // Layers inside a block count on with the rest, in file order (the block, its layers, its
  // shortcut): conv3 in a block is the third conv2d of the file, as a torch module would name it.
  const std::function<void(std::vector<LayerSpec>&)> name_all = [&](std::vector<LayerSpec>& list) {
    for (auto& s : list) {
      const std::string& p = prefix.at(s.kind);
      int k = ++counters[p];
      if (s.name.empty())
        s.name = s.kind == LayerKind::SoftmaxCrossEntropy ? p : p + std::to_string(k);
      CNN_CHECK(seen.insert(s.name).second, "{}: the name '{}' is used twice", where(s), s.name);
      if (s.kind == LayerKind::Residual) {
        name_all(s.branch);
        name_all(s.shortcut);
        check_block(s);
      }
    }
  };
  name_all(specs);
  for (size_t i = 0; i + 1 < specs.size(); ++i)
    CNN_CHECK(specs[i].kind != LayerKind::SoftmaxCrossEntropy,
              "{}: softmax_cross_entropy must be the last layer", where(specs[i]));
  CNN_CHECK(specs.back().kind == LayerKind::SoftmaxCrossEntropy,
            "{}: the last layer must be softmax_cross_entropy", where(specs.back()));
}

namespace {

NetworkSummaryRow summary_row(const LayerSpec& s, const Shape& in, int depth) {
  NetworkSummaryRow row;
  row.name = s.name;
  row.kind = layer_kind_name(s.kind);
  row.out = per_image(layer_output_shape(s, in));  // validates the sizes the counts use
  row.params = layer_param_count(s, in);
  row.flops = layer_forward_flops(s, in);
  row.depth = depth;
  return row;
}

// A block's rows after its own: its layers, its shortcut's (kind marked), the add.
void add_block_rows(const LayerSpec& s, const Shape& in, std::vector<NetworkSummaryRow>* rows) {
  Shape cur = in;
  for (const LayerSpec& c : s.branch) {
    rows->push_back(summary_row(c, cur, 1));
    cur = layer_output_shape(c, cur);
  }
  cur = in;
  for (const LayerSpec& c : s.shortcut) {
    rows->push_back(summary_row(c, cur, 1));
    rows->back().kind += " (shortcut)";
    cur = layer_output_shape(c, cur);
  }
  if (s.shortcut.empty()) rows->push_back({"-", "identity (shortcut)", per_image(in), 0, 0, 1});
  const Shape out = per_image(cur);
  rows->push_back({"+", "add", out, 0, shape_numel(out), 1});
}

}  // namespace

NetworkSummary summarize_network(const std::vector<LayerSpec>& specs, const Shape& input_chw) {
  NetworkSummary sum;
  Shape cur = {1};
  cur.insert(cur.end(), input_chw.begin(), input_chw.end());
  for (const auto& s : specs) {
    NetworkSummaryRow row = summary_row(s, cur, 0);
    sum.total_params += row.params;
    CNN_CHECK(!__builtin_add_overflow(sum.total_flops, row.flops, &sum.total_flops),
              "{}: the network needs more than 2^63 FLOPs per image", where(s));
    sum.rows.push_back(std::move(row));
    if (s.kind == LayerKind::Residual) add_block_rows(s, cur, &sum.rows);
    cur = layer_output_shape(s, cur);
  }
  return sum;
}

namespace {
std::string with_commas(int64_t v) {
  std::string s = std::to_string(v), out;
  int cnt = 0;
  for (auto it = s.rbegin(); it != s.rend(); ++it) {
    if (cnt && cnt % 3 == 0) out.insert(out.begin(), ',');
    out.insert(out.begin(), *it);
    ++cnt;
  }
  return out;
}
}  // namespace

std::string format_network_summary(const NetworkSummary& s) {
  // A residual block's row carries its totals; its layers follow, indented.
  std::string out = fmt::format("{:<12} {:<22} {:<16} {:>12} {:>14}\n", "layer", "kind",
                                "output (C,H,W)", "params", "fwd FLOPs/img");
  for (const auto& r : s.rows)
    out += fmt::format("{:<12} {:<22} {:<16} {:>12} {:>14}\n",
                       std::string(2 * size_t(r.depth), ' ') + r.name, r.kind, shape_str(r.out),
                       with_commas(r.params), with_commas(r.flops));
  out += fmt::format("{:<12} {:<22} {:<16} {:>12} {:>14}\n", "total", "", "",
                     with_commas(s.total_params), with_commas(s.total_flops));
  return out;
}

}  // namespace cnn
