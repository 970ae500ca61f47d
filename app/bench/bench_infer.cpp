#include "app/bench/bench_infer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "runtime/error.h"

namespace cnn::bench {

double int8_speedup_over_float(const InferRow& r) {
  const double best_float = std::min(r.fp32_us, r.tf32_us);
  if (!(r.median_us > 0) || !(best_float > 0)) return kNaN;
  return best_float / r.median_us;
}

std::string format_infer_markdown(const std::vector<std::string>& header,
                                  const std::vector<InferRow>& rows,
                                  const std::vector<int>& batches) {
  std::string out;
  for (const std::string& h : header) out += h + "  \n";
  out += "\n| forward | ";
  for (int b : batches) out += fmt::format("batch {} (images/s) | ", b);
  out += "notes |\n|---|";
  for (size_t i = 0; i < batches.size(); ++i) out += "---:|";
  out += "---|\n";
  // Network rows in first-seen order, one column per batch size.
  std::vector<std::string> order;
  std::map<std::string, std::map<int, const InferRow*>> cells;
  std::vector<const InferRow*> stages, passes;
  for (const InferRow& r : rows) {
    if (r.vs_float) {
      passes.push_back(&r);
      continue;
    }
    if (r.what.find(" stage ") != std::string::npos) {
      stages.push_back(&r);
      continue;
    }
    if (!cells.count(r.what)) order.push_back(r.what);
    cells[r.what][r.batch] = &r;
  }
  for (const std::string& w : order) {
    out += "| " + w + " | ";
    std::string notes;
    for (int b : batches) {
      const auto it = cells[w].find(b);
      if (it == cells[w].end() || !(it->second->images_per_s > 0)) {
        out += "- | ";
      } else {
        out += fmt::format("{:.0f} | ", it->second->images_per_s);
      }
      if (it != cells[w].end() && !it->second->note.empty() &&
          notes.find(it->second->note) == std::string::npos)
        notes += (notes.empty() ? "" : "; ") + it->second->note;
    }
    out += notes + " |\n";
  }
  if (!stages.empty()) {
    out += fmt::format("\n| int8 stage alone, batch {} | median us | P95 us | notes |\n",
                       stages.front()->batch);
    out += "|---|---:|---:|---|\n";
    for (const InferRow* r : stages)
      out +=
          fmt::format("| {} | {:.2f} | {:.2f} | {} |\n", r->what, r->median_us, r->p95_us, r->note);
  }
  if (!passes.empty()) {
    const auto us = [](double v) { return v > 0 ? fmt::format("{:.2f}", v) : std::string("-"); };
    const auto ratio = [](double a, double b) {
      return a > 0 && b > 0 ? fmt::format("{:.2f}x", a / b) : std::string("-");
    };
    out += fmt::format(
        "\n| int8 pass vs the same float pass, batch {} | int8 us | FP32 us | TF32 us | "
        "FP32 / int8 | TF32 / int8 | >= {}x the faster float | notes |\n",
        passes.front()->batch, kInt8GoalSpeedup);
    out += "|---|---:|---:|---:|---:|---:|---|---|\n";
    for (const InferRow* r : passes) {
      const double sp = int8_speedup_over_float(*r);
      out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} |\n", r->what, us(r->median_us),
                         us(r->fp32_us), us(r->tf32_us), ratio(r->fp32_us, r->median_us),
                         ratio(r->tf32_us, r->median_us),
                         !(sp > 0)                ? "-"
                         : sp >= kInt8GoalSpeedup ? "yes"
                                                  : "no",
                         r->note);
    }
  }
  return out;
}

std::string format_infer_csv(const std::vector<InferRow>& rows) {
  // Text fields quoted, inner quotes doubled (RFC 4180).
  auto quoted = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  auto num = [](double v) { return std::isfinite(v) ? fmt::format("{}", v) : std::string(); };
  std::string out = "what,batch,median_us,p95_us,images_per_s,note\n";
  for (const InferRow& r : rows) {
    // A comparison row keeps the columns: the float times go into its note.
    std::string note = r.note;
    if (r.vs_float)
      note = fmt::format("fp32_us={} tf32_us={} speedup_over_faster_float={}{}", num(r.fp32_us),
                         num(r.tf32_us), num(int8_speedup_over_float(r)),
                         note.empty() ? "" : "; " + note);
    out += fmt::format("{},{},{},{},{},{}\n", quoted(r.what), r.batch, num(r.median_us),
                       num(r.p95_us), num(r.images_per_s), quoted(note));
  }
  return out;
}

}  // namespace cnn::bench

