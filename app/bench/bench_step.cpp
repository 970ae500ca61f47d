#include "app/bench/bench_step.h"

namespace cnn::bench {

double trained_flops_per_image(const NetDesc& net) {
  // Over the graph (residual blocks opened up); a conv/linear pass whose input depends on no
  // parameter computes no input gradient, as the Network skips it.
  const std::vector<GraphNode> graph = layer_graph(net.specs);
  Shape input = {1};
  input.insert(input.end(), net.input_chw.begin(), net.input_chw.end());
  std::vector<Shape> out(graph.size());
  std::vector<bool> needs_grad(graph.size(), false);
  double total = 0;
  for (size_t i = 0; i < graph.size(); ++i) {
    const GraphNode& g = graph[i];
    const Shape& in = g.input < 0 ? input : out[size_t(g.input)];
    const bool grad_in = g.input >= 0 && needs_grad[size_t(g.input)];
    const bool weighted = g.spec.kind == LayerKind::Conv2d || g.spec.kind == LayerKind::Linear;
    if (weighted) total += double(layer_forward_flops(g.spec, in)) * (grad_in ? 3 : 2);
    needs_grad[i] =
        weighted || grad_in || (g.shortcut_input >= 0 && needs_grad[size_t(g.shortcut_input)]);
    out[i] = g.spec.kind == LayerKind::Residual ? in : layer_output_shape(g.spec, in);
  }
  return total;
}

}  // namespace cnn::bench

#ifdef CNN_HAVE_CUDA

#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <random>

#include "app/bench/bench_timer.h"
#include "app/cli_common.h"
#include "layers/network.h"
#include "layers/param_optimizer.h"
#include "layers/tune_cache.h"
#include "runtime/cuda_check.h"
#include "runtime/device_identity.h"
#include "runtime/env_switches.h"
#include "runtime/error.h"
#include "runtime/memory.h"

namespace cnn::bench {

namespace {

BenchRow step_row(int batch, Precision p, double flops_per_image) {
  BenchRow r;
  r.section = "step";
  r.op = "step";
  r.shape = fmt::format("batch {}", batch);
  r.precision = precision_name(p);
  r.batch = batch;
  r.flops = flops_per_image * batch;
  r.compute_bound = true;
  return r;
}

void append(std::string& note, const std::string& n) {
  if (!n.empty()) note = note.empty() ? n : note + "; " + n;
}

// Every measurement of one batch size, precision and reduction mode; a failure becomes an error
// row.
void bench_one(const BenchContext& ctx, const NetDesc& net, int batch, Precision p,
               bool deterministic, double flops_per_image, std::vector<BenchRow>& rows) {
  const BenchOptions& opt = *ctx.opt;
  std::vector<LayerSpec> specs = net.specs;
  if (opt.algo_override)
    for (auto& s : specs)
      if (s.kind == LayerKind::Conv2d || s.kind == LayerKind::Linear) s.algo = opt.step_algo;

  Exec ex;
  ex.device = Device::CUDA;
  ex.stream = ctx.stream;
  ex.precision = p;
  ex.deterministic = deterministic;
  NetworkOptions no;
  no.max_batch = batch;
  no.seed = opt.seed;
  no = with_env_switches(no, process_env_switches());
  no.overwrite_grads = process_env_switches().grad_overwrite;  // one backward an update, as here
  no.weight_grads_beside = process_env_switches().wgrad_beside;  // as the trainer on a GPU
  Network model(specs, net.input_chw, no, ex);
  // algo: auto as the trainer runs it: each pass's variant timed once on these shapes. Timed
  // afresh unless CNN_AUTOTUNE_CACHE names a file: then its choices are read and new ones saved,
  // so a profiler run (whose interception distorts the timings) replays the picks of a plain one.
  const std::string cache_file = process_env_switches().autotune_cache.value_or("");
  TuneIdentity id = device_identity(true);
  id["build"] = kBuildGitHash;
  std::string cache_note;
  TuneCache cache =
      cache_file.empty() ? TuneCache(id) : TuneCache::load(cache_file, id, &cache_note);
  if (!cache_note.empty()) fmt::print(stderr, "{}\n", cache_note);
  const std::vector<std::string> tuned = model.autotune(cache_file.empty() ? nullptr : &cache);
  if (cache.changed()) cache.save(cache_file);
  for (const std::string& line : tuned)
    fmt::print(stderr, "step batch {} {}: algo auto {}\n", batch, precision_name(p), line);
  ParamOptimizer optimizer(net.optimizer, model);
  if (process_env_switches().early_update) {  // as the trainer runs its step under the switch
    const std::string why = optimizer.enable_early_updates();
    if (!why.empty())
      fmt::print(stderr, "step batch {} {}: no early updates: {}\n", batch, precision_name(p), why);
  }

  // Random images and labels, on the device before timing starts.
  std::mt19937_64 rng(opt.seed + uint64_t(batch));
  const size_t image = size_t(shape_numel(net.input_chw));
  std::vector<float> h_x(image * size_t(batch));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& v : h_x) v = u(rng);
  std::vector<int32_t> h_labels(static_cast<size_t>(batch));
  std::uniform_int_distribution<int32_t> cls(0, model.num_classes() - 1);
  for (auto& v : h_labels) v = cls(rng);
  Buffer<float> x(h_x.size(), Device::CUDA);  // (batch, C, H, W)
  x.copy_from(h_x.data(), Device::CPU, h_x.size());
  Buffer<int32_t> labels(h_labels.size(), Device::CUDA);  // (batch)
  labels.copy_from(h_labels.data(), Device::CPU, h_labels.size());

