#pragma once
// Runs a QuantizedModel on a device through the int8 kernels (kernels/quant/): the float input
// is quantized once (by the first stage itself where it runs the few-channel kernel), every stage
// (conv/linear + ReLU + max-pool, a residual block's add + ReLU, or an average pool + ReLU) reads
// and writes int8 activations (N, H, W, C padded to 4), each kept in its own buffer for the stages
// that read it later (a block's shortcut), and the last stage writes dequantized float logits.
#include <cstdint>
#include <vector>

#include "kernels/quant/qadd.h"
#include "kernels/quant/qavgpool.h"
#include "kernels/quant/qconv.h"
#include "layers/quant/quant_model.h"
#include "runtime/exec.h"
#include "runtime/memory.h"

namespace cnn {

class Int8Network {
 public:
  // Throws naming the stage when the model is inconsistent (weight/scale sizes, shapes that do not
  // chain, scales that are not finite and > 0).
  // tensor_cores: on CUDA, each conv/linear stage runs the kernel qconv_pick_kernel picks for the
  // batch of the call (few-channel, linear dp4a, tensor cores, or direct); false keeps them all on
  // the direct kernel (CNN_INT8_DIRECT=1, for comparisons and bisecting).
  // fuse_classifier: on CUDA, a last linear stage of at most kQLinearDp4aMaxCols outputs that
  // reads a linear stage runs inside that stage's kernel (qconv_fused_classifier.h) at the
  // batches where that stage runs the linear tensor-core tile; false (the default) runs it alone
  // (CNN_INT8_FUSE_CLASSIFIER=1 turns it on in ./infer, ./quantize and ./bench: on the H200 the
  // fused LeNet fc1 + fc2 at batch 256 took 14.3 us, the two launches apart 11.0 + 2.8 us).
  Int8Network(const QuantizedModel& model, int max_batch, const Exec& ex, bool tensor_cores = true,
              bool fuse_classifier = false);

  // Logits (n, classes) on the network's device for x (n, C, H, W) normalized floats there.
  const float* forward(int n, const float* x);
  int num_classes() const { return classes_; }
  int max_batch() const { return max_batch_; }
  const Exec& exec() const { return ex_; }
  // The int8 output (n, PH, PW, OCP) of stage i of the last forward, on the host (tests).
  std::vector<int8_t> stage_output_to_host(size_t i, int n) const;
  // A conv/linear stage's shape; an add's tensor as the output of a 1x1 conv (c == oc); an
  // average pool's as a 1x1 conv (c == oc) followed by a pool of its window.
  const QConvShape& stage_shape(size_t i) const { return stages_[i].shape; }
  bool stage_is_add(size_t i) const { return stages_.at(i).is_add; }
  bool stage_is_avgpool(size_t i) const { return stages_.at(i).is_avgpool; }
  // The kernel a CUDA forward of n images runs for conv/linear stage i: qconv_pick_kernel's rule,
  // or Direct for every stage with tensor_cores false and on the CPU (where the twin runs).
  QConvKernel stage_kernel(size_t i, int n) const;
  // Whether the first stage reads the float input itself (the few-channel kernel quantizing it
  // while staging) instead of a separate quantization pass.
  bool fuses_input_quantization() const { return fuse_input_quantization_; }
  // Whether a forward of n images runs the last stage inside the one before it (then the last
  // stage's stage_kernel is not launched; the one before still writes its int8 output).
  bool fuses_classifier(int n) const;
  float input_inv_scale() const { return input_inv_scale_; }

 private:
  struct Stage {
    QConvShape shape;               // n = max batch
    int input = -1, shortcut = -1;  // the stages whose outputs it reads (-1: x_q_)
    bool is_add = false;            // a residual add (scales)
    bool is_avgpool = false;        // an average pool (avg_mult), else a conv (w, mult, add)
    QAddScales scales;
    float avg_mult = 1.f;
    bool relu = false;
    bool specialized = false;  // kernels by qconv_pick_kernel's rule, else the direct one
    Buffer<int8_t> w;          // (OC, KH, KW, CGP)
    Buffer<int8_t> w_igemm;    // (OCT, KP) where the rule may pick the tensor cores, else empty
    Buffer<float> mult, add;
    Buffer<int8_t> y;  // (N, PH, PW, OCP); empty for the last stage
  };
  // The QConvPath of conv/linear stage st at the batch of s.
  static QConvPath path_of(const Stage& st, const QConvShape& s);

  Exec ex_;
  int max_batch_ = 0, classes_ = 0;
  Shape input_chw_;
  float input_inv_scale_ = 1.f;
  bool fuse_input_quantization_ = false;
  Buffer<int8_t> x_q_;  // (N, H, W, CP); empty when the first stage quantizes the input itself
  // The fused classifier's scratch (qconv_fused_classifier.h), zeroed once here and left zero by
  // every call (nothing allocated in forward, so it can be captured); empty when the network's
  // shapes cannot fuse.
  Buffer<int32_t> classifier_acc_;
  Buffer<uint32_t> classifier_arrivals_;
  std::vector<Stage> stages_;
  Buffer<float> logits_;
};

// The int8 average pool of an avgpool stage's shape (Int8Network::stage_shape).
QAvgPoolShape avgpool_shape(const QConvShape& s);

// Checks a QuantizedModel's tensors (sizes, finite values, positive scales), naming the first
// bad one; `source` names the file in the message.
void validate_quantized_model(const QuantizedModel& m, const std::string& source);

}  // namespace cnn