#ifdef CNN_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <cstring>
#include <random>

#include "app/bench/bench_timer.h"
#include "kernels/quant/qconv.h"
#include "kernels/quant/qconv_few_channels.h"
#include "kernels/quant/qconv_fused_classifier.h"
#include "layers/fold_batchnorm.h"
#include "layers/network.h"
#include "layers/quant/int8_network.h"
#include "layers/quant/quant_model.h"
#include "runtime/cuda_check.h"
#include "runtime/memory.h"

namespace cnn::bench {
namespace {

// Calibration images for the bench's quantized model: few, since only the scales' existence
// matters here, not their values.
constexpr int kCalibrationImages = 16;

// One forward per graph replay: what a user of the whole network sees, the graph launch's own
// few microseconds included.
constexpr int kForwardLaunches = 1;
// A single pass (one int8 stage, or the float nodes it stands for) runs a few microseconds, about
// what one graph replay costs to start; with one pass a replay its row would mostly time the
// launch, on both sides of the comparison. So the per-pass rows run this many passes a replay
// and report the time per pass, as the ops bench does. Repeating a pass in one capture rewrites
// the same output buffers from the same inputs: harmless for timing.
constexpr int kPassLaunches = 20;

InferRow timed(const BenchContext& ctx, const std::string& what, int batch, int launches,
               const std::function<void(int)>& launch) {
  TimerOptions to;
  to.launches = launches;
  to.repeats = ctx.opt->step_repeats;
  to.warmup = 5;
  to.use_graph = true;
  const Timing t = time_launches(ctx.stream, launch, to);
  InferRow r;
  r.what = what;
  r.batch = batch;
  r.median_us = t.median_us;
  r.p95_us = t.p95_us;
  r.images_per_s = batch / (t.median_us * 1e-6);
  r.note = t.graph ? "" : "no graph: " + t.note;
  return r;
}

InferRow failed(const std::string& what, int batch, const std::string& why) {
  cudaGetLastError();
  const cudaError_t sticky = cudaDeviceSynchronize();
  CNN_CHECK(sticky == cudaSuccess, "the GPU context is unusable after '{}' at batch {}: {} ({})",
            what, batch, cudaGetErrorString(sticky), why);
  InferRow r;
  r.what = what;
  r.batch = batch;
  r.note = why;
  return r;
}

Buffer<float> random_images(const Shape& chw, int batch, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> h(size_t(shape_numel(chw)) * size_t(batch));
  for (auto& v : h) v = u(rng);
  Buffer<float> d(h.size(), Device::CUDA);
  d.copy_from(h.data(), Device::CPU, h.size());
  return d;
}

// Which kernel runs each conv/linear stage at `batch`, counted: "kernels at batch 256: 1
// few-channel dp4a (input quantization fused), 2 tensor cores, 1 linear dp4a", and where the
// classifier runs when it is fused into the stage before.
std::string kernels_of_stages(const Int8Network& q, size_t stages, int batch) {
  std::vector<std::pair<QConvKernel, int>> counts;
  for (size_t i = 0; i < stages; ++i) {
    if (q.stage_is_add(i) || q.stage_is_avgpool(i)) continue;
    const QConvKernel k = q.stage_kernel(i, batch);
    auto it =
        std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == k; });
    if (it == counts.end())
      counts.emplace_back(k, 1);
    else
      ++it->second;
  }
  std::string s = fmt::format("kernels at batch {}:", batch);
  for (size_t j = 0; j < counts.size(); ++j) {
    s +=
        fmt::format("{} {} {}", j ? "," : "", counts[j].second, qconv_kernel_name(counts[j].first));
    if (qconv_is_few_channel_kernel(counts[j].first) && q.fuses_input_quantization())
      s += " (input quantization fused)";
  }
  if (q.fuses_classifier(batch))
    s += fmt::format("; the classifier runs inside stage {}'s kernel", stages - 2);
  return s;
}

