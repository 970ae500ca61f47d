// The network's start-up tuning (algo: auto on CUDA): each layer's passes timed alone, then,
// where the weight gradients run beside, the backward picks checked in the whole backward pass.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "layers/network.h"
#include "runtime/stream_timer.h"

namespace cnn {

std::vector<std::string> Network::autotune(TuneCache* cache) {
  std::vector<std::string> lines;
  if (ex_.device != Device::CUDA || ex_.deterministic || !opt_.autotune) return lines;
  // Defined inputs for the timing runs: zeroed activations and a zero input batch.
  Shape in_shape = {opt_.max_batch};
  in_shape.insert(in_shape.end(), input_chw_.begin(), input_chw_.end());
  Tensor input(in_shape, ex_.device);
  input.zero(ex_.stream);
  for (Tensor& t : storage_) t.zero(ex_.stream);
  for (size_t v : input_views_) acts_[v] = input.data();
  // The timed candidates may need more scratch than the configured variants (wgmma-nhwc's
  // channels-last copies): grown for the tuning, then fitted to the picks below.
  const size_t tune_need = scratch_need(ex_, true);
  if (tune_need > scratch_.size()) resize_scratch(tune_need);
  std::vector<std::pair<size_t, TuneChoice>> tuned;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (skipped_[i] || layers_[i]->spec().kind == LayerKind::Residual) continue;
    const int t = input_[i];
    float* dx = t >= 0 && needs_grad_[size_t(t)] ? grad_acts_[size_t(t)] : nullptr;
    layers_[i]->set_tune_cache(cache);
    for (TuneChoice& c : layers_[i]->autotune(opt_.max_batch, act_of(t, input.data()), acts_[i],
                                              grad_acts_[i], dx, scratch_.data(), ex_)) {
      lines.push_back(describe(c));
      tuned.emplace_back(i, std::move(c));
    }
    layers_[i]->set_tune_cache(nullptr);  // the cache need not outlive the network
  }
  tuned_passes_ = tuned.size();
  if (opt_.weight_grads_beside && opt_.tune_backward)
    for (std::string& l : check_backward(input.data(), tuned)) lines.push_back(std::move(l));
  grads_.zero(ex_.stream);
  stream_sync(ex_.device, ex_.stream);
  // Start-up, before any step (and so before the trainer captures its step graph): the scratch
  // the picked variants need, freeing what only the timed candidates needed. The side stream's
  // too: a pick can need more than the configured variant did (a grouped convolution's weight
  // gradient moved from the grouped kernels to the dense ones takes their copies).
  resize_scratch(scratch_need(ex_, false));
  fit_side_scratch(ex_);
  return lines;
}

std::vector<std::string> Network::check_backward(
    const float* input, std::vector<std::pair<size_t, TuneChoice>>& tuned) {
  // In the order backward runs them: the last layer's passes first.
  std::vector<PassInWhole> passes;
  for (auto it = tuned.rbegin(); it != tuned.rend(); ++it) {
    auto& [node, choice] = *it;
    PassAlgos* algos = layers_[node]->tuned_algos();
    const bool dx = choice.pass == "input-grad";
    if (!algos || (!dx && choice.pass != "weight-grad")) continue;
    Algo* slot = dx ? &algos->dx : &algos->dw;
    // A grouped convolution's weight gradient on the dense kernels needs more side scratch.
    passes.push_back({&choice, [this, slot](Algo a) {
                        *slot = a;
                        fit_side_scratch(ex_);
                      }});
  }
  if (passes.empty()) return {};
  // The picks beside may need more side scratch than the configured variants did (a grouped
  // convolution's weight gradient on the dense kernels); fitted at the end otherwise.
  fit_side_scratch(ex_);

  // One forward of the zero batch (labels 0) for the activations backward reads. It moves
  // batchnorm's running statistics, so they are put back after; the caller zeroes the gradients.
  // A grads-ready hook (data-parallel all-reduce, early updates) must not run on timing passes.
  const int n = opt_.max_batch;
  Buffer<int32_t> labels(size_t(n), ex_.device);
  labels.zero(ex_.stream);
  const std::vector<float> kept_buffers = buffers_to_host();
  struct HeldHook {  // put back however the check ends
    GradsReadyHook& slot;
    GradsReadyHook held;
    ~HeldHook() { slot = std::move(held); }
  } held{grads_ready_, std::exchange(grads_ready_, nullptr)};
  forward_backward(n, input, labels.data(), 1.0f / n);
  const auto backward = [&] { run_backward(n, input); };
  // The best of three means of 5 passes: launch jitter and clocks only ever add time.
  const auto time = [&] {
    double best = time_on_stream(backward, ex_, 5);
    for (int r = 0; r < 2; ++r) best = std::min(best, time_on_stream(backward, ex_, 5));
    return best;
  };
  // First the cluster form of each weight gradient picked alone on a kernel that has one: alone
  // it is as fast or faster, beside the other passes it can be slower (grouped_wide's conv6:
  // 15.7 us more of the whole with it on an H100, docs/performance.md "Clusters weighed in the
  // whole backward pass"). Before the variants, so that they are weighed against the pick in the
  // form it keeps.
  std::vector<SwitchInWhole> switches;
  for (auto it = tuned.rbegin(); it != tuned.rend(); ++it) {
    auto& [node, choice] = *it;
    PassAlgos* algos = layers_[node]->tuned_algos();
    if (!algos || choice.pass != "weight-grad" || !layers_[node]->weight_grad_may_cluster(n, ex_))
      continue;
    switches.push_back(
        {choice.layer, choice.pass, "clusters", [algos](bool on) { algos->dw_clusters = on; }});
  }
  std::vector<std::string> lines = check_switches_in_whole_pass(switches, time, "backward pass");
  for (std::string& l : check_in_whole_pass(passes, time, "backward pass"))
    lines.push_back(std::move(l));
  buffers_from_host(kept_buffers);
  return lines;
}

}  // namespace cnn
