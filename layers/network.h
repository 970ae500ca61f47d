#pragma once
// The layer graph built from the config: owns every activation, activation gradient and the flat
// parameter/gradient buffers, and runs forward/backward over a batch. The loss (softmax
// cross-entropy, always last) is run by the Network itself because it also needs labels.
//
// The graph is a DAG in one flat list (layer_graph(): a residual block opened up into its layers,
// its shortcut's layers and an add), not a layer that owns sub-networks: every layer stays one
// entry of layers(), so whatever walks the layers (parameters, checkpoints, tuning, modes) sees
// the ones inside blocks without knowing about blocks. Where a tensor feeds two nodes (a block's
// input) their input gradients are summed: the last consumer in the list writes the gradient,
// the others write a scratch buffer that is then added to it.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "layers/layer.h"
#include "runtime/env_switches.h"
#include "runtime/exec.h"
#include "runtime/memory.h"
#include "runtime/side_stream.h"
#include "runtime/tensor.h"

namespace cnn {

// Whether a first conv(1 input channel) -> relu -> maxpool(2x2, stride 2) runs as one fused pass
// (kernels/conv_relu_pool.h; needs fuse_relu). Auto: on CUDA only (on the CPU the unfused fast
// kernels are faster than the fused CPU twin, a plain reference). On: on the CPU too (tests).
enum class PoolFusion { Auto, On, Off };

struct NetworkOptions {
  int max_batch = 128;
  uint64_t seed = 1;      // weight initialization
  bool fuse_relu = true;  // fold a ReLU into the preceding conv/linear epilogue (or batchnorm)
  // Also fold a ReLU into the batchnorm before it (needs fuse_relu; CNN_FUSE_BN_RELU=0 clears it).
  bool fuse_batchnorm_relu = true;
  // A residual block whose branch ends in a batchnorm: the add, and a ReLU after it (when
  // fuse_relu), run in the batchnorm's normalizing pass (CNN_FUSE_RESIDUAL=0 clears it).
  bool fuse_residual = true;
  PoolFusion fuse_pool = PoolFusion::Auto;
  bool autotune = true;  // `algo: auto` on CUDA times the variants at start-up (autotune.h)
  // Variants that replace every conv / linear layer's configured one (CNN_ALGO*).
  std::optional<Algo> conv_algo, linear_algo;
  // Label smoothing of the training loss (forward_backward) in [0, 1); forward_loss (evaluation)
  // reports the plain cross-entropy of the true labels.
  float label_smoothing = 0.0f;
  // Backward WRITES the parameter gradients that layers can write in one pass (a linear layer's
  // weight, outside the fused classifier head) instead of adding to them, and the optimizer's
  // update leaves them unzeroed (overwritten_grad_ranges()): that update saves writing them and
  // the GEMM reading them. Only for a caller that runs exactly one forward_backward per update
  // (the trainer's step; CNN_GRAD_OVERWRITE=0 clears it there): two backward passes no longer
  // sum. Off by default, and not among with_env_switches' overrides.
  bool overwrite_grads = false;
  // Training: convolutions' and linear layers' weight gradients run on the side stream
  // (side_stream(), Layer::backward_beside), beside their input gradients and the rest of
  // backward; the same bits. A second stream and scratch, so off by default: the trainer and
  // bench turn it on for a GPU's training step (CNN_WGRAD_BESIDE=0 keeps it off there), where
  // it measured faster on every net (docs/performance.md, "Work beside backward").
  bool weight_grads_beside = false;
  // With weight_grads_beside, autotune then tries in the whole backward pass each weight
  // gradient's cluster form off where its pick has one (check_switches_in_whole_pass), then each
  // variant timed alone within 2x of a backward pass's pick, and keeps those that shorten it by
  // 1% or more (check_in_whole_pass, layers/autotune.h): a variant fastest alone can cost the
  // passes beside it more than it gains (docs/performance.md, "Backward picks checked in the
  // whole backward pass"). CNN_TUNE_BACKWARD=0 clears it.
  bool tune_backward = true;
};

// The options with the environment's overrides applied (CNN_FUSE_POOL=0, CNN_FUSE_BN_RELU=0,
// CNN_FUSE_RESIDUAL=0, CNN_AUTOTUNE=0, CNN_TUNE_BACKWARD=0, CNN_ALGO*; runtime/env_switches.h).
// The programs call this once when a run starts.
NetworkOptions with_env_switches(NetworkOptions opt, const EnvSwitches& env);

class Network {
 public:
  Network(const std::vector<LayerSpec>& specs, const Shape& input_chw, const NetworkOptions& opt,
          const Exec& ex);

