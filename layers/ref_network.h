#pragma once
// A double-precision CPU twin of Network, built from the same specs with the same flat parameter
// layout, running the kernels' double-precision CPU references. It is the ground truth for the
// gradient checks: numerical gradients come from its loss.
#include <cstdint>
#include <vector>

#include "layers/layer.h"

namespace cnn {

class RefNetwork {
 public:
  // specs may end with softmax_cross_entropy (loss = mean cross-entropy over the batch) or not
  // (loss = sum of out * probe, a fixed random linear functional of the output).
  // Training mode: batchnorm with the batch's statistics, dropout with the mask the float
  // Network draws for `seed` (its NetworkOptions::seed) at step 0. label_smoothing as
  // NetworkOptions::label_smoothing.
  RefNetwork(const std::vector<LayerSpec>& specs, const Shape& input_chw, int n,
             double label_smoothing = 0.0, uint64_t seed = 1);

  const std::vector<ParamInfo>& param_infos() const { return infos_; }
  int64_t num_params() const { return num_params_; }
  int64_t input_count() const { return shape_numel(in_shape_); }
  int64_t output_count() const { return out_count_; }
  bool has_softmax() const { return softmax_; }

  double loss(const std::vector<double>& params, const std::vector<double>& x,
              const std::vector<int32_t>& labels, const std::vector<double>& probe) const;
  // The gradient checks' shortcut: a parameter of step k changes no activation before step k, so
  // loss() after perturbing only steps >= first reuses the activations of an unperturbed pass
  // (acts[0] = x, acts[i + 1] = output of step i, from activations()), shared by any threads.
  // With `pieces`: per step, a hash of the linear piece the pass is on (which ReLU inputs are
  // positive, which max-pool inputs win), 0 for steps not run; a central difference whose sides
  // changed pieces straddles a kink, however small its jump.
  std::vector<std::vector<double>> activations(const std::vector<double>& params,
                                               const std::vector<double>& x,
                                               std::vector<uint64_t>* pieces = nullptr) const;
  double loss_from(size_t first, const std::vector<std::vector<double>>& acts,
                   const std::vector<double>& params, const std::vector<int32_t>& labels,
                   const std::vector<double>& probe, std::vector<uint64_t>* pieces = nullptr) const;
  // The step whose parameters hold flat index `offset` (one of param_infos()' ranges).
  size_t step_of_param(int64_t offset) const;
  // Analytic gradients of loss() with respect to the parameters and the input.
  void gradients(const std::vector<double>& params, const std::vector<double>& x,
                 const std::vector<int32_t>& labels, const std::vector<double>& probe,
                 std::vector<double>* dparams, std::vector<double>* dx) const;

 private:
  struct Step {
    LayerSpec spec;
    Shape in, out;
    int64_t param_offset = 0;
    int input = -1;           // step whose output this one reads; -1: the network input
    int shortcut_input = -1;  // a residual block's add (spec.kind Residual): its second input
  };
  // Runs forward keeping every activation (acts[0] = x, acts[i+1] = output of step i), over the
  // graph of layer_graph() (residual blocks opened up into their layers and an add).
  std::vector<std::vector<double>> forward_all(const std::vector<double>& params,
                                               const std::vector<double>& x,
                                               std::vector<std::vector<int32_t>>* argmax) const;
  // forward_all from step `first` on, reading acts[0..first] from `prefix`; those entries of
  // the result are left empty.
  std::vector<std::vector<double>> forward_from(size_t first,
                                                const std::vector<std::vector<double>>& prefix,
                                                const std::vector<double>& params,
                                                std::vector<std::vector<int32_t>>* argmax,
                                                std::vector<uint64_t>* pieces = nullptr) const;
  double loss_of(const std::vector<double>& out, const std::vector<int32_t>& labels,
                 const std::vector<double>& probe) const;
  std::vector<Step> steps_;
  std::vector<ParamInfo> infos_;
  Shape in_shape_;
  int64_t num_params_ = 0, out_count_ = 0;
  int n_ = 0, classes_ = 0;
  bool softmax_ = false;
  double label_smoothing_ = 0;
  uint64_t seed_ = 1;
};

}  // namespace cnn