// How bench_classifier runs the last two stages (a linear layer on the tensor-core tile, then a
// classifier of at most kQLinearDp4aMaxCols outputs): fused into one launch
// (Int8Network::fuses_classifier); two launches, the classifier's overlapping the end of the
// first (QConvPath::overlap_launch, as the unfused network runs them); two plain launches.
enum class ClassifierRun { Fused, Overlapped, Apart };

// Whether the last two stages are such a pair at `batch`.
bool classifier_pair(const Int8Network& q, size_t stages, int batch) {
  if (stages < 2 || q.stage_is_add(stages - 2) || q.stage_is_avgpool(stages - 2) ||
      q.stage_is_add(stages - 1) || q.stage_is_avgpool(stages - 1))
    return false;
  QConvShape s1 = q.stage_shape(stages - 2), s2 = q.stage_shape(stages - 1);
  s1.n = s2.n = batch;
  return qconv_classifier_fusable(s1, s2) &&
         q.stage_kernel(stages - 2, batch) == QConvKernel::TensorCores &&
         q.stage_kernel(stages - 1, batch) == QConvKernel::LinearDp4a;
}

// The last two stages run as `how` says, on random int8 activations and weights (the first
// stage's tile and splits as the network's). Returns its row (also appended to rows).
InferRow bench_classifier(const BenchContext& ctx, const Int8Network& q, size_t stages, int batch,
                          ClassifierRun how, std::vector<InferRow>& rows) {
  std::mt19937_64 rng(ctx.opt->seed + 7);
  std::uniform_int_distribution<int> d(-127, 127);
  const auto random_bytes = [&](size_t count) {
    std::vector<int8_t> v(count);
    for (auto& b : v) b = int8_t(d(rng));
    return v;
  };
  Exec ex;
  ex.device = Device::CUDA;
  ex.stream = ctx.stream;
  QConvShape s1 = q.stage_shape(stages - 2), s2 = q.stage_shape(stages - 1);
  s1.n = s2.n = batch;
  const std::vector<int8_t> hx = random_bytes(size_t(s1.n) * s1.h * s1.w * s1.cp);
  const std::vector<int8_t> hw1 = random_bytes(size_t(s1.oc) * s1.kh * s1.kw * s1.cgp);
  const std::vector<int8_t> hw2 = random_bytes(size_t(s2.oc) * s2.cgp);
  std::vector<int8_t> hp(size_t(qconv_igemm_weight_size(s1)));
  qconv_pack_igemm_weights(s1, hw1.data(), hp.data());
  Buffer<int8_t> x(hx.size(), Device::CUDA), w1(hw1.size(), Device::CUDA),
      w2(hw2.size(), Device::CUDA), packed(hp.size(), Device::CUDA);
  x.copy_from(hx.data(), Device::CPU, hx.size());
  w1.copy_from(hw1.data(), Device::CPU, hw1.size());
  w2.copy_from(hw2.data(), Device::CPU, hw2.size());
  packed.copy_from(hp.data(), Device::CPU, hp.size());
  const std::vector<float> hm1(size_t(s1.oc), 1e-3f), ha1(size_t(s1.oc), 0.5f);
  const std::vector<float> hm2(size_t(s2.oc), 1e-3f), ha2(size_t(s2.oc), 0.5f);
  Buffer<float> m1(hm1.size(), Device::CUDA), a1(ha1.size(), Device::CUDA),
      m2(hm2.size(), Device::CUDA), a2(ha2.size(), Device::CUDA);
  m1.copy_from(hm1.data(), Device::CPU, hm1.size());
  a1.copy_from(ha1.data(), Device::CPU, ha1.size());
  m2.copy_from(hm2.data(), Device::CPU, hm2.size());
  a2.copy_from(ha2.data(), Device::CPU, ha2.size());
  Buffer<int8_t> y1(size_t(s1.n) * s1.ocp, Device::CUDA);
  Buffer<float> y2(size_t(s2.n) * s2.oc, Device::CUDA);
  Buffer<int32_t> acc(size_t(qconv_classifier_acc_size(batch, s2.oc)), Device::CUDA);
  Buffer<uint32_t> arrivals(size_t(qconv_classifier_arrivals_size(batch)), Device::CUDA);
  acc.zero(ctx.stream);
  arrivals.zero(ctx.stream);
  QClassifierFusion cls;
  cls.shape = s2, cls.w = w2.data(), cls.ep = QEpilogue{m2.data(), a2.data(), false};
  cls.acc = acc.data(), cls.arrivals = arrivals.data(), cls.y = y2.data();
  const QEpilogue ep1{m1.data(), a1.data(), true};
  const QEpilogue ep2{m2.data(), a2.data(), false};
  const QIgemmPlan plan = qconv_igemm_plan(s1, ctx.dev.sm_count);
  const char* const how_name = how == ClassifierRun::Fused        ? "classifier fused"
                               : how == ClassifierRun::Overlapped ? "classifier launch overlapped"
                                                                  : "two plain launches";
  const std::string what = fmt::format(
      "int8 stage {}+{} ({} -> {} + {} -> {}) tensor cores {} split {}, {}", stages - 2, stages - 1,
      s1.c * s1.h * s1.w, s1.oc, s2.c, s2.oc, qigemm_tile_name(plan.tile), plan.splits, how_name);
  const QConvPath path1(packed.data(), QConvKernel::TensorCores);
  QConvPath path2(nullptr, QConvKernel::LinearDp4a);
  path2.overlap_launch = how == ClassifierRun::Overlapped;
  InferRow r = timed(ctx, what, batch, kPassLaunches, [&](int) {
    if (how == ClassifierRun::Fused) {
      qconv_linear_classifier_forward(s1, x.data(), w1.data(), packed.data(), ep1, y1.data(), cls,
                                      ex);
      return;
    }
    qconv_forward(s1, x.data(), w1.data(), ep1, y1.data(), ex, path1);
    qconv_forward_float(s2, y1.data(), w2.data(), ep2, y2.data(), ex, path2);
  });
  const double macs = double(s1.n) * s1.oc * s1.h * s1.w * s1.c + double(s2.n) * s2.oc * s2.c;
  const bool networks =
      (how == ClassifierRun::Fused) == q.fuses_classifier(batch) && how != ClassifierRun::Apart;
  r.note = fmt::format("{:.1f} TOP/s{}", 2 * macs / (r.median_us * 1e-6) / 1e12,
                       networks ? "; as the network runs them" : "") +
           (r.note.empty() ? "" : "; " + r.note);
  rows.push_back(r);
  r.what = fmt::format("tensor cores {} split {}, {}", qigemm_tile_name(plan.tile), plan.splits,
                       how_name);
  return r;
}