  // Logits for a batch of n images x (n, C, H, W) on the network's device, in eval mode
  // (batchnorm's running statistics, no dropout).
  const float* forward(int n, const float* x);
  // Forward, loss and backward: writes loss_rows/pred for the batch and ACCUMULATES parameter
  // gradients (zeroed by the optimizer's update), except those in overwritten_grad_ranges()
  // (NetworkOptions::overwrite_grads), which it writes: there they are this batch's gradient
  // alone, also after the update (which does not zero them). grad_scale multiplies dlogits (1/n
  // for a mean). Training mode: batch statistics (which also move batchnorm's running
  // statistics), dropout.
  void forward_backward(int n, const float* x, const int32_t* labels, float grad_scale);

  // Forward and loss without gradients (evaluation): writes loss_rows/pred for the batch.
  void forward_loss(int n, const float* x, const int32_t* labels);

  const float* logits() const { return acts_.back(); }
  // The output of node `node` (an index into layers()) of the last forward, on the network's
  // device, (n, per-image shape) NCHW: the values the next layer reads. A folded relu's is its
  // conv's, linear's or batchnorm's buffer (ReLU applied), a fused conv-relu-pool's pool holds the
  // pooled output; the conv under a fused pool holds that pooled output too (read the pool's).
  // Calibration reads it.
  const float* activation(size_t node) const;
  // Runs node `node` alone on the activations of the last forward (or of the nodes run before
  // it): for timing one layer as the whole forward runs it (a skipped node does nothing).
  void forward_node(size_t node, int n, const float* x);
  const float* loss_rows() const { return loss_rows_.data(); }  // (n) after forward_backward
  const int32_t* predictions() const { return pred_.data(); }   // (n) after forward_backward
  int num_classes() const { return classes_; }
  int max_batch() const { return opt_.max_batch; }
  const Shape& input_chw() const { return input_chw_; }

  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  const float* params() const { return params_.data(); }
  int64_t num_params() const { return static_cast<int64_t>(params_.size()); }
  const std::vector<ParamInfo>& param_infos() const { return infos_; }
  // Ranges [first, second) of the flat gradient buffer that backward writes instead of adding to
  // (NetworkOptions::overwrite_grads; empty without it): sorted, disjoint, at most
  // KeptGrads::kMax (kernels/optimizer/optimizer.h; the largest layers' where more could).
  const std::vector<std::pair<int64_t, int64_t>>& overwritten_grad_ranges() const {
    return overwritten_;
  }
  // The names of the parameters in those ranges, in parameter order.
  std::vector<std::string> overwritten_grad_names() const;
  // Zeroes every parameter gradient on the network's stream: for a step that runs no backward
  // but hands its gradients on (a data-parallel rank without samples joins the all-reduce), as
  // the overwritten ranges hold the last step's gradient.
  void zero_grads() { grads_.zero(ex_.stream); }
  // Data-parallel training (and the optimizer's early updates): called during forward_backward's
  // backward pass, after each node's gradients are enqueued, with the flat offset from which every
  // parameter gradient of this step is final (parameters lie in layer order and backward runs in
  // reverse, so that offset falls node by node to 0). The hook may enqueue work (an all-reduce of
  // the finished range on another stream, after an event); null: none.
  // on_side_stream: the hook enqueues its work on side_stream() (after the weight gradients run
  // beside there); else the network's stream first waits for the side stream's work.
  using GradsReadyHook = std::function<void(int64_t final_from)>;
  void set_grads_ready_hook(GradsReadyHook hook, bool on_side_stream = false) {
    grads_ready_ = std::move(hook);
    hook_on_side_ = on_side_stream;
  }
  bool has_grads_ready_hook() const { return bool(grads_ready_); }
  // A second stream beside the network's (runtime/side_stream.h), created on first use: the
  // weight gradients run beside backward (NetworkOptions::weight_grads_beside) and the
  // optimizer's early updates go there, and forward_backward ends by joining it into the
  // network's stream when anything was forked onto it.
  SideStream& side_stream();
  // The offsets final_from takes, in the order the backward pass reaches them (the last is 0).
  std::vector<int64_t> grads_ready_offsets() const;
  // One per graph node (the loss excluded), in forward order; a residual block's add is a
  // parameter-free entry whose passes the Network runs itself (it reads two inputs).
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }
  const Exec& exec() const { return ex_; }
  void set_exec(const Exec& ex);  // same device; new stream / precision / determinism
  // The step counter dropout draws its masks from (memory of the network's device, read when the
  // kernels run: the trainer's, which a CUDA graph advances). Null: step 0 every time.
  void set_step_counter(const int64_t* d_step) { step_ = d_step; }
  // algo: auto on CUDA (not deterministic, CNN_AUTOTUNE not 0): every conv/linear layer times
  // its kernel variants at the full batch and keeps the fastest per pass (layers/autotune.h);
  // with weight gradients beside, the backward picks are then checked in the whole backward
  // pass (tune_backward).
  // Leaves the parameter gradients zero. Returns one line per choice, then the whole-pass
  // check's (empty when nothing tuned);
  // the trainer logs the fusion_notes() beside them. With a cache, choices recorded there for the
  // same shapes are reused untimed and new ones are added to it (the caller saves it).
  std::vector<std::string> autotune(TuneCache* cache = nullptr);
  // The passes the last autotune() chose a variant for (its lines less the whole-pass check's).
  size_t tuned_passes() const { return tuned_passes_; }
  // Floats of the side stream's scratch (weight_grads_beside; 0 before its first need).
  size_t side_scratch_floats() const { return side_scratch_.size(); }
  // One line per conv-relu-pool fusion in effect ("conv1 + relu1 + pool1: fused ..."), then one
  // naming every relu folded into a batchnorm ("bn1 + relu1, bn2 + relu2: relu folded ..."); empty
  // when none. A fused conv's own variants are not tuned: the fused pass runs.
  const std::vector<std::string>& fusion_notes() const { return fusion_notes_; }
  // Whether the first conv -> relu -> max-pool runs as one fused pass (see PoolFusion).
  bool fused_conv_relu_pool() const { return !layers_.empty() && layers_[0]->fused_pool(); }

