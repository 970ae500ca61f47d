#include "layers/gradcheck/gradcheck.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "layers/network.h"
#include "layers/ref_network.h"
#include "runtime/error.h"
#include "runtime/thread_pool.h"

namespace cnn {
namespace {

struct Problem {
  std::vector<double> params, x, probe;
  std::vector<int32_t> labels;
};

Problem make_problem(const RefNetwork& ref, int classes, const GradcheckOptions& opt) {
  std::mt19937_64 rng(opt.seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Problem p;
  p.params.resize(size_t(ref.num_params()));
  // Parameters at a modest scale so activations stay O(1) through the chain.
  for (const auto& info : ref.param_infos()) {
    const double fan_in = double(info.numel()) / double(info.shape[0]);
    const double bound = info.is_bias ? 0.5 : std::sqrt(3.0 / std::max(1.0, fan_in));
    for (int64_t i = 0; i < info.numel(); ++i) p.params[size_t(info.offset + i)] = bound * u(rng);
  }
  p.x.resize(size_t(ref.input_count()));
  for (auto& v : p.x) v = u(rng);
  p.probe.resize(size_t(ref.output_count()));
  for (auto& v : p.probe) v = u(rng);
  std::uniform_int_distribution<int32_t> lab(0, std::max(1, classes) - 1);
  p.labels.resize(size_t(opt.batch));
  for (auto& l : p.labels) l = lab(rng);
  return p;
}

std::vector<int64_t> sample_indices(int64_t count, int samples, std::mt19937_64& rng) {
  std::vector<int64_t> idx(static_cast<size_t>(count));
  std::iota(idx.begin(), idx.end(), 0);
  if (count > samples) {
    std::shuffle(idx.begin(), idx.end(), rng);
    idx.resize(size_t(samples));
  }
  return idx;
}

// ||a - b|| / max(||a||, ||b||, floor_norm).
double rel_error(const std::vector<double>& a, const std::vector<double>& b,
                 double floor_norm = 0) {
  double diff = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  const double denom = std::max({std::sqrt(na), std::sqrt(nb), floor_norm, 1e-12});
  return std::sqrt(diff) / denom;
}

// Numerical derivative of the loss along coordinate i of v (params or x), or false where the
// step crosses a kink (a ReLU input or a max-pool tie within h): there the one-sided differences
// disagree, neither is the derivative, and a float network may fairly take either side.
// Numerical derivative of the loss along coordinate i of v (params or x), or false where the
// step crosses a kink: a ReLU input changes sign or a max-pool winner changes on either side
// (`pieces` differ from the centre's, `center_pieces`), or the one-sided differences disagree.
// There neither side is the derivative and a float network may fairly take either; in a large
// net a single ReLU of thousands can cross with a jump too small for the one-sided test and
// still move the quotient by ~1e-6 relative. A parameter's perturbation runs the network from
// its step on (`acts`: the unperturbed pass); the input's (acts null) runs all of it.
bool numerical(const RefNetwork& ref, Problem& p, std::vector<double>& v, int64_t i, double h,
               double center, const std::vector<std::vector<double>>* acts,
               const std::vector<uint64_t>& center_pieces, double* out) {
  const size_t first = acts ? ref.step_of_param(i) : 0;
  bool same_pieces = true;
  const auto loss = [&] {
    std::vector<uint64_t> pieces;
    const double l = acts ? ref.loss_from(first, *acts, p.params, p.labels, p.probe, &pieces)
                          : ref.loss_from(0, {p.x}, p.params, p.labels, p.probe, &pieces);
    for (size_t s = first; s < pieces.size(); ++s) same_pieces &= pieces[s] == center_pieces[s];
    return l;
  };
  const double keep = v[size_t(i)];
  v[size_t(i)] = keep + h;
  const double up = loss();
  v[size_t(i)] = keep - h;
  const double down = loss();
  v[size_t(i)] = keep;
  if (!same_pieces) return false;
  const double ahead = (up - center) / h, behind = (center - down) / h;
  // Smooth: the sides differ by ~h * |f''| (~1e-6); a kink jumps by a share of the gradient.
  if (std::abs(ahead - behind) > 1e-3 * (std::abs(ahead) + std::abs(behind)) + 1e-6) return false;
  *out = (up - down) / (2 * h);
  return true;
}

// batchnorm1d normalizes each feature over the batch alone: over 2 values its output is
// +-gamma whatever the input, every input gradient is ~0 and no relative error of it means
// anything. Such networks are checked with a batch of at least 6.
GradcheckOptions with_batch_for(const std::vector<LayerSpec>& specs, GradcheckOptions opt) {
  for (const auto& s : specs)
    if (s.kind == LayerKind::BatchNorm1d) opt.batch = std::max(opt.batch, 6);
  return opt;
}

int classes_of(const std::vector<LayerSpec>& specs, const Shape& input_chw) {
  return int(summarize_network(specs, input_chw).rows.back().out.at(0));
}

// The coordinates checked in one tensor (or the input) and their numerical derivatives.
struct SampledRow {
  std::string what;
  bool is_input = false;
  int64_t offset = 0;
  std::vector<int64_t> index;  // within the tensor
  std::vector<char> smooth;    // 0: the step crosses a kink there; not compared
  std::vector<double> numerical;
};

}  // namespace

struct Gradchecker::Impl {
  GradcheckOptions opt;
  std::vector<LayerSpec> specs;
  Shape input_chw;
  RefNetwork ref;
  Problem p;
  std::vector<SampledRow> rows;  // every parameter tensor, then the input

