#pragma once
// Post-training int8 quantization of a trained network (BatchNorm folded first):
//   weights   symmetric, one scale per output channel: s_w[o] = max|w[o, :]| / 127
//   inputs    one scale per quantized layer's input, calibrated on training images (max,
//             percentile or MSE of the float activations that reach the layer); an activation
//             that several layers read (a residual block's input) has one scale they all share
//   biases    float32
// A QuantizedModel is what ./quantize writes (quant_file.h) and what Int8Network runs.
#include <cstdint>
#include <string>
#include <vector>

#include "layers/fold_batchnorm.h"
#include "layers/layer_spec.h"
#include "runtime/exec.h"
#include "runtime/tensor.h"

namespace cnn {

enum class CalibrationMethod { Max, Percentile, Mse };
const char* calibration_method_name(CalibrationMethod m);
CalibrationMethod parse_calibration_method(const std::string& s);  // throws naming the value
// The default: what measured best on MNIST / Fashion-MNIST (docs/inference.md).
constexpr CalibrationMethod kDefaultCalibration = CalibrationMethod::Mse;
// The percentile of |x| that the percentile method clips at.
constexpr double kCalibrationPercentile = 99.99;

// One int8 pass: a conv2d or linear layer with the ReLU and max-pool that follow it, the add
// that ends a residual block with the ReLU that follows it, or an avgpool2d with its ReLU.
struct QuantStage {
  std::string name;  // the conv/linear layer's (the block's) name, the prefix of its tensors
  // The add of a residual block: out = requantize(branch * input_scale / output_scale +
  // shortcut * shortcut_scale / output_scale), ReLU fused; no weights. c, h, w: its tensors.
  bool add = false;
  // An avgpool2d (torch's count_include_pad: every window divides by kh * kw): reads (c, h, w)
  // at input_scale, writes (c, out_h, out_w) at its own output_scale,
  //   y = requantize(window sum * input_scale / (output_scale * pool_kh * pool_kw)),
  // ReLU fused; no weights. Its window is pool_kh ... pool_pw (`pool` stays false); oc == c.
  bool avgpool = false;
  // The stage whose int8 output this stage reads (-1: the quantized network input); an add
  // reads `input` (the block's layers) and `shortcut` (its shortcut's last conv, or for the
  // identity the stage that wrote the block's input).
  int input = -1, shortcut = -1;
  bool linear = false;  // a linear layer reads its input image (c, h, w) flattened as torch does
  // A linear layer after global_avgpool (flatten and dropout between): it reads the un-pooled
  // image (c, h, w) and averages it inside its integer sum (each weight w[o, ci] repeated over
  // the h*w positions, 1/(h*w) folded into the requantization), so the pool costs no pass and
  // no rounding of its own. Weights stay (OUT, C), as the float layer's.
  bool global_avg = false;
  int c = 1, h = 1, w = 1;  // input image
  int oc = 1;               // output channels / features
  int kh = 1, kw = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  int groups = 1;
  bool relu = false;
  bool pool = false;  // max-pool after the conv (ReLU commutes with it)
  int pool_kh = 1, pool_kw = 1, pool_sh = 1, pool_sw = 1, pool_ph = 0, pool_pw = 0;
  std::vector<std::string> fused;  // names of the relu / pool layers this stage runs

  // Filled by quantize_network or read from a file:
  std::vector<int8_t> weight;       // torch layout: (OC, C/groups, KH, KW) or (OUT, C*H*W)
  std::vector<float> weight_scale;  // (OC)
  float input_scale = 1.f;          // an add: the scale of its `input` (the block's layers' output)
  float shortcut_scale = 1.f;       // an add's
  float output_scale = 1.f;         // an add's and an avgpool's
  std::vector<float> bias;          // (OC), zeros for a layer without bias

  Shape weight_shape() const;  // the torch shape of `weight`
  int64_t weight_numel() const;
  int out_h() const;  // after the pool
  int out_w() const;
  int out_c() const { return add || avgpool ? c : oc; }
  bool has_weights() const { return !add && !avgpool; }
};

struct QuantizedModel {
  std::vector<QuantStage> stages;
  Shape input_chw;
  std::string method;  // calibration method name
  int64_t calibration_images = 0;
  int num_classes() const { return stages.empty() ? 0 : stages.back().oc; }
};

// The scale of stage j's int8 output (j = -1: the network input), as its readers record it; the
// first reader's (validate_quantized_model checks that they agree). Throws when nothing reads it.
float output_scale_of(const QuantizedModel& m, int j);

// The int8 stages of a network whose batchnorms are folded (fold_batchnorm's specs), without
// weights. Throws naming the first layer that int8 cannot run and what it can.
std::vector<QuantStage> plan_int8(const std::vector<LayerSpec>& folded_specs,
                                  const Shape& input_chw);

// Quantizes the folded network: weights per channel, and input scales calibrated with `method`
// on n images x (n, C, H, W) (normalized floats, host memory). The calibration's float forward
// runs on ex's device: on CUDA the training Network's forward (layers/quant/calibration.h), on
// the CPU the stages' own loops (float_forward).
QuantizedModel quantize_network(const FoldedNetwork& folded, const Shape& input_chw, const float* x,
                                int n, CalibrationMethod method, const Exec& ex = Exec{});

// The FP32 forward of the stages (float weights, host memory): the output of every stage for n
// images x, stage_outputs[i] (n, c, h, w) NCHW, and the logits. The CPU calibration and tests.
struct FloatStage {
  std::vector<float> weight, bias;  // torch layouts
};
std::vector<FloatStage> float_stages(const std::vector<QuantStage>& plan,
                                     const FoldedNetwork& folded, const Shape& input_chw);
std::vector<float> float_forward(const std::vector<QuantStage>& plan,
                                 const std::vector<FloatStage>& weights, const float* x, int n,
                                 std::vector<std::vector<float>>* stage_outputs);

// round_half_even(clamp(v, -127, 127)): the rounding of the int8 kernels (kernels/quant/qconv.h).
int8_t requantize_weight(float v);

// The scale that maps the sampled activations onto [-127, 127] by `method` (1 when all are 0).
float calibrate_scale(const std::vector<float>& samples, float max_abs, CalibrationMethod method);

}  // namespace cnn
