#pragma once
// One layer of the graph. Layers own no activations (the Network does) and run every pass
// through the kernel APIs in kernels/; no CUDA code lives here.
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "layers/autotune.h"
#include "layers/layer_spec.h"
#include "runtime/error.h"
#include "runtime/exec.h"
#include "runtime/tensor.h"

namespace cnn {

// A trainable tensor of a layer, placed in the network's flat parameter buffer.
struct ParamInfo {
  std::string name;       // "conv1.weight", "fc2.bias" (torch.nn naming)
  Shape shape;            // torch.nn layout: conv (OC, IC, KH, KW), linear (OUT, IN), bias (C)
  int64_t offset = 0;     // into the flat parameter / gradient buffers
  bool is_bias = false;   // also the 1-D batchnorm weight: no weight decay unless decay_biases
  bool is_int64 = false;  // a buffer kept as float but saved as int64 (num_batches_tracked)
  int64_t numel() const { return shape_numel(shape); }
};

class Layer {
 public:
  explicit Layer(LayerSpec spec) : spec_(std::move(spec)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const LayerSpec& spec() const { return spec_; }
  const std::string& name() const { return spec_.name; }

  // Fixes the input shape (N = the largest batch) and the device, validates, returns the output
  // shape. Layers allocate their own small state (e.g. pooling argmax) here.
  virtual Shape setup(const Shape& in, Device /*dev*/) {
    in_ = in;
    out_ = layer_output_shape(spec_, in);
    return out_;
  }
  const Shape& in_shape() const { return in_; }
  const Shape& out_shape() const { return out_; }

  // Parameter shapes in order (offsets are assigned by the Network).
  virtual std::vector<ParamInfo> param_shapes() const { return {}; }
  // Points the layer at its parameters and gradients inside the network's flat buffers.
  virtual void bind(float* /*params*/, float* /*grads*/) {}
  // Kaiming-uniform weights and biases as torch.nn initializes them, into host memory.
  virtual void init_params(float* /*h_params*/, std::mt19937_64& /*rng*/) const {}
  // Buffers: state that is saved with the parameters but never optimized (batchnorm's running
  // statistics), in the network's flat buffer array, under torch.nn names.
  virtual std::vector<ParamInfo> buffer_shapes() const { return {}; }
  virtual void bind_buffers(float* /*buffers*/) {}
  virtual void init_buffers(float* /*h_buffers*/) const {}
  // Scratch floats forward and backward need for the variants they run now (deterministic
  // reductions of the weight gradient, the channels-last copies of algo wgmma-nhwc); input_grad:
  // whether backward is asked for dx. The Network allocates one scratch, the largest any layer
  // needs, shared by every layer and pass: they run one after another on the network's stream.
  virtual std::size_t scratch_floats(const Exec&, bool /*input_grad*/) const { return 0; }
  // The same for autotune(), which may run every variant it times: at least scratch_floats.
  virtual std::size_t tune_scratch_floats(const Exec& ex, bool input_grad) const {
    return scratch_floats(ex, input_grad);
  }

  // y = f(x) for a batch of n (n <= the setup batch). scratch: scratch_floats(ex, ...) floats.
  virtual void forward(int n, const float* x, float* y, float* scratch, const Exec& ex) = 0;
  // Writes dx (when non-null) and ACCUMULATES parameter gradients, except those that
  // set_overwrite_grads(true) has it write (overwritable_grads()). x and y are this layer's
  // input and output of the last forward.
  // dy may be overwritten (a fused ReLU masks it in place).
  virtual void backward(int n, const float* x, const float* y, float* dy, float* dx, float* scratch,
                        const Exec& ex) = 0;
  // backward with the weight gradient on a second stream (`side`, the Network's side stream),
  // beside the input gradient and the rest of backward on ex's: what must come first (changes to
  // dy) on ex's stream, then fork() (the side stream waits for ex's so far), then the weight
  // gradient on side, reading only x and dy and writing only this layer's parameter gradients
  // (side_scratch: beside_scratch_floats(ex) floats), and the input gradient on ex's stream.
  // False, having enqueued nothing, where the layer cannot (the Network then runs backward).
  virtual bool backward_beside(int /*n*/, const float* /*x*/, const float* /*y*/, float* /*dy*/,
                               float* /*dx*/, float* /*scratch*/, float* /*side_scratch*/,
                               const Exec& /*ex*/, const Exec& /*side*/,
                               const std::function<void()>& /*fork*/) {
    return false;
  }
  virtual std::size_t beside_scratch_floats(const Exec&) const { return 0; }

  // algo: auto on CUDA: times this layer's kernel variants for a batch of n on the given buffers
  // (x input, y output, dy and dx gradients; dx null for the first layer) and keeps the fastest
  // per pass. Writes y and dx and ACCUMULATES (or, as backward, writes) parameter gradients:
  // the caller zeroes them after.
  // scratch: tune_scratch_floats(ex, dx != null) floats.
  virtual std::vector<TuneChoice> autotune(int /*n*/, const float* /*x*/, float* /*y*/,
                                           float* /*dy*/, float* /*dx*/, float* /*scratch*/,
                                           const Exec& /*ex*/) {
    return {};
  }
  // The variants autotune() picked for this layer's passes, which the Network's check in the
  // whole backward pass may change after (null: none tuned, e.g. a configured variant).
  virtual PassAlgos* tuned_algos() { return nullptr; }
  // Whether the weight gradient's tuned pick at batch n may have a cluster form (Exec::clusters)
  // whose cost beside the other passes the whole-pass check should weigh via
  // tuned_algos()->dw_clusters.
  virtual bool weight_grad_may_cluster(int /*n*/, const Exec& /*ex*/) const { return false; }
  // The cache autotune() consults and fills (layers/tune_cache.h); null: time everything.
  void set_tune_cache(TuneCache* cache) { tune_cache_ = cache; }

  // The parameters (indices into param_shapes()) whose gradients backward can WRITE instead of
  // adding to, on every path it may take after setup (any precision, reduction mode, batch and
  // variant autotune may pick): a pass that sums into a gradient in pieces (atomics, split
  // sums, a bias gradient handed to the next layer) cannot. Empty: none.
  virtual std::vector<size_t> overwritable_grads() const { return {}; }
  // Set by the Network once, at construction (NetworkOptions::overwrite_grads): backward (and
  // autotune) then write the overwritable_grads() instead of adding to them.
  void set_overwrite_grads(bool on) { overwrite_grads_ = on; }

  // True when ReLU is fused into this layer's epilogue (the Network then skips the relu layer).
  void set_fused_relu(bool on) { fused_relu_ = on; }
  bool fused_relu() const { return fused_relu_; }

  // The ReLU backward fused across a following max-pool: the pool routes only gradients whose
  // output is > 0 (exactly the windows whose winner passed the ReLU), and the layer with the
  // fused ReLU then skips its full-size ReLU backward pass. The Network pairs the two.
  virtual bool can_mask_input_relu() const { return false; }
  void set_mask_input_relu(bool on) { mask_input_relu_ = on; }
  void set_relu_masked_downstream(bool on) { relu_masked_downstream_ = on; }
  // Beyond the mask, the bias gradient of the layer before: a layer that masks its input gradient
  // by that layer's ReLU has written that layer's output gradient, whose column sums (a linear
  // layer's bias gradient) it can add in the same pass. The Network pairs the two: the layer
  // before hands over its bias gradient (and stops summing it itself; null: it has none to hand
  // over), this layer is given it.
  virtual bool can_sum_input_bias_grad() const { return false; }
  virtual float* hand_over_bias_grad() { return nullptr; }
  void set_input_bias_grad(float* d_db) { input_bias_grad_ = d_db; }

  // Conv -> ReLU -> max-pool run as one pass by this layer (kernels/conv_relu_pool.h), chosen by
  // the Network for a first layer whose ReLU is fused: forward then writes the POOL's output
  // (into the y it is given) and the pool's argmax, backward takes the pool's output gradient as
  // dy and computes the parameter gradients only (dx must be null); the Network skips the relu and
  // pool layers. Returns false, changing nothing, where the fused kernels do not apply.
  virtual bool fuse_relu_pool(Layer& /*pool*/) { return false; }

  // A residual block's add, and the ReLU after it when `relu`, run inside this layer's forward
  // (the layer that ends the block's branch, whose output nothing else reads): y = relu?(f(x) +
  // residual), with the bits of the separate add and relu passes. The Network runs it in the
  // add's turn and skips the add's and the relu's own forward passes; backward is unchanged (the
  // add passes dy on, the Network applies the ReLU's mask). Layers that can_fuse_residual()
  // override forward_residual; the others refuse it.
  virtual bool can_fuse_residual() const { return false; }
  virtual void forward_residual(int /*n*/, const float* /*x*/, const float* /*residual*/,
                                bool /*relu*/, float* /*y*/, float* /*scratch*/,
                                const Exec& /*ex*/) {
    CNN_FAIL("layer '{}' ({}) cannot run a residual add in its forward", name(),
             layer_kind_name(spec_.kind));
  }
  bool fused_pool() const { return fused_pool_; }
  // The argmax buffer (N, C, OH, OW) of a 2x2 / stride-2 / unpadded max-pool layer (the pool the
  // fused kernels implement); null for every other layer.
  virtual int32_t* pool_argmax() { return nullptr; }

 protected:
  // Whether backward must run the ReLU mask itself.
  bool relu_backward_here() const { return fused_relu_ && !relu_masked_downstream_; }
  LayerSpec spec_;
  Shape in_, out_;
  bool fused_relu_ = false;
  bool mask_input_relu_ = false;
  bool relu_masked_downstream_ = false;
  float* input_bias_grad_ = nullptr;  // (in features) the layer before's, or null
  bool overwrite_grads_ = false;
  bool fused_pool_ = false;
  TuneCache* tune_cache_ = nullptr;
};

// Builds the layer for a spec (not the loss: the Network handles softmax_cross_entropy itself).
std::unique_ptr<Layer> make_layer(const LayerSpec& spec);

}  // namespace cnn