  Impl(const std::vector<LayerSpec>& s, const Shape& chw, const GradcheckOptions& o)
      : opt(o),
        specs(s),
        input_chw(chw),
        ref(s, chw, o.batch, o.label_smoothing, NetworkOptions{}.seed),
        p(make_problem(ref, classes_of(s, chw), o)) {
    // The same draws, in the same order, as one row after another would make.
    std::mt19937_64 rng(opt.seed ^ 0x5bd1e995u);
    for (const auto& info : ref.param_infos()) {
      SampledRow r;
      r.what = info.name;
      r.offset = info.offset;
      r.index = sample_indices(info.numel(), opt.samples_per_tensor, rng);
      rows.push_back(std::move(r));
    }
    SampledRow in;
    in.what = "input";
    in.is_input = true;
    in.index = sample_indices(int64_t(p.x.size()), opt.samples_per_tensor, rng);
    rows.push_back(std::move(in));

    struct Task {
      size_t row, k;
    };
    std::vector<Task> tasks;
    for (size_t r = 0; r < rows.size(); ++r) {
      rows[r].smooth.assign(rows[r].index.size(), 0);
      rows[r].numerical.assign(rows[r].index.size(), 0.0);
      for (size_t k = 0; k < rows[r].index.size(); ++k) tasks.push_back({r, k});
    }
    const double center = ref.loss(p.params, p.x, p.labels, p.probe);
    std::vector<uint64_t> center_pieces;
    const std::vector<std::vector<double>> acts = ref.activations(p.params, p.x, &center_pieces);
    // Each chunk perturbs its own copy of the parameters and input; the RefNetwork is const.
    parallel_for(0, int64_t(tasks.size()), [&](int64_t lo, int64_t hi) {
      Problem mine = p;
      for (int64_t t = lo; t < hi; ++t) {
        SampledRow& r = rows[tasks[size_t(t)].row];
        const size_t k = tasks[size_t(t)].k;
        std::vector<double>& v = r.is_input ? mine.x : mine.params;
        double d = 0;
        r.smooth[k] = numerical(ref, mine, v, r.offset + r.index[k], opt.step, center,
                                r.is_input ? nullptr : &acts, center_pieces, &d);
        r.numerical[k] = d;
      }
    });
  }