  const float grad_scale = 1.0f / float(batch);
  const double lr = net.optimizer.lr;
  auto step = [&](int) {
    optimizer.begin_step(lr);
    model.forward_backward(batch, x.data(), labels.data(), grad_scale);
    optimizer.step(lr);
  };

  // Start-up tuning launches every variant of every pass many times; `ncu --profile-from-start
  // off` sees only the timed steps (plain launches first, then graph replays).
  CNN_CUDA_CHECK(cudaProfilerStart());
  for (bool graph : {false, true}) {
    BenchRow r = step_row(batch, p, flops_per_image);
    TimerOptions to;
    to.launches = 1;
    to.repeats = opt.step_repeats;
    to.warmup = graph ? 3 : 10;  // the first rounds also let `auto` variants pick
    to.use_graph = graph;
    to.overlap = process_env_switches().graph_overlap;  // as the trainer replays its step
    const Timing t = time_launches(ctx.stream, step, to);
    r.variant = t.graph ? "graph" : (graph ? "launches (no graph)" : "launches");
    if (deterministic) r.variant += ", deterministic";
    r.graph = t.graph;
    r.median_us = t.median_us;
    r.p95_us = t.p95_us;
    append(r.note, t.note);
    if (t.programmatic_edges > 0)
      append(r.note, fmt::format("{} kernel edges programmatic", t.programmatic_edges));
    r.status = "ok";
    if (model.tuned_passes() > 0)
      append(r.note, fmt::format("algo auto tuned {} passes", model.tuned_passes()));
    if (model.tuned_passes() > 0 && no.weight_grads_beside && !no.tune_backward)
      append(r.note, "backward picks not checked in the whole pass (CNN_TUNE_BACKWARD=0)");
    if (optimizer.early_updates()) append(r.note, "early updates (CNN_EARLY_UPDATE=1)");
    if (!no.weight_grads_beside) append(r.note, "weight gradients in turn (CNN_WGRAD_BESIDE=0)");
    fill_rate(r, p);
    r.images_per_s = batch / (r.median_us * 1e-6);
    rows.push_back(r);
  }
  CNN_CUDA_CHECK(cudaProfilerStop());

  // Random labels on random images: the loss should stay finite; if not, say so (the timing of
  // NaN arithmetic is not representative).
  std::vector<float> loss(static_cast<size_t>(batch));
  CNN_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  raw_copy(loss.data(), Device::CPU, model.loss_rows(), Device::CUDA, loss.size() * 4);
  for (float v : loss)
    if (!std::isfinite(v)) {
      for (size_t i = rows.size() - 2; i < rows.size(); ++i)
        append(rows[i].note, "loss became non-finite during the run");
      break;
    }
}

// Notes on each deterministic row its time relative to the matching atomicAdd row (same batch,
// precision and timing mode): rows [base, det) are the atomicAdd ones, [det, end) the others.
void note_deterministic_cost(std::vector<BenchRow>& rows, size_t base, size_t det) {
  for (size_t i = det; i < rows.size(); ++i) {
    const size_t j = base + (i - det);
    if (j >= det || rows[j].status != "ok" || rows[i].status != "ok" ||
        rows[j].graph != rows[i].graph)
      continue;
    const double ratio = rows[i].median_us / rows[j].median_us;
    append(rows[i].note,
           fmt::format("{:.2f}x the atomicAdd step ({:+.1f}%)", ratio, 100 * (ratio - 1)));
  }
}

}  // namespace

std::vector<BenchRow> bench_steps(const BenchContext& ctx, const NetDesc& net) {
  const BenchOptions& opt = *ctx.opt;
  const double per_image = trained_flops_per_image(net);
  std::vector<BenchRow> rows;
  std::vector<bool> modes = {opt.deterministic};
  if (opt.compare_deterministic) modes = {false, true};
  for (int batch : opt.step_batches)
    for (Precision p : opt.precisions) {
      size_t atomic_first = rows.size();
      for (bool deterministic : modes) {
        const size_t first = rows.size();
        if (!deterministic) atomic_first = first;
        try {
          bench_one(ctx, net, batch, p, deterministic, per_image, rows);
        } catch (const std::exception& e) {
          cudaGetLastError();
          const cudaError_t sticky = cudaDeviceSynchronize();
          if (sticky != cudaSuccess)
            CNN_FAIL("the GPU context is unusable after the batch-{} {} step: {} ({})", batch,
                     precision_name(p), cudaGetErrorString(sticky), e.what());
          BenchRow r = step_row(batch, p, per_image);
          r.variant = deterministic ? "-, deterministic" : "-";
          r.status = "error";
          r.note = e.what();
          rows.push_back(r);
        }
        if (deterministic && opt.compare_deterministic)
          note_deterministic_cost(rows, atomic_first, first);
      }
    }
  return rows;
}

}  // namespace cnn::bench

#endif  // CNN_HAVE_CUDA