// Every int8 stage alone at `batch`: random int8 activations and weights, on each kernel that
// takes it. Returns per conv/linear stage the row of the faster of the direct kernel and the
// network's choice (others: an empty row).
std::vector<InferRow> bench_stages(const BenchContext& ctx, const Int8Network& q, size_t stages,
                                   int batch, std::vector<InferRow>& rows) {
  std::vector<InferRow> best(stages);
  std::mt19937_64 rng(ctx.opt->seed);
  std::uniform_int_distribution<int> d(-127, 127);
  Exec ex;
  ex.device = Device::CUDA;
  ex.stream = ctx.stream;
  for (size_t i = 0; i < stages; ++i) {
    // Memory bound, timed within the whole network.
    if (q.stage_is_add(i) || q.stage_is_avgpool(i)) continue;
    QConvShape s = q.stage_shape(i);
    s.n = batch;
    const bool last = i + 1 == stages;
    std::vector<int8_t> hx(size_t(s.n) * s.h * s.w * s.cp), hw(size_t(s.oc) * s.kh * s.kw * s.cgp);
    for (auto& v : hx) v = int8_t(d(rng));
    for (auto& v : hw) v = int8_t(d(rng));
    std::vector<float> hm(size_t(s.oc), 1e-3f), ha(size_t(s.oc), 0.5f);
    Buffer<int8_t> x(hx.size(), Device::CUDA), w(hw.size(), Device::CUDA);
    x.copy_from(hx.data(), Device::CPU, hx.size());
    w.copy_from(hw.data(), Device::CPU, hw.size());
    Buffer<float> m(hm.size(), Device::CUDA), a(ha.size(), Device::CUDA);
    m.copy_from(hm.data(), Device::CPU, hm.size());
    a.copy_from(ha.data(), Device::CPU, ha.size());
    Buffer<int8_t> packed;
    if (qconv_igemm_supported(s)) {
      std::vector<int8_t> hp(size_t(qconv_igemm_weight_size(s)));
      qconv_pack_igemm_weights(s, hw.data(), hp.data());
      packed = Buffer<int8_t>(hp.size(), Device::CUDA);
      packed.copy_from(hp.data(), Device::CPU, hp.size());
    }
    Buffer<int8_t> y(size_t(s.n) * s.ph() * s.pw() * s.ocp, Device::CUDA);
    Buffer<float> yf(size_t(s.n) * s.ph() * s.pw() * s.oc, Device::CUDA);
    const QEpilogue ep{m.data(), a.data(), !last};
    const double macs = double(s.n) * s.oh() * s.ow() * s.oc * s.kh * s.kw * s.cg() *
                        (double(s.ph()) * s.pw() * s.pool_kh * s.pool_kw) /
                        (double(s.oh()) * s.ow());  // pooled windows recompute overlaps
    const std::string shape =
        fmt::format("{}x{}x{} -> {} k{}x{} s{}{}", s.c, s.h, s.w, s.oc, s.kh, s.kw, s.stride_h,
                    s.pool_kh * s.pool_kw > 1 ? fmt::format(" + pool {}", s.pool_kh) : "");
    // The float input of the first stage's fused quantization (the few-channel kernels only).
    const bool fusable = i == 0 && !last && qconv_few_channels_supported(s);
    Buffer<float> xf;
    if (fusable) {
      std::vector<float> hf(size_t(s.n) * s.c * s.h * s.w);
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      for (auto& v : hf) v = u(rng);
      xf = Buffer<float>(hf.size(), Device::CUDA);
      xf.copy_from(hf.data(), Device::CPU, hf.size());
    }
    // The direct kernel; the rule's choice (QConvKernel::Auto, what the network runs); and, for
    // the first stage, each few-channel kernel (tensor cores, dp4a) that takes the shape with the
    // input quantization fused. Those compete for the per-pass row (a fused one only when the
    // network fuses, on that kernel). Then the alternatives forced, so the choice can be checked
    // against them (rows alone): the few-channel kernels and the tensor-core kernel where they
    // take the shape, and for a linear layer the linear dp4a kernel and each tile and split of the
    // tensor-core one.
    struct Variant {
      QConvPath path;
      bool fused = false, competes = false, automatic = false;
    };
    const int8_t* wp = packed.empty() ? nullptr : packed.data();
    const QConvKernel picked = qconv_resolve_kernel(s, QConvPath(wp));
    std::vector<Variant> variants = {{QConvPath{}, false, true, false}};
    if (picked != QConvKernel::Direct) variants.push_back({QConvPath(wp), false, true, true});
    const QConvKernel few[] = {QConvKernel::FewChannelsTensorCores, QConvKernel::FewChannels};
    const auto takes = [&](QConvKernel k) {
      return k == QConvKernel::FewChannels ? qconv_few_channels_supported(s)
                                           : qconv_few_channels_mma_supported(s);
    };
    for (QConvKernel k : few)
      if (fusable && takes(k))
        variants.push_back({QConvPath(nullptr, k), true,
                            q.fuses_input_quantization() && k == q.stage_kernel(i, batch), false});
    for (QConvKernel k : few)
      if (takes(k) && picked != k) variants.push_back({QConvPath(nullptr, k)});
    if (wp && qconv_is_linear(s)) {
      variants.push_back({QConvPath(wp, QConvKernel::LinearDp4a)});
      for (QIgemmTile tile : {QIgemmTile::Conv128x64, QIgemmTile::Linear64x64,
                              QIgemmTile::Linear64x128, QIgemmTile::Linear128x128})
        for (int splits : {1, 2, 4, 8})
          variants.push_back({QConvPath(wp, QConvKernel::TensorCores, splits, tile)});
    } else if (wp && picked != QConvKernel::TensorCores) {
      variants.push_back({QConvPath(wp, QConvKernel::TensorCores)});
    }
    InferRow direct;
    bool marked = false;
    for (const Variant& v : variants) {
      const QConvKernel kernel = qconv_resolve_kernel(s, v.path);
      std::string name = qconv_kernel_name(kernel);
      if (kernel == QConvKernel::TensorCores) {
        const QIgemmPlan plan = qconv_igemm_plan(s, ctx.dev.sm_count, v.path.tile, v.path.splits);
        name += fmt::format(" {} split {}", qigemm_tile_name(plan.tile), plan.splits);
      }
      if (v.fused) name += ", input quantization fused";
      if (v.automatic) name += " (auto)";
      const std::string what = fmt::format("int8 stage {} ({}) {}", i, shape, name);
      InferRow r = timed(ctx, what, batch, kPassLaunches, [&](int) {
        if (v.fused)
          qconv_few_channels_forward_quantize(s, xf.data(), q.input_inv_scale(), w.data(), ep,
                                              y.data(), ex, v.path.kernel);
        else if (last)
          qconv_forward_float(s, x.data(), w.data(), ep, yf.data(), ex, v.path);
        else
          qconv_forward(s, x.data(), w.data(), ep, y.data(), ex, v.path);
      });
      const double tops = 2 * macs / (r.median_us * 1e-6) / 1e12;
      r.note = fmt::format("{:.1f} TOP/s", tops) + (r.note.empty() ? "" : "; " + r.note);
      if (kernel != QConvKernel::Direct && direct.median_us > 0)
        r.note += fmt::format("; {:.2f}x the direct kernel", direct.median_us / r.median_us);
      if (v.path.kernel == QConvKernel::Direct) direct = r;
      // The first row of the network's kernel (forced duplicates of it come later).
      if (!marked && kernel == q.stage_kernel(i, batch) &&
          v.fused == (i == 0 && q.fuses_input_quantization())) {
        r.note += "; the network's kernel";
        marked = true;
      }
      if (v.competes && !(best[i].median_us <= r.median_us)) {
        best[i] = r;
        best[i].what = name;
      }
      rows.push_back(r);
    }
  }
  return best;
}