  GradcheckResult compare(const std::string& title, const std::vector<double>& analytic_params,
                          const std::vector<double>* analytic_x, double tolerance) const {
    GradcheckResult res;
    res.title = title;
    res.tolerance = tolerance;
    // The largest per-coordinate RMS numerical gradient of a parameter tensor (denominator_floor).
    double rms_max = 0;
    for (const SampledRow& r : rows) {
      if (r.is_input) continue;
      double sq = 0;
      int64_t n = 0;
      for (size_t k = 0; k < r.index.size(); ++k) {
        if (!r.smooth[k]) continue;
        sq += r.numerical[k] * r.numerical[k];
        ++n;
      }
      if (n > 0) rms_max = std::max(rms_max, std::sqrt(sq / double(n)));
    }
    for (const SampledRow& r : rows) {
      if (r.is_input && !analytic_x) continue;
      const std::vector<double>& analytic = r.is_input ? *analytic_x : analytic_params;
      std::vector<double> a, num;
      for (size_t k = 0; k < r.index.size(); ++k) {
        if (!r.smooth[k]) continue;  // at a kink
        a.push_back(analytic[size_t(r.offset + r.index[k])]);
        num.push_back(r.numerical[k]);
      }
      const double floor_norm = opt.denominator_floor * rms_max * std::sqrt(double(a.size()));
      GradcheckRow row{r.what, int64_t(a.size()), rel_error(a, num, floor_norm)};
      res.worst = std::max(res.worst, row.rel_error);
      res.rows.push_back(row);
    }
    return res;
  }
};

Gradchecker::Gradchecker(const std::vector<LayerSpec>& specs, const Shape& input_chw,
                         const GradcheckOptions& opt)
    : impl_(std::make_unique<Impl>(specs, input_chw, with_batch_for(specs, opt))) {}

Gradchecker::~Gradchecker() = default;

int Gradchecker::batch() const {
  return impl_->opt.batch;
}

std::vector<double> Gradchecker::reference_parameter_gradient() const {
  const Impl& m = *impl_;
  std::vector<double> dparams, dx;
  m.ref.gradients(m.p.params, m.p.x, m.p.labels, m.p.probe, &dparams, &dx);
  return dparams;
}

GradcheckResult Gradchecker::reference() {
  const Impl& m = *impl_;
  std::vector<double> dparams, dx;
  m.ref.gradients(m.p.params, m.p.x, m.p.labels, m.p.probe, &dparams, &dx);
  return m.compare("cpu double", dparams, &dx, 1e-6);
}

GradcheckResult Gradchecker::parameters(const std::string& title,
                                        const std::vector<double>& analytic, double tolerance) {
  CNN_CHECK(int64_t(analytic.size()) == impl_->ref.num_params(),
            "gradcheck: {} analytic gradients for a network of {} parameters", analytic.size(),
            impl_->ref.num_params());
  return impl_->compare(title, analytic, nullptr, tolerance);
}

GradcheckResult Gradchecker::network(const Exec& ex, bool fuse_relu) {
  const Impl& m = *impl_;
  CNN_CHECK(m.ref.has_softmax(),
            "gradcheck_network needs a network ending in softmax_cross_entropy");
  NetworkOptions nopt;
  nopt.max_batch = m.opt.batch;
  nopt.fuse_relu = fuse_relu;
  nopt.label_smoothing = static_cast<float>(m.opt.label_smoothing);
  Network net(m.specs, m.input_chw, nopt, ex);
  CNN_CHECK(net.num_params() == m.ref.num_params(), "network and reference disagree on the layout");
  net.params_from_host(std::vector<float>(m.p.params.begin(), m.p.params.end()));

  std::vector<float> hx(m.p.x.begin(), m.p.x.end());
  Buffer<float> x(hx.size(), ex.device);
  x.copy_from(hx.data(), Device::CPU, hx.size());
  Buffer<int32_t> labels(m.p.labels.size(), ex.device);
  labels.copy_from(m.p.labels.data(), Device::CPU, m.p.labels.size());
  net.forward_backward(m.opt.batch, x.data(), labels.data(), 1.0f / float(m.opt.batch));
  stream_sync(ex.device, ex.stream);
  std::vector<float> g = net.grads_to_host();
  std::vector<double> analytic(g.begin(), g.end());
  return m.compare(
      fmt::format(
          "{} float{}{}{}", device_name(ex.device),
          ex.precision == Precision::FP32 ? "" : std::string(" ") + precision_name(ex.precision),
          ex.deterministic ? " deterministic" : "",
          net.fused_conv_relu_pool() ? " conv-relu-pool fused" : ""),
      analytic, nullptr, gradcheck_network_tolerance(ex.precision));
}

double gradcheck_network_tolerance(Precision p) {
  // FP32 and TF32 (2^-11 relative rounding per operand): 1e-2, the float arithmetic's allowance.
  // BF16 keeps 8 significant bits: 2^-8 relative rounding per operand, up to 2^-7 = 7.8e-3 per
  // product. A gradient here passes through up to ~6 rounded products in sequence (forward conv
  // / linear, then input and weight gradients), more in a residual block (two convolutions
  // forward, two input gradients back, the weight gradient: ~8): 6.3e-2 if every error pointed
  // the same way; random ones (rms ~0.6 2^-8 per product) add to ~7e-3; 1e-1 covers the aligned
  // case. This bounds rounding only: a network with ReLUs or max-pools can also take the other
  // side of a kink that lies within BF16's noise of an activation (measured up to 0.35 on the
  // H200), so the BF16 network checks (tests/gpu_bf16.cpp) run smooth networks, and measure each
  // tensor against a floor of the network's largest gradient (denominator_floor). A wrong BF16
  // path (a dropped k-slice, a mis-rounded operand tile) is off by O(1); the FP32 checks keep
  // their 1e-2 for the smaller mistakes.
  return p == Precision::BF16 ? 1e-1 : 1e-2;
}

GradcheckResult gradcheck_reference(const std::vector<LayerSpec>& specs, const Shape& input_chw,
                                    const GradcheckOptions& opt) {
  return Gradchecker(specs, input_chw, opt).reference();
}

GradcheckResult gradcheck_network(const std::vector<LayerSpec>& specs, const Shape& input_chw,
                                  const GradcheckOptions& opt, const Exec& ex, bool fuse_relu) {
  return Gradchecker(specs, input_chw, opt).network(ex, fuse_relu);
}

std::vector<GradcheckCase> gradcheck_layer_cases() {
  const auto wrap = [](std::string title, std::vector<LayerSpec> body, Shape chw) {
    std::vector<LayerSpec> s;
    if (chw.size() == 3) s.push_back(conv2d_spec("prefix", int(chw[0]), 1, 1, 1, 0));
    for (auto& b : body) s.push_back(b);
    if (chw.size() == 3) s.push_back(layer_spec(LayerKind::Flatten, "flatten"));
    s.push_back(linear_spec("head", 5));
    s.push_back(layer_spec(LayerKind::SoftmaxCrossEntropy, "loss"));
    return GradcheckCase{std::move(title), std::move(s), std::move(chw)};
  };
  LayerSpec rect = conv2d_spec("conv", 4, 3, 5, 1, 1);
  rect.stride_w = 2;
  LayerSpec nobias = conv2d_spec("conv", 3, 3, 3, 1, 0);
  nobias.bias = false;
  LayerSpec fc = linear_spec("fc", 7);
  // Before a batchnorm a bias has no effect (the batch mean removes it): its gradient is 0 and
  // no relative error of it means anything, so these layers have none, as in real nets.
  LayerSpec conv_bn = conv2d_spec("conv", 4, 3, 3, 1, 1);
  conv_bn.bias = false;
  LayerSpec fc_bn = linear_spec("fc", 7);
  fc_bn.bias = false;
  // Residual blocks: the prefix conv's output feeds the block's layers and its shortcut, so its
  // gradient is the sum of both paths'.
  const LayerSpec relu_a = layer_spec(LayerKind::Relu, "relu_a");
  const LayerSpec identity_block = residual_spec(
      "res", {conv2d_spec("conv_a", 2, 3, 3, 1, 1), relu_a, conv2d_spec("conv_b", 2, 3, 3, 1, 1)});
  const LayerSpec projection_block = residual_spec(
      "res", {conv2d_spec("conv_a", 4, 3, 3, 2, 1), relu_a, conv2d_spec("conv_b", 4, 3, 3, 1, 1)},
      {conv2d_spec("proj", 4, 1, 1, 2, 0)});
  return {
      wrap("conv2d 3x3 stride 1 pad 1", {conv2d_spec("conv", 4, 3, 3, 1, 1)}, {3, 7, 6}),
      wrap("conv2d 5x5 stride 2 pad 2", {conv2d_spec("conv", 3, 5, 5, 2, 2)}, {2, 9, 8}),
      wrap("conv2d 3x5 stride 1x2 pad 1", {rect}, {2, 6, 9}),
      wrap("conv2d 1x1 no bias pad 0", {nobias}, {3, 5, 5}),
      wrap("maxpool2d 2x2", {maxpool2d_spec("pool", 2, 2, 0)}, {2, 6, 8}),
      wrap("maxpool2d 3x3 stride 2 pad 1", {maxpool2d_spec("pool", 3, 2, 1)}, {2, 7, 7}),
      wrap("relu", {layer_spec(LayerKind::Relu, "relu")}, {2, 4, 5}),
      wrap("flatten + linear", {}, {2, 3, 4}),
      wrap("linear + relu", {fc, layer_spec(LayerKind::Relu, "relu")}, {11}),
      wrap("conv2d + batchnorm2d", {conv_bn, batchnorm_spec(LayerKind::BatchNorm2d, "bn")},
           {3, 5, 3}),
      wrap("linear + batchnorm1d", {fc_bn, batchnorm_spec(LayerKind::BatchNorm1d, "bn")}, {9}),
      wrap("avgpool2d 2x2", {avgpool2d_spec("pool", 2, 2, 0)}, {2, 6, 8}),
      wrap("avgpool2d 3x3 stride 2 pad 1", {avgpool2d_spec("pool", 3, 2, 1)}, {2, 7, 7}),
      wrap("global_avgpool", {layer_spec(LayerKind::GlobalAvgPool, "gap")}, {3, 5, 7}),
      wrap("dropout 0.3", {dropout_spec("drop", 0.3)}, {2, 4, 5}),
      wrap("residual conv-relu-conv + identity", {identity_block}, {2, 6, 5}),
      wrap("residual stride 2 + 1x1 projection",
           {projection_block, layer_spec(LayerKind::Relu, "relu")}, {3, 7, 6}),
      // With fuse_relu the relu folds into the batchnorm (its forward and masked backward).
      wrap("conv2d + batchnorm2d + relu",
           {conv_bn, batchnorm_spec(LayerKind::BatchNorm2d, "bn"),
            layer_spec(LayerKind::Relu, "relu")},
           {3, 5, 3}),
      wrap("linear + batchnorm1d + relu",
           {fc_bn, batchnorm_spec(LayerKind::BatchNorm1d, "bn"),
            layer_spec(LayerKind::Relu, "relu")},
           {9}),
  };
}

GradcheckCase gradcheck_small_network_case() {
  return {"conv-relu-pool-conv-relu-pool-linear-relu-linear-softmax",
          {conv2d_spec("conv1", 4, 3, 3, 1, 1), layer_spec(LayerKind::Relu, "relu1"),
           maxpool2d_spec("pool1", 2, 2, 0), conv2d_spec("conv2", 6, 3, 3, 1, 1),
           layer_spec(LayerKind::Relu, "relu2"), maxpool2d_spec("pool2", 2, 2, 0),
           layer_spec(LayerKind::Flatten, "flatten"), linear_spec("fc1", 16),
           layer_spec(LayerKind::Relu, "relu3"), linear_spec("fc2", 10),
           layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")},
          {1, 12, 12}};
}

std::string format_gradcheck(const GradcheckResult& r) {
  std::string out;
  for (const auto& row : r.rows)
    out += fmt::format("  {:<16} {:>6} checked  rel error {:.2e}\n", row.what, row.checked,
                       row.rel_error);
  out += fmt::format("  {} worst {:.2e} (tolerance {:.0e}): {}\n", r.title, r.worst, r.tolerance,
                     r.passed() ? "PASS" : "FAIL");
  return out;
}

}  // namespace cnn