  std::vector<float> params_to_host() const;
  void params_from_host(const std::vector<float>& h_params);
  std::vector<float> grads_to_host() const;
  // Buffers (batchnorm's running statistics): saved and loaded with the parameters, never
  // optimized. Flat floats in layer order; is_int64 ones are counts saved as int64.
  const std::vector<ParamInfo>& buffer_infos() const { return buffer_infos_; }
  int64_t num_buffers() const { return static_cast<int64_t>(buffers_.size()); }
  std::vector<float> buffers_to_host() const;
  void buffers_from_host(const std::vector<float>& h_buffers);
  // Per-element weight-decay mask (1 for weights, 0 for biases unless decay_biases).
  std::vector<uint8_t> decay_mask(bool decay_biases) const;

 private:
  NetworkOptions opt_;
  Exec ex_;
  Shape input_chw_;
  int classes_ = 0;
  // The input gradient node i writes for its input t (null where none is needed), running its
  // backward; sums it into t's gradient when another consumer of t wrote that first.
  void backward_node(size_t i, int n, const float* x, const Exec& ex);
  // The backward pass of forward_backward (the grads-ready hook included), after its forward and
  // loss: every node in reverse, then the side stream joined.
  void run_backward(int n, const float* x);
  // Whether node i's backward is asked for the gradient of its input.
  bool input_grad(size_t i) const;
  // autotune's check of its backward picks (tuned: each with its node) in the whole backward
  // pass, as forward_backward runs it after one forward of `input` (layers/network_tune.cpp).
  std::vector<std::string> check_backward(const float* input,
                                          std::vector<std::pair<size_t, TuneChoice>>& tuned);
  // The one scratch every layer's passes share (they run in turn on the network's stream): the
  // largest Layer::scratch_floats, or, tuning, the largest Layer::tune_scratch_floats.
  size_t scratch_need(const Exec& ex, bool tuning) const;
  // Reallocates scratch_ (construction, set_exec and autotune only: never inside a step, so a
  // captured step graph holds no allocation and its scratch pointer stays valid).
  void resize_scratch(size_t floats);
  // The side stream's scratch (weight_grads_beside): the largest Layer::beside_scratch_floats.
  void fit_side_scratch(const Exec& ex);
  const float* act_of(int node, const float* x) const { return node < 0 ? x : acts_[node]; }
  // NetworkOptions::overwrite_grads: tells the layers whose gradients backward writes, within
  // the optimizer's limit of ranges, and records them in overwritten_.
  void pick_overwritten_grads();
  int64_t per_image(int node) const;

  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<int> input_;           // node read by node i; -1: the network input
  std::vector<int> shortcut_input_;  // a block's add: its second input; else -1
  std::vector<int> last_consumer_;   // of node i's output (the loss counts); it writes the grad
  std::vector<bool> needs_grad_;     // node i's output depends on parameters
  // Layers not run: a relu folded into the previous layer (conv, linear, batchnorm), the relu and
  // pool of a fused conv-relu-pool, the relu after a fused residual add.
  std::vector<bool> skipped_;
  // A block's add run by its branch end (Layer::forward_residual): for the add, the branch end's
  // node (else -1), whose own forward turn then does nothing; whether a ReLU after the add is in.
  std::vector<int> add_run_by_;
  std::vector<bool> runs_at_add_, add_relu_;
  // Backward of a fused add with its relu: where the shortcut's input gradient is the add's to
  // write (it is the last reader), the relu's masked gradient goes straight there, and the
  // branch end reads its output gradient from that node's buffer (dy_from_[branch end]; else -1)
  // instead of a masked copy in its own.
  std::vector<int> dy_from_;
  std::vector<std::string> fusion_notes_;
  std::vector<Tensor> storage_;      // activation and gradient tensors
  std::vector<float*> acts_;         // output of node i (aliases for flatten / fused relu)
  std::vector<float*> grad_acts_;    // gradient w.r.t. the output of node i (null: none needed)
  std::vector<size_t> input_views_;  // nodes whose output is the network input itself (flatten)
  float* grad_sum_ = nullptr;        // a second consumer's input gradient before it is summed
  std::vector<ParamInfo> infos_, buffer_infos_;
  std::vector<std::pair<int64_t, int64_t>> overwritten_;  // overwritten_grad_ranges()
  Buffer<float> params_, grads_, scratch_, buffers_;
  const int64_t* step_ = nullptr;
  std::vector<int64_t> layer_param_begin_;  // node i's parameters start here (layer order)
  GradsReadyHook grads_ready_;
  bool hook_on_side_ = false;
  std::unique_ptr<SideStream> side_;
  Buffer<float> side_scratch_;
  size_t tuned_passes_ = 0;
  // Runs the layers forward in training or eval mode; returns the logits.
  const float* run_forward(int n, const float* x, bool training);
  void run_node(size_t i, int n, const float* x, const Exec& ex);
  Exec mode_exec(bool training) const;
  Buffer<float> loss_rows_;
  Buffer<int32_t> pred_;
};

}  // namespace cnn