// The nodes of a float Network on the folded specs that one int8 stage stands for: from the first
// to the last of its own layer and the layers it fuses, in graph order (a global_avgpool and the
// flatten/dropout between it and the classifier included).
std::pair<size_t, size_t> stage_nodes(const QuantStage& q, const std::vector<LayerSpec>& specs) {
  const std::vector<GraphNode> graph = layer_graph(specs);
  size_t lo = graph.size(), hi = 0;
  for (size_t k = 0; k < graph.size(); ++k) {
    const std::string& name = graph[k].spec.name;
    if (name == q.name || std::find(q.fused.begin(), q.fused.end(), name) != q.fused.end())
      lo = std::min(lo, k), hi = std::max(hi, k);
  }
  CNN_CHECK(lo <= hi, "bench: stage '{}' has no layer in the float network", q.name);
  return {lo, hi};
}

// Each conv/linear stage's faster int8 kernel (best[i]) next to the same pass of the float
// network with BatchNorm folded, autotuned at `batch`, in FP32 and TF32: the nodes the stage
// stands for, run one after another as the whole forward runs them (a ReLU folded into the conv,
// a fused conv-relu-pool, a separate max-pool pass where the float network has one). With
// `fused` timed (the network runs its classifier inside the stage before), one more row: the
// last two stages as that one launch against the float nodes of both.
void bench_passes_vs_float(const BenchContext& ctx, const QuantizedModel& qm,
                           const FoldedNetwork& folded, const Buffer<float>& x, int batch,
                           const std::vector<InferRow>& best, const InferRow& fused,
                           const InferRow& overlapped, std::vector<InferRow>& rows) {
  std::vector<InferRow> cmp;
  std::vector<std::pair<size_t, size_t>> stages_of;  // first and last stage a row stands for
  const size_t count = qm.stages.size();
  const bool fuses = fused.median_us > 0;
  const auto layers_of = [&](size_t i) {
    std::string layers = qm.stages[i].name;
    for (const std::string& f : qm.stages[i].fused) layers += " + " + f;
    return layers;
  };
  const auto add = [&](const std::string& what, const InferRow& b, size_t first, size_t last) {
    InferRow r;
    r.vs_float = true;
    r.what = what;
    r.batch = batch;
    r.median_us = b.median_us, r.p95_us = b.p95_us;
    r.images_per_s = b.images_per_s;
    r.note = "int8 on " + b.what;
    cmp.push_back(r);
    stages_of.emplace_back(first, last);
  };
  for (size_t i = 0; i < count; ++i) {
    if (!(best[i].median_us > 0)) continue;
    add(fmt::format("stage {}: {}", i, layers_of(i)), best[i], i, i);
    if (fuses && i + 1 == count)
      cmp.back().note += fmt::format("; the network runs it fused into stage {}", i - 1);
  }
  if (fuses)
    add(fmt::format("stage {}+{}: {} + {} (classifier fused)", count - 2, count - 1,
                    layers_of(count - 2), layers_of(count - 1)),
        fused, count - 2, count - 1);
  if (overlapped.median_us > 0) {
    add(fmt::format("stage {}+{}: {} + {} (classifier launch overlapped)", count - 2, count - 1,
                    layers_of(count - 2), layers_of(count - 1)),
        overlapped, count - 2, count - 1);
    if (!fuses) cmp.back().note += "; as the network runs them";
  }
  for (Precision p : {Precision::FP32, Precision::TF32}) {
    Exec ex;
    ex.device = Device::CUDA;
    ex.stream = ctx.stream;
    ex.precision = p;
    NetworkOptions no;
    no.max_batch = batch;
    no.seed = ctx.opt->seed;
    no = with_env_switches(no, process_env_switches());
    try {
      Network net(folded.specs, qm.input_chw, no, ex);
      net.params_from_host(folded.params);
      net.buffers_from_host(folded.buffers);
      CNN_CUDA_CHECK(cudaDeviceSynchronize());  // the uploads, before ctx.stream (non-blocking)
      for (const std::string& line : net.autotune())
        fmt::print(stderr, "infer {} (batchnorm folded): algo auto {}\n", precision_name(p), line);
      net.forward(batch, x.data());  // every node's input defined
      for (size_t j = 0; j < cmp.size(); ++j) {
        const size_t lo = stage_nodes(qm.stages[stages_of[j].first], folded.specs).first;
        const size_t hi = stage_nodes(qm.stages[stages_of[j].second], folded.specs).second;
        const InferRow t = timed(ctx, cmp[j].what, batch, kPassLaunches, [&](int) {
          for (size_t k = lo; k <= hi; ++k) net.forward_node(k, batch, x.data());
        });
        (p == Precision::FP32 ? cmp[j].fp32_us : cmp[j].tf32_us) = t.median_us;
      }
    } catch (const std::exception& e) {
      failed(precision_name(p), batch, e.what());  // throws if the GPU context is gone
      for (InferRow& r : cmp)
        r.note += fmt::format("; no {} time: {}", precision_name(p), e.what());
    }
  }
  rows.insert(rows.end(), cmp.begin(), cmp.end());
}

}  // namespace

std::vector<InferRow> bench_infer(const BenchContext& ctx, const NetDesc& net,
                                  const std::vector<int>& batches) {
  const BenchOptions& opt = *ctx.opt;
  std::vector<InferRow> rows;
  int max_batch = 1;
  for (int b : batches) max_batch = std::max(max_batch, b);
  Buffer<float> x = random_images(net.input_chw, max_batch, opt.seed);

  // The float network once per precision; its parameters (random, seeded) feed the int8 model.
  std::vector<float> params, buffers;
  for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16}) {
    Exec ex;
    ex.device = Device::CUDA;
    ex.stream = ctx.stream;
    ex.precision = p;
    NetworkOptions no;
    no.max_batch = max_batch;
    no.seed = opt.seed;
    no = with_env_switches(no, process_env_switches());
    try {
      Network model(net.specs, net.input_chw, no, ex);
      const std::vector<std::string> tuned = model.autotune();
      for (const std::string& line : tuned)
        fmt::print(stderr, "infer {}: algo auto {}\n", precision_name(p), line);
      if (params.empty()) params = model.params_to_host(), buffers = model.buffers_to_host();
      for (int b : batches)
        rows.push_back(timed(ctx, precision_name(p), b, kForwardLaunches,
                             [&](int) { model.forward(b, x.data()); }));
    } catch (const std::exception& e) {
      for (int b : batches) rows.push_back(failed(precision_name(p), b, e.what()));
    }
  }

  QuantizedModel qm;
  FoldedNetwork folded;
  std::string why_not;
  try {
    folded = fold_batchnorm(net.specs, net.input_chw, params, buffers);
    std::vector<float> h(size_t(shape_numel(net.input_chw)) * kCalibrationImages);
    std::mt19937_64 rng(opt.seed + 1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& v : h) v = u(rng);
    Exec cal;
    cal.device = Device::CUDA;
    cal.stream = ctx.stream;
    qm = quantize_network(folded, net.input_chw, h.data(), kCalibrationImages,
                          CalibrationMethod::Max, cal);
  } catch (const std::exception& e) {
    why_not = e.what();
  }
  for (bool tc : {true, false}) {
    const std::string what = tc ? "int8 (tensor cores)" : "int8 (direct dp4a)";
    if (!why_not.empty()) {
      for (int b : batches) rows.push_back(failed(what, b, why_not));
      continue;
    }
    Exec ex;
    ex.device = Device::CUDA;
    ex.stream = ctx.stream;
    try {
      Int8Network q(qm, max_batch, ex, tc, process_env_switches().int8_fuse_classifier);
      // Validation first, as every ./bench row: the logits of a few images equal the CPU twin's
      // bit for bit, else the row is not timed.
      const int n_check = std::min(max_batch, 8);
      std::vector<float> h_x(size_t(shape_numel(net.input_chw)) * size_t(n_check));
      raw_copy(h_x.data(), Device::CPU, x.data(), Device::CUDA, h_x.size() * sizeof(float));
      Int8Network cpu(qm, n_check, Exec{});
      const float* ref = cpu.forward(n_check, h_x.data());
      std::vector<float> got(size_t(n_check) * size_t(q.num_classes()));
      const float* d_logits = q.forward(n_check, x.data());
      CNN_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
      raw_copy(got.data(), Device::CPU, d_logits, Device::CUDA, got.size() * sizeof(float));
      if (!std::equal(got.begin(), got.end(), ref)) {
        for (int b : batches)
          rows.push_back(failed(what, b, "WRONG: the logits differ from the CPU twin's"));
        continue;
      }
      // The fused classifier runs at larger batches only (where the stage before it runs the
      // tensor-core tile): its logits there against the same network's unfused ones.
      if (q.fuses_classifier(max_batch)) {
        Int8Network unfused(qm, max_batch, ex, tc, /*fuse_classifier=*/false);
        std::vector<float> a(size_t(max_batch) * size_t(q.num_classes())), b(a.size());
        const float* fused_logits = q.forward(max_batch, x.data());
        const float* unfused_logits = unfused.forward(max_batch, x.data());
        CNN_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
        raw_copy(a.data(), Device::CPU, fused_logits, Device::CUDA, a.size() * sizeof(float));
        raw_copy(b.data(), Device::CPU, unfused_logits, Device::CUDA, b.size() * sizeof(float));
        if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0) {
          for (int bt : batches)
            rows.push_back(failed(
                what, bt, "WRONG: the fused classifier's logits differ from the unfused ones"));
          continue;
        }
      }
      for (int b : batches)
        rows.push_back(timed(ctx, what, b, kForwardLaunches, [&](int) { q.forward(b, x.data()); }));
      if (tc) {
        rows[rows.size() - 1].note = kernels_of_stages(q, qm.stages.size(), max_batch);
        const std::vector<InferRow> best = bench_stages(ctx, q, qm.stages.size(), max_batch, rows);
        const size_t stages = qm.stages.size();
        InferRow fused, overlapped;
        if (q.fuses_classifier(max_batch))
          fused = bench_classifier(ctx, q, stages, max_batch, ClassifierRun::Fused, rows);
        if (classifier_pair(q, stages, max_batch)) {
          overlapped = bench_classifier(ctx, q, stages, max_batch, ClassifierRun::Overlapped, rows);
          bench_classifier(ctx, q, stages, max_batch, ClassifierRun::Apart, rows);
        }
        bench_passes_vs_float(ctx, qm, folded, x, max_batch, best, fused, overlapped, rows);
      }
    } catch (const std::exception& e) {
      for (int b : batches) rows.push_back(failed(what, b, e.what()));
    }
  }
  return rows;
}

}  // namespace cnn::bench

#endif  // CNN_HAVE_CUDA
